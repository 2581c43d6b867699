"""Which workers the server can see: the liveness keys (streamkit/liveness.py) of stage workers
in the transport's Redis and of engine workers in the engine's, refreshed every few seconds for
/healthz. A role the pipelines need with no live worker makes the server degraded (503)."""
from __future__ import annotations

import asyncio
from typing import Any

from streamkit.liveness import BEAT_S, live_workers


class WorkerWatch:
    def __init__(self, redis_urls: list[str]) -> None:
        self.redis_urls = sorted(set(redis_urls))
        self.live: dict[str, int] | None = None  # role -> live workers; None: not read yet
        self.error: str | None = None  # why the last read failed
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self.redis_urls and self._task is None:
            self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def missing(self, required: set[str]) -> list[str]:
        if self.live is None:
            return []
        return sorted(role for role in required if not self.live.get(role))

    def report(self, required: set[str]) -> dict[str, Any]:
        return {"workers": self.live or {}, "workers_missing": self.missing(required), "workers_error": self.error}

    async def _run(self) -> None:
        import redis.asyncio as aioredis

        clients = [aioredis.from_url(u, socket_timeout=3, socket_connect_timeout=3) for u in self.redis_urls]
        try:
            while True:
                try:
                    live: dict[str, int] = {}
                    for r in clients:
                        for role, n in (await live_workers(r)).items():
                            live[role] = live.get(role, 0) + n
                    self.live, self.error = live, None
                except Exception as exc:  # Redis down: degraded until it answers again
                    self.error = f"redis unreachable: {exc}"
                await asyncio.sleep(BEAT_S)
        finally:
            for r in clients:
                await r.aclose()
