"""Simple real audio stages: resample and gain."""

from __future__ import annotations

from dataclasses import replace
from typing import AsyncIterator, Literal

import numpy as np
from pydantic import Field

from streamkit.audio import StreamResampler
from streamkit.frames import AudioFrame, Frame
from streamkit.stage import Stage, StageConfig, register_stage


@register_stage("resample")
class Resample(Stage):
    """Converts audio to a fixed sample rate and channel count."""

    class Config(StageConfig):
        type: Literal["resample"] = "resample"
        sample_rate: int = Field(ge=1000, le=384_000)
        channels: Literal[1, 2] = 1

    accepts = (AudioFrame,)
    # The filter state spans the whole stream, so inputs are acknowledged at end of stream:
    # a replacement worker replays the session and produces exactly the same samples.
    stateful = True

    async def start(self) -> None:
        self._resampler = StreamResampler(self.config.sample_rate, self.config.channels)

    async def process(self, frame: Frame) -> AsyncIterator[Frame]:
        for out in self._resampler.process(frame):
            yield replace(out, source=self.name)

    async def flush(self) -> AsyncIterator[Frame]:
        for out in self._resampler.flush(self.name):
            yield out
        self.checkpoint()


@register_stage("gain")
class Gain(Stage):
    """Multiplies audio by a gain in decibels, clipping to [-1, 1]."""

    class Config(StageConfig):
        type: Literal["gain"] = "gain"
        db: float = Field(default=0.0, ge=-96.0, le=48.0)

    accepts = (AudioFrame,)

    async def process(self, frame: Frame) -> AsyncIterator[Frame]:
        factor = np.float32(10.0 ** (self.config.db / 20.0))
        yield replace(frame, samples=np.clip(frame.samples * factor, -1.0, 1.0), source=self.name)
