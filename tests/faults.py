"""Faults for Redis tests: stage workers to SIGKILL mid-stream, a redis-server to restart or pause.

Each `*_during` returns a coroutine function for `sessions.drive(..., during=...)`."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import redis

from streamkit.transport.redis_edges import work_key

TESTS = Path(__file__).resolve().parent


def start_workers(url: str, stage: str, count: int = 2, claim_ms: int = 800,
                  plugins: tuple[str, ...] = ()) -> list[subprocess.Popen]:
    """`streamkit worker` processes for `stage`, logging at info (their stderr says "took over")."""
    args = [sys.executable, "-m", "streamkit.cli", "-v", "worker", "--stage", stage, "--redis", url,
            "--claim-idle-ms", str(claim_ms)]
    for plugin in plugins:
        args += ["--plugin", plugin]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))}
    return [subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
            for _ in range(count)]


def stop_workers(workers: list[subprocess.Popen]) -> None:
    for w in workers:
        w.kill()
        w.wait(10)


def owner_pid(client: redis.Redis, stage: str, timeout: float = 20.0) -> int:
    """The pid of the worker that took the session's announcement (consumer names end in -PID-XXXXXX)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            pending = client.xpending_range(work_key(stage), "workers", "-", "+", 10)
        except redis.ResponseError:
            pending = []
        if pending:
            return int(pending[0]["consumer"].decode().split("-")[-2])
        time.sleep(0.05)
    raise AssertionError(f"no worker took the {stage} announcement")


def kill_owner_during(url: str, stage: str, workers: list[subprocess.Popen], killed: list[subprocess.Popen],
                      ready: Callable[[redis.Redis, str], bool]):
    """SIGKILL the worker serving the session once `ready(client, session_id)` holds."""
    client = redis.Redis.from_url(url)

    async def kill(session) -> None:
        pid = await asyncio.to_thread(owner_pid, client, stage)
        victim = next(w for w in workers if w.pid == pid)
        deadline = time.monotonic() + 60
        while not ready(client, session.id):
            assert time.monotonic() < deadline, f"the {stage} worker never reached the point to kill it"
            await asyncio.sleep(0.005)
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        killed.append(victim)

    return kill


def redis_fault_during(server, fault: str, pause_s: float = 3.0):
    """Restart the redis-server (it keeps its data: append-only, fsync always) or SIGSTOP it."""

    async def hurt(session) -> None:
        if fault == "restart":
            await asyncio.to_thread(server.restart)
        else:
            server.pause()
            asyncio.get_running_loop().call_later(pause_s, server.resume)

    return hurt


def survivor_log(workers: list[subprocess.Popen], killed: list[subprocess.Popen]) -> str:
    """stderr of the worker that was not killed (call after stop_workers)."""
    assert killed, "no worker was killed"
    return next(w for w in workers if w not in killed).stderr.read()
