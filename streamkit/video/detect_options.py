"""The options of the detect stage, one model per detector (faces, people, motion, your ONNX model)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class FaceOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    width: int | None = Field(default=640, ge=64)
    scale_factor: float = Field(default=1.15, gt=1.0, le=2.0)
    min_neighbors: int = Field(default=5, ge=0)
    min_size: int = Field(default=24, ge=8)
    cascade: str = "haarcascade_frontalface_default.xml"
    # with motion among the detectors: a whole-frame pass every `full_every` analysed frames
    # (5 s at 5 fps; a Haar pass over a textured 720p frame costs ~55 ms of CPU) and after each
    # scene cut, in between only around recent faces and motion regions (1 = always the whole frame)
    full_every: int = Field(default=25, ge=1, le=10_000)


class PersonOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    width: int | None = Field(default=640, ge=64)
    stride: int = Field(default=8, ge=4, le=64)
    scale: float = Field(default=1.1, gt=1.0, le=2.0)
    hit_threshold: float = 0.0
    min_score: float = Field(default=0.5, ge=0, le=1)
    full_every: int = Field(default=25, ge=1, le=10_000)  # as for faces


class MotionOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    width: int = Field(default=320, ge=32)
    threshold: int = Field(default=25, ge=1, le=255)
    min_area: float = Field(default=0.002, ge=0, le=1)
    max_regions: int = Field(default=8, ge=1)


class OnnxOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str
    labels: list[str] | None = None
    input_size: int | None = Field(default=None, ge=32)
    score_threshold: float = Field(default=0.35, ge=0, le=1)
    iou_threshold: float = Field(default=0.45, ge=0, le=1)
    format: Literal["auto", "yolov8", "yolov5", "xyxy"] = "auto"
    threads: int = Field(default=0, ge=0)
