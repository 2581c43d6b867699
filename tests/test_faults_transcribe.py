"""Issue 7: the transcription pipeline over Redis keeps every word, once, through faults:
an ASR worker SIGKILLed with messages pending, redis-server restarted, redis-server paused."""

import asyncio

import pytest
from faults import (
    kill_owner_during,
    redis_fault_during,
    start_workers,
    stop_workers,
    survivor_log,
)
from sessions import run_pipeline
from speech import sentences, speech_audio

from streamkit.frames import AudioFrame, TextFrame
from streamkit.pipeline import find_pipeline, load_pipeline
from streamkit.transport import MemoryTransport
from streamkit.transport.redis import RedisTransport
from streamkit.transport.redis_edges import edge_key

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def audio_frames(n_sentences: int = 3, chunk_s: float = 0.1) -> list[AudioFrame]:
    audio, _ = speech_audio(sentences()[:n_sentences], rate=16000, gap_s=1.0)
    chunk = int(16000 * chunk_s)
    return [AudioFrame(audio[i:i + chunk], 16000, pts=i / 16000) for i in range(0, len(audio), chunk)]


def final_words(frames) -> list[tuple[int, str]]:
    """(utterance, word) of every final transcript: the words and the utterance they belong to."""
    return [(f.utterance, w) for f in frames if isinstance(f, TextFrame) and f.final and f.source == "asr"
            for w in f.text.split()]


async def transcribe(transport, frames, **kwargs):
    _, out = await run_pipeline(load_pipeline(find_pipeline("transcribe")), transport, frames, **kwargs)
    return out


@pytest.fixture(scope="module")
def reference_words():
    words = final_words(asyncio.run(transcribe(MemoryTransport(), audio_frames())))
    assert len(words) > 20
    return words


async def test_asr_worker_killed_with_pending_messages(own_redis, reference_words):
    workers = start_workers(own_redis.url, "asr", claim_ms=1000)
    killed: list = []

    def asr_has_pending_input(client, session_id):
        return client.xpending(edge_key(session_id, "vad", "asr"), "g")["pending"] > 0

    try:
        transport = RedisTransport(own_redis.url, remote_stages={"asr"})
        kill = kill_owner_during(own_redis.url, "asr", workers, killed, asr_has_pending_input)
        out = await transcribe(transport, audio_frames(), during=kill, pace=0.02)
        await transport.aclose()
    finally:
        stop_workers(workers)
    assert "took over stage asr" in survivor_log(workers, killed)
    assert final_words(out) == reference_words


@pytest.mark.parametrize("fault", ["restart", "pause"])
async def test_redis_restart_and_pause_keep_every_word(own_redis, reference_words, fault):
    transport = RedisTransport(own_redis.url, retry_s=60)
    out = await transcribe(transport, audio_frames(), during=redis_fault_during(own_redis, fault))
    await transport.aclose()
    assert final_words(out) == reference_words
