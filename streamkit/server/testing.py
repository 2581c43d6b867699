"""Small real pipelines and helpers for testing the server without models.

`audio_meter` is a real (if simple) stage: it reports how much audio it has heard as text,
partial every `every_s` seconds and final at flush, so flush-on-stop and flush-on-SIGTERM can be
checked without loading Whisper. Import this module (serve --plugin streamkit.server.testing)
to register it.
"""

from __future__ import annotations

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
