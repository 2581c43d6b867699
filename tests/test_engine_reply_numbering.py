"""RemoteEngine's reading of numbered reply messages, against a real redis-server: a worker that
retried a write the connection cut off leaves a duplicate, which is read once; a missing number
is a loss, which is an error naming it."""
import asyncio
import uuid

import pytest

from streamkit.engine.service import wire
from streamkit.engine.service.remote import RemoteEngine

pytestmark = pytest.mark.redis


async def _answer(redis_url: str, prefix: str, numbers: list[int]) -> None:
    """Take the one request, then reply with text messages numbered as given, then done."""
    import redis.asyncio as aioredis

    r = aioredis.from_url(redis_url)
    try:
        while not (resp := await r.xread({wire.requests_key(prefix): "0"}, count=1, block=200)):
            pass
        request = wire.unpack(resp[0][1][0][1][b"d"])
        for n in numbers:
            await r.xadd(request["reply"], {"d": wire.pack({"k": "text", "v": f"<{n}>", "n": n})})
        await r.xadd(request["reply"], {"d": wire.pack({"k": "done", "v": None, "n": max(numbers) + 1})})
    finally:
        await r.aclose()


async def _generate(redis_url: str, numbers: list[int]) -> str:
    prefix = f"test:{uuid.uuid4().hex[:8]}"
    remote = RemoteEngine(redis_url, prefix=prefix, first_reply_timeout=10, idle_timeout=10)
    try:
        worker = asyncio.create_task(_answer(redis_url, prefix, numbers))
        text = await asyncio.wait_for(remote.complete("hi"), 20)
        await worker
        return text
    finally:
        await remote.aclose()


async def test_a_retried_reply_write_is_read_once(redis_url):
    assert await _generate(redis_url, [0, 1, 1, 2]) == "<0><1><2>"


async def test_a_lost_reply_message_is_an_error_naming_it(redis_url):
    with pytest.raises(RuntimeError, match="lost 1 message"):
        await _generate(redis_url, [0, 2])
