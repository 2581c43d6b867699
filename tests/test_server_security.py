"""Security model: token, origin allow-list, loopback default, session and message-rate limits."""

from __future__ import annotations

import asyncio
import json

import pytest
import websockets

from streamkit.client import StartRefused, StreamClient
from streamkit.server.limits import Limits, Security, is_loopback
from streamkit.server.serve_cli import build_parser, server_from_args
from streamkit.server.testing import running_server, tone, write_pipelines


@pytest.fixture
def pipelines(tmp_path):
    return write_pipelines(tmp_path / "pipelines")


def test_defaults_bind_loopback(monkeypatch):
    monkeypatch.delenv("STREAMKIT_TOKEN", raising=False)
    args = build_parser().parse_args([])
    assert args.host == "127.0.0.1" and args.port == 8765 and args.token is None
    server = server_from_args(args)
    assert is_loopback(server.host) and server.limits.max_message == 1 << 20
    monkeypatch.setenv("STREAMKIT_TOKEN", "s3cret")
    assert build_parser().parse_args([]).token == "s3cret"
    assert not is_loopback("0.0.0.0") and is_loopback("::1") and is_loopback("localhost")


async def test_token_required(pipelines):
    async with running_server(pipelines, security=Security(token="s3cret")) as server:
        for url in (server.url, server.url + "?token=wrong"):
            with pytest.raises(websockets.InvalidStatus) as err:
                async with websockets.connect(url):
                    pass
            assert err.value.response.status_code == 401
            assert json.loads(err.value.response.body)["code"] == "unauthorized"
        async with StreamClient(server.url, token="s3cret") as c:
            await c.start("echo")
            r = await c.stream_audio(tone(0.1), speed=0)
            assert r.ended
        async with websockets.connect(server.url, additional_headers={"Authorization": "Bearer s3cret"}) as ws:
            await ws.send('{"type":"start","pipeline":"echo"}')
            assert json.loads(await ws.recv())["type"] == "ready"
        status = await asyncio.to_thread(_status, f"http://127.0.0.1:{server.port}/metrics")
        assert status == 401
        assert await asyncio.to_thread(_status, f"http://127.0.0.1:{server.port}/metrics?token=s3cret") == 200


def _status(url):
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


async def test_origin_allow_list(pipelines):
    async with running_server(pipelines, security=Security(allow_origins=["https://app.example"])) as server:
        host = f"127.0.0.1:{server.port}"
        with pytest.raises(websockets.InvalidStatus) as err:
            async with websockets.connect(server.url, origin="https://evil.example"):
                pass
        assert err.value.response.status_code == 403
        for origin in ("https://app.example", f"http://{host}"):  # allow-listed, and the server's own page
            async with websockets.connect(server.url, origin=origin) as ws:
                await ws.send('{"type":"start","pipeline":"echo"}')
                assert json.loads(await ws.recv())["type"] == "ready"
        async with websockets.connect(server.url) as ws:  # no Origin: not a browser
            await ws.send('{"type":"start","pipeline":"echo"}')
            assert json.loads(await ws.recv())["type"] == "ready"


async def test_session_limit(pipelines):
    async with running_server(pipelines, limits=Limits(max_sessions=2, metrics_interval=0)) as server:
        a, b = StreamClient(server.url), StreamClient(server.url)
        await a.connect()
        await b.connect()
        await a.start("echo")
        await b.start("echo")
        async with websockets.connect(server.url) as ws:
            await ws.send('{"type":"start","pipeline":"echo"}')
            event = json.loads(await ws.recv())
            assert event["type"] == "error" and event["code"] == "too_many_sessions" and "2" in event["message"]
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), 5)
            assert closed.value.rcvd.code == 1008
        r = await a.stream_audio(tone(0.1), speed=0)
        assert r.ended
        await a.close()
        for _ in range(100):
            if server.session_count() < 2:
                break
            await asyncio.sleep(0.02)
        async with StreamClient(server.url) as c:  # a slot is free again
            await c.start("echo")
            assert (await c.stream_audio(tone(0.1), speed=0)).ended
        assert (await b.stream_audio(tone(0.1), speed=0)).ended
        await b.close()


async def test_pipeline_session_limit_per_core(pipelines):
    """A pipeline's `sessions_per_core` caps its own sessions on an in-process server (one here:
    0.01 x the cores, at least one); other pipelines still start, and a slot frees at stop."""
    echo = (pipelines / "echo.yaml").read_text()
    (pipelines / "heavy.yaml").write_text(echo.replace("name: echo", "name: heavy", 1) + "sessions_per_core: 0.01\n")
    async with running_server(pipelines, limits=Limits(metrics_interval=0)) as server:
        async with StreamClient(server.url) as first:
            await first.start("heavy")
            async with websockets.connect(server.url) as ws:
                await ws.send('{"type":"start","pipeline":"heavy"}')
                event = json.loads(await ws.recv())
                assert event["type"] == "error" and event["code"] == "too_many_sessions", event
                assert "'heavy' runs at most 1 sessions" in event["message"], event
            async with StreamClient(server.url) as refused:  # the client's typed error
                with pytest.raises(StartRefused) as exc:
                    await refused.start("heavy")
                assert exc.value.code == "too_many_sessions" and exc.value.pipeline == "heavy"
            async with StreamClient(server.url) as other:  # another pipeline is not limited by it
                await other.start("echo")
                assert (await other.stream_audio(tone(0.1), speed=0)).ended
            assert (await first.stream_audio(tone(0.1), speed=0)).ended
        for _ in range(100):
            if server.pipeline_session_count("heavy") == 0:
                break
            await asyncio.sleep(0.02)
        async with StreamClient(server.url) as again:  # its slot is free again
            await again.start("heavy")
            assert (await again.stream_audio(tone(0.1), speed=0)).ended


async def test_message_rate_limit(pipelines):
    async with running_server(pipelines, limits=Limits(rate=50, burst=20, metrics_interval=0)) as server:
        async with websockets.connect(server.url) as ws:
            await ws.send('{"type":"start","pipeline":"echo"}')
            assert json.loads(await ws.recv())["type"] == "ready"
            codes = []
            with pytest.raises(websockets.ConnectionClosed) as closed:
                for _ in range(200):
                    await ws.send(b"\x01\x00\x00")
                while True:
                    msg = await asyncio.wait_for(ws.recv(), 5)
                    if isinstance(msg, str):
                        codes.append(json.loads(msg)["code"])
            assert "rate_limited" in codes
            assert closed.value.rcvd.code == 1008
        async with StreamClient(server.url) as c:  # others are unaffected
            await c.start("echo")
            assert (await c.stream_audio(tone(0.2), speed=0, chunk_s=0.1)).ended
