"""One websocket connection speaking the protocol: the socket, and the session's state machine
(idle -> starting -> running -> stopping -> closed).

Per connection three tasks run besides the reader: the output pump (pipeline outputs ->
serializer.py -> the out-queue), the writer (out-queue -> socket) and, for video, a decoder that
always takes the newest frame. Backpressure, per message type (docs/server.md, outqueue.py):

* client audio, and everything KEEP on the way out: never dropped. When the client reads slowly
  the bounded out-queue fills, the pipeline's queues fill, and the server stops reading from the
  socket, so TCP pushes back on the sender. A client that reads nothing for `send_timeout`
  seconds is closed (1008, slow_consumer).
* client video frames: the newest frame wins; a frame replaced before it was decoded is dropped
  and counted (session metrics `video_dropped`, streamkit_server_dropped_total{kind="video"}).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import Any, Protocol

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from streamkit import cores
from streamkit.pipeline import PipelineSpec
from streamkit.runtime import Session
from streamkit.server import protocol
from streamkit.server.inputs import SessionInput
from streamkit.server.limits import Limits, RateLimiter
from streamkit.server.outqueue import OutQueue, SendPolicy
from streamkit.server.serializer import FrameSerializer, Outgoing, event_message
from streamkit.server.telemetry import (
    CONNECTIONS_TOTAL,
    ERRORS,
    MESSAGES_IN,
    MESSAGES_OUT,
)
from streamkit.transport.base import Transport

log = logging.getLogger("streamkit.server")


class SessionHost(Protocol):
    """What a connection needs of the server (streamkit.server.app.StreamServer)."""

    limits: Limits
    pipelines: dict[str, PipelineSpec]
    shutting_down: bool

    def transport(self) -> Transport: ...
    def pipeline_names(self) -> list[str]: ...
    def session_count(self) -> int: ...
    def pipeline_session_limit(self, spec: PipelineSpec) -> int | None: ...
    def pipeline_session_count(self, name: str) -> int: ...
    def session_opened(self, conn: "Connection") -> None: ...
    def session_closed(self, conn: "Connection") -> None: ...


class Connection:
    """Serves one websocket connection on /ws."""

    def __init__(self, server: SessionHost, ws: ServerConnection) -> None:
        self.server = server
        self.ws = ws
        self.limits = server.limits
        self.state = "idle"  # idle -> running -> stopping -> closed
        self.session = None
        self.spec = None
        self.out = OutQueue(self.limits.out_queue)
        self.rate = RateLimiter(self.limits.rate, self.limits.burst)
        self.tasks: list[asyncio.Task] = []
        self.writer: asyncio.Task | None = None
        self.finisher: asyncio.Task | None = None
        self.closer: asyncio.Task | None = None
        self.closing = False  # no more input is processed
        self.close_started = False
        self.stopping_warned = False
        self.input: SessionInput | None = None  # set at start
        self.serializer: FrameSerializer | None = None  # set at start: needs the output rate
        self.counters: collections.Counter[str] = collections.Counter()
        self.last_output = 0.0  # loop time the pipeline last emitted a frame (the flush's progress)
        self.shutdown_deadline: float | None = None  # loop time a server shutdown ends the flush

    # ------------------------------------------------------------------ sending
    async def send_event(self, event: dict[str, Any], policy: SendPolicy = SendPolicy.KEEP, key: Any = None) -> None:
        await self.send(event_message(event, policy, key))

    async def send(self, item: Outgoing) -> None:
        if item.error_code is not None:
            ERRORS.inc(code=item.error_code)
            self.counters["errors_sent"] += 1
        await self.out.put(item.message, item.policy, item.key)

    async def _writer(self) -> None:
        try:
            while True:
                message = await self.out.get()
                if message is None:
                    return
                try:
                    await asyncio.wait_for(self.ws.send(message), self.limits.send_timeout)
                except (asyncio.TimeoutError, TimeoutError):
                    log.warning("closing a client that read nothing for %.0fs", self.limits.send_timeout)
                    ERRORS.inc(code="slow_consumer")
                    await self.out.close()
                    await self._hard_close(protocol.CLOSE_POLICY, "slow_consumer: client is not reading")
                    return
                kind = "audio" if isinstance(message, bytes) else "json"
                MESSAGES_OUT.inc(kind=kind)
                self.counters[f"out_{kind}"] += 1
        except ConnectionClosed:
            await self.out.close()
        except asyncio.CancelledError:
            raise

    async def _hard_close(self, code: int, reason: str) -> None:
        self.closing = True
        try:
            await asyncio.wait_for(self.ws.close(code, reason[:120]), 2.0)
        except Exception:
            pass
        transport = getattr(self.ws, "transport", None)
        if transport is not None and not transport.is_closing():
            transport.abort()

    async def fail(self, err: protocol.ProtocolError) -> None:
        """Tell the client what was wrong; close if the session cannot go on."""
        await self.send_event(err.event())
        if err.close is not None and self.closer is None:
            # in a task, so the reader keeps draining the socket and sees the client's close frame
            self.closing = True
            self.closer = asyncio.create_task(self.close_after_flush(err.close, f"{err.code}"))

    async def close_after_flush(self, code: int, reason: str) -> None:
        if self.close_started:
            return
        self.close_started = True
        self.closing = True
        await self._teardown_session()
        await self.out.close()
        if self.writer is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self.writer), self.limits.send_timeout)
            except Exception:
                pass
        try:
            await asyncio.wait_for(self.ws.close(code, reason[:120]), 5.0)
        except Exception:
            transport = getattr(self.ws, "transport", None)
            if transport is not None:
                transport.abort()

    # ------------------------------------------------------------------ main loop
    async def run(self) -> None:
        self.writer = asyncio.create_task(self._writer())
        CONNECTIONS_TOTAL.inc()
        try:
            async for message in self.ws:
                kind = "text" if isinstance(message, str) else (
                    "audio" if message[:1] == b"\x01" else "video" if message[:1] == b"\x02" else "other")
                MESSAGES_IN.inc(kind=kind)
                if self.closing:
                    continue
                if not self.rate.allow():
                    await self.fail(protocol.ProtocolError(
                        "rate_limited",
                        f"more than {self.limits.rate:g} messages per second (burst {self.limits.burst}); closing",
                        close=protocol.CLOSE_POLICY))
                    continue
                try:
                    msg = protocol.parse_message(message, self.limits.max_message)
                    await self.handle(msg)
                except protocol.ProtocolError as err:
                    await self.fail(err)
        except ConnectionClosed:
            pass
        except Exception as exc:  # a bug here must not take the server down
            log.exception("connection handler failed")
            try:
                await self.send_event(protocol.error("internal_error", f"server error: {type(exc).__name__}"))
            except Exception:
                pass
        finally:
            await self._cleanup()

    async def handle(self, msg: protocol.ClientMessage) -> None:
        if isinstance(msg, protocol.Start):
            await self.start(msg)
        elif isinstance(msg, protocol.Stop):
            if self.state == "idle":
                raise protocol.ProtocolError("not_started", "stop before start: there is no session to stop")
            if self.state == "running":
                self.state = "stopping"
                self.finisher = asyncio.create_task(self.finish(protocol.CLOSE_NORMAL, "stop"))
        elif self.state == "idle":
            what = "audio" if isinstance(msg, protocol.Audio) else "video"
            raise protocol.ProtocolError("not_started", f"binary {what} message before start: send {{\"type\":\"start\"}} first")
        elif self.state != "running":
            if not self.stopping_warned:
                self.stopping_warned = True
                raise protocol.ProtocolError("stopping", "the session is stopping; further input is ignored")
        elif isinstance(msg, protocol.Audio):
            await self.input.push_audio(msg.pcm)
        elif isinstance(msg, protocol.Video):
            self.input.queue_video(msg.jpeg)

    # ------------------------------------------------------------------ start
    async def start(self, msg: protocol.Start) -> None:
        if self.state != "idle":
            raise protocol.ProtocolError("already_started", "this connection already has a session; send stop first")
        if self.server.shutting_down:
            raise protocol.ProtocolError("shutting_down", "the server is shutting down", close=protocol.CLOSE_GOING_AWAY)
        spec = self.server.pipelines.get(msg.pipeline)
        if spec is None:
            known = ", ".join(sorted(self.server.pipeline_names())) or "none"
            raise protocol.ProtocolError("unknown_pipeline", f"unknown pipeline {msg.pipeline!r}; available: {known}")
        if self.server.session_count() >= self.limits.max_sessions:
            raise protocol.ProtocolError(
                "too_many_sessions", f"the server is at its limit of {self.limits.max_sessions} sessions",
                close=protocol.CLOSE_POLICY)
        limit = self.server.pipeline_session_limit(spec)
        if limit is not None and self.server.pipeline_session_count(spec.name) >= limit:
            raise protocol.ProtocolError(
                "too_many_sessions", f"pipeline {spec.name!r} runs at most {limit} sessions at once on this server's "
                f"{cores.count()} cores (its sessions_per_core: {spec.sessions_per_core:g}); try again later",
                close=protocol.CLOSE_POLICY)
        self.state = "starting"
        self.spec = spec
        try:
            self.serializer = FrameSerializer(spec.output_audio.sample_rate)
            # websocket input is live: stages that drop by policy (video capture) use latest-frame-wins
            self.session = await Session.open(spec, self.server.transport(), params={"live": True, **msg.params})
        except Exception as exc:
            self.state = "idle"
            self.session = None
            log.exception("could not open pipeline %s", msg.pipeline)
            raise protocol.ProtocolError("start_failed", f"pipeline {msg.pipeline!r} could not start: {exc}") from None
        self.input = SessionInput(self.session, spec, msg.audio, self.limits, self.counters, self.send_event)
        self.state = "running"
        self.server.session_opened(self)
        await self.send_event(protocol.ready(self.session.id, spec.output_audio.sample_rate))
        self.tasks.append(asyncio.create_task(self._pump(), name=f"pump:{self.session.id}"))
        self.tasks.append(asyncio.create_task(self.input.video_loop(), name=f"video:{self.session.id}"))
        if self.limits.metrics_interval > 0:
            self.tasks.append(asyncio.create_task(self._metrics_loop(), name=f"metrics:{self.session.id}"))

    # ------------------------------------------------------------------ output
    async def _pump(self) -> None:
        try:
            async for frame in self.session.outputs():
                self.last_output = asyncio.get_running_loop().time()
                for item in self.serializer.serialize(frame):
                    await self.send(item)
            for item in self.serializer.flush():
                await self.send(item)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("output pump failed")
            await self.send_event(protocol.error("internal_error", f"output failed: {type(exc).__name__}: {exc}"))

    def session_metrics(self) -> dict[str, Any]:
        c = self.counters
        return {
            "audio_in_msgs": c["audio_in_msgs"], "audio_in_samples": c["audio_in_samples"],
            "audio_out_samples": self.serializer.audio_samples_out if self.serializer else 0,
            "video_in": c["video_in"],
            "video_dropped": c["video_dropped"], "detections_dropped": self.out.dropped,
            "partials_coalesced": self.out.coalesced, "errors": c["errors_sent"],
            "out_queue": len(self.out),
        }

    def metrics_event(self) -> dict[str, Any]:
        return {"type": "metrics", "session": self.session.id if self.session else None,
                "stages": self.session.stats() if self.session else {}, "counters": self.session_metrics()}

    async def _metrics_loop(self) -> None:
        while self.state == "running":
            await asyncio.sleep(self.limits.metrics_interval)
            if self.state == "running":
                await self.send_event(self.metrics_event(), SendPolicy.COALESCE, "metrics")

    # ------------------------------------------------------------------ stop
    async def finish(self, code: int, reason: str) -> None:
        """Flush every stage, send what comes out, then metrics, end, and close."""
        try:
            await self.input.flush()
            await self.session.end()
            pump = self.tasks[0] if self.tasks else None
            if pump is not None and not await self._flushed(pump):
                await self.send_event(protocol.error("flush_timeout", "the pipeline did not finish flushing in time"))
            await self.send_event(self.metrics_event())
            await self.send_event({"type": "end"})
        except ConnectionClosed:
            pass
        except Exception as exc:
            log.exception("finishing session failed")
            try:
                await self.send_event(protocol.error("internal_error", f"stop failed: {type(exc).__name__}"))
            except Exception:
                pass
        await self.close_after_flush(code, reason)

    async def _flushed(self, pump: asyncio.Task) -> bool:
        """Wait for the output pump to end: True once everything the flush produced is queued.
        A client's stop waits as long as the pipeline makes progress (a loaded server may take
        minutes to dub the last sentences, and they are the client's words); it gives up after
        `flush_stall_timeout` s without output. A server shutdown bounds the flush to
        `shutdown_timeout` s in all, as the process is killed soon after (compose's grace period)."""
        loop = asyncio.get_running_loop()
        self.last_output = max(self.last_output, loop.time())
        while not pump.done():
            give_up = self.last_output + self.limits.flush_stall_timeout
            if self.shutdown_deadline is not None:
                give_up = min(give_up, self.shutdown_deadline)
            if loop.time() >= give_up:
                return False
            # in slices: a shutdown that starts during a client's stop moves the deadline
            await asyncio.wait({pump}, timeout=min(give_up - loop.time(), 0.5))
        return True

    async def shutdown(self) -> None:
        """Server is going away: flush a running session, close an idle connection."""
        self.shutdown_deadline = asyncio.get_running_loop().time() + self.limits.shutdown_timeout
        if self.state == "running":
            self.state = "stopping"
            self.finisher = asyncio.create_task(self.finish(protocol.CLOSE_GOING_AWAY, "server shutting down"))
            await asyncio.shield(self.finisher)
        elif self.finisher is not None:
            await asyncio.shield(self.finisher)
        elif not self.closing:
            await self.close_after_flush(protocol.CLOSE_GOING_AWAY, "server shutting down")

    async def _teardown_session(self) -> None:
        for t in self.tasks:
            if not t.done():
                t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.tasks = []
        if self.session is not None:
            session, self.session = self.session, None
            try:
                await session.close()
            except Exception:
                log.exception("closing session failed")
        self.server.session_closed(self)

    async def _cleanup(self) -> None:
        if self.closer is not None and not self.closer.done():
            try:
                await asyncio.wait_for(asyncio.shield(self.closer), 10)
            except Exception:
                self.closer.cancel()
        if self.finisher is not None and not self.finisher.done():
            try:
                await asyncio.wait_for(asyncio.shield(self.finisher), self.limits.shutdown_timeout + 5)
            except Exception:
                self.finisher.cancel()
        self.state = "closed"
        await self._teardown_session()
        await self.out.close()
        if self.writer is not None:
            self.writer.cancel()
            await asyncio.gather(self.writer, return_exceptions=True)
