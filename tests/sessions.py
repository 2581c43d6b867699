"""Driving a session in tests: push input, optionally hurt something mid-stream, collect output."""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable

from streamkit.frames import Frame
from streamkit.pipeline import PipelineSpec
from streamkit.runtime import Session


async def drive(
    session: Session,
    frames: list[Frame],
    during: Callable[[Session], Awaitable[None]] | None = None,
    pace: float = 0.0,
    timeout: float = 180.0,
) -> list[Frame]:
    """Push `frames` (with `pace` seconds between them), end the stream and return every output.

    `during(session)` starts as a task once a third of the input is in and runs while the rest is
    pushed; it must be done before the input ends."""
    collected: list[Frame] = []

    async def collect() -> None:
        async for f in session.outputs():
            collected.append(f)

    collector = asyncio.create_task(collect())
    fault = None
    for i, f in enumerate(frames):
        if during is not None and i == len(frames) // 3:
            fault = asyncio.create_task(during(session))
        await session.push(f)
        if pace:
            await asyncio.sleep(pace)
    if fault is not None:
        await asyncio.wait_for(fault, 60)
    await session.end()
    await asyncio.wait_for(collector, timeout)
    await session.close()
    return collected


async def run_pipeline(spec: PipelineSpec, transport, frames: list[Frame], **kwargs) -> tuple[Session, list[Frame]]:
    session = await Session.open(spec, transport)
    return session, await drive(session, frames, **kwargs)
