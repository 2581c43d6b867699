"""llm and tts stages with the real engine (SmolLM2-135M) and hibari; interruption; the dubbing CLI."""

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from speech import sentences, speech_wav

from streamkit.frames import AudioFrame, Control, ControlKind, TextFrame
from streamkit.pipeline import parse_pipeline
from streamkit.runtime import Session
from streamkit.transport.memory import MemoryTransport

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def engine():
    from streamkit.engine import SamplingParams, get_engine

    eng = get_engine()

    async def warm():
        await eng.complete("Hello", SamplingParams(max_tokens=2))

    asyncio.run(warm())
    return eng


async def open_session(text):
    session = await Session.open(parse_pipeline(text), MemoryTransport())
    got = []
    t0 = time.monotonic()

    async def collect():
        async for f in session.outputs():
            got.append((time.monotonic() - t0, f))

    task = asyncio.create_task(collect())
    task.t0 = t0
    return session, got, task


LLM = "name: t\nstages:\n  - {name: llm, type: llm, %s}\noutput: [llm]\n"


async def test_llm_streams_deltas_then_final(engine):
    session, got, collector = await open_session(LLM % "mode: answer, max_tokens: 24")
    await session.push(TextFrame("What color is the sky on a clear day?", final=True, utterance=7, start=1.0, end=2.5))
    await session.end()
    await collector
    await session.close()
    texts = [f for _, f in got if isinstance(f, TextFrame)]
    pieces = [f for f in texts if not f.final]
    finals = [f for f in texts if f.final]
    assert len(pieces) >= 2 and len(finals) == 1
    assert "".join(p.text for p in pieces).strip() == finals[0].text
    assert all(f.utterance == 7 and f.source == "llm" for f in texts)
    assert finals[0].text.strip()


async def test_llm_prompt_and_messages_modes(engine):
    from streamkit.stage import StageContext
    from streamkit.stages.llm import LLM as Stage

    ctx = StageContext("t", "s")
    p = Stage(Stage.Config(name="x", prompt="Q: {text}\nA:"), ctx)
    assert p.build_prompt("hi") == "Q: hi\nA:"
    m = Stage(Stage.Config(name="x", messages=[{"role": "system", "content": "Be brief."},
                                                {"role": "user", "content": "Say: {text}"}]), ctx)
    assert m.build_prompt("hi")[-1] == {"role": "user", "content": "Say: hi"}
    t = Stage(Stage.Config(name="x", mode="translate", target_language="es"), ctx)
    msgs = t.build_prompt("Good night.")
    assert "Spanish" in msgs[0]["content"] and msgs[-1]["content"] == "Translate to Spanish: Good night."


TTS = "name: t\noutput_audio: {sample_rate: %d}\nstages:\n  - {name: tts, type: tts, voice: af_heart}\noutput: [tts]\n"


@pytest.mark.parametrize("rate", [24000, 16000])
async def test_tts_streams_audible_audio_before_text_is_complete(rate):
    session, got, collector = await open_session(TTS % rate)
    text = "The first sentence is short. The second sentence comes a little later. And then a third one."
    pieces = text.split(" ")
    first_audio_at = None
    pushed_all_at = None
    for i, word in enumerate(pieces):
        await session.push(TextFrame(word + " ", final=False, utterance=0))
        if i == 4:  # "The first sentence is short." is complete: audio must come before the rest exists
            for _ in range(200):
                if any(isinstance(f, AudioFrame) for _, f in got):
                    break
                await asyncio.sleep(0.01)
            first_audio_at = next((t for t, f in got if isinstance(f, AudioFrame)), None)
    pushed_all_at = time.monotonic()
    await session.push(TextFrame(text, final=True, utterance=0))
    await session.end()
    await collector
    await session.close()
    assert first_audio_at is not None, "speech starts before the whole text exists"
    audio = [f for _, f in got if isinstance(f, AudioFrame)]
    assert all(f.sample_rate == rate and f.channels == 1 for f in audio)
    assert max(f.duration for f in audio) <= 0.1 + 1e-6
    samples = np.concatenate([f.samples for f in audio])
    assert 4.0 < len(samples) / rate < 12.0
    assert np.sqrt(np.mean(samples ** 2)) > 0.02 and np.abs(samples).max() <= 1.0
    assert pushed_all_at is not None


async def test_tts_speaks_final_text_of_named_stage():
    spec = "name: t\nstages:\n  - {name: tts, type: tts, speak: [asr]}\noutput: [tts]\n"
    session, got, collector = await open_session(spec)
    frame = TextFrame("Hello there.", final=True, words=[], source="asr")
    await session.push(frame)
    await session.push(TextFrame("ignored", final=True, source="other"))
    await session.end()
    await collector
    await session.close()
    audio = [f for _, f in got if isinstance(f, AudioFrame)]
    assert 0.5 < sum(f.duration for f in audio) < 3.0


async def test_interrupt_cancels_llm_and_tts_within_200ms(engine):
    spec = ("name: t\nstages:\n  - {name: answer, type: llm, mode: answer, max_tokens: 400, temperature: 0.0}\n"
            "  - {name: tts, type: tts}\noutput: [answer, tts]\n")
    session, got, collector = await open_session(spec)
    await session.push(TextFrame("Tell me a long story about a dragon and a knight, with many details.",
                                 final=True, utterance=0))
    for _ in range(1500):
        if any(isinstance(f, AudioFrame) for _, f in got):
            break
        await asyncio.sleep(0.01)
    assert any(isinstance(f, AudioFrame) for _, f in got), "the answer started speaking"
    interrupt_at = time.monotonic() - collector.t0
    await session.push(Control(ControlKind.INTERRUPT))
    await asyncio.sleep(1.5)
    produced = [t for t, f in got if isinstance(f, (AudioFrame, TextFrame)) and f.source in ("answer", "tts")]
    assert max(produced) - interrupt_at <= 0.2, f"output went on {max(produced) - interrupt_at:.3f} s after the interrupt"
    assert not any(isinstance(f, TextFrame) and f.final and f.source == "answer" for _, f in got)
    await session.end()
    await collector
    await session.close()



def test_streamkit_run_dubbing_writes_outputs(tmp_path):
    wav = speech_wav(tmp_path, sentences()[:2])
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "streamkit.cli", "run", str(ROOT / "pipelines" / "dubbing.yaml"),
                           "--input", str(wav), "--output", str(out)], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    transcript = json.loads((out / "transcript.json").read_text())
    from streamkit.speech.wer import wer

    assert wer(" ".join(sentences()[:2]), " ".join(u["text"] for u in transcript)) <= 0.1
    assert "-->" in (out / "transcript.srt").read_text()
    assert (out / "translate.txt").read_text().strip()
    from streamkit.media import read_audio

    dubbed = read_audio(out / "tts.wav", 24000)
    assert len(dubbed) > 24000 and np.sqrt(np.mean(dubbed ** 2)) > 0.01


async def test_assistant_barge_in_cancels_answer(engine):
    """Full assistant pipeline: a spoken question, then the user talks over the answer: the VAD's
    speech_start interrupts the answer's LLM and TTS."""
    from speech import synthesize

    from streamkit.frames import EventFrame
    from streamkit.pipeline import load_pipeline
    from streamkit.speech.whisper import get_whisper

    get_whisper(None, 0, "int8")
    spec = load_pipeline(ROOT / "pipelines" / "assistant.yaml")
    for st in spec.stages:
        if st.type == "llm":
            st.max_tokens = 300
    session = await Session.open(spec, MemoryTransport())
    got = []
    t0 = time.monotonic()

    async def collect():
        async for f in session.outputs():
            got.append((time.monotonic() - t0, f))

    collector = asyncio.create_task(collect())
    question = synthesize("Can you tell me a long story about the sea?")
    silence = np.zeros(1600, np.float32)
    for i in range(0, len(question), 1600):
        await session.push(AudioFrame(question[i:i + 1600], 16000, pts=i / 16000))
    pts = len(question) / 16000
    # keep sending silence (a live microphone) until the answer is being spoken
    for _ in range(300):
        await session.push(AudioFrame(silence, 16000, pts=pts))
        pts += 0.1
        await asyncio.sleep(0.1)
        if any(isinstance(f, AudioFrame) and f.source == "tts" for _, f in got):
            break
    assert any(isinstance(f, AudioFrame) and f.source == "tts" for _, f in got), "the answer is spoken"
    barge = synthesize("Stop, please.")
    for i in range(0, len(barge), 1600):
        await session.push(AudioFrame(barge[i:i + 1600], 16000, pts=pts))
        pts += 0.1
        await asyncio.sleep(0.1)
    for _ in range(10):
        await session.push(AudioFrame(silence, 16000, pts=pts))
        pts += 0.1
        await asyncio.sleep(0.1)
    starts = [t for t, f in got if isinstance(f, EventFrame) and f.name == "speech_start"]
    assert len(starts) >= 2
    barge_at = starts[1]
    ends = [t for t, f in got if isinstance(f, EventFrame) and f.name == "speech_end" and t > barge_at]
    barge_end = ends[0] if ends else got[-1][0]
    late = [t for t, f in got if barge_at + 0.2 < t < barge_end and f.source in ("answer", "tts")
            and isinstance(f, (AudioFrame, TextFrame))]
    late += [t for t, f in got if t > barge_at + 0.2 and isinstance(f, TextFrame) and f.source == "answer"
             and f.utterance == 0]
    assert not late, f"the interrupted answer went on {max(late) - barge_at:.3f} s after the user spoke"
    # the interrupt itself comes out too, so a client drops the answer audio it has queued
    from streamkit.frames import Control, ControlKind

    assert any(isinstance(f, Control) and f.control is ControlKind.INTERRUPT for _, f in got)
    await session.end()
    await collector
    await session.close()


@pytest.mark.redis
async def test_llm_stage_over_remote_engine(redis_url, engine):
    import uuid

    from streamkit.engine.service.worker import run_worker

    prefix = f"speechtest:{uuid.uuid4().hex[:8]}"
    stop = asyncio.Event()
    worker = asyncio.create_task(run_worker(redis_url, stop_event=stop, engine=engine, prefix=prefix))
    try:
        cfg = f"mode: answer, max_tokens: 12, engine: '{redis_url}', engine_prefix: '{prefix}'"
        session, got, collector = await open_session(LLM % cfg)
        await session.push(TextFrame("What is the capital of France?", final=True, utterance=3))
        await session.end()
        await asyncio.wait_for(collector, 120)
        await session.close()
        texts = [f for _, f in got if isinstance(f, TextFrame)]
        finals = [f for f in texts if f.final]
        assert len(finals) == 1 and finals[0].utterance == 3
        assert "".join(f.text for f in texts if not f.final).strip() == finals[0].text
        from streamkit.stage import StageContext
        from streamkit.stages.llm import LLM as Stage

        local = Stage(Stage.Config(name="x", mode="answer", max_tokens=12), StageContext("t", "s"))
        expected = await engine.complete(local.build_prompt("What is the capital of France?"), local.sampling_params())
        assert finals[0].text == expected.strip()  # greedy: the remote engine answers as the local one
    finally:
        stop.set()
        await asyncio.wait_for(worker, 10)
