"""The websocket protocol of DESIGN.md: parsing client messages, encoding server events.

Client -> server
    text   {"type":"start","pipeline":NAME,"params":{},"audio":{"sample_rate":16000,"format":"s16le","channels":1}}
    text   {"type":"stop"}
    binary 0x01 + s16le mono PCM at the declared rate (any whole number of samples)
    binary 0x02 + one JPEG frame
Server -> client
    {"type":"ready","session":ID,"output_audio":{"sample_rate":R,"format":"s16le","channels":1}}
    {"type":"transcript","text","final","start","end"}   {"type":"text","stage","text","final"}
    {"type":"detections","pts","objects":[...]}          {"type":"metrics","stages":{...}}
    {"type":"event","name","data"}   (additive extension: VAD speech_start/speech_end and friends)
    {"type":"error","code","message"}                    {"type":"end"}
    binary 0x01 + s16le mono PCM at output_audio.sample_rate

Everything here is pure (no I/O), so the parser can be fuzzed: `parse_message` either returns a
message object or raises ProtocolError; no other exception escapes it.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Union

import numpy as np

KIND_AUDIO = 0x01
KIND_VIDEO = 0x02
DEFAULT_MAX_MESSAGE = 1 << 20  # 1 MiB

# close codes (RFC 6455)
CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
CLOSE_UNSUPPORTED = 1003
CLOSE_POLICY = 1008
CLOSE_TOO_BIG = 1009
CLOSE_INTERNAL = 1011

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]{0,127}$")
AUDIO_RATES = (8000, 192000)  # inclusive bounds of a declarable input sample rate


class ProtocolError(Exception):
    """What was wrong with a client message. `close` is set when the session cannot go on."""

    def __init__(self, code: str, message: str, close: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.close = close

    def event(self) -> dict[str, Any]:
        return error(self.code, self.message)


@dataclass
class AudioFormat:
    sample_rate: int = 16000
    channels: int = 1
    format: str = "s16le"


@dataclass
class Start:
    pipeline: str
    params: dict[str, Any] = field(default_factory=dict)
    audio: AudioFormat | None = None  # None: the pipeline's own input format


@dataclass
class Stop:
    pass


@dataclass
class Audio:
    pcm: bytes


@dataclass
class Video:
    jpeg: bytes


ClientMessage = Union[Start, Stop, Audio, Video]


def error(code: str, message: str) -> dict[str, Any]:
    return {"type": "error", "code": code, "message": message}


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _parse_audio_format(raw: Any) -> AudioFormat:
    if not isinstance(raw, dict):
        raise ProtocolError("bad_audio_format", f"start.audio must be an object, got {type(raw).__name__}")
    rate = raw.get("sample_rate", 16000)
    if isinstance(rate, float) and rate.is_integer():
        rate = int(rate)
    if not isinstance(rate, int) or isinstance(rate, bool):
        raise ProtocolError("bad_audio_format", f"start.audio.sample_rate must be an integer, got {_describe(rate)}")
    if not AUDIO_RATES[0] <= rate <= AUDIO_RATES[1]:
        raise ProtocolError(
            "bad_audio_format",
            f"start.audio.sample_rate {rate} is outside {AUDIO_RATES[0]}..{AUDIO_RATES[1]} Hz",
        )
    fmt = raw.get("format", "s16le")
    if fmt != "s16le":
        raise ProtocolError("bad_audio_format", f"start.audio.format must be \"s16le\", got {_describe(fmt)}")
    channels = raw.get("channels", 1)
    if channels not in (1, 2) or isinstance(channels, bool):
        raise ProtocolError("bad_audio_format", f"start.audio.channels must be 1 or 2, got {_describe(channels)}")
    return AudioFormat(rate, int(channels), fmt)


def parse_text(text: str) -> ClientMessage:
    try:
        obj = json.loads(text)
    except RecursionError:
        raise ProtocolError("bad_json", "text message is nested too deeply to be a protocol message") from None
    except ValueError as exc:
        raise ProtocolError("bad_json", f"text message is not JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise ProtocolError("bad_message", f"a text message must be a JSON object, got {type(obj).__name__}")
    kind = obj.get("type")
    if not isinstance(kind, str):
        raise ProtocolError("bad_message", f"message has no string \"type\" (got {_describe(kind)})")
    if kind == "stop":
        return Stop()
    if kind != "start":
        raise ProtocolError("unknown_type", f"unknown message type {_describe(kind)}; expected \"start\" or \"stop\"")
    pipeline = obj.get("pipeline")
    if not isinstance(pipeline, str) or not _NAME.match(pipeline):
        raise ProtocolError("bad_message", f"start.pipeline must be a pipeline name, got {_describe(pipeline)}")
    params = obj.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise ProtocolError("bad_message", f"start.params must be an object, got {type(params).__name__}")
    audio = None if obj.get("audio") is None else _parse_audio_format(obj["audio"])
    return Start(pipeline, params, audio)


def parse_message(message: str | bytes, max_size: int = DEFAULT_MAX_MESSAGE) -> ClientMessage:
    """One websocket message -> a client message, or ProtocolError naming what was wrong."""
    try:
        if len(message) > max_size:
            what = "text" if isinstance(message, str) else "binary"
            raise ProtocolError(
                "message_too_big",
                f"{what} message of {len(message)} bytes exceeds the limit of {max_size} bytes",
                close=CLOSE_TOO_BIG,
            )
        if isinstance(message, str):
            return parse_text(message)
        if not isinstance(message, (bytes, bytearray, memoryview)):
            raise ProtocolError("bad_message", f"unsupported message type {type(message).__name__}")
        data = bytes(message)
        if not data:
            raise ProtocolError("empty_message", "binary message is empty: the first byte must be the kind (0x01 audio, 0x02 video)")
        kind = data[0]
        if kind == KIND_AUDIO:
            return Audio(data[1:])
        if kind == KIND_VIDEO:
            if len(data) < 2:
                raise ProtocolError("bad_jpeg", "video message has no JPEG payload")
            return Video(data[1:])
        raise ProtocolError("unknown_kind", f"unknown binary kind byte 0x{kind:02x}; expected 0x01 audio or 0x02 video")
    except ProtocolError:
        raise
    except Exception as exc:  # defence in depth: nothing else escapes the parser
        raise ProtocolError("bad_message", f"message could not be parsed ({type(exc).__name__})") from None


def pcm_to_array(pcm: bytes, channels: int) -> np.ndarray:
    """s16le bytes -> float32 samples; ProtocolError if not a whole number of samples."""
    width = 2 * channels
    if len(pcm) % width:
        raise ProtocolError(
            "bad_audio",
            f"audio message of {len(pcm)} bytes is not a whole number of s16le samples "
            f"({width} bytes per {channels}-channel sample); the message was dropped",
        )
    samples = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0
    return samples.reshape(-1, channels) if channels > 1 else samples


def jpeg_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a JPEG's SOF marker, without decoding; ProtocolError if it is not
    one whole JPEG (checked here, before the frame is queued for decoding)."""
    from streamkit.video.jpeg import JpegError
    from streamkit.video.jpeg import jpeg_size as header_size

    try:
        size = header_size(data)
    except JpegError as exc:
        raise ProtocolError("bad_jpeg", str(exc)) from None
    if data.rfind(b"\xff\xd9", max(0, len(data) - 64)) < 0:
        raise ProtocolError("bad_jpeg", f"truncated JPEG of {len(data)} bytes (no EOI marker at the end)")
    return size


# ------------------------------------------------------------------ server -> client

def ready(session: str, output_rate: int) -> dict[str, Any]:
    return {"type": "ready", "session": session,
            "output_audio": {"sample_rate": output_rate, "format": "s16le", "channels": 1}}


def _num(x: Any, default: float = 0.0) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return default
    return round(v, 3) if math.isfinite(v) else default


def jsonable(value: Any, depth: int = 0) -> Any:
    """Best-effort conversion of event payloads to plain JSON values."""
    if depth > 20:
        return None
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        v = float(value)
        return v if math.isfinite(v) else None
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist(), depth + 1)
    if isinstance(value, dict):
        return {str(k): jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v, depth + 1) for v in value]
    return str(value)


def transcript(text: str, final: bool, start: Any, end: Any) -> dict[str, Any]:
    s = _num(start)
    e = _num(end, s)
    return {"type": "transcript", "text": text, "final": bool(final), "start": s, "end": e}


def text_event(stage: str, text: str, final: bool) -> dict[str, Any]:
    return {"type": "text", "stage": stage, "text": text, "final": bool(final)}


def detections(pts: Any, objects: Any) -> dict[str, Any]:
    objs = []
    for o in objects if isinstance(objects, (list, tuple)) else []:
        if not isinstance(o, dict):
            continue
        box = o.get("box", [0, 0, 0, 0])
        item = jsonable(o)
        item["label"] = str(o.get("label", ""))
        item["box"] = [_num(b) for b in (box if isinstance(box, (list, tuple)) else [0, 0, 0, 0])][:4]
        item["score"] = _num(o.get("score", 1.0))
        objs.append(item)
    return {"type": "detections", "pts": _num(pts), "objects": objs}


def encode(event: dict[str, Any]) -> str:
    return json.dumps(event, separators=(",", ":"), allow_nan=False, default=str)


def audio_message(pcm: bytes) -> bytes:
    return bytes([KIND_AUDIO]) + pcm
