"""Small real pipelines and helpers for testing the server without models.

`audio_meter` is a real (if simple) stage: it reports how much audio it has heard as text,
partial every `every_s` seconds and final at flush, so flush-on-stop and flush-on-SIGTERM can be
checked without loading Whisper; `slow_flush` takes its time flushing, for the limits on a
flush. Import this module (serve --plugin streamkit.server.testing) to register them.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import AsyncIterator, Literal

import numpy as np
from pydantic import Field

from streamkit.frames import AudioFrame, Frame, TextFrame
from streamkit.stage import Stage, StageConfig, register_stage


@register_stage("audio_meter")
class AudioMeter(Stage):
    class Config(StageConfig):
        type: Literal["audio_meter"] = "audio_meter"
        every_s: float = Field(default=1.0, gt=0)

    accepts = (AudioFrame,)

    async def start(self) -> None:
        self.heard = 0.0
        self.next_report = self.config.every_s
        self.peak = 0.0

    async def process(self, frame: Frame) -> AsyncIterator[Frame]:
        self.heard += frame.duration
        if frame.num_samples:
            self.peak = max(self.peak, float(np.abs(frame.samples).max()))
        if self.heard >= self.next_report:
            self.next_report += self.config.every_s
            yield TextFrame(f"heard {self.heard:.2f} s", final=False, start=0.0, end=self.heard, pts=frame.pts)

    async def flush(self) -> AsyncIterator[Frame]:
        yield TextFrame(f"heard {self.heard:.2f} s, peak {self.peak:.3f}", final=True, start=0.0, end=self.heard,
                        pts=self.heard)


@register_stage("slow_flush")
class SlowFlush(Stage):
    """At flush, `pieces` final texts, each `gap_s` seconds after the last: a pipeline whose last
    words take a while (a loaded translator), or, with one long gap, one that stalls."""

    class Config(StageConfig):
        type: Literal["slow_flush"] = "slow_flush"
        pieces: int = Field(default=3, ge=1)
        gap_s: float = Field(default=0.1, ge=0)

    accepts = (AudioFrame,)  # consumed by Stage.process, which emits nothing

    async def flush(self) -> AsyncIterator[Frame]:
        for n in range(self.config.pieces):
            await asyncio.sleep(self.config.gap_s)
            yield TextFrame(f"piece {n + 1} of {self.config.pieces}", final=True)


PIPELINES = {
    "echo": """
name: echo
input: {audio: {sample_rate: 16000}}
output_audio: {sample_rate: 16000}
stages:
  - {name: gain, type: gain, db: 0}
output: [gain]
""",
    "echo24": """
name: echo24
input: {audio: {sample_rate: 16000}}
stages:
  - {name: up, type: resample, sample_rate: 24000}
  - {name: gain, type: gain, db: -6}
output: [gain]
""",
    "meter": """
name: meter
input: {audio: {sample_rate: 16000}}
output_audio: {sample_rate: 16000}
stages:
  - {name: meter, type: audio_meter, every_s: 0.5}
  - {name: gain, type: gain, input: input}
output: [meter, gain]
""",
}


def slow_flush_pipeline(name: str, pieces: int, gap_s: float) -> str:
    """The YAML of a pipeline whose one stage flushes `pieces` results `gap_s` s apart."""
    return f"""
name: {name}
input: {{audio: {{sample_rate: 16000}}}}
stages:
  - {{name: slow, type: slow_flush, pieces: {pieces}, gap_s: {gap_s}}}
output: [slow]
"""


PIPELINES["slow_flush"] = slow_flush_pipeline("slow_flush", pieces=8, gap_s=0.4)  # progress all the way
PIPELINES["stalled_flush"] = slow_flush_pipeline("stalled_flush", pieces=1, gap_s=4.0)  # silence


def write_pipelines(directory: str | Path, names: list[str] | None = None) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in PIPELINES.items():
        if names is None or name in names:
            (directory / f"{name}.yaml").write_text(text.lstrip())
    return directory


def tone(seconds: float, rate: int = 16000, freq: float = 440.0, amp: float = 0.5) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (amp * np.sin(2 * np.pi * freq * t)).astype(np.float32)


@contextlib.asynccontextmanager
async def running_server(pipelines_dir: str | Path, **kwargs):
    from streamkit.server.app import StreamServer

    kwargs.setdefault("progress", lambda msg: None)
    server = StreamServer(host="127.0.0.1", port=0, pipelines_dir=pipelines_dir, **kwargs)
    await server.start()
    try:
        yield server
    finally:
        await server.shutdown()
