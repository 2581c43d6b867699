"""Redis commands that ride out a restarted, paused or unreachable redis-server: the retry loop
every Redis user here shares (the transport, the stage and engine workers, the remote engine)."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Callable, TypeVar

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from streamkit.metrics import REGISTRY

log = logging.getLogger("streamkit.redis")
T = TypeVar("T")
RETRIES = REGISTRY.counter("streamkit_redis_retries_total", "Redis commands retried after a connection fault")


class RedisUnavailable(ConnectionError):
    """Redis did not answer within the retry budget."""


# what a Redis command raises while redis-server is down, restarting or paused, and what
# `retrying` raises once it gives up
REDIS_FAULTS = (RedisConnectionError, RedisTimeoutError, ConnectionError, OSError)


def connect(url: str) -> aioredis.Redis:
    # socket_timeout above the 1 s blocking reads, so a paused server shows up as a timeout
    return aioredis.from_url(url, socket_timeout=5.0, socket_connect_timeout=5.0, health_check_interval=10)


async def retrying(op: Callable[[], Awaitable[T]], what: str, retry_s: float = 60.0) -> T:
    """Run `op` until it gets through to Redis, backing off up to 1 s, for at most `retry_s`."""
    deadline = time.monotonic() + retry_s
    delay = 0.05
    while True:
        try:
            return await op()
        except REDIS_FAULTS as exc:
            if isinstance(exc, RedisUnavailable) or time.monotonic() > deadline:
                raise RedisUnavailable(f"redis unreachable for {retry_s:.0f}s during {what}: {exc}") from exc
            RETRIES.inc(op=what)
            log.warning("redis %s failed (%s); retrying in %.2fs", what, exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
