"""Media in and out through PyAV: decode any file or URL FFmpeg opens, write WAV, pace playback."""

from __future__ import annotations

import asyncio
import time
import wave
from pathlib import Path
from typing import AsyncIterator, Iterable, Iterator, TypeVar

import av
import numpy as np

from streamkit.audio import StreamResampler
from streamkit.frames import AudioFrame, VideoFrame, float_to_s16le

F = TypeVar("F", AudioFrame, VideoFrame)


class MediaError(ValueError):
    """A media file or URL could not be opened or decoded."""


def _open(source: str | Path) -> av.container.InputContainer:
    try:
        return av.open(str(source), mode="r", timeout=10.0)
    except (av.error.FFmpegError, OSError) as exc:
        raise MediaError(f"cannot open {source}: {exc}") from None


def has_stream(source: str | Path, kind: str) -> bool:
    with _open(source) as container:
        return any(s.type == kind for s in container.streams)


def iter_audio(
    source: str | Path, sample_rate: int, channels: int = 1, chunk_s: float = 0.1
) -> Iterator[AudioFrame]:
    """Decode the first audio stream, resampled to `sample_rate`, in chunks of `chunk_s` seconds.

    pts counts from 0 at the first decoded sample."""
    chunk = max(1, int(round(sample_rate * chunk_s)))
    resampler = StreamResampler(sample_rate, channels)
    buffer: list[np.ndarray] = []
    buffered = 0
    emitted = 0

    def drain(final: bool) -> Iterator[AudioFrame]:
        nonlocal buffer, buffered, emitted
        if not buffer:
            return
        data = np.concatenate(buffer)
        n_full = (len(data) // chunk) * chunk
        cut = len(data) if final else n_full
        for start in range(0, cut, chunk):
            piece = data[start:start + chunk]
            yield AudioFrame(piece, sample_rate, channels, pts=emitted / sample_rate)
            emitted += len(piece)
        rest = data[cut:]
        buffer, buffered = ([rest], len(rest)) if len(rest) else ([], 0)

    with _open(source) as container:
        stream = next((s for s in container.streams if s.type == "audio"), None)
        if stream is None:
            raise MediaError(f"{source} has no audio stream")
        try:
            for av_frame in container.decode(stream):
                pcm = av_frame.to_ndarray()
                if av_frame.format.is_planar:
                    pcm = pcm.T
                else:
                    pcm = pcm.reshape(-1, len(av_frame.layout.channels))
                pcm = _to_float(pcm)
                src_channels = pcm.shape[1]
                samples = pcm[:, 0] if src_channels == 1 else pcm
                for out in resampler.process(AudioFrame(samples, av_frame.sample_rate, src_channels)):
                    buffer.append(out.samples)
                    buffered += out.num_samples
                if buffered >= chunk:
                    yield from drain(final=False)
        except av.error.FFmpegError as exc:
            raise MediaError(f"cannot decode audio of {source}: {exc}") from None
    for out in resampler.flush():
        buffer.append(out.samples)
    yield from drain(final=True)


def _to_float(pcm: np.ndarray) -> np.ndarray:
    if pcm.dtype == np.int16:
        return pcm.astype(np.float32) / 32768.0
    if pcm.dtype == np.int32:
        return pcm.astype(np.float32) / 2147483648.0
    if pcm.dtype == np.uint8:
        return (pcm.astype(np.float32) - 128.0) / 128.0
    return pcm.astype(np.float32)


def read_audio(source: str | Path, sample_rate: int) -> np.ndarray:
    """The whole first audio stream as mono float32 at `sample_rate`."""
    parts = [f.samples for f in iter_audio(source, sample_rate, chunk_s=1.0)]
    return np.concatenate(parts) if parts else np.zeros(0, np.float32)


def write_wav(path: str | Path, samples: np.ndarray, sample_rate: int) -> None:
    """16-bit PCM WAV, mono or (n, channels)."""
    samples = np.asarray(samples, dtype=np.float32)
    channels = 1 if samples.ndim == 1 else samples.shape[1]
    pcm = float_to_s16le(samples)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(sample_rate)
        w.writeframes(pcm)


def iter_video(source: str | Path, threads: bool = True) -> Iterator[VideoFrame]:
    """Decode the first video stream into BGR frames with their pts in seconds."""
    with _open(source) as container:
        stream = next((s for s in container.streams if s.type == "video"), None)
        if stream is None:
            raise MediaError(f"{source} has no video stream")
        if threads:
            stream.thread_type = "AUTO"
        try:
            for index, av_frame in enumerate(container.decode(stream)):
                pts = float(av_frame.pts * av_frame.time_base) if av_frame.pts is not None else index / float(stream.average_rate or 30)
                yield VideoFrame(av_frame.to_ndarray(format="bgr24"), pts=pts, index=index)
        except av.error.FFmpegError as exc:
            raise MediaError(f"cannot decode video of {source}: {exc}") from None


def frame_end(frame: AudioFrame | VideoFrame) -> float:
    return frame.end if isinstance(frame, AudioFrame) else frame.pts


async def paced(frames: Iterable[F], speed: float = 1.0) -> AsyncIterator[F]:
    """Yield frames no faster than real time (times `speed`): a frame is released when the
    media clock reaches its pts, as a live microphone or camera would deliver it."""
    started = time.monotonic()
    for frame in frames:
        due = started + frame_end(frame) / speed
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        yield frame
