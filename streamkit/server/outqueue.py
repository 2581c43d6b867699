"""The outgoing messages of one connection, with a policy per message (docs/server.md):

* KEEP (audio, final transcripts, LLM text, errors, end): never dropped; a full queue makes the
  sender wait, which backs up the pipeline and, in the end, the client's own sending.
* COALESCE (partial transcripts, metrics): a queued, unsent message is replaced by the newer one
  with the same key (counted in `coalesced`).
* DROPPABLE (detections): at most `max_droppable` wait; the oldest goes first (counted in `dropped`).
"""
from __future__ import annotations

import asyncio
import collections
import enum
from typing import Any

from streamkit.server.telemetry import SERVER_DROPPED


class SendPolicy(str, enum.Enum):
    KEEP = "keep"
    COALESCE = "coalesce"
    DROPPABLE = "droppable"


class OutQueue:
    """Outgoing messages with the policies above. Only KEEP items block when full."""

    def __init__(self, maxsize: int, max_droppable: int = 8) -> None:
        self.maxsize = maxsize
        self.max_droppable = max_droppable
        self.items: collections.deque[list[Any]] = collections.deque()  # [policy, key, message]
        self.keep = 0
        self.droppable = 0
        self.closed = False
        self.dropped = 0
        self.coalesced = 0
        self.cond = asyncio.Condition()

    async def put(self, message: str | bytes, policy: SendPolicy = SendPolicy.KEEP, key: Any = None) -> bool:
        async with self.cond:
            if self.closed:
                return False
            if policy is SendPolicy.COALESCE:
                for item in self.items:
                    if item[0] is SendPolicy.COALESCE and item[1] == key:
                        item[2] = message
                        self.coalesced += 1
                        return True
            elif policy is SendPolicy.DROPPABLE:
                if self.droppable >= self.max_droppable:
                    for i, item in enumerate(self.items):
                        if item[0] is SendPolicy.DROPPABLE:
                            del self.items[i]
                            self.droppable -= 1
                            self.dropped += 1
                            SERVER_DROPPED.inc(kind=str(item[1]))
                            break
                self.droppable += 1
            else:
                await self.cond.wait_for(lambda: self.keep < self.maxsize or self.closed)
                if self.closed:
                    return False
                self.keep += 1
            self.items.append([policy, key, message])
            self.cond.notify_all()
            return True

    async def get(self) -> str | bytes | None:
        """The next message, or None once closed and empty."""
        async with self.cond:
            await self.cond.wait_for(lambda: bool(self.items) or self.closed)
            if not self.items:
                return None
            policy, _key, message = self.items.popleft()
            if policy is SendPolicy.KEEP:
                self.keep -= 1
            elif policy is SendPolicy.DROPPABLE:
                self.droppable -= 1
            self.cond.notify_all()
            return message

    async def close(self) -> None:
        async with self.cond:
            self.closed = True
            self.cond.notify_all()

    async def drained(self) -> None:
        async with self.cond:
            await self.cond.wait_for(lambda: not self.items)

    def __len__(self) -> int:
        return len(self.items)
