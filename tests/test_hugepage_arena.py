"""The huge-page arena (streamkit/engine/arena.py): copies exact, aligned, in mappings advised to
take huge pages; a real model's weights and the CPU KV cache live there."""
from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from streamkit.engine.arena import ALIGN, HugePageArena
from streamkit.engine.kv_cache import PagedKVCache


def _mapping(address: int) -> dict[str, str]:
    """The smaps fields (Rss, VmFlags, ...) of the mapping holding `address` (Linux's /proc/self/smaps)."""
    fields: dict[str, str] | None = None
    with open("/proc/self/smaps") as f:
        for line in f:
            head, _, rest = line.partition(" ")
            if "-" in head and not head.endswith(":"):
                if fields is not None:
                    return fields
                lo, hi = (int(v, 16) for v in head.split("-"))
                fields = {} if lo <= address < hi else None
            elif fields is not None:
                fields[head.rstrip(":")] = rest.strip()
    if fields is None:
        raise AssertionError(f"no mapping holds {address:#x}")
    return fields


def test_placed_arrays_are_exact_aligned_and_kept_apart():
    arena = HugePageArena(segment_bytes=1 << 20)  # small segments, so that placing crosses several
    rng = np.random.default_rng(0)
    arrays = [rng.integers(0, 256, size, dtype=np.uint8) for size in (1, 63, 4097, 300_000, 900_000, 2_500_000)]
    arrays += [rng.standard_normal((37, 11)).astype(np.float32), np.empty(0, np.float32)]
    placed = [arena.place(a) for a in arrays]
    for a, p in zip(arrays, placed):
        assert p.dtype == a.dtype and p.shape == a.shape and p.flags.c_contiguous
        assert np.array_equal(p, a)
        if a.nbytes:
            assert p.ctypes.data % ALIGN == 0
    for p in placed:  # writing one copy leaves the others as they were
        if p.nbytes:
            p.view(np.uint8)[...] = 0
    for a, p in zip(arrays[1:], placed[1:]):
        assert np.array_equal(p, np.zeros_like(a)) or a.nbytes == 0
    assert arena.nbytes == sum(a.nbytes for a in arrays)
    assert all(arena.holds(p) for p in placed if p.nbytes)
    assert not arena.holds(arrays[3])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise(MADV_HUGEPAGE) is Linux's")
def test_the_arena_asks_for_huge_pages():
    arena = HugePageArena()
    p = arena.place(np.ones(3 << 20, np.uint8))
    assert "hg" in _mapping(p.ctypes.data)["VmFlags"].split()  # hg: MADV_HUGEPAGE on this mapping
    assert p.ctypes.data % (2 << 20) == 0  # the first array starts on a huge page's boundary


def test_zeros_are_fresh_memory_after_writes_elsewhere():
    arena = HugePageArena(segment_bytes=1 << 20)
    first = arena.place(np.full(1000, 7, np.int32))
    z = arena.zeros((3, 500), np.float16)
    assert z.shape == (3, 500) and z.dtype == np.float16 and not z.any()
    z[...] = 1
    assert (first == 7).all() and arena.holds(z)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise(MADV_HUGEPAGE) is Linux's")
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_the_cpu_kv_cache_asks_for_huge_pages(dtype):
    cache = PagedKVCache(2, 3, 64, 40, 16, dtype, "cpu")
    for pool in (cache.k, cache.v):
        assert pool.dtype == dtype and pool.shape == (2, 3, 640, 64) and pool.is_contiguous()
        smaps = _mapping(pool.data_ptr())
        assert "hg" in smaps["VmFlags"].split()
        # resident from the start: pages faulted in one by one during a session stalled the dubbing
        assert int(smaps["Rss"].split()[0]) * 1024 >= pool.numel() * pool.element_size()
        assert not pool.any()
    cache.k[1, 2, 5] = 3.0  # the pools are apart
    assert not cache.v.any() and float(cache.k.sum()) == 3.0 * 64


def test_a_kv_cache_in_a_dtype_numpy_lacks_is_torchs():
    cache = PagedKVCache(1, 1, 16, 2, 16, torch.bfloat16, "cpu")
    assert cache.k.dtype == torch.bfloat16 and not cache.k.any()


def test_a_native_models_weights_live_in_its_arena():
    from streamkit.engine import native

    if not native.available():
        pytest.skip(f"native kernels unavailable: {native.error()}")
    from streamkit.engine.gguf_loader import load_gguf
    from streamkit.engine.model_store import resolve_model
    from streamkit.engine.native.model import NativeLlamaModel

    m = NativeLlamaModel(load_gguf(str(resolve_model("smollm2-135m")), raw=True), "native")
    weights = [m._embed, m._head]
    for _an, _fn, qkv, o, gu, down in m._layers:
        weights += [*qkv, o, *gu, down]
    assert all(m._arena.holds(a) for w in weights for a in (w.qs, w.sc) if a.nbytes)
    assert m._arena.nbytes == sum(w.nbytes for w in {id(w): w for w in weights}.values())
