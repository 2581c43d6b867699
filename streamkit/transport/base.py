"""What a transport gives the runtime: an inbox per stage and an outbox per edge."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

from streamkit.frames import Frame

Overflow = Literal["block", "drop_oldest"]
SINK = "__out__"  # the pseudo-stage that session output goes to


@dataclass
class Delivery:
    frame: Frame
    token: Any = None  # what ack() needs to acknowledge this frame (transport-specific)


class Inbox(Protocol):
    """Frames for one stage of one session, from all of its upstream edges."""

    async def get(self) -> Delivery: ...

    async def ack(self, tokens: list[Any]) -> None: ...


class Outbox(Protocol):
    """One edge: frames from one stage to one downstream stage (or the session sink)."""

    async def put(self, frame: Frame) -> None: ...

    async def commit(self) -> None:
        """Record this outbox's position (Redis: with the inputs' acknowledgement)."""
        ...


class TransportClosed(Exception):
    """The transport under a session went away; the session cannot go on."""
