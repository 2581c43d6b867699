"""Speech logic without models: WER, LocalAgreement, sentence splitting, PCM decoding."""

import numpy as np
import pytest

from streamkit.speech.agreement import HypothesisBuffer, TimedWord, join_words
from streamkit.speech.synth import SentenceSplitter, packaged_voice
from streamkit.speech.wer import corpus_wer, normalize, wer


def words(text, start=0.0, step=0.3):
    return [TimedWord(" " + w, start + i * step, start + (i + 1) * step) for i, w in enumerate(text.split())]


def test_normalize_and_wer():
    assert normalize("The train leaves at Seven O'Clock!") == ["the", "train", "leaves", "at", "7", "oclock"]
    assert wer("the cat sat", "The cat, sat.") == 0.0
    assert wer("the cat sat", "the cat") == pytest.approx(1 / 3)
    assert corpus_wer(["a b", "c d"], ["a b"]) == 0.5


def test_agreement_commits_common_prefix_only():
    hb = HypothesisBuffer()
    assert hb.insert(words("the quick brown")) == []
    got = hb.insert(words("the quick brown fox jumps"))
    assert [w.key for w in got] == ["the", "quick", "brown"]
    assert [w.key for w in hb.insert(words("the quick brown fox leaps over"))] == ["fox"]
    hb.finish(words("the quick brown fox jumps over the dog"))
    assert join_words(hb.committed) == "the quick brown fox jumps over the dog"


def test_agreement_no_repeat_at_window_cut():
    hb = HypothesisBuffer()
    hb.insert(words("one two three four"))
    hb.insert(words("one two three four five"))
    assert join_words(hb.committed) == "one two three four"
    # the window was cut after "four" (t=1.2); a new decode re-hears "three four" with
    # slightly shifted times: they must not be committed twice
    later = [TimedWord(" three", 1.05, 1.15), TimedWord(" four", 1.15, 1.3), TimedWord(" five", 1.3, 1.6)]
    hb.insert(later)
    hb.finish(later + [TimedWord(" six", 1.6, 1.9)])
    assert join_words(hb.committed) == "one two three four five six"


def test_sentence_splitter_streams_sentences():
    sp = SentenceSplitter(first_min_chars=1000)
    out = []
    for piece in ["Hola. ", "Me llamo", " Ana. Vivo en", " Madrid, con el Dr. Pérez."]:
        out += sp.feed(piece)
    assert out == ["Hola.", "Me llamo Ana."]
    assert sp.flush() == ["Vivo en Madrid, con el Dr. Pérez."]


def test_sentence_splitter_cuts_first_clause_early():
    sp = SentenceSplitter(first_min_chars=20)
    assert sp.feed("Well, the weather today is lovely, and ") == ["Well, the weather today is lovely,"]
    assert sp.feed("tomorrow it rains") == []  # the next piece: a sentence end or twice the length


def test_voice_names():
    assert packaged_voice("af_heart") == "heart"
    with pytest.raises(ValueError):
        packaged_voice("no_such_voice")


def test_sentence_splitter_first_piece_word_boundary():
    sp = SentenceSplitter(first_min_chars=1000, first_max_chars=20)
    out = sp.feed("El libro de la casa grande es")
    assert out == ["El libro de la casa"]
    assert sp.feed(" muy bonito y") == []  # the second piece may be cut past 40 characters
    assert sp.feed(" viejo. Hola") == ["grande es muy bonito y viejo."]


def test_sentence_splitter_early_pieces_double():
    """Without a sentence end, each early piece is cut at a word boundary past twice the limit of
    the one before (12, 24, 48 characters), until the limits pass max_chars."""
    sp = SentenceSplitter(max_chars=60, first_min_chars=12, first_max_chars=12)
    words = "Comencemos con una actualización rápida de cada equipo y luego hablaremos del presupuesto del año"
    out = []
    for word in words.split(" "):
        out += sp.feed(word + " ")
    assert out == ["Comencemos", "con una actualización", "rápida de cada equipo y luego hablaremos del"]
    assert [len(p) for p in out] == [10, 21, 44]
    assert sp.feed("que viene sin prisa") == []  # 96 > max_chars: whole sentences (or max_chars) again
    assert sp.flush() == ["presupuesto del año que viene sin prisa"]


def test_vad_ignores_clicks_and_silence():
    from streamkit.speech.vad import Segmenter

    seg = Segmenter(min_speech_ms=96)
    rng = np.random.default_rng(0)
    audio = np.zeros(16000 * 2, np.float32)
    audio[16000:16000 + 400] = rng.standard_normal(400).astype(np.float32) * 0.5  # a 25 ms click
    events = seg.process(audio) + seg.flush()
    assert [k for k, _ in events if k != "audio"] == []


async def test_asr_finals_hold_the_cores_urgently_and_partials_do_not():
    """The final's decode (what captions and the translation wait for) holds the ASR's threads
    urgently, so an in-process engine pauses for it; partial decodes only narrow its team."""
    import speech

    from streamkit import cores, events
    from streamkit.frames import AudioFrame, EventFrame, TextFrame
    from streamkit.stage import StageContext
    from streamkit.stages.asr import ASR

    stage = ASR(ASR.Config(name="asr", model="tiny.en", speculative=False), StageContext("t", "s"))
    await stage.start()
    seen: list[tuple[bool, int, int]] = []
    decode = stage.decoder.decode

    def spy(audio, prompt, *args):
        seen.append((bool(cores.urgent()), cores.held(), len(audio)))
        return decode(audio, prompt, *args)

    stage.decoder.decode = spy
    audio = speech.synthesize(speech.sentences()[0])
    out = [f async for f in stage.process(EventFrame(events.SPEECH_START, {"start": 0.0}))]
    for i in range(0, len(audio), 1600):
        out += [f async for f in stage.process(AudioFrame(audio[i:i + 1600], 16000, pts=i / 16000))]
        if stage._partial is not None:  # let each partial decode finish before more audio comes
            await stage._partial
    out += [f async for f in stage.process(EventFrame(events.SPEECH_END, {}))]
    finals = [f for f in out if isinstance(f, TextFrame) and f.final]
    assert len(finals) == 1 and finals[0].text, out
    assert seen[-1][:2] == (True, stage.threads), seen
    assert len(seen) > 1 and all(s[:2] == (False, stage.threads) for s in seen[:-1]), seen


async def _utterances(stage, clips: list[np.ndarray], rate: int) -> list:
    from streamkit import events
    from streamkit.frames import AudioFrame, EventFrame, TextFrame

    out, t = [], 0.0
    for clip in clips:
        out += [f async for f in stage.process(EventFrame(events.SPEECH_START, {"start": t}))]
        step = rate // 10
        for i in range(0, len(clip), step):
            out += [f async for f in stage.process(AudioFrame(clip[i:i + step], rate, pts=t + i / rate))]
        out += [f async for f in stage.process(EventFrame(events.SPEECH_END, {}))]
        t += len(clip) / rate + 1.0
    return [f for f in out if isinstance(f, TextFrame) and f.final]


@pytest.mark.parametrize("condition", [True, False])
async def test_asr_prompts_an_utterance_with_the_finals_before_it(condition):
    """condition_on_previous: the decodes of an utterance get the session's earlier finals as
    Whisper's prompt (real telephone prompts, two utterances), and a restored stage keeps them."""
    import recordings

    from streamkit.stage import StageContext
    from streamkit.stages.asr import ASR

    recordings.require()
    config = ASR.Config(name="asr", model="tiny.en", speculative=False, partials=False, condition_on_previous=condition)
    stage = ASR(config, StageContext("t", "s"))
    await stage.start()
    prompts: list[str] = []
    decode = stage.decoder.decode

    def spy(audio, prompt, *args):
        prompts.append(prompt)
        return decode(audio, prompt, *args)

    stage.decoder.decode = spy
    clips = [recordings.load("conf-getpin"), recordings.load("conf-invalidpin")]
    finals = await _utterances(stage, clips, recordings.RATE)
    assert len(finals) == 2 and len(prompts) == 2, (finals, prompts)
    assert prompts[0] == ""
    assert prompts[1] == (finals[0].text if condition else ""), prompts
    restored = ASR(config, StageContext("t", "s"))
    restored.restore(stage.snapshot())
    assert restored.previous == stage.previous == (f"{finals[0].text} {finals[1].text}" if condition else "")


def test_loop_cut_keeps_phrases_that_come_back_and_cuts_repeats():
    """Whisper in a shortened context can loop; a phrase said again later is speech, not a loop."""
    from streamkit.speech.whisper import _loop_start

    menu = "4 or 6 to decrease or increase the conference volume 7 or 9 to decrease or increase your volume"
    assert _loop_start(menu.split(), 8) is None
    assert _loop_start("call forward on no answer call forward on no answer".split(), 8) == 5
    assert _loop_start("thank you thank you thank you thank you".split(), 8) == 2
    assert _loop_start("no no I said no".split(), 8) is None
    assert _loop_start("so so so so so so so so".split(), 8) == 1


def test_one_cache_root_for_models_and_kernels(monkeypatch, tmp_path):
    """Joined models and compiled kernels are found under one root; each override moves what it names."""
    from streamkit import cache

    for name in ("STREAMKIT_CACHE_DIR", "STREAMKIT_MODEL_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache.root() == tmp_path / "home" / ".cache" / "streamkit"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.models_dir() == tmp_path / "xdg" / "streamkit" / "models"
    monkeypatch.setenv("STREAMKIT_CACHE_DIR", str(tmp_path / "sk"))
    assert (cache.models_dir(), cache.native_dir()) == (tmp_path / "sk" / "models", tmp_path / "sk" / "native")
    monkeypatch.setenv("STREAMKIT_MODEL_CACHE", str(tmp_path / "models"))
    assert (cache.models_dir(), cache.native_dir()) == (tmp_path / "models", tmp_path / "sk" / "native")


def test_dubbing_bench_counts_the_silence_a_listener_hears():
    """bench dubbing's stall: pieces played back to back as they arrive; a piece that arrives after
    the one before has finished leaves a silence, one that arrives early waits its turn."""
    from streamkit.bench.dubbing import _stall_s
    from streamkit.frames import AudioFrame

    def frame(seconds: float) -> AudioFrame:
        return AudioFrame(np.zeros(int(24000 * seconds), np.float32), 24000)

    # 0.5 s piece at 1.0 (plays to 1.5), the next at 2.0 (0.5 s of silence, plays to 3.0), one at 2.5 (queued)
    assert _stall_s([(1.0, frame(0.5)), (2.0, frame(1.0)), (2.5, frame(0.2))]) == pytest.approx(0.5)
    assert _stall_s([(1.0, frame(0.5)), (1.2, frame(0.5))]) == 0.0
    assert _stall_s([]) == 0.0
