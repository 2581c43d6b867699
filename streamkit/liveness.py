"""Which workers are alive, through Redis: every worker process refreshes its own key

    sk:alive:{role}:{consumer}     role "stage:<name>" (a stage worker) or "engine" (a decode-engine
                                   worker); consumer starts with the host name; the value is JSON

four times per TTL (TTL_S by default; a stage worker's is its claim timeout), and deletes it when it
stops. A stage worker takes over another's session only once that worker's key has expired. The server reads them for
/healthz (a pipeline whose remote stage or engine has no live worker is degraded), and a worker's
container health check asks whether its own host has one (`streamkit worker ... --health`). A
restarted redis-server loses the keys; the next beat writes them again.
"""
from __future__ import annotations

import asyncio
import json
import logging
import socket
from typing import Any, Callable

log = logging.getLogger("streamkit.worker")

ALIVE_PREFIX = "sk:alive"
BEAT_S = 2.0
TTL_S = 10


def stage_role(stage: str) -> str:
    return f"stage:{stage}"


ENGINE_ROLE = "engine"


def alive_key(role: str, consumer: str) -> str:
    return f"{ALIVE_PREFIX}:{role}:{consumer}"


async def heartbeat(redis: Any, role: str, consumer: str, stop: asyncio.Event,
                    info: Callable[[], dict[str, Any]] | None = None, ttl_s: float = TTL_S) -> None:
    """Refresh this worker's key (every quarter of `ttl_s`) until `stop` is set, then delete it."""
    key = alive_key(role, consumer)
    beat_s = min(BEAT_S, ttl_s / 4)
    try:
        while not stop.is_set():
            try:
                await redis.set(key, json.dumps(info() if info else {}), px=int(ttl_s * 1000))
            except Exception as exc:  # Redis down or restarting: the next beat writes it again
                log.warning("liveness beat failed: %s", exc)
            try:
                await asyncio.wait_for(stop.wait(), beat_s)
            except (asyncio.TimeoutError, TimeoutError):
                pass
    finally:  # stopped or cancelled: gone at once rather than at the TTL
        try:
            await redis.delete(key)
        except Exception:  # the key expires by itself
            pass


async def live_workers(redis: Any) -> dict[str, int]:
    """Role -> number of workers whose key is fresh."""
    counts: dict[str, int] = {}
    async for raw in redis.scan_iter(match=f"{ALIVE_PREFIX}:*", count=500):
        key = raw.decode() if isinstance(raw, bytes) else raw
        role = key[len(ALIVE_PREFIX) + 1:].rpartition(":")[0]
        counts[role] = counts.get(role, 0) + 1
    return counts


def alive_on_this_host(redis_url: str, role: str, host: str | None = None) -> bool:
    """True when a worker of `role` on this host (container) has a fresh key: the health check."""
    import redis

    r = redis.Redis.from_url(redis_url, socket_timeout=3, socket_connect_timeout=3)
    try:
        pattern = alive_key(role, f"{host or socket.gethostname()}-*")
        return any(True for _ in r.scan_iter(match=pattern, count=500))
    finally:
        r.close()


async def is_alive(redis: Any, role: str, consumer: str) -> bool:
    return bool(await redis.exists(alive_key(role, consumer)))
