"""vad: voice activity detection (Silero VAD as faster-whisper ships it, run streaming).

Input: audio at any rate (resampled to 16 kHz here). Output, in order:
  EventFrame("speech_start", {"start": s})           speech confirmed (start includes the pad)
  Control(INTERRUPT)                                  right after speech_start, with interrupt_on_speech
  AudioFrame (16 kHz)                                 the speech, with `speech_pad_ms` either side
  EventFrame("speech_pause", {"at": s})              probability fell; downstream ASR starts its final
  EventFrame("speech_resume", {"at": s})             ...speech came back, the pause was not the end
  EventFrame("speech_end", {"start": s, "end": s})   `min_silence_ms` of silence
Audio outside speech is dropped (`pass_audio: all` forwards it too, for stages that want it).
Times are seconds of session media time (the pts of the input audio).
"""

from __future__ import annotations

from typing import AsyncIterator, Literal

import numpy as np
from pydantic import Field

from streamkit import events
from streamkit.audio import StreamResampler
from streamkit.frames import AudioFrame, Control, ControlKind, EventFrame, Frame
from streamkit.stage import Stage, StageConfig, register_stage

RATE = 16000
# the segmenter's (speech/vad.py) event kinds -> the events downstream stages see
_SPEECH_EVENT = {"start": events.SPEECH_START, "pause": events.SPEECH_PAUSE, "resume": events.SPEECH_RESUME,
                 "end": events.SPEECH_END}


@register_stage("vad")
class VAD(Stage):
    class Config(StageConfig):
        type: Literal["vad"] = "vad"
        engine: Literal["silero"] = "silero"
        threshold: float = Field(default=0.5, gt=0.0, lt=1.0)
        neg_threshold: float | None = Field(default=None, gt=0.0, lt=1.0)
        min_speech_ms: int = Field(default=96, ge=0, le=5000)
        min_silence_ms: int = Field(default=300, ge=32, le=10_000)
        speech_pad_ms: int = Field(default=160, ge=0, le=2000)
        lead_pad_ms: int = Field(default=400, ge=0, le=2000)  # audio kept before a confirmed start
        max_speech_s: float = Field(default=60.0, gt=1.0, le=3600.0)
        interrupt_on_speech: bool = False
        pass_audio: Literal["speech", "all"] = "speech"

    accepts = (AudioFrame,)
    stateful = True

    async def start(self) -> None:
        from streamkit.resources import shared_async
        from streamkit.speech.vad import Segmenter, _vad_model

        model = await shared_async(("silero-vad", "faster-whisper"), _vad_model)
        c = self.config
        self.segmenter = Segmenter(c.threshold, c.neg_threshold, c.min_speech_ms, c.min_silence_ms,
                                   c.speech_pad_ms, c.max_speech_s, model=model, lead_pad_ms=c.lead_pad_ms)
        self.resampler = StreamResampler(RATE)
        self._origin: float | None = None  # pts of the first input sample

    def _frames(self, segmented: list, pts_fallback: float) -> list[Frame]:
        out: list[Frame] = []
        origin = self._origin or 0.0
        for kind, payload in segmented:
            if kind == "audio":
                if self.config.pass_audio == "speech":
                    at, samples = payload
                    out.append(AudioFrame(np.asarray(samples, np.float32), RATE, pts=origin + at / RATE))
                continue
            data = {k: round(origin + v, 3) for k, v in payload.items()}
            pts = data.get("start", data.get("at", pts_fallback)) if kind != "end" else data["end"]
            out.append(EventFrame(_SPEECH_EVENT[kind], data, pts=pts))
            if kind == "start" and self.config.interrupt_on_speech:
                out.append(Control(ControlKind.INTERRUPT, pts=pts))
            if kind == "end":
                self.checkpoint()
        return out

    async def process(self, frame: Frame) -> AsyncIterator[Frame]:
        assert isinstance(frame, AudioFrame)
        if self._origin is None:
            self._origin = frame.pts
        for chunk in self.resampler.process(frame):
            if self.config.pass_audio == "all":
                yield AudioFrame(chunk.samples, RATE, pts=chunk.pts)
            for out in self._frames(self.segmenter.process(chunk.mono()), chunk.pts):
                yield out

    async def flush(self) -> AsyncIterator[Frame]:
        for chunk in self.resampler.flush():
            for out in self._frames(self.segmenter.process(chunk.mono()), chunk.pts):
                yield out
        for out in self._frames(self.segmenter.flush(), 0.0):
            yield out
        self.checkpoint()
