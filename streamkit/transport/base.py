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

    async def ack(self, tokens: list[Any], snapshot: Any = None) -> None:
        """These frames are done; `snapshot` is the stage's state at this point (stateful stages)."""
        ...


class Outbox(Protocol):
    """One edge: frames from one stage to one downstream stage (or the session sink)."""

    def at_input(self, seq: int) -> None:
        """The producer is now handling its `seq`-th input: what it puts next was caused by it."""
        ...

    async def put(self, frame: Frame) -> None: ...


class TransportClosed(Exception):
    """The transport under a session went away; the session cannot go on."""
