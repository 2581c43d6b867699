"""An asyncio Event that SIGINT or SIGTERM sets: how every long-running command stops cleanly."""
from __future__ import annotations

import asyncio
import signal


def stop_on_signals() -> asyncio.Event:
    """Call from inside the running loop. Where the loop cannot take signal handlers (Windows, or a
    loop outside the main thread) the event is set only by its owner."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError, ValueError):
            pass
    return stop
