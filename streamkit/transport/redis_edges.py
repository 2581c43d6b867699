"""One session's edges on Redis Streams: the keys, an outbox that writes with deduplicating
explicit IDs (fenced for remote stages), an inbox that reads through consumer group "g" and
acknowledges with the stage's checkpoint. The guarantees are in streamkit/transport/redis.py."""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable, TypeVar

import msgpack
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from streamkit import redis_io
from streamkit.frames import Frame, FrameDecodeError, decode_frame, encode_frame
from streamkit.metrics import REGISTRY
from streamkit.redis_io import RedisUnavailable
from streamkit.transport.base import Delivery, TransportClosed
from streamkit.transport.fencing import Fence

log = logging.getLogger("streamkit.transport.redis")
T = TypeVar("T")

GROUP = "g"
WORK_GROUP = "workers"
DEDUPLICATED = REGISTRY.counter("streamkit_redis_deduplicated_total", "Replayed outputs Redis already held")
UNDECODABLE = REGISTRY.counter("streamkit_redis_undecodable_total", "Stream entries that were not valid frames")


def edge_key(session: str, src: str, dst: str) -> str:
    return f"sk:{{{session}}}:e:{src}:{dst}"


def ckpt_key(session: str) -> str:
    return f"sk:{{{session}}}:ckpt"


def work_key(stage: str) -> str:
    return f"sk:work:{stage}"


async def retrying(op: Callable[[], Awaitable[T]], what: str, retry_s: float = 60.0) -> T:
    """streamkit.redis_io.retrying, with giving up meaning what it means here: the session's
    transport is gone."""
    try:
        return await redis_io.retrying(op, what, retry_s)
    except RedisUnavailable as exc:
        raise TransportClosed(str(exc)) from exc


async def ensure_group(r: aioredis.Redis, key: str, group: str = GROUP) -> None:
    async def create() -> None:
        try:
            await r.xgroup_create(key, group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    await retrying(create, "xgroup create")


class SessionState:
    """Shared by one session's inboxes and outboxes in one process: set closed when the
    session's streams are gone, so late writes do not recreate them."""

    def __init__(self) -> None:
        self.closed = False


class RedisOutbox:
    def __init__(
        self,
        r: aioredis.Redis,
        key: str,
        state: SessionState,
        explicit_ids: bool,
        maxlen: int,
        lag_limit: int,
        retry_s: float,
        fence: Fence | None = None,
    ) -> None:
        self.r = r
        self.key = key
        self.fence = fence  # a remote stage's writes are fenced by its owner token
        self.state = state
        self.explicit_ids = explicit_ids
        self.maxlen = maxlen
        self.lag_limit = lag_limit
        self.retry_s = retry_s
        self.seq = 0  # the producer's input being handled
        self.k = 0  # frames written for it so far
        self._since_check = 0

    async def _wait_for_room(self) -> None:
        self._since_check += 1
        if self._since_check < max(1, self.lag_limit // 4):
            return
        self._since_check = 0
        while not self.state.closed:
            groups = await retrying(lambda: self.r.xinfo_groups(self.key), "xinfo groups", self.retry_s)
            lag = next((g.get("lag") for g in groups if g.get("name") in (GROUP, GROUP.encode())), None)
            if not isinstance(lag, int) or lag <= self.lag_limit:
                return
            await asyncio.sleep(0.01)

    def at_input(self, seq: int) -> None:
        if seq != self.seq:
            self.seq, self.k = seq, 0

    async def put(self, frame: Frame) -> None:
        if self.state.closed:
            return
        await self._wait_for_room()
        self.k += 1  # from 1: "0-0" is not a valid entry ID
        entry_id = f"{self.seq}-{self.k}" if self.explicit_ids else "*"
        data = encode_frame(frame)

        async def add() -> None:
            if self.fence is not None:
                if not await self.fence.xadd(self.key, entry_id, self.maxlen, data):
                    DEDUPLICATED.inc()
                return
            try:
                await self.r.xadd(self.key, {"f": data}, id=entry_id, maxlen=self.maxlen, approximate=True)
            except ResponseError as exc:
                if self.explicit_ids and "equal or smaller" in str(exc):
                    DEDUPLICATED.inc()
                    return
                raise

        await retrying(add, "xadd", self.retry_s)


class RedisInbox:
    """A stage's input edges, read through consumer group "g" as `consumer`."""

    def __init__(
        self,
        r: aioredis.Redis,
        keys: list[str],
        consumer: str,
        state: SessionState,
        retry_s: float,
        checkpoint: tuple[str, str, list[RedisOutbox]] | None = None,
        takeover: bool = False,
        fence: Fence | None = None,
    ) -> None:
        self.r = r
        self.keys = keys
        self.consumer = consumer
        self.state = state
        self.retry_s = retry_s
        self.checkpoint = checkpoint  # (hash key, stage name, the stage's outboxes)
        self._buffer: list[Delivery] = []
        self._reclaim = takeover
        self.fence = fence
        self._last_seen: dict[str, str] = {k: "0-0" for k in keys}
        self._reconnected = False

    async def restore_position(self) -> tuple[int, Any]:
        """(inputs the stage had handled, its snapshot) at its last acknowledgement; (0, None) if none."""
        if self.checkpoint is None:
            return 0, None
        hkey, stage, _ = self.checkpoint
        raw = await retrying(lambda: self.r.hget(hkey, stage), "hget ckpt", self.retry_s)
        if not raw:
            return 0, None
        saved = msgpack.unpackb(raw)
        return int(saved["seq"]), saved.get("state")

    async def _accept(self, key: str, entries: list[Any]) -> None:
        undecodable = []
        for entry_id, fields in entries:
            if fields is None:  # deleted while pending
                continue
            entry_id = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
            self._last_seen[key] = entry_id
            try:
                frame = decode_frame(fields[b"f"])
            except (FrameDecodeError, KeyError) as exc:
                UNDECODABLE.inc()
                log.warning("skipping undecodable entry %s on %s: %s", entry_id, key, exc)
                undecodable.append(entry_id)
                continue
            self._buffer.append(Delivery(frame, (key, entry_id)))
        if undecodable:
            # a plain XACK: ack() would also move the stage's checkpoint, which this is not
            await retrying(lambda: self.r.xack(key, GROUP, *undecodable), "xack", self.retry_s)

    async def _reclaim_pending(self) -> None:
        for key in self.keys:
            start = "0-0"
            while True:
                result = await retrying(
                    lambda key=key, start=start: self.r.xautoclaim(key, GROUP, self.consumer, min_idle_time=0,
                                                             start_id=start, count=100),
                    "xautoclaim", self.retry_s)
                next_start, entries = result[0], result[1]
                await self._accept(key, entries)
                next_start = next_start.decode() if isinstance(next_start, bytes) else next_start
                if next_start == "0-0" or not entries:
                    break
                start = next_start
        self._buffer.sort(key=lambda d: (self.keys.index(d.token[0]), _id_tuple(d.token[1])))

    async def _read(self) -> None:
        async def read() -> Any:
            try:
                if self.fence is not None:
                    return await self._read_fenced()
                if self._reconnected:
                    # entries delivered to us whose reply a broken connection lost
                    self._reconnected = False
                    pending = await self.r.xreadgroup(GROUP, self.consumer, dict(self._last_seen), count=64)
                    if any(entries for _, entries in pending or []):
                        return pending
                return await self.r.xreadgroup(GROUP, self.consumer, {k: ">" for k in self.keys}, count=32, block=1000)
            except (RedisConnectionError, RedisTimeoutError):
                self._reconnected = True
                raise
            except ResponseError as exc:
                if "NOGROUP" in str(exc):
                    self.state.closed = True
                    raise TransportClosed("the session's streams are gone from Redis: the session was closed, or "
                                          "redis-server restarted without persistence (appendonly)") from None
                raise

        result = await retrying(read, "xreadgroup", self.retry_s)
        for key, entries in result or []:
            key = key.decode() if isinstance(key, bytes) else key
            await self._accept(key, entries)

    async def _read_fenced(self) -> Any:
        """A remote stage's read: fenced, so never blocking in Redis; XREAD (which takes nothing)
        waits for the next entry instead."""
        if self._reconnected:
            self._reconnected = False
            pending = await self.r.xreadgroup(GROUP, self.consumer, dict(self._last_seen), count=64)
            if any(entries for _, entries in pending or []):
                return pending
        found, after = await self.fence.read(self.keys, self.consumer, 32)
        if not found:
            await self.r.xread(after, count=1, block=1000)
        return found

    async def get(self) -> Delivery:
        while not self._buffer:
            if self.state.closed:
                raise TransportClosed("session closed")
            if self._reclaim:
                self._reclaim = False
                await self._reclaim_pending()
                continue
            await self._read()
        return self._buffer.pop(0)

    async def ack(self, tokens: list[Any], snapshot: Any = None) -> None:
        if self.state.closed or (not tokens and self.checkpoint is None):
            return
        by_key: dict[str, list[str]] = {}
        for key, entry_id in tokens:
            by_key.setdefault(key, []).append(entry_id)

        async def ack_all() -> None:
            if self.fence is not None:
                hkey, stage, outboxes = self.checkpoint or (ckpt_key(self.fence.session), "", [])
                ckpt = (msgpack.packb({"seq": max(o.seq for o in outboxes), "state": snapshot})
                        if self.checkpoint is not None else None)
                await self.fence.ack(hkey, by_key, ckpt)
                return
            pipe = self.r.pipeline(transaction=True)
            for key, ids in by_key.items():
                pipe.xack(key, GROUP, *ids)
            if self.checkpoint is not None:
                hkey, stage, outboxes = self.checkpoint
                pipe.hset(hkey, stage, msgpack.packb({"seq": max(o.seq for o in outboxes), "state": snapshot}))
            await pipe.execute()

        await retrying(ack_all, "xack", self.retry_s)


def _id_tuple(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)
