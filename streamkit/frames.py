"""Typed frames that flow between stages, and their msgpack wire format.

Every frame carries `pts` (presentation time in seconds from the start of the session's media)
and `source` (the name of the stage that produced it; "" for frames fed in from outside).

Audio samples are float32 in [-1, 1]: shape (n,) for mono, (n, channels) otherwise.
Video images are uint8 BGR (OpenCV's order), shape (height, width, 3).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar, Union

import msgpack
import numpy as np


class FrameDecodeError(ValueError):
    """A wire frame could not be decoded; the message says what was wrong."""


def float_to_s16le(samples: np.ndarray) -> bytes:
    """float32 in [-1, 1] to 16-bit PCM: the inverse of from_s16le (x * 32768), so PCM that came
    in goes out bit for bit; out-of-range samples clip."""
    return np.clip(np.round(np.asarray(samples) * 32768.0), -32768, 32767).astype("<i2").tobytes()


@dataclass(eq=False)
class AudioFrame:
    samples: np.ndarray
    sample_rate: int
    channels: int = 1
    pts: float = 0.0
    source: str = ""
    kind: ClassVar[str] = "audio"

    def __post_init__(self) -> None:
        self.samples = np.asarray(self.samples, dtype=np.float32)
        expected_ndim = 1 if self.channels == 1 else 2
        if self.samples.ndim != expected_ndim or (
            self.channels > 1 and self.samples.shape[1] != self.channels
        ):
            raise ValueError(
                f"AudioFrame: samples of shape {self.samples.shape} do not match channels={self.channels}"
            )
        if self.sample_rate <= 0:
            raise ValueError(f"AudioFrame: sample_rate must be positive, got {self.sample_rate}")

    @property
    def num_samples(self) -> int:
        return int(self.samples.shape[0])

    @property
    def duration(self) -> float:
        return self.num_samples / self.sample_rate

    @property
    def end(self) -> float:
        return self.pts + self.duration

    def mono(self) -> np.ndarray:
        return self.samples if self.channels == 1 else self.samples.mean(axis=1)

    def to_s16le(self) -> bytes:
        return float_to_s16le(self.samples)

    @classmethod
    def from_s16le(
        cls, data: bytes, sample_rate: int, channels: int = 1, pts: float = 0.0, source: str = ""
    ) -> "AudioFrame":
        if len(data) % (2 * channels):
            raise ValueError(
                f"s16le audio of {len(data)} bytes is not a whole number of {channels}-channel samples"
            )
        pcm = np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0
        if channels > 1:
            pcm = pcm.reshape(-1, channels)
        return cls(pcm, sample_rate, channels, pts, source)


@dataclass(eq=False)
class VideoFrame:
    image: np.ndarray
    pts: float = 0.0
    index: int = 0
    source: str = ""
    kind: ClassVar[str] = "video"

    def __post_init__(self) -> None:
        if self.image.dtype != np.uint8 or self.image.ndim != 3 or self.image.shape[2] != 3:
            raise ValueError(
                f"VideoFrame: image must be uint8 (height, width, 3), got {self.image.dtype} {self.image.shape}"
            )

    @property
    def width(self) -> int:
        return int(self.image.shape[1])

    @property
    def height(self) -> int:
        return int(self.image.shape[0])


@dataclass(eq=False)
class Word:
    text: str
    start: float
    end: float
    probability: float = 1.0


class TextRole(str, enum.Enum):
    """What a TextFrame is: what was said (ASR), or text a stage wrote (LLM, descriptions)."""

    TRANSCRIPT = "transcript"
    GENERATED = "generated"


@dataclass(eq=False)
class TextFrame:
    """Text from ASR or an LLM. `final=False` frames are revisable partial hypotheses."""

    text: str
    final: bool = True
    language: str | None = None
    start: float | None = None
    end: float | None = None
    words: list[Word] = field(default_factory=list)
    utterance: int | None = None
    pts: float = 0.0
    source: str = ""
    role: TextRole = TextRole.GENERATED
    kind: ClassVar[str] = "text"


@dataclass(eq=False)
class EventFrame:
    """A named event with a JSON-compatible payload (speech_start, detections, metrics...)."""

    name: str
    data: dict[str, Any] = field(default_factory=dict)
    pts: float = 0.0
    source: str = ""
    kind: ClassVar[str] = "event"


class ControlKind(str, enum.Enum):
    EOS = "eos"  # end of stream: flush, then no more frames
    FLUSH = "flush"  # emit whatever is buffered, keep going
    INTERRUPT = "interrupt"  # the user barged in: drop in-flight output


@dataclass(eq=False)
class Control:
    control: ControlKind
    pts: float = 0.0
    source: str = ""
    kind: ClassVar[str] = "control"

    def __post_init__(self) -> None:
        self.control = ControlKind(self.control)


Frame = Union[AudioFrame, VideoFrame, TextFrame, EventFrame, Control]
FRAME_TYPES: dict[str, type] = {t.kind: t for t in (AudioFrame, VideoFrame, TextFrame, EventFrame, Control)}


def frames_equal(a: Frame, b: Frame) -> bool:
    """Exact equality, arrays compared element for element (dataclass eq cannot do arrays)."""
    if type(a) is not type(b):
        return False
    for f in fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            if not (x.shape == y.shape and x.dtype == y.dtype and np.array_equal(x, y)):
                return False
        elif isinstance(x, list) and x and isinstance(x[0], Word):
            if len(x) != len(y) or any(vars(p) != vars(q) for p, q in zip(x, y)):
                return False
        elif x != y:
            return False
    return True


def with_source(frame: Frame, source: str) -> Frame:
    return replace(frame, source=source)


# ---------------------------------------------------------------- wire format
# A frame on the wire is a msgpack map {"k": kind, ...fields}; arrays are
# {"dtype", "shape", "data"} maps so they round-trip bit for bit.

_WIRE_VERSION = 1


def _pack_array(a: np.ndarray) -> dict[str, Any]:
    a = np.ascontiguousarray(a)
    return {"dtype": a.dtype.str, "shape": list(a.shape), "data": a.tobytes()}


def _unpack_array(obj: Any, what: str) -> np.ndarray:
    try:
        dtype = np.dtype(obj["dtype"])
        shape = tuple(int(s) for s in obj["shape"])
        if dtype.hasobject:
            raise ValueError("object arrays are not allowed")
        arr = np.frombuffer(obj["data"], dtype=dtype)
        return arr.reshape(shape).copy()
    except (KeyError, TypeError, ValueError) as exc:
        raise FrameDecodeError(f"{what}: bad array ({exc})") from None


def encode_frame(frame: Frame) -> bytes:
    body: dict[str, Any] = {"v": _WIRE_VERSION, "k": frame.kind}
    for f in fields(frame):
        value = getattr(frame, f.name)
        if isinstance(value, np.ndarray):
            value = _pack_array(value)
        elif isinstance(value, (ControlKind, TextRole)):
            value = value.value
        elif f.name == "words":
            value = [[w.text, w.start, w.end, w.probability] for w in value]
        body[f.name] = value
    return msgpack.packb(body, use_bin_type=True)


def decode_frame(data: bytes) -> Frame:
    try:
        body = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise FrameDecodeError(f"frame is not valid msgpack ({type(exc).__name__}: {exc})") from None
    if not isinstance(body, dict):
        raise FrameDecodeError(f"frame must be a msgpack map, got {type(body).__name__}")
    kind = body.pop("k", None)
    body.pop("v", None)
    cls = FRAME_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise FrameDecodeError(f"unknown frame kind {kind!r}")
    names = {f.name for f in fields(cls)}
    unknown = set(body) - names
    if unknown:
        raise FrameDecodeError(f"{kind} frame has unknown fields {sorted(unknown)}")
    try:
        for name in ("samples", "image"):
            if name in body:
                body[name] = _unpack_array(body[name], f"{kind}.{name}")
        if "words" in body:
            body["words"] = [Word(*w) for w in body["words"]]
        if "role" in body:
            body["role"] = TextRole(body["role"])
        return cls(**body)
    except FrameDecodeError:
        raise
    except Exception as exc:
        raise FrameDecodeError(f"{kind} frame is malformed: {exc}") from None
