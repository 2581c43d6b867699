"""Shared plumbing for the speech benchmarks: run a pipeline on paced audio, time its outputs."""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

import numpy as np


def log(*args: Any) -> None:
    print(*args, file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else float("nan")


async def run_paced(spec: Any, audio: np.ndarray, rate: int = 16000, chunk_s: float = 0.02,
                    speed: float = 1.0) -> tuple[list[tuple[float, Any]], float]:
    """Feed `audio` at real-time pace in `chunk_s` chunks; returns [(media_clock_s, frame)] for
    every output frame (media clock = seconds since the first sample was due, times speed) and
    the wall time of the run."""
    from streamkit.frames import AudioFrame
    from streamkit.media import paced
    from streamkit.runtime import Session
    from streamkit.transport.memory import MemoryTransport

    session = await Session.open(spec, MemoryTransport())
    step = int(rate * chunk_s)
    frames = [AudioFrame(audio[i:i + step], rate, pts=i / rate) for i in range(0, len(audio), step)]
    out: list[tuple[float, Any]] = []
    t0 = time.monotonic()

    async def feed() -> None:
        async for f in paced(frames, speed):
            await session.push(f)
        await session.end()

    feeder = asyncio.create_task(feed())
    async for f in session.outputs():
        out.append(((time.monotonic() - t0) * speed, f))
    await feeder
    await session.close()
    return out, time.monotonic() - t0


def match_finals(finals: list[tuple[float, Any]], spans: list[tuple[float, float, float]]):
    """For each sentence span, the finals that overlap it most; returns per-sentence lists."""
    per: list[list[tuple[float, Any]]] = [[] for _ in spans]
    for clock, f in finals:
        s, e = f.start or 0.0, f.end or 0.0
        best, best_ov = None, -1e9
        for i, (a, _v, b) in enumerate(spans):
            ov = min(e, b) - max(s, a)
            if ov > best_ov:
                best, best_ov = i, ov
        if best is not None:
            per[best].append((clock, f))
    return per
