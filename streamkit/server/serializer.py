"""Pipeline output frames -> websocket protocol messages, each with its send policy.

No I/O: the only state is one output resampler per audio source (to the session's output rate)
and the last interrupt forwarded (every output stage forwards the same one; the client hears it
once). The connection queues what `serialize` returns.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from streamkit.audio import StreamResampler
from streamkit.frames import (
    AudioFrame,
    Control,
    ControlKind,
    EventFrame,
    Frame,
    TextFrame,
    TextRole,
    float_to_s16le,
)
from streamkit.server import protocol
from streamkit.server.outqueue import SendPolicy

AUDIO_CHUNK_BYTES = 32 * 1024  # long TTS frames go out in pieces, so playback can start early


@dataclass
class Outgoing:
    message: str | bytes
    policy: SendPolicy = SendPolicy.KEEP
    key: Any = None
    error_code: str | None = None  # set on error events (counted by the connection)


def event_message(event: dict[str, Any], policy: SendPolicy = SendPolicy.KEEP, key: Any = None) -> Outgoing:
    code = str(event.get("code")) if event.get("type") == "error" else None
    return Outgoing(protocol.encode(event), policy, key, code)


class FrameSerializer:
    def __init__(self, output_rate: int) -> None:
        self.output_rate = output_rate
        self.resamplers: dict[str, StreamResampler] = {}
        self.last_interrupt_pts: float | None = None
        self.audio_samples_out = 0

    def serialize(self, frame: Frame) -> list[Outgoing]:
        if isinstance(frame, TextFrame):
            return [self._text(frame)]
        if isinstance(frame, AudioFrame):
            return self._audio(frame)
        if isinstance(frame, EventFrame):
            return [self._event(frame)]
        if isinstance(frame, Control) and frame.control is ControlKind.INTERRUPT:
            # additive extension: the user barged in; clients drop the audio they have queued
            if frame.pts == self.last_interrupt_pts:
                return []
            self.last_interrupt_pts = frame.pts
            return [event_message({"type": "event", "name": "interrupt", "source": frame.source,
                                   "pts": protocol._num(frame.pts), "data": {}})]
        return []  # other Control frames and VideoFrame outputs are not part of the protocol

    def flush(self) -> list[Outgoing]:
        """The tails the output resamplers still hold, at the end of the session."""
        out: list[Outgoing] = []
        for name, rs in self.resamplers.items():
            for f in rs.flush(name):
                out += self._pcm(f.samples)
        return out

    def _text(self, frame: TextFrame) -> Outgoing:
        if frame.role is not TextRole.TRANSCRIPT:
            return event_message(protocol.text_event(frame.source, frame.text, frame.final))
        event = protocol.transcript(frame.text, frame.final, frame.start if frame.start is not None else frame.pts,
                                    frame.end if frame.end is not None else frame.pts)
        if frame.final:
            return event_message(event)
        return event_message(event, SendPolicy.COALESCE, ("partial", frame.source))

    def _audio(self, frame: AudioFrame) -> list[Outgoing]:
        mono = frame.mono()
        if frame.sample_rate == self.output_rate:
            return self._pcm(mono)
        rs = self.resamplers.get(frame.source)
        if rs is None:
            rs = self.resamplers[frame.source] = StreamResampler(self.output_rate, 1)
        out: list[Outgoing] = []
        for f in rs.process(AudioFrame(mono, frame.sample_rate, 1, frame.pts, frame.source)):
            out += self._pcm(f.samples)
        return out

    def _pcm(self, samples: np.ndarray) -> list[Outgoing]:
        if samples.size == 0:
            return []
        self.audio_samples_out += samples.size
        pcm = float_to_s16le(samples)
        return [Outgoing(protocol.audio_message(pcm[i:i + AUDIO_CHUNK_BYTES]))
                for i in range(0, len(pcm), AUDIO_CHUNK_BYTES)]

    def _event(self, frame: EventFrame) -> Outgoing:
        data = frame.data if isinstance(frame.data, dict) else {}
        if frame.name == "detections":
            return event_message(protocol.detections(data.get("pts", frame.pts), data.get("objects", [])),
                                 SendPolicy.DROPPABLE, "detections")
        if frame.name == "error":
            return event_message(protocol.error(str(data.get("code", "stage_error")), str(data.get("message", ""))))
        return event_message({"type": "event", "name": frame.name, "source": frame.source,
                              "pts": protocol._num(frame.pts), "data": protocol.jsonable(data)})
