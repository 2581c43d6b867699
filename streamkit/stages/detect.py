"""detect: faces, people, motion and your ONNX model on the sampled frames; boxes in source pixels."""

from __future__ import annotations

import asyncio
import collections
from dataclasses import replace
from typing import Any, AsyncIterator, Literal

from pydantic import Field, model_validator

from streamkit import events
from streamkit.frames import EventFrame, Frame, VideoFrame
from streamkit.stage import Stage, StageConfig, register_stage
from streamkit.video.detect_options import (
    FaceOptions,
    MotionOptions,
    OnnxOptions,
    PersonOptions,
)


@register_stage("detect")
class Detect(Stage):
    """Faces (Haar), people (HOG), motion regions, and/or a user's ONNX model, in batches.

    Emits, for every VideoFrame it receives, `EventFrame("detections", {"pts", "objects":
    [{"label", "box": [x, y, w, h], "score"}], "width", "height"})` in source pixels.
    Frames are grouped into batches of `batch_size` (a batch also closes when its first
    frame is `max_batch_delay_s` older than the newest); detection runs in worker threads
    (OpenCV and onnxruntime release the GIL), so decoding goes on meanwhile. With `motion`
    among the detectors, faces and people are region-tracked: the whole frame every
    `full_every` analysed frames and after each scene cut, otherwise only around recent
    finds and this frame's motion regions (see streamkit.video.detectors.RegionTracker)."""

    class Config(StageConfig):
        type: Literal["detect"] = "detect"
        detectors: list[Literal["face", "person", "motion", "onnx"]] = Field(
            default_factory=lambda: ["face", "person", "motion"], min_length=1)
        face: FaceOptions = Field(default_factory=FaceOptions)
        person: PersonOptions = Field(default_factory=PersonOptions)
        motion: MotionOptions = Field(default_factory=MotionOptions)
        onnx: OnnxOptions | None = None
        batch_size: int = Field(default=1, ge=1, le=64)
        max_batch_delay_s: float = Field(default=0.5, ge=0)
        workers: int = Field(default=2, ge=1, le=64)  # batches detected at once (threads)
        # keep up to workers - 1 batches in flight while the next frames arrive: the most frames per
        # second, but a batch's detections then leave with the next frame's arrival (a sample period
        # later, 200 ms at 5 fps). None: off for live input (session param live: true), on otherwise
        overlap: bool | None = None
        cv_threads: int | None = Field(default=None, ge=0, le=64)

        @model_validator(mode="after")
        def _onnx_needs_path(self):
            if "onnx" in self.detectors and self.onnx is None:
                raise ValueError("detector 'onnx' needs an `onnx: {path: model.onnx}` section")
            return self

    FORWARDED = (events.VIDEO_DROPPED, events.SCENE_CHANGE)

    def wants(self, frame: Frame) -> bool:
        # upstream analysis events are re-emitted by this stage so they reach the session output
        return isinstance(frame, VideoFrame) or (isinstance(frame, EventFrame) and frame.name in self.FORWARDED)

    async def start(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        from streamkit.video.detectors import MotionDetector, RegionTracker

        self._batch: list[VideoFrame] = []
        self._pending: collections.deque[tuple[list[VideoFrame], Any]] = collections.deque()
        self.detectors = await asyncio.to_thread(self._build)
        c = self.config
        overlap = c.overlap if c.overlap is not None else not self.context.params.get("live")
        self._in_flight = c.workers - 1 if overlap else 0  # batches left running when process() returns
        # motion (it compares with the previous analysed frame) runs on its own FIFO thread;
        # faces and people are region-tracked (order-dependent too), each on its own FIFO
        # thread, so the two run at the same time, after the same frame's motion; stateless
        # detectors (onnx) run on `workers` threads, batches in parallel
        self._motion = next((d for d in self.detectors if isinstance(d, MotionDetector)), None)
        self._tracked: dict[str, Any] = {}
        self._parallel: list[Any] = []
        for kind, det in zip(c.detectors, self.detectors):
            if kind in ("face", "person"):
                self._tracked[kind] = RegionTracker(det, full_every=getattr(c, kind).full_every)
            elif kind == "onnx":
                self._parallel.append(det)
        widths = [w for w in (c.face.width if "face" in c.detectors else None,
                              c.person.width if "person" in c.detectors else None,
                              c.motion.width if "motion" in c.detectors else None) if w]
        self._widths = sorted(set(widths), reverse=True)  # pyramid levels, largest first
        prefix = f"detect-{self.name}"
        self._pool = ThreadPoolExecutor(c.workers, thread_name_prefix=prefix)
        self._serial = ThreadPoolExecutor(1, thread_name_prefix=f"{prefix}-motion")
        self._track_exec = {k: ThreadPoolExecutor(1, thread_name_prefix=f"{prefix}-{k}") for k in self._tracked}

    def _build(self) -> list[Any]:
        from streamkit.resources import shared
        from streamkit.video import detectors as d
        from streamkit.video.onnx_detector import OnnxDetector, load_onnx_session

        c = self.config
        if c.cv_threads is not None:
            import cv2

            cv2.setNumThreads(c.cv_threads)
        built: list[Any] = []
        for kind in c.detectors:
            if kind == "face":
                built.append(d.HaarFaceDetector(**c.face.model_dump(exclude={"full_every"})))
            elif kind == "person":
                built.append(d.HogPeopleDetector(**c.person.model_dump(exclude={"full_every"})))
            elif kind == "motion":
                built.append(d.MotionDetector(**c.motion.model_dump()))
            elif kind == "onnx":
                o = c.onnx.model_dump()
                session = shared(("onnx", o["path"], o["threads"]), lambda o=o: load_onnx_session(o["path"], o["threads"]))
                built.append(OnnxDetector(session=session, **o))
        return built

    async def process(self, frame: Frame) -> AsyncIterator[Frame]:
        if isinstance(frame, EventFrame):
            if frame.name == events.SCENE_CHANGE:
                # a cut is not motion: what came before is compared with the old scene, then reset
                # (and the trackers search the whole of the new scene's first frame)
                self._submit()
                async for out in self._drain(0):
                    yield out
                for det in self.detectors:
                    det.reset()
                for tracker in self._tracked.values():
                    tracker.reset()
            yield replace(frame, data={**frame.data, "stage": frame.data.get("stage", frame.source)})
            return
        assert isinstance(frame, VideoFrame)
        self._batch.append(frame)
        if len(self._batch) >= self.config.batch_size or frame.pts - self._batch[0].pts >= self.config.max_batch_delay_s:
            self._submit()
        async for out in self._drain(self._in_flight):
            yield out

    def _motion_job(self, images: list[Any]) -> list[list[dict[str, Any]]]:
        for im in images:  # downscaled copies, each from the next larger one
            for w in self._widths:
                im.at(w)
        return [self._motion.detect(im) for im in images]

    @staticmethod
    def _tracked_job(tracker: Any, images: list[Any], motion: Any) -> list[list[dict[str, Any]]]:
        regions = motion.result() if motion is not None else [None] * len(images)
        return [tracker.detect(im, regions[i]) for i, im in enumerate(images)]

    def _submit(self) -> None:
        from streamkit.video.detectors import detect_all
        from streamkit.video.geometry import Pyramid

        batch, self._batch = self._batch, []
        if not batch:
            return
        images = [Pyramid(f.image) for f in batch]
        jobs: dict[str, Any] = {}
        motion = self._serial.submit(self._motion_job, images) if self._motion is not None else None
        if motion is not None:
            jobs["motion"] = motion
        for kind, tracker in self._tracked.items():
            jobs[kind] = self._track_exec[kind].submit(self._tracked_job, tracker, images, motion)
        if self._parallel:
            jobs["onnx"] = self._pool.submit(detect_all, self._parallel, images)
        order = [k for k in dict.fromkeys(self.config.detectors) if k in jobs]
        futures = [asyncio.wrap_future(jobs[k]) for k in order]
        self._pending.append((batch, asyncio.gather(*futures)))

    async def _drain(self, keep: int) -> AsyncIterator[Frame]:
        """Emit finished batches in order; wait while more than `keep` are in flight."""
        while self._pending and (len(self._pending) > keep or self._pending[0][1].done()):
            batch, job = self._pending[0]
            parts = await job
            self._pending.popleft()
            for i, frame in enumerate(batch):
                objects = [o for part in parts for o in part[i]]
                yield EventFrame(events.DETECTIONS, {"pts": frame.pts, "objects": objects,
                                                "width": frame.width, "height": frame.height}, pts=frame.pts)

    def stats(self) -> dict[str, Any]:
        return {kind: t.stats() for kind, t in getattr(self, "_tracked", {}).items()}

    async def flush(self) -> AsyncIterator[Frame]:
        self._submit()
        async for out in self._drain(0):
            yield out

    async def interrupt(self) -> None:
        self._batch = []
        self._pending.clear()

    async def stop(self) -> None:
        pools = [getattr(self, "_pool", None), getattr(self, "_serial", None), *getattr(self, "_track_exec", {}).values()]
        for pool in pools:
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
