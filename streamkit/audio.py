"""Audio helpers shared by stages: streaming resampling (libswresample through PyAV)."""

from __future__ import annotations

import av
import numpy as np

from streamkit.frames import AudioFrame


class StreamResampler:
    """Resamples a stream of chunks to a fixed rate, mono or stereo, keeping filter state across
    chunks so chunk boundaries leave no clicks. Call `flush()` at end of stream for the tail."""

    def __init__(self, rate: int, channels: int = 1) -> None:
        self.rate = rate
        self.channels = channels
        self._layout = "mono" if channels == 1 else "stereo"
        self._resampler: av.AudioResampler | None = None
        self._input_key: tuple[int, int] | None = None
        self._out_pts: float | None = None
        self._out_samples = 0

    def _open(self, sample_rate: int, channels: int) -> av.AudioResampler:
        key = (sample_rate, channels)
        if self._resampler is None or key != self._input_key:
            self._resampler = av.AudioResampler(format="flt", layout=self._layout, rate=self.rate)
            self._input_key = key
        return self._resampler

    def _emit(self, frames: list[av.AudioFrame], source: str) -> list[AudioFrame]:
        out = []
        for f in frames:
            pcm = f.to_ndarray().reshape(-1, self.channels)  # packed flt: (1, n*ch)
            samples = pcm[:, 0] if self.channels == 1 else pcm
            pts = (self._out_pts or 0.0) + self._out_samples / self.rate
            self._out_samples += samples.shape[0]
            out.append(AudioFrame(samples.copy(), self.rate, self.channels, pts, source))
        return out

    def process(self, frame: AudioFrame) -> list[AudioFrame]:
        if self._out_pts is None:
            self._out_pts = frame.pts
        if frame.sample_rate == self.rate and frame.channels == self.channels and self._resampler is None:
            self._out_samples += frame.num_samples
            return [frame]
        resampler = self._open(frame.sample_rate, frame.channels)
        planar = frame.samples.reshape(frame.num_samples, frame.channels).T
        layout = "mono" if frame.channels == 1 else "stereo"
        av_frame = av.AudioFrame.from_ndarray(
            np.ascontiguousarray(planar, dtype=np.float32), format="fltp", layout=layout
        )
        av_frame.sample_rate = frame.sample_rate
        return self._emit(resampler.resample(av_frame), frame.source)

    def flush(self, source: str = "") -> list[AudioFrame]:
        if self._resampler is None:
            return []
        frames = self._resampler.resample(None)
        self._resampler = None
        return self._emit(frames, source)


def resample_array(samples: np.ndarray, rate_in: int, rate_out: int) -> np.ndarray:
    """Resample a whole mono float32 array at once."""
    if rate_in == rate_out:
        return np.asarray(samples, dtype=np.float32)
    r = StreamResampler(rate_out)
    parts = r.process(AudioFrame(samples, rate_in)) + r.flush()
    return np.concatenate([p.samples for p in parts]) if parts else np.zeros(0, np.float32)
