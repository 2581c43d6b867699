"""The per-connection output queue's policy: keep never drops, partials coalesce, detections bounded."""

from __future__ import annotations

import asyncio

from streamkit.server.outqueue import OutQueue, SendPolicy


async def drain(q: OutQueue) -> list:
    out = []
    while q.items:
        out.append(await q.get())
    return out


async def test_keep_blocks_instead_of_dropping():
    q = OutQueue(maxsize=3)
    for i in range(3):
        await q.put(f"k{i}")
    blocked = asyncio.create_task(q.put("k3"))
    await asyncio.sleep(0.05)
    assert not blocked.done()  # backpressure, not loss
    assert await q.get() == "k0"
    await asyncio.wait_for(blocked, 1)
    assert await drain(q) == ["k1", "k2", "k3"]


async def test_partials_coalesce_in_place():
    q = OutQueue(maxsize=10)
    await q.put("p1", SendPolicy.COALESCE, ("partial", "asr"))
    await q.put("audio")
    await q.put("p2", SendPolicy.COALESCE, ("partial", "asr"))
    await q.put("m1", SendPolicy.COALESCE, "metrics")
    await q.put("final")
    await q.put("m2", SendPolicy.COALESCE, "metrics")
    assert await drain(q) == ["p2", "audio", "m2", "final"]
    assert q.coalesced == 2


async def test_detections_bounded_and_counted():
    q = OutQueue(maxsize=2, max_droppable=3)
    for i in range(10):
        await q.put(f"d{i}", SendPolicy.DROPPABLE, "detections")  # never blocks, even past maxsize
    await q.put("final", SendPolicy.KEEP)
    assert await drain(q) == ["d7", "d8", "d9", "final"]
    assert q.dropped == 7


async def test_close_releases_blocked_put():
    q = OutQueue(maxsize=1)
    await q.put("a")
    blocked = asyncio.create_task(q.put("b"))
    await asyncio.sleep(0.01)
    await q.close()
    assert await asyncio.wait_for(blocked, 1) is False
    assert await q.get() == "a" and await q.get() is None
