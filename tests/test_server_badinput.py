"""Bad input on the websocket: each gets an error event naming what was wrong, and the server and
every other session keep working (issue 7)."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
import websockets

from streamkit.client import StreamClient
from streamkit.server.limits import Limits
from streamkit.server.testing import running_server, tone, write_pipelines

START = json.dumps({"type": "start", "pipeline": "echo", "params": {},
                    "audio": {"sample_rate": 16000, "format": "s16le", "channels": 1}})


@pytest.fixture
def pipelines(tmp_path):
    return write_pipelines(tmp_path / "pipelines")


async def next_json(ws, timeout=5.0, skip=("metrics",)):
    while True:
        msg = await asyncio.wait_for(ws.recv(), timeout)
        if isinstance(msg, str):
            event = json.loads(msg)
            if event["type"] not in skip:
                return event


async def expect_error(ws, code, contains=None):
    event = await next_json(ws)
    assert event["type"] == "error", event
    assert event["code"] == code, event
    assert set(event) == {"type", "code", "message"} and event["message"]
    if contains:
        assert contains in event["message"], event
    return event


async def healthy(server):
    """Another session works end to end."""
    async with StreamClient(server.url) as c:
        await c.start("echo")
        r = await c.stream_audio(tone(0.2), speed=0)
    assert r.ended and len(r.audio) == 2 * 3200 and not r.errors


@pytest.fixture
async def server(pipelines):
    async with running_server(pipelines, limits=Limits(max_message=64 * 1024, metrics_interval=0)) as s:
        yield s


async def test_messages_before_start(server):
    async with websockets.connect(server.url) as ws:
        await ws.send("not json at all")
        await expect_error(ws, "bad_json")
        await ws.send('{"type":"start","pipeline":"echo"')  # truncated
        await expect_error(ws, "bad_json")
        await ws.send("[1,2,3]")
        await expect_error(ws, "bad_message", "object")
        await ws.send('{"type":"hello"}')
        await expect_error(ws, "unknown_type", "hello")
        await ws.send('{"type":"start","pipeline":42}')
        await expect_error(ws, "bad_message", "pipeline")
        await ws.send('{"type":"start","pipeline":"nonesuch"}')
        await expect_error(ws, "unknown_pipeline", "nonesuch")
        await ws.send(b"\x01\x00\x00")
        await expect_error(ws, "not_started", "before start")
        await ws.send('{"type":"stop"}')
        await expect_error(ws, "not_started")
        await ws.send(b"")
        await expect_error(ws, "empty_message")
        await ws.send(b"\x07abc")
        await expect_error(ws, "unknown_kind", "0x07")
        await ws.send(json.dumps({"type": "start", "pipeline": "echo", "audio": {"sample_rate": 7}}))
        await expect_error(ws, "bad_audio_format", "sample_rate")
        await ws.send(json.dumps({"type": "start", "pipeline": "echo", "audio": {"format": "mp3"}}))
        await expect_error(ws, "bad_audio_format", "format")
        # after all that the same connection can still start a session
        await ws.send(START)
        assert (await next_json(ws))["type"] == "ready"
        await ws.send(b"\x01" + b"\x00\x10" * 160)
        await ws.send('{"type":"stop"}')
        got = b""
        while True:
            msg = await asyncio.wait_for(ws.recv(), 5)
            if isinstance(msg, bytes):
                got += msg[1:]
            elif json.loads(msg)["type"] == "end":
                break
        assert len(got) == 320
    await healthy(server)


async def test_errors_during_session(server):
    async with websockets.connect(server.url) as ws:
        await ws.send(START)
        assert (await next_json(ws))["type"] == "ready"
        await ws.send(START)
        await expect_error(ws, "already_started")
        await ws.send(b"\x01\x00\x00\x00")  # 3 bytes: not whole s16le samples
        await expect_error(ws, "bad_audio", "3 bytes")
        await ws.send(b"\x09")
        await expect_error(ws, "unknown_kind")
        await ws.send(b"\x02" + b"\xff\xd8\xff\xe0garbage")  # corrupt JPEG into an audio pipeline
        await expect_error(ws, "unexpected_video")
        await ws.send("{{{")
        await expect_error(ws, "bad_json")
        # the session itself is unharmed
        await ws.send(b"\x01" + b"\x00\x10" * 100)
        msg = await asyncio.wait_for(ws.recv(), 5)
        assert isinstance(msg, bytes) and len(msg) == 201
    await healthy(server)


@pytest.mark.parametrize("size,expect_event", [(80 * 1024, True), (200 * 1024, False)])
async def test_oversized_closes_1009(server, size, expect_event):
    async with websockets.connect(server.url, max_size=None) as ws:
        await ws.send(START)
        assert (await next_json(ws))["type"] == "ready"
        await ws.send(b"\x01" + b"\0" * size)
        events = []
        with pytest.raises(websockets.ConnectionClosed) as closed:
            while True:
                msg = await asyncio.wait_for(ws.recv(), 5)
                if isinstance(msg, str):
                    events.append(json.loads(msg))
        assert closed.value.rcvd.code == 1009
        if expect_event:  # within twice the limit the client is told which message was too big
            err = [e for e in events if e["type"] == "error"][-1]
            assert err["code"] == "message_too_big" and str(65536) in err["message"]
    await healthy(server)


async def test_oversized_text_before_start(server):
    async with websockets.connect(server.url) as ws:
        await ws.send(json.dumps({"type": "start", "pipeline": "echo", "params": {"pad": "x" * 70000}}))
        await expect_error(ws, "message_too_big")
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 5)
        assert closed.value.rcvd.code == 1009
    await healthy(server)


async def test_invalid_utf8_and_truncated_frames(server):
    # invalid UTF-8 in a text frame: the protocol layer closes with 1007, the server survives
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert b" 101 " in head
    # a masked binary frame header claiming 1000 bytes, then only 10, then hang up
    writer.write(bytes([0x82, 0x80 | 126]) + (1000).to_bytes(2, "big") + b"\0\0\0\0" + b"\1" * 10)
    await writer.drain()
    writer.close()
    await asyncio.sleep(0.2)
    await healthy(server)
    for _ in range(50):
        if server.connection_count() == 0:
            break
        await asyncio.sleep(0.05)
    assert server.connection_count() == 0


async def test_video_pipeline_corrupt_jpeg(tmp_path):
    import cv2

    d = tmp_path / "p"
    d.mkdir()
    (d / "vid.yaml").write_text(
        "name: vid\ninput: {video: {fps: 10}}\nstages:\n  - {name: gain, type: gain}\noutput: [gain]\n")
    async with running_server(d, limits=Limits(metrics_interval=0)) as server:
        async with websockets.connect(server.url) as ws:
            await ws.send('{"type":"start","pipeline":"vid"}')
            assert (await next_json(ws))["type"] == "ready"
            await ws.send(b"\x02not a jpeg")
            await expect_error(ws, "bad_jpeg", "not a JPEG")
            ok, good = cv2.imencode(".jpg", np.full((32, 32, 3), 128, np.uint8))
            body = good.tobytes()
            await ws.send(b"\x02" + body[: len(body) // 3])  # truncated: header fine, data cut
            await expect_error(ws, "bad_jpeg", "truncated")
            await ws.send(b"\x02" + body[:40] + b"\x00" * 50 + body[90:])  # corrupt middle
            await expect_error(ws, "bad_jpeg", "corrupt")
            await ws.send(b"\x02" + body)
            await ws.send(b"\x01\x00\x00")
            await expect_error(ws, "unexpected_audio")
            huge = bytearray(body)
            i = huge.find(b"\xff\xc0")
            huge[i + 5:i + 9] = (60000).to_bytes(2, "big") * 2  # claims 60000 x 60000 pixels
            await ws.send(b"\x02" + bytes(huge))
            await expect_error(ws, "bad_jpeg", "exceeds")
            await ws.send('{"type":"stop"}')
            while (await next_json(ws, skip=("metrics", "error")))["type"] != "end":
                pass
        assert server.session_count() == 0


async def test_random_message_sequences(server):
    """Seeded random junk and valid messages in random order on live connections: every reply is
    a protocol message, no internal error, nothing hangs, and the server stays healthy."""
    import random

    rng = random.Random(1234)

    def junk() -> str | bytes:
        r = rng.random()
        if r < 0.15:
            return START
        if r < 0.22:
            return '{"type":"stop"}'
        if r < 0.35:
            return b"\x01" + rng.randbytes(rng.choice([0, 1, 2, 3, 64, 321]))
        if r < 0.45:
            return b"\x02" + rng.choice([b"", b"\xff\xd8", b"\xff\xd8\xff\xc0\x00\x11" + rng.randbytes(40)])
        if r < 0.6:
            return rng.randbytes(rng.randint(0, 50))
        if r < 0.75:
            return json.dumps(rng.choice([{}, [], 1, "x", None, {"type": None}, {"type": "start", "pipeline": rng.random()},
                                          {"type": "start", "pipeline": "echo", "audio": {"sample_rate": rng.randint(-5, 10**6)}}]))
        return "".join(chr(rng.randint(1, 0x2FFF)) for _ in range(rng.randint(0, 40)))

    for _ in range(12):
        async with websockets.connect(server.url) as ws:
            for _ in range(25):
                await ws.send(junk())
            await ws.send('{"type":"stop"}')
            replies = []
            try:
                while True:
                    msg = await asyncio.wait_for(ws.recv(), 2)
                    if isinstance(msg, str):
                        replies.append(json.loads(msg))
                    if replies and replies[-1]["type"] == "end":
                        break
            except (asyncio.TimeoutError, TimeoutError, websockets.ConnectionClosed):
                pass
            for event in replies:
                assert event["type"] in ("ready", "error", "end", "metrics"), event
                if event["type"] == "error":
                    assert event["code"] != "internal_error", event
    await healthy(server)
    for _ in range(100):
        if server.session_count() == 0:
            break
        await asyncio.sleep(0.02)
    assert server.session_count() == 0
