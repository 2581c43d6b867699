"""RemoteEngine: Engine.generate() served by engine workers over Redis Streams."""
from __future__ import annotations

import asyncio
import uuid
from typing import AsyncIterator

from streamkit.engine.params import SamplingParams
from streamkit.engine.service import wire


class RemoteEngine:
    def __init__(self, redis_url: str, prefix: str = wire.DEFAULT_PREFIX, first_reply_timeout: float = 120.0,
                 idle_timeout: float = 60.0, model: str | None = None):
        import redis.asyncio as aioredis

        self.redis_url = redis_url
        self.prefix = prefix
        self.model = model  # what the worker should run (a GGUF path or packaged name); None: its default
        self.first_reply_timeout = first_reply_timeout
        self.idle_timeout = idle_timeout
        self._r = aioredis.from_url(redis_url, socket_timeout=5.0, socket_connect_timeout=5.0)  # a paused Redis times out

    async def generate(self, prompt: str | list[dict], params: SamplingParams | None = None) -> AsyncIterator[str]:
        """Stream the answer. Through a restarted or paused redis-server it waits (up to the
        timeouts); a request that a non-persistent restart lost before any worker took it is sent
        again; pieces such a restart lost raise an error naming the cause rather than leaving a
        hole in the text."""
        from streamkit.redis_io import REDIS_FAULTS

        params = params or SamplingParams()
        r = self._r
        rid = uuid.uuid4().hex
        reply = wire.reply_key(self.prefix, rid)
        payload = {"id": rid, "prompt": prompt if isinstance(prompt, str) else [dict(m) for m in prompt],
                   "params": params.to_dict(), "reply": reply, "model": self.model}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.first_reply_timeout

        async def submit() -> str:
            while True:
                try:
                    return await r.xadd(wire.requests_key(self.prefix), {"d": wire.pack(payload)})
                except REDIS_FAULTS:
                    if loop.time() > deadline:
                        raise TimeoutError("redis unreachable: the request could not be sent") from None
                    await asyncio.sleep(0.2)

        request_id = await submit()
        last = "0"
        done = False
        started = False
        expected = 0  # the number of the next reply message
        faulted = False
        try:
            while True:
                try:
                    if faulted and not started and not await r.xrange(wire.requests_key(self.prefix), request_id,
                                                                      request_id):
                        request_id = await submit()  # Redis came back without it: no worker has it
                    faulted = False
                    resp = await r.xread({reply: last}, count=256, block=500)
                except REDIS_FAULTS:
                    faulted = True
                    if loop.time() > deadline:
                        raise TimeoutError("redis unreachable while waiting for the engine") from None
                    await asyncio.sleep(0.2)
                    continue
                if not resp:
                    if loop.time() > deadline:
                        raise TimeoutError("no reply from an engine worker" if not started else "engine worker stalled")
                    continue
                for _s, entries in resp:
                    for eid, f in entries:
                        last = eid
                        msg = wire.unpack(f[b"d"])
                        kind, value = msg.get("k"), msg.get("v")
                        n = msg.get("n", expected)
                        if n < expected:
                            # the worker retries a write whose reply the restart cut off, so Redis may
                            # hold it twice: delivery is at least once, the numbers make it exactly once
                            continue
                        if n > expected:
                            done = kind in ("done", "error")
                            raise RuntimeError(f"the engine's reply lost {n - expected} message(s) in Redis "
                                               "(redis-server restarted without persistence?)")
                        expected += 1
                        started = True
                        deadline = loop.time() + self.idle_timeout
                        if kind == "text":
                            yield value
                        elif kind == "done":
                            done = True
                            return
                        elif kind == "error":
                            done = True
                            raise RuntimeError(value)
        finally:
            if not done:
                try:
                    await asyncio.shield(r.xadd(wire.cancel_key(self.prefix), {"d": wire.pack({"id": rid})},
                                                maxlen=10000, approximate=True))
                except Exception:
                    pass
            try:
                await asyncio.shield(r.delete(reply))
            except Exception:
                pass

    async def complete(self, prompt, params: SamplingParams | None = None) -> str:
        return "".join([t async for t in self.generate(prompt, params)])

    async def stats(self) -> dict:
        out = {}
        async for key in self._r.scan_iter(match=f"{self.prefix}:stats:*"):
            h = await self._r.hgetall(key)
            out[key.decode().rsplit(":", 1)[-1]] = {k.decode(): v.decode() for k, v in h.items()}
        return out

    async def aclose(self) -> None:
        await self._r.aclose()
