"""The names of the events stages emit (EventFrame.name) and the shape of their payloads.

A stage that emits or reacts to an event uses these names, never a bare string, so a reader finds
every producer and consumer of an event by its constant, and the payload's keys are written down
once. Event names travel as plain strings (on Redis and, as `{"type":"event","name":...}`, to clients).
"""
from __future__ import annotations

from typing import Any, Final, TypedDict

# speech (vad -> asr, tts, llm; clients)
SPEECH_START: Final = "speech_start"  # SpeechSpan (start only): speech confirmed, start includes the pad
SPEECH_PAUSE: Final = "speech_pause"  # SpeechAt: the probability fell; ASR starts a speculative final
SPEECH_RESUME: Final = "speech_resume"  # SpeechAt: speech came back, the pause was not the end
SPEECH_END: Final = "speech_end"  # SpeechSpan: `min_silence_ms` of silence
# video (video_capture, sampler, detect -> describe, annotate; clients)
DETECTIONS: Final = "detections"  # Detections
SCENE_CHANGE: Final = "scene_change"  # SceneChange
VIDEO_DROPPED: Final = "video_dropped"  # VideoDropped
# anything
ERROR: Final = "error"  # StageError: a stage failed on a frame; the session goes on
OPEN: Final = "open"  # OpenSource: capture opens a file or URL


class SpeechSpan(TypedDict, total=False):
    start: float
    end: float


class SpeechAt(TypedDict):
    at: float


class Detection(TypedDict):
    label: str
    box: list[float]  # x, y, w, h in source pixels
    score: float


class Detections(TypedDict, total=False):
    pts: float
    objects: list[Detection]
    width: int
    height: int


class SceneChange(TypedDict):
    pts: float
    index: int
    score: float


class VideoDropped(TypedDict):
    pts: float
    dropped: int
    reasons: dict[str, int]
    reason: str
    total_dropped: int
    frames: int
    policy: str


class StageError(TypedDict):
    stage: str
    code: str
    message: str


class OpenSource(TypedDict, total=False):
    url: str
    paced: bool


Payload = dict[str, Any]
