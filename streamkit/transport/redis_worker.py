"""`streamkit worker --stage NAME --redis URL`: run one stage for any number of sessions.

A session whose stage runs remotely is announced on `sk:work:{stage}`. Workers read
announcements through the consumer group "workers"; the one that reads it owns that session's
stage and keeps the announcement pending while it works, touching it every second (XCLAIM with
JUSTID resets its idle time). When a worker dies the announcement goes idle; after
`claim_idle_ms` another worker takes it with XAUTOCLAIM, restores the output positions from the
session's checkpoint, replays the inputs the dead worker left pending, and carries on.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from typing import Any

import msgpack

from streamkit.pipeline import spec_from_mapping
from streamkit.runtime import StageHost
from streamkit.shutdown import stop_on_signals
from streamkit.stage import StageContext, get_stage_class
from streamkit.transport.base import TransportClosed
from streamkit.transport.liveness import heartbeat, stage_role
from streamkit.transport.redis import (
    WORK_GROUP,
    RedisTransport,
    SessionState,
    ensure_group,
    retrying,
    work_key,
)

log = logging.getLogger("streamkit.worker")


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
        self.running: dict[str, asyncio.Task] = {}  # announcement id -> host task
        self.sessions_done = 0

    @property
    def redis(self):
        return self.transport.redis

    async def run(self, stop: asyncio.Event | None = None) -> None:
        stop = stop or asyncio.Event()
        await ensure_group(self.redis, self.key, WORK_GROUP)
        beats = [asyncio.create_task(self._heartbeat(stop)),
                 asyncio.create_task(heartbeat(self.redis, stage_role(self.stage), self.consumer, stop,
                                               lambda: {"sessions": len(self.running), "sessions_done": self.sessions_done}))]
        log.info("worker %s serving stage %s", self.consumer, self.stage)
        try:
            while not stop.is_set():
                if len(self.running) < self.max_sessions:
                    await self._claim_abandoned()
                    await self._read_new()
                else:
                    await asyncio.sleep(0.2)
        finally:
            stop.set()  # also when the loop failed: the liveness key goes at once
            await asyncio.gather(*beats, return_exceptions=True)
            # let sessions in flight finish their current work (graceful stop)
            if self.running:
                await asyncio.gather(*self.running.values(), return_exceptions=True)
            await self.transport.aclose()

    async def _read_new(self) -> None:
        result = await retrying(
            lambda: self.redis.xreadgroup(WORK_GROUP, self.consumer, {self.key: ">"}, count=1, block=1000),
            "read announcements")
        for _, entries in result or []:
            for entry_id, fields in entries:
                self._start(entry_id, fields, takeover=False)

    async def _claim_abandoned(self) -> None:
        result = await retrying(
            lambda: self.redis.xautoclaim(self.key, WORK_GROUP, self.consumer,
                                          min_idle_time=self.claim_idle_ms, start_id="0-0", count=4),
            "claim announcements")
        for entry_id, fields in result[1]:
            if fields is not None:
                self._start(entry_id, fields, takeover=True)

    async def _heartbeat(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.sleep(max(0.2, self.claim_idle_ms / 3000))
            ids = list(self.running)
            if ids:
                try:
                    await self.redis.xclaim(self.key, WORK_GROUP, self.consumer, 0, ids, justid=True)
                except Exception as exc:  # a missed beat only risks an early takeover
                    log.warning("heartbeat failed: %s", exc)

    def _start(self, entry_id: Any, fields: dict[bytes, bytes], takeover: bool) -> None:
        entry_id = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
        if entry_id in self.running:
            return
        self.running[entry_id] = asyncio.create_task(self._serve(entry_id, fields, takeover))

    async def _serve(self, entry_id: str, fields: dict[bytes, bytes], takeover: bool) -> None:
        session = fields.get(b"session", b"?").decode()
        try:
            spec = spec_from_mapping(msgpack.unpackb(fields[b"spec"]))
            params = msgpack.unpackb(fields[b"params"])
            cfg = spec.stage(self.stage)
            state = SessionState()
            inbox, downstream, sink = self.transport.stage_io(spec, session, self.stage, self.consumer, state, takeover)
            start_seq, snapshot = 0, None
            if takeover:
                start_seq, snapshot = await inbox.restore_position()
                log.info("took over stage %s of session %s", self.stage, session)
            context = StageContext(spec.name, session, params, spec.output_audio.sample_rate)
            stage = get_stage_class(cfg.type)(cfg, context)
            host = StageHost(stage, inbox, downstream, sink, to_sink=self.stage in spec.output,
                             upstream_count=len(spec.inputs_of[self.stage]), concurrent=False,
                             start_seq=start_seq, snapshot=snapshot)
            await host.run()
        except TransportClosed as exc:
            log.info("session %s ended under stage %s: %s", session, self.stage, exc)
        except Exception as exc:
            log.exception("stage %s of session %s failed: %s", self.stage, session, exc)
        finally:
            self.running.pop(entry_id, None)
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
