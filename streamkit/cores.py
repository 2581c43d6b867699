"""The process's CPU cores, shared between the in-process decode engine and the other compute that
runs on threads of its own (Whisper's decodes, Kokoro's and hibari's syntheses).

On a 2-core machine a synthesis on one core and a 2-thread decode step contend: the step's thread
team waits at its barriers for the core the synthesis holds, and both slow down (measured: Kokoro's
first piece took 970 ms on one thread while the engine decoded, 108 ms a token instead of 58). So
the stages say what they run:

    with cores.hold(2, urgent=True):   # the first spoken piece of an answer: someone is waiting
        audio = voice(text)

and the engine asks before each step: `engine_threads(n)` is n less the threads held (at least
1), and `wait_urgent(timeout)` blocks while an urgent holder runs, so the piece a listener waits
for gets every core. Work that is not urgent only narrows the engine's team.
"""

from __future__ import annotations

import functools
import os
import threading
import time
import weakref
from contextlib import contextmanager
from typing import Callable, Iterator

_cond = threading.Condition()
_held = 0  # threads held by compute outside the engine
_urgent = 0  # holders the engine pauses for
_waiting = 0  # threads blocked in wait_urgent
_changes = 0  # holds begun or ended so far: a step that saw it change ran contended
_listeners: list[weakref.WeakMethod] = []  # told of each hold begun or ended (on_change)


@functools.cache
def _cpuinfo() -> dict[str, str]:
    """The first processor's fields in /proc/cpuinfo (empty where it cannot be read)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    return fields


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as /proc/cpuinfo names them (empty where it cannot be read)."""
    return frozenset(_cpuinfo().get("flags", "").split())


def cpu_vendor() -> str:
    """/proc/cpuinfo's vendor_id: "GenuineIntel", "AuthenticAMD", or "" where unknown."""
    return _cpuinfo().get("vendor_id", "")


def count() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@contextmanager
def hold(threads: int, urgent: bool = False) -> Iterator[None]:
    """Mark `threads` cores busy with other compute for the duration of the block; urgent: the
    engine also pauses before its next step until the block ends (or its wait times out)."""
    global _held, _urgent, _changes
    threads = max(1, int(threads))
    with _cond:
        _held += threads
        _urgent += int(urgent)
        _changes += 1
    _tell_listeners()
    try:
        yield
    finally:
        with _cond:
            _held -= threads
            _urgent -= int(urgent)
            _changes += 1
            _cond.notify_all()
        _tell_listeners()


def on_change(method: Callable[[], None]) -> None:
    """Call `method()` each time a hold begins or ends, on the thread that begins or ends it: the
    engine ends a decode burst there, so its next step runs with the cores as they are now. A
    bound method, held weakly (its object going away unregisters it); it must be quick."""
    with _cond:
        _listeners.append(weakref.WeakMethod(method))


def _tell_listeners() -> None:
    with _cond:
        methods = [m() for m in _listeners]
        _listeners[:] = [ref for ref, m in zip(_listeners, methods) if m is not None]
    for m in methods:
        if m is not None:
            m()


def held() -> int:
    """Threads held now by compute outside the engine."""
    return _held


def changes() -> int:
    """Holds begun or ended so far (equal before and after a step: no other compute ran meanwhile)."""
    return _changes


def urgent() -> int:
    """Urgent holders running now."""
    return _urgent


def waiting() -> int:
    """Threads blocked in wait_urgent now."""
    return _waiting


def engine_threads(wanted: int) -> int:
    """The threads an engine step should use: `wanted` less what other compute holds, at least 1."""
    return max(1, wanted - _held)


def wait_urgent(timeout: float) -> float:
    """Block while an urgent holder runs, at most `timeout` seconds; returns the seconds waited."""
    global _waiting
    if not _urgent:
        return 0.0
    start = time.monotonic()
    deadline = start + timeout
    with _cond:
        _waiting += 1
        try:
            while _urgent and (left := deadline - time.monotonic()) > 0:
                _cond.wait(left)
        finally:
            _waiting -= 1
    return time.monotonic() - start
