"""Real audio made and decoded by PyAV, and small pipelines of real stages, for runtime tests."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np

from streamkit.audio import StreamResampler
from streamkit.frames import AudioFrame
from streamkit.pipeline import PipelineSpec, parse_pipeline

RESAMPLE_GAIN = """\
name: resample_gain
input: {audio: {sample_rate: 16000}}
stages:
  - {name: rs, type: resample, sample_rate: 24000}
  - {name: g, type: gain, db: -6}
output: [g]
"""


def pipeline(text: str = RESAMPLE_GAIN, **remote: str) -> PipelineSpec:
    return parse_pipeline(text)


def make_flac(path: Path, seconds: float = 2.0, rate: int = 44100) -> Path:
    """A chirp with a little noise, encoded to FLAC with PyAV."""
    t = np.arange(int(seconds * rate)) / rate
    rng = np.random.default_rng(3)
    signal = 0.4 * np.sin(2 * np.pi * (200 + 600 * t) * t) + 0.02 * rng.standard_normal(t.size)
    pcm = (signal * 32767).astype(np.int16)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("flac", rate=rate, layout="mono")
        for start in range(0, pcm.size, 4096):
            frame = av.AudioFrame.from_ndarray(pcm[None, start:start + 4096], format="s16", layout="mono")
            frame.sample_rate = rate
            frame.pts = start
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return path


def expected_resample_gain(frames: list[AudioFrame], rate: int = 24000, db: float = -6.0) -> np.ndarray:
    """What resample+gain must produce, computed directly without the runtime."""
    resampler = StreamResampler(rate)
    parts = [out.samples for f in frames for out in resampler.process(f)] + [o.samples for o in resampler.flush()]
    return np.clip(np.concatenate(parts) * np.float32(10 ** (db / 20)), -1, 1)
