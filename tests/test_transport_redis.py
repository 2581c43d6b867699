"""The Redis Streams transport against a real redis-server."""

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import redis

from audio_pipelines import RESAMPLE_GAIN, expected_resample_gain, make_flac
import flaky_stages  # noqa: F401  (registers test_flaky_partials here too)
from sessions import run_pipeline
from streamkit.frames import AudioFrame, EventFrame, TextFrame, frames_equal
from streamkit.media import iter_audio
from streamkit.pipeline import parse_pipeline
from streamkit.transport import MemoryTransport
from streamkit.transport.redis import RedisTransport, edge_key, work_key

pytestmark = pytest.mark.redis


def audio_of(frames):
    return np.concatenate([f.samples for f in frames if isinstance(f, AudioFrame)])


async def test_same_output_on_memory_and_redis(tmp_path, redis_url):
    frames = list(iter_audio(make_flac(tmp_path / "chirp.flac"), 16000))
    spec = parse_pipeline(RESAMPLE_GAIN)
    _, on_memory = await run_pipeline(spec, MemoryTransport(), frames)
    transport = RedisTransport(redis_url)
    session, on_redis = await run_pipeline(spec, transport, frames)
    assert len(on_memory) == len(on_redis) > 20
    assert all(frames_equal(a, b) for a, b in zip(on_memory, on_redis))
    np.testing.assert_array_equal(audio_of(on_redis), expected_resample_gain(frames))
    # the session's streams are gone once it is closed
    left = transport.redis
    assert await left.keys(f"sk:{{{session.id}}}:*") == []
    assert edge_key(session.id, "rs", "g") == f"sk:{{{session.id}}}:e:rs:g"
    await transport.aclose()


def start_worker(redis_url: str, stage: str, claim_ms: int = 800) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "streamkit.cli", "-v", "worker", "--stage", stage, "--redis", redis_url,
         "--claim-idle-ms", str(claim_ms)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )


def wait_for_owner(client: redis.Redis, stage: str, timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            pending = client.xpending_range(work_key(stage), "workers", "-", "+", 10)
        except redis.ResponseError:
            pending = []
        if pending:
            return pending[0]["consumer"].decode()
        time.sleep(0.05)
    raise AssertionError(f"no worker took the {stage} announcement")


async def test_killed_worker_is_replaced_with_nothing_lost_or_duplicated(tmp_path, own_redis):
    """Stage rs runs in two worker processes; the one serving the session is SIGKILLed
    mid-stream with inputs pending; the other takes over, replays, and downstream gets
    exactly the frames an uninterrupted run gives."""
    frames = list(iter_audio(make_flac(tmp_path / "chirp.flac", seconds=3.0), 16000, chunk_s=0.02))
    spec = parse_pipeline(RESAMPLE_GAIN)
    _, reference = await run_pipeline(spec, MemoryTransport(), frames)

    workers = [start_worker(own_redis.url, "rs") for _ in range(2)]
    client = redis.Redis.from_url(own_redis.url)
    killed: list[subprocess.Popen] = []

    async def kill_owner(session):
        owner = await asyncio.to_thread(wait_for_owner, client, "rs")
        victim = next(w for w in workers if w.pid == int(owner.split("-")[-2]))
        # wait until the victim has read input it has not acknowledged and has emitted output
        edge_in, edge_out = edge_key(session.id, "input", "rs"), edge_key(session.id, "rs", "g")
        deadline = time.monotonic() + 20
        while not (client.xpending(edge_in, "g")["pending"] > 0 and client.xlen(edge_out) > 0):
            assert time.monotonic() < deadline, "the worker never had pending input"
            await asyncio.sleep(0.02)
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        killed.append(victim)

    try:
        transport = RedisTransport(own_redis.url, remote_stages={"rs"})
        session, collected = await run_pipeline(spec, transport, frames, during=kill_owner, pace=0.002)
        await transport.aclose()
        new_owner = next(w for w in workers if w not in killed)
        assert killed and new_owner.poll() is None
    finally:
        for w in workers:
            w.kill()
            w.wait(10)

    assert "took over stage rs of session " + session.id in new_owner.stderr.read()
    assert len(collected) == len(reference)
    assert all(frames_equal(a, b) for a, b in zip(reference, collected))
    np.testing.assert_array_equal(audio_of(collected), audio_of(reference))


@pytest.mark.parametrize("fault", ["restart", "pause"])
async def test_pipeline_survives_redis_restart_and_pause(tmp_path, own_redis, fault):
    frames = list(iter_audio(make_flac(tmp_path / "chirp.flac", seconds=2.0), 16000, chunk_s=0.02))
    spec = parse_pipeline(RESAMPLE_GAIN)
    _, reference = await run_pipeline(spec, MemoryTransport(), frames)

    async def hurt(session):
        if fault == "restart":
            await asyncio.to_thread(own_redis.restart)
        else:
            own_redis.pause()
            asyncio.get_running_loop().call_later(3.0, own_redis.resume)

    transport = RedisTransport(own_redis.url, retry_s=30)
    _, collected = await run_pipeline(spec, transport, frames, during=hurt, timeout=90)
    await transport.aclose()
    assert len(collected) == len(reference)
    assert all(frames_equal(a, b) for a, b in zip(reference, collected))


async def test_takeover_keeps_finals_exactly_once_when_partials_vary(tmp_path, own_redis):
    """The replayed run emits a different number of partials than the dead worker did; the
    finals, which depend only on the inputs, still arrive exactly once each."""
    spec = parse_pipeline("name: flaky\nstages:\n  - {name: flaky, type: test_flaky_partials}\n")
    frames = []
    for u in range(12):
        frames += [TextFrame(f"u{u}w{w}") for w in range(8)] + [EventFrame("end_utterance")]
    workers = [subprocess.Popen(
        [sys.executable, "-m", "streamkit.cli", "-v", "worker", "--stage", "flaky", "--redis", own_redis.url,
         "--claim-idle-ms", "800", "--plugin", "flaky_stages"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parent)}) for _ in range(2)]
    client = redis.Redis.from_url(own_redis.url)
    killed = []

    async def kill_owner(session):
        owner = await asyncio.to_thread(wait_for_owner, client, "flaky")
        victim = next(w for w in workers if w.pid == int(owner.split("-")[-2]))
        edge_in, edge_out = edge_key(session.id, "input", "flaky"), edge_key(session.id, "flaky", "__out__")
        deadline = time.monotonic() + 20
        # mid-utterance: input read but not acknowledged, and partials already written
        while not (client.xpending(edge_in, "g")["pending"] > 2 and client.xlen(edge_out) > 20):
            assert time.monotonic() < deadline, "the worker never got going"
            await asyncio.sleep(0.005)
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        killed.append(victim)

    try:
        transport = RedisTransport(own_redis.url, remote_stages={"flaky"})
        _, out = await run_pipeline(spec, transport, frames, during=kill_owner, pace=0.004)
        await transport.aclose()
    finally:
        for w in workers:
            w.kill()
            w.wait(10)
    assert killed and "took over stage flaky" in next(w for w in workers if w not in killed).stderr.read()
    finals = [(f.utterance, f.text) for f in out if isinstance(f, TextFrame) and f.final]
    assert finals == [(u, " ".join(f"u{u}w{w}" for w in range(8))) for u in range(12)]
