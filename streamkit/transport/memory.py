"""The embedded transport: bounded in-process queues with backpressure.

Overflow policy, per inbox: audio, text, events and control frames are never dropped: a full
queue makes the producer wait (backpressure all the way back to the client socket). Video frames
may be dropped when the stage says `video_overflow: drop_oldest` (latest frame wins, for live
input); each drop is counted in `dropped` and in the frames-dropped metric.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any

from streamkit.frames import Frame, VideoFrame
from streamkit.metrics import FRAMES_DROPPED
from streamkit.pipeline import SOURCE, PipelineSpec
from streamkit.transport.base import Delivery, Inbox, Outbox, Overflow, Wiring


class MemoryChannel:
    def __init__(self, maxsize: int, overflow: Overflow = "block", name: str = "") -> None:
        if maxsize < 1:
            raise ValueError("maxsize must be at least 1")
        self.maxsize = maxsize
        self.overflow = overflow
        self.name = name
        self.dropped = 0
        self._items: collections.deque[Frame] = collections.deque()
        self._changed = asyncio.Condition()

    def qsize(self) -> int:
        return len(self._items)

    async def put(self, frame: Frame) -> None:
        async with self._changed:
            if len(self._items) >= self.maxsize and self.overflow == "drop_oldest" and isinstance(frame, VideoFrame):
                for i, queued in enumerate(self._items):
                    if isinstance(queued, VideoFrame):
                        del self._items[i]
                        self._count_drop()
                        break
            await self._changed.wait_for(lambda: len(self._items) < self.maxsize)
            self._items.append(frame)
            self._changed.notify_all()

    def _count_drop(self) -> None:
        self.dropped += 1
        FRAMES_DROPPED.inc(stage=self.name, kind="video")

    async def get(self) -> Delivery:
        async with self._changed:
            await self._changed.wait_for(lambda: bool(self._items))
            frame = self._items.popleft()
            self._changed.notify_all()
            return Delivery(frame)

    async def ack(self, tokens: list[Any], snapshot: Any = None) -> None:
        """In memory a frame is done once taken, and nothing outlives the process."""


class MemoryOutbox:
    """An edge into a MemoryChannel (the downstream stage's inbox)."""

    def __init__(self, channel: MemoryChannel) -> None:
        self.channel = channel

    def at_input(self, seq: int) -> None:
        """Positions matter only where a replay must line up with what was written."""

    async def put(self, frame: Frame) -> None:
        await self.channel.put(frame)


class MemoryTransport:
    """Wires every stage of a session in this process (the default)."""

    concurrent = True

    def __init__(self, sink_size: int = 1024) -> None:
        self.sink_size = sink_size

    def is_remote(self, spec: PipelineSpec, stage: str) -> bool:
        return False

    async def aclose(self) -> None:
        """Nothing to release: the channels belong to their sessions."""

    async def wire(self, spec: PipelineSpec, session_id: str, params: dict[str, Any]) -> Wiring:
        channels = {cfg.name: MemoryChannel(cfg.queue_size, cfg.video_overflow, name=cfg.name) for cfg in spec.stages}
        inboxes: dict[str, Inbox] = dict(channels)
        edges: dict[tuple[str, str], Outbox] = {
            (up, name): MemoryOutbox(channels[name]) for name, ups in spec.inputs_of.items() for up in ups}
        sink = MemoryChannel(self.sink_size, name="__out__")
        return Wiring(
            source=[edges[(SOURCE, name)] for name, ups in spec.inputs_of.items() if SOURCE in ups],
            inboxes=inboxes,
            edges=edges,
            sinks={cfg.name: MemoryOutbox(sink) for cfg in spec.stages},
            sink=sink,
            local_stages={cfg.name for cfg in spec.stages},
        )
