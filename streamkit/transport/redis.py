"""The Redis Streams transport: every edge of a session is a stream, read by a consumer group.

Keys (prefix `sk:`; the session id in braces is a Redis Cluster hash tag, so every key of a
session lives in one slot and the multi-key reads and transactions below work on a cluster):
    sk:{session}:e:{from}:{to}   one stream per edge ("input" is the session source, "__out__"
                                 the session sink); consumer group "g"
    sk:{session}:ckpt            hash: per stage, the output positions at its last acknowledgement
    sk:work:{stage}              announcements of sessions whose stage runs in remote workers;
                                 consumer group "workers" (see streamkit/stage_worker.py)

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

import logging
import os
import uuid
from typing import Any

import msgpack
import redis.asyncio as aioredis

from streamkit.pipeline import SOURCE, PipelineSpec
from streamkit.redis_io import connect
from streamkit.transport.base import SINK, Delivery, Wiring
from streamkit.transport.fencing import Fence, own_key
from streamkit.transport.redis_edges import (
    WORK_GROUP,
    RedisInbox,
    RedisOutbox,
    SessionState,
    ckpt_key,
    edge_key,
    ensure_group,
    retrying,
    work_key,
)

log = logging.getLogger("streamkit.transport.redis")


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

    async def wire(self, spec: PipelineSpec, session_id: str, params: dict[str, Any]) -> Wiring:
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
            await retrying(lambda name=name, announcement=announcement: r.xadd(work_key(name), announcement), "announce",
                           self.retry_s)

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

    async def get(self) -> Delivery:
        delivery = await self.inbox.get()
        await self.inbox.ack([delivery.token])
        return delivery

    async def ack(self, tokens: list[Any], snapshot: Any = None) -> None:
        pass
