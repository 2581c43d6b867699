"""Backpressure (a client that never reads), graceful SIGTERM shutdown and the serve CLI."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import websockets

from streamkit.client import StreamClient
from streamkit.server.limits import Limits
from streamkit.server.testing import running_server, slow_flush_pipeline, tone, write_pipelines

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def pipelines(tmp_path):
    return write_pipelines(tmp_path / "pipelines")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_client_that_never_reads(pipelines):
    """Server memory stays bounded, the stalled client is closed, other sessions carry on."""
    from streamkit.server.telemetry import ERRORS

    limits = Limits(send_timeout=1.5, out_queue=16, metrics_interval=0.2)
    before = ERRORS.value(code="slow_consumer")
    async with running_server(pipelines, limits=limits) as server:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", server.port))
        ws = await websockets.connect(server.url, sock=sock, max_queue=1, max_size=None)
        await ws.send('{"type":"start","pipeline":"echo24"}')
        chunk = b"\x01" + b"\x00\x10" * 16000  # 1 s of audio per message; comes back 1.5x bigger

        async def flood():
            for _ in range(600):
                await ws.send(chunk)

        sender = asyncio.create_task(flood())
        peak_queue = 0
        conn = None
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            conns = list(server.connections)
            if conns:
                conn = conns[0]
                peak_queue = max(peak_queue, len(conn.out))
                if conn.session is not None:
                    for _name, host in conn.session.hosts.items():
                        assert host.inbox.qsize() <= host.inbox.maxsize
            elif conn is not None:
                break  # the server closed the stalled connection
            await asyncio.sleep(0.05)
            if sender.done() and not conns:
                break
        assert conn is not None and server.connection_count() == 0, "the stalled client was not closed"
        assert ERRORS.value(code="slow_consumer") == before + 1
        assert peak_queue <= limits.out_queue + 8 + 1  # keep items + droppable + one coalesced metrics
        sender.cancel()
        await asyncio.gather(sender, return_exceptions=True)
        ws.transport.abort()
        async with StreamClient(server.url) as c:
            await c.start("echo")
            r = await c.stream_audio(tone(0.3), speed=0)
        assert r.ended and len(r.audio) == 2 * 4800


async def test_inprocess_shutdown_flushes(pipelines):
    async with running_server(pipelines, plugins=["streamkit.server.testing"]) as server:
        c = StreamClient(server.url)
        await c.connect()
        await c.start("meter")
        for _ in range(10):
            await c.send_audio(tone(0.1))
        await asyncio.sleep(0.3)
        await server.shutdown()
        result = await c.wait_closed(10)
    finals = [e for e in result.events if e["type"] == "text" and e["final"]]
    assert finals and finals[-1]["text"].startswith("heard 1.00 s")
    assert result.ended and result.close_code == 1001


def _finals(result) -> list[str]:
    return [e["text"] for e in result.events if e["type"] == "text" and e["final"]]


def _error_codes(result) -> list[str]:
    return [e["code"] for e in result.events if e["type"] == "error"]


async def test_a_stop_waits_for_a_flush_that_keeps_making_progress(pipelines):
    """Eight pieces 0.4 s apart (3.2 s) outlast both limits (1.5 s of silence, 1 s in all on
    SIGTERM): a client's stop still gets all of them, as the pipeline never goes 1.5 s without
    output."""
    limits = Limits(shutdown_timeout=1.0, flush_stall_timeout=1.5)
    async with running_server(pipelines, limits=limits) as server:
        async with StreamClient(server.url) as c:
            await c.start("slow_flush")
            result = await c.stream_audio(tone(0.2), speed=0)
    assert _finals(result) == [f"piece {n} of 8" for n in range(1, 9)]
    assert _error_codes(result) == [] and result.ended and result.close_code == 1000


async def test_a_stalled_flush_ends_with_flush_timeout(pipelines):
    """A flush that sends nothing for `flush_stall_timeout` s is given up: the client is told so,
    still gets `end` and a normal close."""
    limits = Limits(flush_stall_timeout=1.0)
    async with running_server(pipelines, limits=limits) as server:
        async with StreamClient(server.url) as c:
            await c.start("stalled_flush")
            result = await c.stream_audio(tone(0.2), speed=0)
    assert _finals(result) == [] and _error_codes(result) == ["flush_timeout"]
    assert result.ended and result.close_code == 1000


async def test_a_shutdown_bounds_a_flush_the_client_started(pipelines):
    """A server shutdown during a client's stop ends that flush after `shutdown_timeout` s even
    though the pipeline is still making progress (the process is about to be killed)."""
    (pipelines / "slow_flush.yaml").write_text(slow_flush_pipeline("slow_flush", pieces=40, gap_s=0.4))
    limits = Limits(shutdown_timeout=1.0, flush_stall_timeout=30.0)
    async with running_server(pipelines, limits=limits) as server:
        c = StreamClient(server.url)
        await c.connect()
        await c.start("slow_flush")
        await c.send_audio(tone(0.2))
        await c.stop()
        await asyncio.sleep(0.5)
        await server.shutdown()
        result = await c.wait_closed(10)
    got = _finals(result)
    assert 0 < len(got) < 40 and got == [f"piece {n} of 40" for n in range(1, len(got) + 1)]
    assert _error_codes(result) == ["flush_timeout"] and result.ended


def _wait_healthy(port: int, proc, timeout: float = 60) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited: {proc.stderr.read().decode()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
                if json.loads(r.read())["status"] in ("ok", "degraded"):
                    return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("server did not come up")


async def test_sigterm_flushes_open_sessions(pipelines):
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamkit.cli", "serve", "--port", str(port), "--pipelines", str(pipelines),
         "--plugin", "streamkit.server.testing"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT)
    try:
        await asyncio.to_thread(_wait_healthy, port, proc)
        clients = [StreamClient(f"ws://127.0.0.1:{port}/ws") for _ in range(3)]
        for i, c in enumerate(clients):
            await c.connect()
            await c.start("meter")
            await c.send_audio(tone(0.5 + 0.25 * i))
        idle = await websockets.connect(f"ws://127.0.0.1:{port}/ws")  # connected, never started
        await asyncio.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        results = [await c.wait_closed(20) for c in clients]
        for i, r in enumerate(results):
            finals = [e for e in r.events if e["type"] == "text" and e["final"]]
            assert finals and finals[-1]["text"].startswith(f"heard {0.5 + 0.25 * i:.2f} s"), r.events
            assert r.ended and r.close_code == 1001
            assert len(r.audio) == 2 * int(16000 * (0.5 + 0.25 * i))  # the audio output was flushed too
        with pytest.raises(websockets.ConnectionClosed):
            await asyncio.wait_for(idle.recv(), 10)
        rc = await asyncio.to_thread(proc.wait, 20)
        assert rc == 0
        assert b"flushing" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_sigterm_sends_final_transcript(tmp_path):
    """Real transcribe pipeline: speech still in progress at SIGTERM comes back as a final transcript."""
    import shutil

    import numpy as np

    src = ROOT / "pipelines" / "transcribe.yaml"
    if not src.exists():
        pytest.skip("pipelines/transcribe.yaml has not landed")
    from speech import synthesize

    pdir = tmp_path / "p"
    pdir.mkdir()
    shutil.copy(src, pdir / "transcribe.yaml")
    speech = synthesize("Please remember to close the window before you leave the house.", 16000)
    loud = np.nonzero(np.abs(speech) > 0.02)[0]
    speech = speech[: loud[-1] - 1600]  # cut inside the last word: no trailing silence at all
    audio = np.concatenate([np.zeros(8000, np.float32), speech])
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "streamkit.cli", "serve", "--port", str(port), "--pipelines", str(pdir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT)
    try:
        await asyncio.to_thread(_wait_healthy, port, proc, 120)
        c = StreamClient(f"ws://127.0.0.1:{port}/ws")
        await c.connect()
        await c.start("transcribe")
        for i in range(0, len(audio), 1600):  # no trailing silence: the VAD has not ended the utterance
            await c.send_audio(audio[i:i + 1600])
        await asyncio.sleep(1.0)
        assert not c.result.transcript  # nothing final yet
        proc.send_signal(signal.SIGTERM)
        result = await c.wait_closed(60)
        assert "close the window" in result.transcript.lower(), result.events
        assert result.ended and result.close_code == 1001
        assert await asyncio.to_thread(proc.wait, 30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_cli_client_exits_0_when_the_server_stops_mid_file(pipelines, tmp_path):
    """`docker compose stop` mid-session: the server flushes and closes (1001) while `streamkit
    client` is still sending; the client prints what it received and exits 0, no traceback."""
    from streamkit.media import write_wav

    wav = tmp_path / "long.wav"
    write_wav(wav, tone(6.0), 16000)
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    server = subprocess.Popen(
        [sys.executable, "-m", "streamkit.cli", "serve", "--port", str(port), "--pipelines", str(pipelines),
         "--plugin", "streamkit.server.testing"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT)
    client = None
    try:
        await asyncio.to_thread(_wait_healthy, port, server)
        client = subprocess.Popen(
            [sys.executable, "-m", "streamkit.cli", "client", "meter", str(wav), "--url", f"ws://127.0.0.1:{port}/ws",
             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT)
        await asyncio.sleep(2.5)  # a second or more of the 6 s file is sent at real-time pace
        server.send_signal(signal.SIGTERM)
        out, err = await asyncio.to_thread(client.communicate, timeout=30)
        lines = [json.loads(line) for line in out.decode().splitlines()]
        finals = [e for e in lines if e.get("type") == "text" and e.get("final")]
        assert finals and finals[-1]["text"].startswith("heard "), lines  # flushed and printed
        summary = lines[-1]
        assert summary["type"] == "summary" and summary["ended"] and summary["cut_short"], summary
        assert summary["close_code"] == 1001
        assert b"Traceback" not in err, err.decode()
        assert client.returncode == 0, err.decode()
    finally:
        for proc in (server, client):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
