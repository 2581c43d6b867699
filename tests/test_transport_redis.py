"""The Redis Streams transport against a real redis-server."""


import flaky_stages  # noqa: F401  (registers test_flaky_partials here too)
import numpy as np
import pytest
from audio_pipelines import RESAMPLE_GAIN, expected_resample_gain, make_flac
from faults import (
    kill_owner_during,
    redis_fault_during,
    start_workers,
    stop_workers,
    survivor_log,
)
from sessions import run_pipeline

from streamkit.frames import AudioFrame, EventFrame, TextFrame, frames_equal
from streamkit.media import iter_audio
from streamkit.pipeline import parse_pipeline
from streamkit.transport import MemoryTransport
from streamkit.transport.redis import RedisTransport
from streamkit.transport.redis_edges import edge_key

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


async def test_killed_worker_is_replaced_with_nothing_lost_or_duplicated(tmp_path, own_redis):
    """Stage rs runs in two worker processes; the one serving the session is SIGKILLed
    mid-stream with inputs pending; the other takes over, replays, and downstream gets
    exactly the frames an uninterrupted run gives."""
    frames = list(iter_audio(make_flac(tmp_path / "chirp.flac", seconds=3.0), 16000, chunk_s=0.02))
    spec = parse_pipeline(RESAMPLE_GAIN)
    _, reference = await run_pipeline(spec, MemoryTransport(), frames)

    workers = start_workers(own_redis.url, "rs")
    killed: list = []

    def pending_and_written(client, session_id):
        # the worker has read input it has not acknowledged, and has emitted output
        return (client.xpending(edge_key(session_id, "input", "rs"), "g")["pending"] > 0
                and client.xlen(edge_key(session_id, "rs", "g")) > 0)

    try:
        transport = RedisTransport(own_redis.url, remote_stages={"rs"})
        kill = kill_owner_during(own_redis.url, "rs", workers, killed, pending_and_written)
        session, collected = await run_pipeline(spec, transport, frames, during=kill, pace=0.002)
        await transport.aclose()
        assert all(w.poll() is None for w in workers if w not in killed)
    finally:
        stop_workers(workers)

    assert "took over stage rs of session " + session.id in survivor_log(workers, killed)
    assert len(collected) == len(reference)
    assert all(frames_equal(a, b) for a, b in zip(reference, collected))
    np.testing.assert_array_equal(audio_of(collected), audio_of(reference))


@pytest.mark.parametrize("fault", ["restart", "pause"])
async def test_pipeline_survives_redis_restart_and_pause(tmp_path, own_redis, fault):
    frames = list(iter_audio(make_flac(tmp_path / "chirp.flac", seconds=2.0), 16000, chunk_s=0.02))
    spec = parse_pipeline(RESAMPLE_GAIN)
    _, reference = await run_pipeline(spec, MemoryTransport(), frames)

    transport = RedisTransport(own_redis.url, retry_s=30)
    _, collected = await run_pipeline(spec, transport, frames, during=redis_fault_during(own_redis, fault),
                                      timeout=90)
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
    workers = start_workers(own_redis.url, "flaky", plugins=("flaky_stages",))
    killed: list = []

    def mid_utterance(client, session_id):
        # input read but not acknowledged, and partials already written
        return (client.xpending(edge_key(session_id, "input", "flaky"), "g")["pending"] > 2
                and client.xlen(edge_key(session_id, "flaky", "__out__")) > 20)

    try:
        transport = RedisTransport(own_redis.url, remote_stages={"flaky"})
        kill = kill_owner_during(own_redis.url, "flaky", workers, killed, mid_utterance)
        _, out = await run_pipeline(spec, transport, frames, during=kill, pace=0.004)
        await transport.aclose()
    finally:
        stop_workers(workers)
    assert "took over stage flaky" in survivor_log(workers, killed)
    finals = [(f.utterance, f.text) for f in out if isinstance(f, TextFrame) and f.final]
    assert finals == [(u, " ".join(f"u{u}w{w}" for w in range(8))) for u in range(12)]


async def test_undecodable_entry_is_skipped_without_moving_the_checkpoint(own_redis):
    from streamkit.frames import encode_frame
    from streamkit.transport.redis_edges import (
        GROUP,
        RedisInbox,
        SessionState,
        ckpt_key,
        ensure_group,
    )

    transport = RedisTransport(own_redis.url)
    r = transport.redis
    key = edge_key("badentry", "input", "s")
    await ensure_group(r, key)
    await r.hset(ckpt_key("badentry"), "s", b"saved")
    await r.xadd(key, {"f": b"\xc1 not a frame"})
    await r.xadd(key, {"f": encode_frame(TextFrame("good"))})
    inbox = RedisInbox(r, [key], "c1", SessionState(), retry_s=5, checkpoint=(ckpt_key("badentry"), "s", []))
    delivery = await inbox.get()
    assert delivery.frame.text == "good"
    assert (await r.xpending(key, GROUP))["pending"] == 1  # the bad entry is acknowledged, the good one not yet
    assert await r.hget(ckpt_key("badentry"), "s") == b"saved"
    await transport.aclose()
