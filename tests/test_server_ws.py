"""The server end to end on loopback: the protocol's happy path, HTTP routes, metrics, sharing."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import numpy as np
import pytest
import websockets

from streamkit.client import StreamClient
from streamkit.server.testing import running_server, tone, write_pipelines


@pytest.fixture
def pipelines(tmp_path):
    return write_pipelines(tmp_path / "pipelines")


def http_get(url: str, headers: dict | None = None) -> tuple[int, dict, bytes]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


async def aget(url, headers=None):
    return await asyncio.to_thread(http_get, url, headers)


async def test_echo_round_trip(pipelines):
    audio = tone(1.5)
    async with running_server(pipelines) as server:
        async with StreamClient(server.url) as c:
            ready = await c.start("echo", sample_rate=16000)
            assert ready["type"] == "ready" and isinstance(ready["session"], str)
            assert ready["output_audio"] == {"sample_rate": 16000, "format": "s16le", "channels": 1}
            result = await c.stream_audio(audio, speed=0, chunk_s=0.02)
    assert result.ended and result.close_code == 1000
    assert [e["type"] for e in result.events][-1] == "end"
    out = np.frombuffer(bytes(result.audio), "<i2").astype(np.float32) / 32768
    assert len(out) == len(audio)  # nothing lost
    assert np.max(np.abs(out - audio)) < 1e-3
    assert not result.errors


async def test_output_rate_and_metrics(pipelines):
    async with running_server(pipelines) as server:
        async with StreamClient(server.url) as c:
            ready = await c.start("echo24")
            assert ready["output_audio"]["sample_rate"] == 24000
            result = await c.stream_audio(tone(1.0), speed=4.0)
    n = len(result.audio) // 2
    assert abs(n - 24000) <= 64  # resampled 16k -> 24k, all of it
    metrics = result.last_metrics()
    assert metrics and set(metrics["stages"]) == {"up", "gain"}
    assert "latency_ms_p50" in metrics["stages"]["gain"]
    assert metrics["counters"]["audio_in_samples"] == 16000


async def test_resamples_declared_rate(pipelines):
    """A client may declare another rate (48 kHz here): the server converts it to the pipeline's."""
    async with running_server(pipelines) as server:
        async with StreamClient(server.url) as c:
            await c.start("echo", sample_rate=48000)
            result = await c.stream_audio(tone(1.0, rate=48000), speed=0)
    assert abs(len(result.audio) // 2 - 16000) <= 64
    assert not result.errors


async def test_text_partial_and_final_on_stop(pipelines):
    async with running_server(pipelines, plugins=["streamkit.server.testing"]) as server:
        async with StreamClient(server.url) as c:
            await c.start("meter")
            result = await c.stream_audio(tone(1.2), speed=0)
    texts = [e for e in result.events if e["type"] == "text"]
    assert texts[-1] == {"type": "text", "stage": "meter", "text": "heard 1.20 s, peak 0.500", "final": True, "t": texts[-1]["t"]}
    types = [e["type"] for e in result.events]
    assert types.index("end") > types.index("text")


async def test_concurrent_sessions_share_server(pipelines):
    async with running_server(pipelines) as server:
        async def one(i):
            async with StreamClient(server.url) as c:
                await c.start("echo")
                r = await c.stream_audio(tone(0.5, freq=200 + 50 * i), speed=0)
                return len(r.audio) // 2, r.close_code
        results = await asyncio.gather(*(one(i) for i in range(6)))
        assert results == [(8000, 1000)] * 6
        assert server.session_count() == 0


async def test_http_routes(pipelines, tmp_path):
    web = tmp_path / "web"
    web.mkdir()
    (web / "index.html").write_text("<h1>hi</h1>")
    (web / "app.js").write_text("1;")
    (tmp_path / "secret.txt").write_text("no")
    async with running_server(pipelines, web_dir=web) as server:
        base = f"http://127.0.0.1:{server.port}"
        status, headers, body = await aget(base + "/healthz")
        health = json.loads(body)
        assert status == 200 and health["status"] == "ok" and health["sessions"] == 0
        assert set(health["pipelines"]) == {"echo", "echo24", "meter", "slow_flush", "stalled_flush"}
        assert isinstance(health["models"], list)
        status, headers, body = await aget(base + "/")
        assert status == 200 and body == b"<h1>hi</h1>" and headers["Content-Type"].startswith("text/html")
        status, headers, _ = await aget(base + "/app.js")
        assert status == 200 and headers["Content-Type"].startswith("text/javascript")
        assert (await aget(base + "/../secret.txt"))[0] == 404
        assert (await aget(base + "/%2e%2e/secret.txt"))[0] == 404
        assert (await aget(base + "/nope.html"))[0] == 404
        # a session, then metrics mention it
        async with StreamClient(server.url) as c:
            await c.start("echo")
            _, _, body = await aget(base + "/healthz")
            assert json.loads(body)["sessions"] == 1
            await c.stream_audio(tone(0.3), speed=0)
        status, headers, body = await aget(base + "/metrics")
        text = body.decode()
        assert status == 200 and headers["Content-Type"].startswith("text/plain")
        for name in ("streamkit_sessions", "streamkit_stage_frames_in_total", "streamkit_stage_frames_out_total",
                     "streamkit_stage_latency_seconds_bucket", "streamkit_engine_tokens_per_second",
                     "streamkit_engine_batch_size", "streamkit_ws_messages_in_total"):
            assert name in text, name
        assert 'streamkit_stage_frames_in_total{pipeline="echo",stage="gain"}' in text


async def test_ws_path_only(pipelines):
    async with running_server(pipelines) as server:
        with pytest.raises(websockets.InvalidStatus) as err:
            async with websockets.connect(f"ws://127.0.0.1:{server.port}/other"):
                pass
        assert err.value.response.status_code == 404


async def test_client_cli(pipelines, tmp_path, capsys):
    from streamkit.client import main
    from streamkit.media import write_wav

    wav = tmp_path / "in.wav"
    write_wav(wav, tone(0.6), 16000)
    out = tmp_path / "out.wav"
    async with running_server(pipelines, plugins=["streamkit.server.testing"]) as server:
        rc = await asyncio.to_thread(main, ["meter", str(wav), "--url", server.url, "--speed", "4",
                                            "--json", "--save-audio", str(out)])
    assert rc == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    types = [e["type"] for e in lines]
    assert types[0] == "ready" and "end" in types and types[-1] == "summary"
    assert any(e["type"] == "text" and e["final"] and e["text"].startswith("heard 0.60 s") for e in lines)
    assert lines[-1]["audio_s"] == 0.6 and lines[-1]["errors"] == 0
    assert out.exists()
