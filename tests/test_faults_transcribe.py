"""Issue 7: the transcription pipeline over Redis keeps every word, once, through faults:
an ASR worker SIGKILLed with messages pending, redis-server restarted, redis-server paused."""

import asyncio
import signal
import subprocess
import sys
import time

import pytest
import redis

from sessions import run_pipeline
from speech import sentences, speech_audio
from streamkit.frames import AudioFrame, TextFrame
from streamkit.pipeline import find_pipeline, load_pipeline
from streamkit.transport import MemoryTransport
from streamkit.transport.redis import RedisTransport, edge_key, work_key

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


def start_worker(url: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "streamkit.cli", "-v", "worker", "--stage", "asr", "--redis", url,
                             "--claim-idle-ms", "1000"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


async def test_asr_worker_killed_with_pending_messages(own_redis, reference_words):
    workers = [start_worker(own_redis.url) for _ in range(2)]
    client = redis.Redis.from_url(own_redis.url)
    killed: list[subprocess.Popen] = []

    async def kill_owner(session):
        deadline = time.monotonic() + 60
        edge = edge_key(session.id, "vad", "asr")
        while time.monotonic() < deadline:
            pending = client.xpending_range(work_key("asr"), "workers", "-", "+", 1)
            if pending and client.xpending(edge, "g")["pending"] > 0:
                pid = int(pending[0]["consumer"].decode().split("-")[-2])
                victim = next(w for w in workers if w.pid == pid)
                victim.send_signal(signal.SIGKILL)
                victim.wait(10)
                killed.append(victim)
                return
            await asyncio.sleep(0.05)
        raise AssertionError("the asr worker never had pending input")

    try:
        transport = RedisTransport(own_redis.url, remote_stages={"asr"})
        out = await transcribe(transport, audio_frames(), during=kill_owner, pace=0.02)
        await transport.aclose()
    finally:
        for w in workers:
            w.kill()
            w.wait(10)
    survivor = next(w for w in workers if w not in killed)
    assert "took over stage asr" in survivor.stderr.read()
    assert final_words(out) == reference_words


@pytest.mark.parametrize("fault", ["restart", "pause"])
async def test_redis_restart_and_pause_keep_every_word(own_redis, reference_words, fault):
    async def hurt(session):
        if fault == "restart":
            await asyncio.to_thread(own_redis.restart)
        else:
            own_redis.pause()
            asyncio.get_running_loop().call_later(3.0, own_redis.resume)

    transport = RedisTransport(own_redis.url, retry_s=60)
    out = await transcribe(transport, audio_frames(), during=hurt)
    await transport.aclose()
    assert final_words(out) == reference_words
