"""Hands the engine thread's results to asyncio loops, one wake-up per loop per step.

Every `loop.call_soon_threadsafe` writes to the loop's self-pipe and wakes it. Posting each token
of each stream that way cost 32 wake-ups a step with 16 streams on one loop; the engine thread
posts into a BatchedWakeups instead and flushes it once per step, so a loop wakes once and runs the
whole batch. Used only from the engine thread.
"""
from __future__ import annotations

import asyncio
from typing import Any, Callable


def _run_batch(items: list[tuple[Callable[[Any], None], Any]]) -> None:
    for fn, arg in items:
        fn(arg)


class BatchedWakeups:
    def __init__(self) -> None:
        self._pending: dict[asyncio.AbstractEventLoop, list[tuple[Callable[[Any], None], Any]]] = {}

    def post(self, loop: asyncio.AbstractEventLoop, fn: Callable[[Any], None], arg: Any) -> None:
        """fn(arg) on `loop`, at the next flush()."""
        self._pending.setdefault(loop, []).append((fn, arg))

    def flush(self) -> None:
        pending, self._pending = self._pending, {}
        for loop, items in pending.items():
            try:
                loop.call_soon_threadsafe(_run_batch, items)
            except RuntimeError:  # that loop is closed: its consumers are gone
                pass
