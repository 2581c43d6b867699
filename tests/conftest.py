"""Shared fixtures: real redis-server processes on free loopback ports."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A redis-server this test owns: it can be restarted, paused and killed."""

    def __init__(self, workdir: Path, persistent: bool = False) -> None:
        if shutil.which("redis-server") is None:
            pytest.skip("redis-server is not installed (./dev test installs it)")
        self.port = free_port()
        self.workdir = workdir
        self.persistent = persistent
        self.proc: subprocess.Popen | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--dir", str(self.workdir)]
        # append-only with fsync on every write, so a restart keeps every stream entry
        args += ["--appendonly", "yes", "--appendfsync", "always"] if self.persistent else ["--appendonly", "no"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            self.proc.wait(10)

    def restart(self) -> None:
        self.stop()
        self.start()

    def pause(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory) -> str:
    """A shared redis-server: $REDIS_URL (.ci/run starts one) or one started for this run."""
    url = os.environ.get("REDIS_URL")
    if url:
        yield url
        return
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server.url
    server.stop()


@pytest.fixture
def own_redis(tmp_path) -> RedisServer:
    """A persistent redis-server for fault tests (restart, SIGSTOP, kill)."""
    server = RedisServer(tmp_path, persistent=True)
    yield server
    server.stop()


@pytest.fixture
def streamkit_cmd() -> list[str]:
    return [sys.executable, "-m", "streamkit.cli"]
