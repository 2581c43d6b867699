"""The Redis Streams transport: every edge of a session is a stream, read by a consumer group.

Keys (prefix `sk:`; the session id in braces is a Redis Cluster hash tag, so every key of a
session lives in one slot and the multi-key reads and transactions below work on a cluster):
    sk:{session}:e:{from}:{to}   one stream per edge ("input" is the session source, "__out__"
                                 the session sink); consumer group "g"
    sk:{session}:ckpt            hash: per stage, the output positions at its last acknowledgement
    sk:work:{stage}              announcements of sessions whose stage runs in remote workers;
                                 consumer group "workers" (see streamkit/transport/redis_worker.py)

Delivery guarantees:
- A stage's inputs are acknowledged (XACK) only after the outputs they caused are written, and
  for stateful stages only at the stage's checkpoints, atomically with the producer's input
  count at that point.
- Entries on an edge with one producer get explicit IDs `S-K`: the K-th frame written while the
  producer handled its S-th input. A worker that takes over a dead worker's session restores S
  from the checkpoint, replays the pending inputs (XAUTOCLAIM) in order and re-emits; Redis
  rejects IDs it already holds, so every output that is a deterministic function of the inputs
  reaches downstream exactly once. Outputs whose timing varies (an ASR partial that lands with
  whichever input is being handled when its background decode finishes) may be deduplicated
  against a different frame or repeated, which is harmless for revisable partials; finals are
  emitted at a fixed input. A fan-in stage's inputs interleave differently on replay, so edges
  out of fan-in stages use server-side IDs and are at-least-once on takeover.
- Every command retries through connection loss, a restarted server and a paused server
  (timeouts), for `retry_s` seconds; XADD retries are safe because explicit IDs deduplicate.
- XADD trims with MAXLEN ~ `maxlen`; producers wait while a group's lag exceeds the
  downstream stage's queue_size, so trimming never reaches unread entries in practice.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from typing import Any, Awaitable, Callable, TypeVar

import msgpack
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from streamkit.frames import Frame, FrameDecodeError, decode_frame, encode_frame
from streamkit.metrics import REGISTRY
from streamkit.pipeline import SOURCE, PipelineSpec
from streamkit.transport.base import SINK, Delivery, TransportClosed
from streamkit.transport.fencing import Fence, own_key

log = logging.getLogger("streamkit.transport.redis")
T = TypeVar("T")

GROUP = "g"
WORK_GROUP = "workers"
DEDUPLICATED = REGISTRY.counter("streamkit_redis_deduplicated_total", "Replayed outputs Redis already held")
RETRIES = REGISTRY.counter("streamkit_redis_retries_total", "Redis commands retried after a connection fault")
UNDECODABLE = REGISTRY.counter("streamkit_redis_undecodable_total", "Stream entries that were not valid frames")


def edge_key(session: str, src: str, dst: str) -> str:
    return f"sk:{{{session}}}:e:{src}:{dst}"


def ckpt_key(session: str) -> str:
    return f"sk:{{{session}}}:ckpt"


def work_key(stage: str) -> str:
    return f"sk:work:{stage}"


def connect(url: str) -> aioredis.Redis:
    # socket_timeout above the 1 s blocking reads, so a paused server shows up as a timeout
    return aioredis.from_url(url, socket_timeout=5.0, socket_connect_timeout=5.0, health_check_interval=10)


# what a Redis command raises while redis-server is down, restarting or paused (and what
# `retrying` raises once it gives up)
REDIS_FAULTS = (RedisConnectionError, RedisTimeoutError, ConnectionError, OSError, TransportClosed)


async def retrying(op: Callable[[], Awaitable[T]], what: str, retry_s: float = 60.0) -> T:
    deadline = time.monotonic() + retry_s
    delay = 0.05
    while True:
        try:
            return await op()
        except (RedisConnectionError, RedisTimeoutError, ConnectionError, OSError) as exc:
            if time.monotonic() > deadline:
                raise TransportClosed(f"redis unreachable for {retry_s:.0f}s during {what}: {exc}") from exc
            RETRIES.inc(op=what)
            log.warning("redis %s failed (%s); retrying in %.2fs", what, exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)


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
                    lambda: self.r.xautoclaim(key, GROUP, self.consumer, min_idle_time=0, start_id=start, count=100),
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


def stage_edges(spec: PipelineSpec, session: str, stage: str) -> tuple[list[str], list[str]]:
    """(input edge keys, output edge keys with the sink edge last) of one stage."""
    inputs = [edge_key(session, up, stage) for up in spec.inputs_of[stage]]
    outputs = [edge_key(session, stage, down) for down in spec.downstream_of(stage)]
    return inputs, outputs + [edge_key(session, stage, SINK)]


class RedisTransport:
    """Wires a session over Redis Streams. Stages named in `remote_stages`, or whose YAML says
    `transport: redis`, run in `streamkit worker` processes; the rest run here, still over Redis."""

    concurrent = False

    def __init__(
        self,
        url: str,
        remote_stages: set[str] | None = None,
        maxlen: int = 100_000,
        retry_s: float = 60.0,
        owner: str | None = None,
    ) -> None:
        self.url = url
        self.remote_stages = set(remote_stages or ())
        self.maxlen = maxlen
        self.retry_s = retry_s
        self.owner = owner or f"{os.uname().nodename}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._r: aioredis.Redis | None = None

    @property
    def redis(self) -> aioredis.Redis:
        if self._r is None:
            self._r = connect(self.url)
        return self._r

    def is_remote(self, spec: PipelineSpec, stage: str) -> bool:
        return stage in self.remote_stages or spec.stage(stage).transport == "redis"

    def outbox(self, spec: PipelineSpec, key: str, producer: str, state: SessionState,
               fence: Fence | None = None) -> RedisOutbox:
        # explicit (deduplicating) IDs need one deterministic producer: not a fan-in stage
        explicit = producer == SOURCE or len(spec.inputs_of[producer]) == 1
        dst = key.rsplit(":", 1)[1]
        lag_limit = spec.stage(dst).queue_size if dst != SINK else 1024
        return RedisOutbox(self.redis, key, state, explicit, self.maxlen, lag_limit, self.retry_s, fence)

    def stage_io(
        self, spec: PipelineSpec, session: str, stage: str, consumer: str, state: SessionState, takeover: bool,
        fence: Fence | None = None,
    ) -> tuple[RedisInbox, list[RedisOutbox], RedisOutbox]:
        """A stage's inbox and outboxes. With a `fence` (remote stages) every write and ack is
        refused once another worker owns the stage."""
        in_keys, out_keys = stage_edges(spec, session, stage)
        outboxes = [self.outbox(spec, k, stage, state, fence) for k in out_keys]
        inbox = RedisInbox(self.redis, in_keys, consumer, state, self.retry_s,
                           checkpoint=(ckpt_key(session), stage, outboxes), takeover=takeover, fence=fence)
        return inbox, outboxes[:-1], outboxes[-1]

    async def wire(self, spec: PipelineSpec, session_id: str, params: dict[str, Any]):
        from streamkit.runtime import Wiring

        r = self.redis
        state = SessionState()
        all_edges = [edge_key(session_id, up, s) for s, ups in spec.inputs_of.items() for up in ups]
        sink_edges = [edge_key(session_id, s.name, SINK) for s in spec.stages]
        for key in all_edges + sink_edges:
            await ensure_group(r, key)

        inboxes, edges, sinks = {}, {}, {}
        local = {s.name for s in spec.stages if not self.is_remote(spec, s.name)}
        for name in local:
            inbox, downstream, sink = self.stage_io(spec, session_id, name, self.owner, state, takeover=False)
            inboxes[name] = inbox
            for down, out in zip(spec.downstream_of(name), downstream):
                edges[(name, down)] = out
            sinks[name] = sink
        source = [self.outbox(spec, edge_key(session_id, SOURCE, s), SOURCE, state)
                  for s, ups in spec.inputs_of.items() if SOURCE in ups]
        sink_inbox = RedisInbox(r, sink_edges, self.owner, state, self.retry_s)

        for name in sorted(set(spec.order()) - local):
            await ensure_group(r, work_key(name), WORK_GROUP)
            announcement = {"session": session_id, "stage": name,
                            "spec": msgpack.packb(spec.raw), "params": msgpack.packb(params)}
            await retrying(lambda: r.xadd(work_key(name), announcement), "announce", self.retry_s)

        async def close() -> None:
            state.closed = True
            try:
                await r.delete(*all_edges, *sink_edges, ckpt_key(session_id), own_key(session_id))
            except Exception as exc:  # closing must not raise; leftovers are only garbage
                log.warning("could not delete session %s streams: %s", session_id, exc)

        return Wiring(source=source, inboxes=inboxes, edges=edges, sinks=sinks,
                      sink=_AckingInbox(sink_inbox), local_stages=local, closer=close)

    async def aclose(self) -> None:
        if self._r is not None:
            await self._r.aclose()
            self._r = None


class _AckingInbox:
    """The session sink: what the owner reads is done once read."""

    def __init__(self, inbox: RedisInbox) -> None:
        self.inbox = inbox

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
        delivery = await self.inbox.get()
        await self.inbox.ack([delivery.token])
        return delivery

    async def ack(self, tokens: list[Any], snapshot: Any = None) -> None:
        pass
