"""vad + asr on real models (Silero VAD from faster-whisper, tiny.en) with hibari speech."""

import asyncio
import time

import numpy as np
import pytest
from speech import sentences, speech_audio, synthesize

from streamkit.frames import AudioFrame, EventFrame, TextFrame
from streamkit.media import paced
from streamkit.pipeline import parse_pipeline
from streamkit.runtime import Session
from streamkit.speech.vad import Segmenter
from streamkit.speech.wer import wer
from streamkit.transport.memory import MemoryTransport

VAD_ASR = """
name: t
input: {audio: {sample_rate: 16000}}
stages:
  - {name: vad, type: vad, min_silence_ms: 300}
  - {name: asr, type: asr%s}
output: [asr]
"""


@pytest.fixture(scope="module", autouse=True)
def warm_models():
    """Load the models once up front, as a server does at startup, so timing-sensitive tests
    measure streaming and not model loading."""
    from streamkit.speech.vad import get_vad_model
    from streamkit.speech.whisper import get_whisper

    get_whisper(None, 0, "int8")
    get_vad_model()


def chunks(audio, rate=16000, step=0.05):
    n = int(rate * step)
    return [AudioFrame(audio[i:i + n], rate, pts=i / rate) for i in range(0, len(audio), n)]


async def run(spec_text, audio, rate=16000, speed=None):
    """Feed audio (paced at `speed` x real time, or as fast as possible); (clock, frame) list."""
    session = await Session.open(parse_pipeline(spec_text), MemoryTransport())
    out = []
    t0 = time.monotonic()

    async def feed():
        frames = chunks(audio, rate)
        if speed:
            async for f in paced(frames, speed):
                await session.push(f)
        else:
            for f in frames:
                await session.push(f)
        await session.end()

    feeder = asyncio.create_task(feed())
    async for f in session.outputs():
        out.append((time.monotonic() - t0, f))
    await feeder
    stages = {name: host.stage for name, host in session.hosts.items()}
    await session.close()
    return out, stages


def test_vad_segments_sentences():
    audio, spans = speech_audio(sentences()[:3], gap_s=0.8)
    seg = Segmenter(min_silence_ms=300)
    events = []
    for i in range(0, len(audio), 800):
        events += seg.process(audio[i:i + 800])
    events += seg.flush()
    starts = [p["start"] for k, p in events if k == "start"]
    ends = [p["end"] for k, p in events if k == "end"]
    assert len(starts) == len(ends) == 3
    for (s, v, _e), a, b in zip(spans, starts, ends):
        assert s - 0.3 <= a <= s + 0.3 and v - 0.3 <= b <= v + 0.4
    speech = sum(len(p[1]) for k, p in events if k == "audio") / 16000
    assert speech < len(audio) / 16000 - 1.5  # silence between sentences is not passed on


async def test_transcript_matches_and_events_ordered():
    texts = sentences()[:2]
    audio, spans = speech_audio(texts, gap_s=0.8)
    out, _ = await run(VAD_ASR % "", audio, speed=1.5)
    frames = [f for _, f in out]
    finals = [f for f in frames if isinstance(f, TextFrame) and f.final]
    assert len(finals) == 2
    assert wer(" ".join(texts), " ".join(f.text for f in finals)) <= 0.1
    for u, f in enumerate(finals):
        assert f.utterance == u and f.language == "en"
        assert f.words and f.words[0].start >= f.start - 0.01 and f.words[-1].end <= f.end + 0.01
        assert spans[u][0] - 0.45 <= f.start <= spans[u][0] + 0.3 and abs(f.end - spans[u][1]) < 0.5
        idx = frames.index(f)
        before = frames[:idx]
        partials = [p for p in before if isinstance(p, TextFrame) and not p.final and p.utterance == u]
        assert partials, "partial hypotheses arrive before the final"
        ends = [i for i, e in enumerate(before) if isinstance(e, EventFrame) and e.name == "speech_end"]
        starts = [i for i, e in enumerate(before) if isinstance(e, EventFrame) and e.name == "speech_start"]
        assert len(ends) == u + 1 and len(starts) == u + 1, "final comes after its speech_end"
        assert frames.index(partials[0]) > starts[-1]


async def test_long_utterance_window_cuts_no_repeats():
    texts = sentences()[3:7]
    audio = np.concatenate([synthesize(t) for t in texts])  # ~17 s, no pauses long enough to end
    spec = VAD_ASR.replace("min_silence_ms: 300", "min_silence_ms: 3000") % ", max_window_s: 6"
    out, stages = await run(spec, audio, speed=3.0)
    finals = [f for _, f in out if isinstance(f, TextFrame) and f.final]
    text = " ".join(f.text for f in finals)
    assert stages["asr"].trims >= 1, "the window was cut at least once"
    assert wer(" ".join(texts), text) <= 0.1, text
    ws = [w.text.lower().strip(".,?!") for f in finals for w in f.words]
    assert not any(a == b and a not in ("the",) for a, b in zip(ws, ws[1:])), ws
    times = [w.start for f in finals for w in f.words]
    assert times == sorted(times)


async def test_asr_without_vad_finalises_at_end():
    text = sentences()[8]
    audio = np.concatenate([np.zeros(8000, np.float32), synthesize(text), np.zeros(8000, np.float32)])
    spec = "name: t\nstages:\n  - {name: asr, type: asr}\noutput: [asr]\n"
    out, _ = await run(spec, audio)
    finals = [f for _, f in out if isinstance(f, TextFrame) and f.final]
    assert len(finals) == 1 and wer(text, finals[0].text) <= 0.1


@pytest.mark.parametrize("fmt", ["mp3", "webm"])
async def test_capture_decodes_compressed_files(tmp_path, fmt):
    import av

    text = sentences()[9]
    audio = synthesize(text, 48000)
    path = tmp_path / f"speech.{fmt}"
    codec = {"mp3": "libmp3lame", "webm": "libopus"}[fmt]
    with av.open(str(path), "w") as out:
        st = out.add_stream(codec, rate=48000, layout="mono")
        frame_len = 960
        pcm = (np.clip(audio, -1, 1) * 32767).astype(np.int16)
        for i in range(0, len(pcm) - frame_len, frame_len):
            fr = av.AudioFrame.from_ndarray(pcm[None, i:i + frame_len], format="s16", layout="mono")
            fr.sample_rate = 48000
            fr.pts = i
            for p in st.encode(fr):
                out.mux(p)
        for p in st.encode(None):
            out.mux(p)
    spec = ("name: t\nstages:\n  - {name: capture, type: capture, sample_rate: 16000}\n"
            "  - {name: asr, type: asr}\noutput: [capture, asr]\n")
    session = await Session.open(parse_pipeline(spec), MemoryTransport())
    got = []

    async def collect():
        async for f in session.outputs():
            got.append(f)

    c = asyncio.create_task(collect())
    await session.push(EventFrame("open", {"url": str(path)}))
    await session.end()
    await c
    await session.close()
    pcm = [f for f in got if isinstance(f, AudioFrame)]
    assert pcm and all(f.sample_rate == 16000 for f in pcm)
    assert abs(sum(f.num_samples for f in pcm) / 16000 - len(audio) / 48000) < 0.15
    finals = [f for f in got if isinstance(f, TextFrame) and f.final]
    assert finals and wer(text, finals[-1].text) <= 0.1


async def test_capture_resamples_client_pcm():
    spec = "name: t\nstages:\n  - {name: capture, type: capture, sample_rate: 16000}\noutput: [capture]\n"
    session = await Session.open(parse_pipeline(spec), MemoryTransport())
    tone = np.sin(np.arange(44100) * 2 * np.pi * 440 / 44100).astype(np.float32) * 0.5
    stereo = np.stack([tone, tone], axis=1)
    frames = [AudioFrame(stereo[i:i + 4410], 44100, channels=2, pts=i / 44100) for i in range(0, 44100, 4410)]
    got = [f for f in await session.run_to_end(frames) if isinstance(f, AudioFrame)]
    total = sum(f.num_samples for f in got)
    assert all(f.sample_rate == 16000 and f.channels == 1 for f in got)
    assert abs(total - 16000) < 200
