"""`streamkit worker --stage NAME --redis URL`: run one stage for any number of sessions.

A session whose stage runs remotely is announced on `sk:work:{stage}`. Workers read
announcements through the consumer group "workers"; the one that reads it owns that session's
stage: it acquires the stage's owner token (streamkit/transport/fencing.py), which every write and
acknowledgement it makes is checked against, and keeps the announcement pending while it works,
touching it (XCLAIM with JUSTID resets its idle time) as long as the token is still its own.

Takeover: an announcement idle for `claim_idle_ms` whose owner's liveness key
(streamkit/liveness.py, TTL = the claim timeout) has expired is claimed by another
worker, which acquires a newer token (fencing the old owner out: a paused worker that resumes gets
`Fenced` on its next write or ack and drops the session), restores the output positions from the
session's checkpoint, replays the inputs the old owner left pending, and carries on. A worker
that has just seen Redis fail claims nothing for one claim timeout, so owners whose beats failed
while Redis was down or restarting beat again before anyone judges them dead. Consumer groups a
restarted (non-persistent) Redis lost are created again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from typing import Any

import msgpack
from redis.exceptions import ResponseError

from streamkit.liveness import heartbeat, is_alive, stage_role
from streamkit.metrics import REGISTRY
from streamkit.pipeline import spec_from_mapping
from streamkit.redis_io import REDIS_FAULTS
from streamkit.runtime import StageHost
from streamkit.shutdown import stop_on_signals
from streamkit.stage import StageContext
from streamkit.stages.catalog import build_stage
from streamkit.transport.base import TransportClosed
from streamkit.transport.fencing import Fence, Fenced
from streamkit.transport.redis import RedisTransport
from streamkit.transport.redis_edges import (
    WORK_GROUP,
    SessionState,
    ensure_group,
    retrying,
    work_key,
)

log = logging.getLogger("streamkit.worker")
# a Redis fault, or the transport giving up on one
FAULTS = (*REDIS_FAULTS, TransportClosed)
TAKEOVERS = REGISTRY.counter("streamkit_worker_takeovers_total",
                             "Sessions a stage worker took over from a worker whose liveness expired")


class StageWorker:
    def __init__(
        self,
        redis_url: str,
        stage: str,
        consumer: str | None = None,
        claim_idle_ms: int = 3000,
        max_sessions: int = 64,
        retry_s: float = 60.0,
    ) -> None:
        self.stage = stage
        self.consumer = consumer or f"{os.uname().nodename}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.claim_idle_ms = claim_idle_ms
        self.max_sessions = max_sessions
        self.transport = RedisTransport(redis_url, retry_s=retry_s, owner=self.consumer)
        self.key = work_key(stage)
        self.role = stage_role(stage)
        self.running: dict[str, asyncio.Task] = {}  # announcement id -> host task
        self.fences: dict[str, Fence] = {}  # announcement id -> this worker's owner token
        self.sessions_done = 0
        self.takeovers = 0
        self.fenced = 0
        self._redis_failed_at = float("-inf")

    @property
    def redis(self):
        return self.transport.redis

    @property
    def claim_idle_s(self) -> float:
        return self.claim_idle_ms / 1000

    async def run(self, stop: asyncio.Event | None = None) -> None:
        stop = stop or asyncio.Event()
        await ensure_group(self.redis, self.key, WORK_GROUP)
        beats = [asyncio.create_task(self._heartbeat(stop)),
                 asyncio.create_task(heartbeat(self.redis, self.role, self.consumer, stop, self._info,
                                               ttl_s=max(1.0, self.claim_idle_s)))]
        log.info("worker %s serving stage %s", self.consumer, self.stage)
        try:
            while not stop.is_set():
                try:
                    if len(self.running) < self.max_sessions:
                        await self._claim_abandoned()
                        await self._read_new()
                    else:
                        await asyncio.sleep(0.2)
                except ResponseError as exc:
                    if "NOGROUP" not in str(exc):
                        raise
                    log.warning("the work stream %s is gone (redis-server restarted without persistence?): "
                                "creating it again", self.key)
                    self._redis_failed_at = time.monotonic()
                    await ensure_group(self.redis, self.key, WORK_GROUP)
                except FAULTS as exc:  # Redis down for longer than the retries: keep trying
                    log.warning("redis unavailable (%s); retrying", exc)
                    self._redis_failed_at = time.monotonic()
                    await asyncio.sleep(1.0)
        finally:
            stop.set()  # also when the loop failed: the liveness key goes at once
            await asyncio.gather(*beats, return_exceptions=True)
            # let sessions in flight finish their current work (graceful stop)
            if self.running:
                await asyncio.gather(*self.running.values(), return_exceptions=True)
            await self.transport.aclose()

    def _info(self) -> dict[str, Any]:
        return {"sessions": len(self.running), "sessions_done": self.sessions_done, "takeovers": self.takeovers,
                "fenced": self.fenced}

    async def _redis(self, op, what: str) -> Any:
        try:
            return await retrying(op, what)
        except FAULTS:
            self._redis_failed_at = time.monotonic()
            raise

    async def _read_new(self) -> None:
        result = await self._redis(
            lambda: self.redis.xreadgroup(WORK_GROUP, self.consumer, {self.key: ">"}, count=1, block=1000),
            "read announcements")
        for _, entries in result or []:
            for entry_id, fields in entries:
                self._start(entry_id, fields, takeover=False)

    async def _claim_abandoned(self) -> None:
        """Claim announcements idle past the claim timeout whose owner's liveness has expired."""
        if time.monotonic() - self._redis_failed_at < 2 * self.claim_idle_s + 1:
            return  # owners cut off by the same outage have not had the time to beat again
        pending = await self._redis(
            lambda: self.redis.xpending_range(self.key, WORK_GROUP, min="-", max="+", count=16,
                                              idle=self.claim_idle_ms),
            "pending announcements")
        for entry in pending:
            owner = entry["consumer"].decode() if isinstance(entry["consumer"], bytes) else entry["consumer"]
            if owner == self.consumer or await is_alive(self.redis, self.role, owner):
                continue  # a live worker is never taken over, however long its announcement idles
            claimed = await self._redis(
                lambda e=entry: self.redis.xclaim(self.key, WORK_GROUP, self.consumer, self.claim_idle_ms,
                                                  [e["message_id"]]),
                "claim announcement")
            for entry_id, fields in claimed:
                if fields is not None:
                    log.info("taking over stage %s from %s (its liveness expired)", self.stage, owner)
                    self._start(entry_id, fields, takeover=True)

    async def _heartbeat(self, stop: asyncio.Event) -> None:
        """Keep the announcements of the sessions this worker still owns from idling; drop the
        sessions whose stage another worker has taken (it was paused or cut off too long)."""
        while not stop.is_set():
            await asyncio.sleep(max(0.2, self.claim_idle_s / 3))
            owned = []
            for entry_id, fence in list(self.fences.items()):
                try:
                    if await fence.still_owner():
                        owned.append(entry_id)
                    elif entry_id in self.running:
                        log.warning("stage %s of session %s was taken over: dropping it", self.stage, fence.session)
                        self.running[entry_id].cancel()
                except Exception as exc:  # a missed beat only risks an early takeover
                    log.warning("heartbeat failed: %s", exc)
                    owned.append(entry_id)
            if owned:
                try:
                    await self.redis.xclaim(self.key, WORK_GROUP, self.consumer, 0, owned, justid=True)
                except Exception as exc:
                    log.warning("heartbeat failed: %s", exc)

    def _start(self, entry_id: Any, fields: dict[bytes, bytes], takeover: bool) -> None:
        entry_id = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
        if entry_id in self.running:
            return
        self.running[entry_id] = asyncio.create_task(self._serve(entry_id, fields, takeover))

    async def _serve(self, entry_id: str, fields: dict[bytes, bytes], takeover: bool) -> None:
        session = fields.get(b"session", b"?").decode()
        finished = True
        try:
            spec = spec_from_mapping(msgpack.unpackb(fields[b"spec"]))
            params = msgpack.unpackb(fields[b"params"])
            cfg = spec.stage(self.stage)
            fence = await retrying(lambda: Fence.acquire(self.redis, session, self.stage, self.consumer),
                                   "acquire owner token")
            self.fences[entry_id] = fence
            state = SessionState()
            inbox, downstream, sink = self.transport.stage_io(spec, session, self.stage, self.consumer, state,
                                                              takeover, fence=fence)
            start_seq, snapshot = 0, None
            if takeover:
                start_seq, snapshot = await inbox.restore_position()
                self.takeovers += 1
                TAKEOVERS.inc(stage=self.stage)
                log.info("took over stage %s of session %s (owner epoch %d)", self.stage, session, fence.epoch)
            context = StageContext(spec.name, session, params, spec.output_audio.sample_rate)
            stage = build_stage(cfg, context)
            host = StageHost(stage, inbox, downstream, sink, to_sink=self.stage in spec.output,
                             upstream_count=len(spec.inputs_of[self.stage]), concurrent=False,
                             start_seq=start_seq, snapshot=snapshot)
            await host.run()
        except Fenced as exc:
            finished = False  # the new owner finishes the announcement
            self.fenced += 1
            log.warning("%s", exc)
        except asyncio.CancelledError:
            finished = False  # dropped by the heartbeat: taken over
            self.fenced += 1
        except TransportClosed as exc:
            log.info("session %s ended under stage %s: %s", session, self.stage, exc)
        except Exception as exc:
            log.exception("stage %s of session %s failed: %s", self.stage, session, exc)
        finally:
            self.running.pop(entry_id, None)
            self.fences.pop(entry_id, None)
            if finished:
                self.sessions_done += 1
                try:
                    await retrying(lambda: self._finish(entry_id), "finish announcement")
                except TransportClosed:
                    pass

    async def _finish(self, entry_id: str) -> None:
        pipe = self.redis.pipeline(transaction=True)
        pipe.xack(self.key, WORK_GROUP, entry_id)
        pipe.xdel(self.key, entry_id)
        await pipe.execute()


async def run_stage_worker(redis_url: str, stage: str, **kwargs: Any) -> None:
    stop = stop_on_signals()
    await StageWorker(redis_url, stage, **kwargs).run(stop)
