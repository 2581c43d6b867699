"""Process-wide shared resources (models, engines): loaded once, shared by every session.

    model = await shared_async(("whisper", path), lambda: WhisperModel(path))

The factory runs once per key, in a worker thread for the async variant, so loading a model
never blocks the event loop and concurrent sessions wait for the same load.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any, Callable, Hashable, TypeVar

T = TypeVar("T")
log = logging.getLogger("streamkit.resources")

_values: dict[Hashable, Any] = {}
_locks: dict[Hashable, threading.Lock] = {}
_guard = threading.Lock()


def _lock_for(key: Hashable) -> threading.Lock:
    with _guard:
        return _locks.setdefault(key, threading.Lock())


def shared(key: Hashable, factory: Callable[[], T]) -> T:
    if key in _values:
        return _values[key]
    with _lock_for(key):
        if key not in _values:
            started = time.perf_counter()
            log.info("loading %s", key)
            _values[key] = factory()
            log.info("loaded %s in %.1fs", key, time.perf_counter() - started)
    return _values[key]


async def shared_async(key: Hashable, factory: Callable[[], T]) -> T:
    if key in _values:
        return _values[key]
    return await asyncio.to_thread(shared, key, factory)


def loaded() -> list[str]:
    """Names of what is loaded, for /healthz: a key ("whisper", path, ...) reads whisper:path:..."""
    return [":".join(map(str, k)) if isinstance(k, tuple) else str(k) for k in _values]
