"""Transports carry frames between stages: `memory` in-process (default) and `redis` (Redis Streams)."""

from streamkit.transport.base import SINK, Delivery, Inbox, Outbox
from streamkit.transport.memory import MemoryChannel, MemoryTransport

__all__ = ["SINK", "Delivery", "Inbox", "Outbox", "MemoryChannel", "MemoryTransport"]
