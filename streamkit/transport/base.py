"""What a transport gives the runtime: an inbox per stage and an outbox per edge."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Literal, Protocol

from streamkit.frames import Frame

if TYPE_CHECKING:
    from streamkit.pipeline import PipelineSpec

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


@dataclass
class Wiring:
    """How one session's stages connect, as a transport built it."""

    source: list[Outbox]
    inboxes: dict[str, Inbox]
    edges: dict[tuple[str, str], Outbox]  # (from, to) -> outbox
    sinks: dict[str, Outbox]  # stage -> its edge into the session output
    sink: Inbox
    local_stages: set[str]
    closer: Callable[[], Awaitable[None]] | None = None

    async def close(self) -> None:
        if self.closer is not None:
            await self.closer()


class Transport(Protocol):
    """What runs a session's edges: MemoryTransport (in-process) or RedisTransport."""

    concurrent: bool  # whether a stage host may overlap its stage's work with reading its inbox

    async def wire(self, spec: "PipelineSpec", session_id: str, params: dict[str, Any]) -> Wiring:
        """Build one session's inboxes and outboxes (and announce its remote stages)."""
        ...

    def is_remote(self, spec: "PipelineSpec", stage: str) -> bool:
        """Whether `stage` runs in other processes (stage workers) rather than in this one."""
        ...

    async def aclose(self) -> None: ...


class TransportClosed(Exception):
    """The transport under a session went away; the session cannot go on."""
