"""capture: bring audio into a pipeline at the rate the next stages need.

As a stage it takes the session's input audio (raw PCM a client sent, already turned into
AudioFrames by the server; any rate, mono or stereo) and emits mono (or `channels`) audio at
`sample_rate`, keeping the resampler's state across chunks. Given an
EventFrame("open", {"url": ..., "paced": bool}) — or `url:` in its config, opened on the first
frame the stage sees — it decodes any file or URL PyAV opens (wav, mp3, mp4, webm/opus, http...)
and emits it in `chunk_s` chunks, paced at real time when `paced` is true (tests and demos).
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, Literal

from pydantic import Field

from streamkit.audio import StreamResampler
from streamkit.frames import AudioFrame, EventFrame, Frame
from streamkit.stage import Stage, StageConfig, register_stage


@register_stage("capture")
class Capture(Stage):
    class Config(StageConfig):
        type: Literal["capture"] = "capture"
        sample_rate: int = Field(default=16000, ge=8000, le=192000)
        channels: Literal[1, 2] = 1
        url: str | None = None
        paced: bool = False
        chunk_s: float = Field(default=0.1, gt=0.0, le=5.0)

    stateful = True

    def wants(self, frame: Frame) -> bool:
        return isinstance(frame, AudioFrame) or (isinstance(frame, EventFrame) and frame.name == "open")

    async def start(self) -> None:
        self.resampler = StreamResampler(self.config.sample_rate, self.config.channels)
        self._opened_config_url = False

    async def _decode(self, url: str, paced: bool) -> AsyncIterator[Frame]:
        from streamkit.media import iter_audio
        from streamkit.media import paced as pace

        frames = iter_audio(url, self.config.sample_rate, self.config.channels, self.config.chunk_s)
        if paced:
            async for f in pace(frames):
                yield f
        else:
            for i, f in enumerate(frames):
                yield f
                if i % 50 == 49:
                    await asyncio.sleep(0)

    async def process(self, frame: Frame) -> AsyncIterator[Frame]:
        if self.config.url and not self._opened_config_url:
            self._opened_config_url = True
            async for f in self._decode(self.config.url, self.config.paced):
                yield f
        if isinstance(frame, EventFrame):
            url = str(frame.data.get("url", ""))
            if url:
                async for f in self._decode(url, bool(frame.data.get("paced", self.config.paced))):
                    yield f
            return
        assert isinstance(frame, AudioFrame)
        for out in self.resampler.process(frame):
            yield out

    async def flush(self) -> AsyncIterator[Frame]:
        if self.config.url and not self._opened_config_url:
            self._opened_config_url = True
            async for f in self._decode(self.config.url, self.config.paced):
                yield f
        for out in self.resampler.flush():
            yield out
        self.checkpoint()
