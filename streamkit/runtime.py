"""Running pipelines: one StageHost per stage per session, wired by a transport.

    transport = MemoryTransport()
    session = await Session.open(spec, transport, params={})
    await session.push(AudioFrame(...))
    await session.end()                      # EOS: every stage flushes
    async for frame in session.outputs(): ...

A StageHost feeds a stage its frames, forwards what it yields, handles control frames and
acknowledges inputs once their outputs are written. Exceptions in a stage become error events
on the session's output; they never end the process or another session.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, AsyncIterator

from streamkit.frames import Control, ControlKind, EventFrame, Frame
from streamkit.metrics import FRAMES_IN, FRAMES_OUT, STAGE_ERRORS, STAGE_LATENCY
from streamkit.pipeline import PipelineSpec
from streamkit.stage import Stage, StageContext
from streamkit.stages.catalog import build_stage
from streamkit.transport.base import Delivery, Inbox, Outbox, Transport, Wiring

log = logging.getLogger("streamkit.runtime")


@dataclass
class StageStats:
    frames_in: int = 0
    frames_out: int = 0
    errors: int = 0
    busy_s: float = 0.0
    last_latency_ms: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)

    def record(self, seconds: float) -> None:
        self.busy_s += seconds
        self.last_latency_ms = seconds * 1000
        self.latencies_ms.append(self.last_latency_ms)
        del self.latencies_ms[:-200]

    def summary(self) -> dict[str, Any]:
        lat = sorted(self.latencies_ms)
        p50 = lat[len(lat) // 2] if lat else 0.0
        return {"frames_in": self.frames_in, "frames_out": self.frames_out, "errors": self.errors,
                "latency_ms_p50": round(p50, 2), "latency_ms_last": round(self.last_latency_ms, 2)}


def _is_interrupt(frame: Frame) -> bool:
    return isinstance(frame, Control) and frame.control is ControlKind.INTERRUPT


def error_event(stage: str, code: str, message: str) -> EventFrame:
    return EventFrame("error", {"stage": stage, "code": code, "message": message}, source=stage)


class StageHost:
    """Runs one stage for one session.

    With `concurrent=True` (in-process transport) the host of an interruptible stage keeps reading
    its inbox while the stage works on a frame, so an INTERRUPT cancels in-flight work at once and
    frames the stage does not want pass straight through. Over Redis hosts run strictly in order,
    which is what lets a replacement worker's replay line up with what was already written."""

    def __init__(
        self,
        stage: Stage,
        inbox: Inbox,
        downstream: list[Outbox],
        sink: Outbox,
        to_sink: bool,
        upstream_count: int,
        concurrent: bool,
        start_seq: int = 0,
        snapshot: Any = None,
    ) -> None:
        self.stage = stage
        self.inbox = inbox
        self.downstream = downstream
        self.sink = sink
        self.to_sink = to_sink
        self.upstream_count = upstream_count
        self.concurrent = concurrent
        self.stats = StageStats()
        self.input_seq = start_seq  # inputs handled; a worker taking over resumes the count
        self._snapshot = snapshot  # the stage state to restore after start() (takeover)
        self._outboxes = [*downstream, sink]
        self._unacked: list[Any] = []
        self._started = False
        self._labels = {"pipeline": stage.context.pipeline, "stage": stage.name}

    # ------------------------------------------------------------ output
    async def _emit(self, frame: Frame) -> None:
        for out in self.downstream:
            await out.put(frame)
        if self.to_sink and (frame.source == self.stage.name or _is_interrupt(frame)):
            # interrupts reach the session output too, so a client drops audio it has queued
            await self.sink.put(frame)
        self.stats.frames_out += 1
        FRAMES_OUT.inc(**self._labels)

    async def _emit_produced(self, frame: Frame) -> None:
        if frame.source != self.stage.name:
            frame = replace(frame, source=self.stage.name)
        await self._emit(frame)

    async def _report(self, code: str, exc: BaseException, where: str) -> None:
        self.stats.errors += 1
        STAGE_ERRORS.inc(**self._labels)
        log.warning("stage %s failed in %s: %s", self.stage.name, where, exc, exc_info=exc)
        await self.sink.put(error_event(self.stage.name, code, f"stage {self.stage.name!r} {where}: {exc}"))

    async def _ack(self, token: Any, force: bool = False) -> None:
        if token is not None:
            self._unacked.append(token)
        if force or not self.stage.stateful or self.stage.take_checkpoint():
            await self.inbox.ack(self._unacked, self.stage.snapshot() if self.stage.stateful else None)
            self._unacked = []

    # ------------------------------------------------------------ work
    def _received(self) -> None:
        """Count an input; what is emitted from now on was caused by it."""
        self.stats.frames_in += 1
        FRAMES_IN.inc(**self._labels)
        self.input_seq += 1
        for out in self._outboxes:
            out.at_input(self.input_seq)

    async def _process(self, frame: Frame) -> None:
        started = time.perf_counter()
        try:
            async for out in self.stage.process(frame):
                await self._emit_produced(out)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await self._report("stage_error", exc, f"process({frame.kind})")
        finally:
            elapsed = time.perf_counter() - started
            self.stats.record(elapsed)
            STAGE_LATENCY.observe(elapsed, **self._labels)

    async def _flush(self) -> None:
        try:
            async for out in self.stage.flush():
                await self._emit_produced(out)
        except Exception as exc:
            await self._report("stage_error", exc, "flush")

    async def _interrupt(self) -> None:
        try:
            await self.stage.interrupt()
        except Exception as exc:
            await self._report("stage_error", exc, "interrupt")

    async def run(self) -> None:
        try:
            await self.stage.start()
            if self._snapshot is not None:
                self.stage.restore(self._snapshot)
            self._started = True
        except Exception as exc:
            await self._report("stage_start_failed", exc, "start")
        eos_seen = 0
        pending_get: asyncio.Task | None = None
        try:
            while True:
                if pending_get is not None:
                    delivery = await pending_get
                    pending_get = None
                else:
                    delivery = await self.inbox.get()
                frame = delivery.frame
                self._received()
                if isinstance(frame, Control):
                    if frame.control is ControlKind.EOS:
                        eos_seen += 1
                        if eos_seen < self.upstream_count:
                            await self._ack(delivery.token)
                            continue
                    if frame.control in (ControlKind.EOS, ControlKind.FLUSH) and self._started:
                        await self._flush()
                    elif frame.control is ControlKind.INTERRUPT and self._started:
                        await self._interrupt()
                    await self._emit(frame)
                    await self._ack(delivery.token, force=frame.control is ControlKind.EOS)
                    if frame.control is ControlKind.EOS:
                        return
                    continue
                if not (self._started and self.stage.wants(frame)):
                    await self._emit(frame)
                    await self._ack(delivery.token)
                    continue
                if not (self.concurrent and self.stage.interruptible):
                    await self._process(frame)
                    await self._ack(delivery.token)
                    continue
                pending_get = await self._process_watching(frame)
                await self._ack(delivery.token)
        finally:
            if pending_get is not None:
                pending_get.cancel()
            try:
                await self.stage.stop()
            except Exception as exc:
                log.warning("stage %s failed to stop: %s", self.stage.name, exc)
            await self.sink.put(Control(ControlKind.EOS, source=self.stage.name))

    async def _process_watching(self, frame: Frame) -> asyncio.Task | None:
        """Process one frame while watching the inbox for interrupts and pass-through frames.

        Returns a get() task that already holds the next frame the stage must see in order."""
        work = asyncio.create_task(self._process(frame))
        getter: asyncio.Task | None = None
        try:
            while True:
                if getter is None:
                    getter = asyncio.create_task(self.inbox.get())
                done, _ = await asyncio.wait({work, getter}, return_when=asyncio.FIRST_COMPLETED)
                if getter in done:
                    delivery: Delivery = getter.result()
                    nxt = delivery.frame
                    if isinstance(nxt, Control) and nxt.control is ControlKind.INTERRUPT:
                        work.cancel()
                        await asyncio.gather(work, return_exceptions=True)
                        self._received()
                        await self._interrupt()
                        await self._emit(nxt)
                        await self._ack(delivery.token)
                        return None
                    if not isinstance(nxt, Control) and not self.stage.wants(nxt):
                        self._received()
                        await self._emit(nxt)
                        await self._ack(delivery.token)
                        getter = None
                        continue
                    # the stage must see this frame after the current one: hold it (backpressure)
                    await work
                    done_getter, getter = getter, None
                    return done_getter
                await work
                return getter
        except asyncio.CancelledError:
            work.cancel()
            if getter is not None:
                getter.cancel()
            raise


class Session:
    """One running instance of a pipeline."""

    def __init__(self, spec: PipelineSpec, wiring: Wiring, session_id: str, params: dict[str, Any]) -> None:
        self.spec = spec
        self.id = session_id
        self.params = params
        self.wiring = wiring
        self.hosts: dict[str, StageHost] = {}
        self._tasks: list[asyncio.Task] = []
        self._stages_done = 0
        self._pushed = 0
        self._finished = False
        self.started_at = time.time()

    @classmethod
    async def open(
        cls,
        spec: PipelineSpec,
        transport: Transport,
        session_id: str | None = None,
        params: dict[str, Any] | None = None,
    ) -> "Session":
        session_id = session_id or uuid.uuid4().hex[:12]
        params = dict(params or {})
        wiring = await transport.wire(spec, session_id, params)
        session = cls(spec, wiring, session_id, params)
        context = StageContext(spec.name, session_id, params, spec.output_audio.sample_rate)
        for cfg in spec.stages:
            if cfg.name not in wiring.local_stages:
                continue
            stage = build_stage(cfg, context)
            session.hosts[cfg.name] = make_host(spec, cfg.name, stage, wiring, transport.concurrent)
        for name, host in session.hosts.items():
            session._tasks.append(asyncio.create_task(host.run(), name=f"{session_id}:{name}"))
        return session

    async def push(self, frame: Frame) -> None:
        """Feed one frame of session input (backpressure: waits while the first stage is full)."""
        self._pushed += 1
        for out in self.wiring.source:
            out.at_input(self._pushed)
            await out.put(frame)

    async def end(self) -> None:
        await self.push(Control(ControlKind.EOS))

    async def interrupt(self) -> None:
        await self.push(Control(ControlKind.INTERRUPT))

    async def next_output(self) -> Frame | None:
        """The next output frame, or None once every stage has finished. Besides what output
        stages produce, an INTERRUPT that passed through the pipeline comes out once per
        output stage it reached."""
        while not self._finished:
            frame = (await self.wiring.sink.get()).frame
            if isinstance(frame, Control) and frame.control is ControlKind.EOS:
                self._stages_done += 1
                if self._stages_done >= len(self.spec.stages):
                    self._finished = True
                    return None
                continue
            return frame
        return None

    async def outputs(self) -> AsyncIterator[Frame]:
        while (frame := await self.next_output()) is not None:
            yield frame

    async def run_to_end(self, frames: list[Frame]) -> list[Frame]:
        """Push frames, end the stream and collect every output (for offline runs and tests)."""
        collected: list[Frame] = []

        async def collect() -> None:
            async for f in self.outputs():
                collected.append(f)

        collector = asyncio.create_task(collect())
        for f in frames:
            await self.push(f)
        await self.end()
        await collector
        await self.close()
        return collected

    def stats(self) -> dict[str, Any]:
        return {name: host.stats.summary() for name, host in self.hosts.items()}

    async def close(self) -> None:
        for t in self._tasks:
            if not t.done():
                t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.wiring.close()


def make_host(spec: PipelineSpec, name: str, stage: Stage, wiring: Wiring, concurrent: bool) -> StageHost:
    return StageHost(
        stage,
        wiring.inboxes[name],
        [wiring.edges[(name, down)] for down in spec.downstream_of(name)],
        wiring.sinks[name],
        to_sink=name in spec.output,
        upstream_count=len(spec.inputs_of[name]),
        concurrent=concurrent,
    )
