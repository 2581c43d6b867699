import asyncio
from typing import AsyncIterator, Literal

import numpy as np
from audio_pipelines import RESAMPLE_GAIN, expected_resample_gain, make_flac

from streamkit.frames import AudioFrame, Control, ControlKind, EventFrame, Frame, TextFrame, VideoFrame
from streamkit.media import iter_audio
from streamkit.pipeline import parse_pipeline
from streamkit.runtime import Session
from streamkit.stage import Stage, StageConfig, register_stage
from streamkit.transport import MemoryChannel, MemoryTransport


async def test_resample_gain_on_decoded_flac_matches_direct_computation(tmp_path):
    frames = list(iter_audio(make_flac(tmp_path / "chirp.flac"), 16000))
    assert len(frames) == 20 and frames[0].sample_rate == 16000
    session = await Session.open(parse_pipeline(RESAMPLE_GAIN), MemoryTransport())
    out = await session.run_to_end(frames)
    audio = [f for f in out if isinstance(f, AudioFrame)]
    assert all(f.source == "g" and f.sample_rate == 24000 for f in audio)
    got = np.concatenate([f.samples for f in audio])
    want = expected_resample_gain(frames)
    assert got.shape == want.shape == (48000,)
    np.testing.assert_array_equal(got, want)
    pts = [f.pts for f in audio]
    assert pts == sorted(pts) and abs(pts[-1] + audio[-1].duration - 2.0) < 1e-6


async def test_fan_out_feeds_both_branches_every_frame():
    spec = parse_pipeline("""
name: fan
stages:
  - {name: up, type: gain, db: 0}
  - {name: loud, type: gain, db: 6, input: up}
  - {name: quiet, type: gain, db: -6, input: up}
output: [loud, quiet]
""")
    frames = [AudioFrame(np.full(160, 0.1, np.float32), 16000, pts=i * 0.01) for i in range(30)]
    out = await (await Session.open(spec, MemoryTransport())).run_to_end(frames)
    by_source = {name: [f for f in out if isinstance(f, AudioFrame) and f.source == name] for name in ("loud", "quiet")}
    assert [len(v) for v in by_source.values()] == [30, 30]
    assert np.allclose(by_source["loud"][0].samples, 0.1 * 10 ** (6 / 20))
    assert np.allclose(by_source["quiet"][0].samples, 0.1 * 10 ** (-6 / 20))


# ---------------------------------------------------------------- stages made for these tests


@register_stage("test_upper")
class Upper(Stage):
    """Upper-cases text; fails on the word 'boom' (for the error test)."""

    class Config(StageConfig):
        type: Literal["test_upper"] = "test_upper"

    accepts = (TextFrame,)

    async def process(self, frame: Frame) -> AsyncIterator[Frame]:
        if frame.text == "boom":
            raise RuntimeError("cannot shout boom")
        yield TextFrame(frame.text.upper(), utterance=frame.utterance)


@register_stage("test_slow_words")
class SlowWords(Stage):
    """Emits a text's words one by one, slowly; stops when interrupted."""

    class Config(StageConfig):
        type: Literal["test_slow_words"] = "test_slow_words"
        delay: float = 0.05

    accepts = (TextFrame,)
    interruptible = True

    async def start(self) -> None:
        self.interrupted = 0

    async def process(self, frame: Frame) -> AsyncIterator[Frame]:
        for word in frame.text.split():
            await asyncio.sleep(self.config.delay)
            yield TextFrame(word, final=False)

    async def interrupt(self) -> None:
        self.interrupted += 1


async def test_stage_error_becomes_error_event_and_session_goes_on():
    spec = parse_pipeline("name: t\nstages:\n  - {name: up, type: test_upper}\n")
    frames = [TextFrame("hello"), TextFrame("boom"), TextFrame("world")]
    out = await (await Session.open(spec, MemoryTransport())).run_to_end(frames)
    texts = [f.text for f in out if isinstance(f, TextFrame)]
    errors = [f for f in out if isinstance(f, EventFrame) and f.name == "error"]
    assert texts == ["HELLO", "WORLD"]
    assert len(errors) == 1 and errors[0].data["stage"] == "up" and "cannot shout boom" in errors[0].data["message"]


async def test_frames_a_stage_does_not_accept_pass_through_in_order():
    spec = parse_pipeline("name: t\nstages:\n  - {name: up, type: test_upper}\n  - {name: g, type: gain}\noutput: [up, g]\n")
    frames = [TextFrame("a"), EventFrame("speech_start", {"n": 1}), TextFrame("b")]
    session = await Session.open(spec, MemoryTransport())
    out = await session.run_to_end(frames)
    # the event passes both stages (it is neither stage's output, so it is not session output)
    assert [f.text for f in out if isinstance(f, TextFrame)] == ["A", "B"]
    assert session.hosts["g"].stats.frames_in == 4  # A, event, B, EOS


async def test_interrupt_cancels_in_flight_work_immediately():
    spec = parse_pipeline("name: t\nstages:\n  - {name: talk, type: test_slow_words, delay: 0.2}\n")
    session = await Session.open(spec, MemoryTransport())
    await session.push(TextFrame("one two three four five six seven eight"))
    first = await session.next_output()
    assert first.text == "one"
    await session.interrupt()
    rest = []
    await session.end()
    async for f in session.outputs():
        rest.append(f)
    await session.close()
    words = [f.text for f in rest if isinstance(f, TextFrame)]
    # "two" may already be on its way; the other six words are never produced
    assert len(words) <= 1
    assert session.hosts["talk"].stage.interrupted == 1
    assert [f.control for f in rest if isinstance(f, Control)] == [ControlKind.INTERRUPT]  # reaches the client


@register_stage("test_slow_words_strict")
class StrictSlowWords(SlowWords):
    class Config(StageConfig):
        type: Literal["test_slow_words_strict"] = "test_slow_words_strict"
        delay: float = 0.05

    interruptible = False


async def test_interrupt_never_cuts_a_non_interruptible_stage_short():
    spec = parse_pipeline("name: t\nstages:\n  - {name: talk, type: test_slow_words_strict, delay: 0.05}\n")
    session = await Session.open(spec, MemoryTransport())
    await session.push(TextFrame("one two three four"))
    await session.interrupt()
    await session.end()
    out = [f async for f in session.outputs()]
    await session.close()
    # the interrupt is handled after the frame in front of it, in order
    assert [f.text if isinstance(f, TextFrame) else f.control for f in out] == [
        "one", "two", "three", "four", ControlKind.INTERRUPT]
    assert session.hosts["talk"].stage.interrupted == 1


async def test_backpressure_blocks_the_producer_instead_of_growing_queues():
    spec = parse_pipeline("name: t\nstages:\n  - {name: talk, type: test_slow_words, delay: 0.01, queue_size: 2}\n")
    session = await Session.open(spec, MemoryTransport(sink_size=4))
    inbox: MemoryChannel = session.wiring.inboxes["talk"]
    pushed = 0

    async def produce():
        nonlocal pushed
        for i in range(50):
            await session.push(TextFrame(f"w{i}"))
            pushed += 1

    producer = asyncio.create_task(produce())
    await asyncio.sleep(0.3)  # nobody reads the output
    assert inbox.qsize() <= 2 and session.wiring.sink.qsize() <= 4
    assert pushed < 10
    got = []

    async def consume():
        async for f in session.outputs():
            got.append(f)

    consumer = asyncio.create_task(consume())
    await producer
    await session.end()
    await consumer
    await session.close()
    assert [f.text for f in got if isinstance(f, TextFrame)] == [f"w{i}" for i in range(50)]


async def test_video_overflow_policy_drops_only_video_and_counts_it():
    channel = MemoryChannel(3, overflow="drop_oldest", name="detect")
    image = np.zeros((4, 4, 3), np.uint8)
    for i in range(5):
        await channel.put(VideoFrame(image, pts=i, index=i))
    assert channel.dropped == 2
    assert [(await channel.get()).frame.index for _ in range(3)] == [2, 3, 4]
    blocking = MemoryChannel(1, overflow="drop_oldest")
    await blocking.put(TextFrame("keep"))
    put = asyncio.create_task(blocking.put(TextFrame("waits")))
    await asyncio.sleep(0.05)
    assert not put.done() and blocking.dropped == 0  # text is never dropped: the producer waits
    assert (await blocking.get()).frame.text == "keep"
    await put


async def test_flush_control_reaches_every_stage_and_session_output_ends():
    spec = parse_pipeline(RESAMPLE_GAIN)
    session = await Session.open(spec, MemoryTransport())
    await session.push(AudioFrame(np.zeros(1600, np.float32), 16000))
    await session.push(Control(ControlKind.FLUSH))
    await session.end()
    out = [f async for f in session.outputs()]
    await session.close()
    assert sum(f.num_samples for f in out if isinstance(f, AudioFrame)) == 2400
    assert all(t.done() for t in session._tasks)
