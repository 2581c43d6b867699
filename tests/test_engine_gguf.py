"""GGUF reading: architectures and tensor types, refusals, and the tiny qwen2 model on both paths.

Files are written with gguf's own writer (tests/gguf_files.py); every dequantization is compared
with gguf's reference `gguf.quants.dequantize`."""
import gguf
import numpy as np
import pytest
import torch
from gguf.quants import dequantize
from gguf_files import random_blocks, write_model

from streamkit.engine import native
from streamkit.engine.architectures import (
    TENSOR_TYPES,
    UnsupportedModelError,
    neox_to_interleaved,
)
from streamkit.engine.gguf_loader import load_gguf
from streamkit.engine.kv_cache import PagedKVCache
from streamkit.engine.model import LlamaModel, StepBatch

QT = gguf.GGMLQuantizationType
ALL = tuple(TENSOR_TYPES)


@pytest.fixture(scope="module")
def qwen_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("gguf") / "tiny-qwen2.gguf"
    write_model(p, extra_types=ALL)
    return str(p)


def _reference(path: str) -> dict[str, np.ndarray]:
    r = gguf.GGUFReader(path)
    return {t.name: dequantize(t.data, t.tensor_type).reshape(tuple(int(s) for s in reversed(t.shape.tolist())))
            for t in r.tensors}


def test_every_tensor_type_dequantizes_like_gguf(qwen_file):
    gm = load_gguf(qwen_file, progress=False)
    ref = _reference(qwen_file)
    assert {gm.tensor_types[f"extra.{k}.weight"] for k in ALL} == set(ALL)
    cfg = gm.config
    for name, want in ref.items():
        if ".attn_q." in name:
            want = neox_to_interleaved(want, cfg.n_heads)
        elif ".attn_k." in name:
            want = neox_to_interleaved(want, cfg.n_kv_heads)
        assert np.array_equal(gm.tensors[name], want), name


def test_qwen2_config_from_metadata(qwen_file):
    cfg = load_gguf(qwen_file, progress=False).config
    assert (cfg.arch, cfg.qkv_bias, cfg.tied_embeddings) == ("qwen2", True, False)
    assert (cfg.n_layers, cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.rope_base) == (2, 256, 4, 2, 1e6)


def test_neox_permutation_moves_half_split_pairs_together():
    # head of 8 dims stored half-split: pairs are (0, 4), (1, 5), (2, 6), (3, 7)
    rows = np.arange(16)[:, None]
    out = neox_to_interleaved(rows, 2)[:, 0]
    assert out.tolist() == [0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15]


@pytest.mark.parametrize("arch", ["gemma2", "phi3", "mamba"])
def test_other_architectures_are_refused_by_name(tmp_path, arch):
    p = tmp_path / "m.gguf"
    write_model(p, arch=arch, biases=False)
    with pytest.raises(UnsupportedModelError, match=arch):
        load_gguf(str(p), progress=False)


def test_unsupported_tensor_type_is_refused_by_name(tmp_path):
    p = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(p), "llama")
    for k, v in (("block_count", 1), ("embedding_length", 256), ("feed_forward_length", 512),
                 ("attention.head_count", 4)):
        w.add_uint32(f"llama.{k}", v)
    rng = np.random.default_rng(0)
    b = rng.integers(0, 256, (4, 84), dtype=np.uint8)
    b[:, 80:84] = np.array([0.01, 0.01], np.float16).view(np.uint8)  # Q2_K: d, dmin at the end
    w.add_tensor("blk.0.ffn_up.weight", b, raw_dtype=QT.Q2_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedModelError, match=r"blk\.0\.ffn_up\.weight.*Q2_K"):
        load_gguf(str(p), progress=False)


def test_qwen2_without_biases_is_refused(tmp_path):
    p = tmp_path / "m.gguf"
    write_model(p, biases=False)
    with pytest.raises(UnsupportedModelError, match="bias"):
        load_gguf(str(p), progress=False)


def test_garbage_file_gets_a_clear_error(tmp_path):
    p = tmp_path / "m.gguf"
    p.write_bytes(b"GGUF" + b"\xff" * 64)
    with pytest.raises(UnsupportedModelError, match="not a readable GGUF"):
        load_gguf(str(p), progress=False)


def _run(model, ids: list[int]) -> torch.Tensor:
    """Logits of every position of one prefill, then of one decode step after it."""
    cfg = model.cfg
    cache = PagedKVCache(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, 16, 16,
                         getattr(model, "kv_dtype", torch.float32), "cpu", prefix_caching=False)
    model.kv_cache = cache
    blocks: list[int] = []
    n = len(ids)
    assert cache.ensure_capacity(blocks, n + 1)
    pre = model.forward(StepBatch(ids=torch.tensor(ids[:-1]), positions=torch.arange(n - 1),
                                  slots=torch.tensor(cache.slots(blocks, 0, n - 1)), prefills=[(0, n - 1, 0, None)]))
    pre = pre.clone()
    dec = model.forward(StepBatch(ids=torch.tensor(ids[-1:]), positions=torch.tensor([n - 1]),
                                  slots=torch.tensor(cache.slots(blocks, n - 1, n)), n_decode=1,
                                  block_tables=torch.tensor([blocks]), ctx_lens=torch.tensor([n])))
    return torch.cat([pre, dec.clone()])


@pytest.mark.skipif(not native.available(), reason=f"native kernels unavailable: {native.error()}")
def test_tiny_qwen2_native_matches_torch_fp32(qwen_file):
    """Biases, NEOX rope (permuted at load) and the exact Q4_K / Q5_0 repacks: the native kernels'
    fp32 mode against the torch fp32 path on the same file."""
    from streamkit.engine.native.model import NativeLlamaModel

    ids = [5, 17, 200, 3, 99, 150, 42, 7, 8, 250, 1, 64, 33, 12, 77, 290, 4, 2]
    ref = _run(LlamaModel(load_gguf(qwen_file, progress=False), "cpu", weights="fp32"), ids)
    mine = _run(NativeLlamaModel(load_gguf(qwen_file, raw=True, progress=False), "native-fp32"), ids)
    assert torch.allclose(mine, ref, atol=1e-4, rtol=1e-4), (mine - ref).abs().max()


@pytest.mark.skipif(not native.available(), reason=f"native kernels unavailable: {native.error()}")
def test_native_reads_q5_k_f16_and_bf16_as_stored(tmp_path):
    """A model whose layers are Q5_K, F16 and BF16: the native kernels keep each tensor in its own
    format (nothing re-quantized, no float32 copy) and match the torch fp32 path on the same file."""
    from streamkit.engine.native.model import NativeLlamaModel

    path = str(tmp_path / "mixed.gguf")
    write_model(path, layer_types=("Q5_K", "F16", "BF16"), layers=3)
    gm = load_gguf(path, raw=True, progress=False)
    kinds = {kind for name, (kind, _) in gm.blocks.items() if name.startswith("blk.")}
    assert kinds == {"Q5_K", "F16", "BF16"}
    ids = [5, 17, 200, 3, 99, 150, 42, 7, 8, 250, 1, 64, 33, 12, 77, 290, 4, 2]
    ref = _run(LlamaModel(load_gguf(path, progress=False), "cpu", weights="fp32"), ids)
    mine = _run(NativeLlamaModel(gm, "native-fp32"), ids)
    assert torch.allclose(mine, ref, atol=1e-4, rtol=1e-4), (mine - ref).abs().max()


@pytest.mark.skipif(not native.available(), reason=f"native kernels unavailable: {native.error()}")
@pytest.mark.parametrize("kind", ["Q4_K", "Q5_K", "Q6_K", "Q5_0"])
def test_native_repacks_are_bit_identical_to_gguf(kind):
    from streamkit.engine.native.weights import dequantize as native_dequantize
    from streamkit.engine.native.weights import pack

    raw = random_blocks(kind, 24, 512, np.random.default_rng(3))
    packed = pack(kind, raw)
    assert (packed.n, packed.k) == (24, 512)
    assert np.array_equal(native_dequantize(packed), dequantize(raw, QT[kind]).reshape(24, 512))


@pytest.mark.skipif(not native.available(), reason=f"native kernels unavailable: {native.error()}")
@pytest.mark.parametrize("kind", ["Q8_0", "Q5_0", "Q6_K", "Q5_K"])
def test_draft_narrowing_to_q4_0_writes_what_gguf_writes(kind):
    """The draft's Q4_0 narrowing (native kernels) against gguf-py's quantize(dequantize(...)), byte
    for byte; rows of zeros and rows whose largest magnitude is negative included."""
    from gguf.quants import quantize

    from streamkit.engine.native.weights import requantize_q4_0

    rng = np.random.default_rng(5)
    if kind in ("Q8_0", "Q5_0"):
        w = (rng.standard_normal((24, 512)) * rng.uniform(0.01, 0.5, (24, 1))).astype(np.float32)
        w[3] = 0.0
        w[4] = -np.abs(w[4])
        raw = quantize(w, QT[kind])
    else:
        raw = random_blocks(kind, 24, 512, rng)
    want = quantize(dequantize(raw, QT[kind]).reshape(24, 512), QT.Q4_0)
    assert np.array_equal(requantize_q4_0(kind, raw, native.load()), want)


def _native_matmul(w, x: torch.Tensor, amx_min_rows: int, y: torch.Tensor) -> torch.Tensor:
    y = y.clone()
    rc = native.load().sk_matmul(w.fmt, native.ptr(w.qs), native.ptr(w.sc), w.n, w.k, x.shape[0], native.ptr(x),
                                 native.ptr(y), 1, amx_min_rows, 0, 0, 2)
    assert rc == 0
    return y


@pytest.mark.skipif(not native.available(), reason=f"native kernels unavailable: {native.error()}")
@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K"])
@pytest.mark.parametrize("rows", [1, 4, 5, 19])
def test_native_k_quant_matmul(kind, rows):
    """K-quants read in their own layouts: the fp32 FMA path exactly, the AMX path (where present)
    bf16-close; an odd number of 16-column tiles and y += x . W^T."""
    from streamkit.engine.native.weights import dequantize as native_dequantize
    from streamkit.engine.native.weights import pack

    rng = np.random.default_rng(rows)
    n, k = 80, 512
    w = pack(kind, random_blocks(kind, n, k, rng))
    assert w.nbytes <= n * k * {"Q4_K": 0.6, "Q6_K": 0.85}[kind]  # 4 / 6-bit values, 8-bit scales
    x = torch.from_numpy(rng.standard_normal((rows, k)).astype(np.float32))
    y0 = torch.from_numpy(rng.standard_normal((rows, n)).astype(np.float32))
    ref = y0 + x @ torch.from_numpy(native_dequantize(w)).T
    tol = 1e-4 * ref.abs().max()
    assert torch.allclose(_native_matmul(w, x, 0, y0), ref, rtol=1e-5, atol=tol)
    if native.amx() and rows >= 6:
        got = _native_matmul(w, x, 6, y0)
        assert ((got - ref).abs().max() / ref.abs().max()).item() < 1e-2


@pytest.mark.parametrize("isa", native.ISAS)
def test_tiny_qwen2_native_default_is_close_to_fp32(tmp_path, isa):
    """The default native mode of each instruction-set path on a file laid out like Q4_K_M: Q4_K with
    Q6_K attn_v, ffn_down and output (the 17-row prefill on the path's batched kernel, the decode
    step on the few-row one, float16 KV cache). The fused QKV keeps its Q4_K q/k and Q6_K v as two
    parts, as stored (it was re-quantized to Q8_0, whose rounding grew through the layers of random
    weights until this test had to leave such files out)."""
    from streamkit.engine.native import FORMATS
    from streamkit.engine.native.model import NativeLlamaModel

    if not native.available(isa):
        pytest.skip(f"native {isa} path unavailable here: {native.error(isa)}")
    path = str(tmp_path / "kquants.gguf")
    write_model(path, layer_types=("Q4_K", "Q4_K", "Q6_K", "Q4_K", "Q4_K", "Q4_K", "Q6_K"))
    ids = [5, 17, 200, 3, 99, 150, 42, 7, 8, 250, 1, 64, 33, 12, 77, 290, 4, 2]
    ref = _run(LlamaModel(load_gguf(path, progress=False), "cpu", weights="fp32"), ids)
    model = NativeLlamaModel(load_gguf(path, raw=True, progress=False), "native", isa=isa)
    _an, _fn, qkv, _o, gu, _down = model._layers[0]
    assert [(p.fmt, p.n) for p in qkv] == [(FORMATS["Q4_K"], 256 + 128), (FORMATS["Q6_K"], 128)]
    assert [(p.fmt, p.n) for p in gu] == [(FORMATS["Q4_K"], 2 * 512)]
    mine = _run(model, ids)
    assert ((mine - ref).abs().max() / ref.abs().max()).item() < 1e-2


@pytest.mark.parametrize("isa", native.ISAS)
@pytest.mark.parametrize("layer_types", [("Q4_K", "Q4_K", "Q6_K", "Q4_K", "Q4_K", "Q4_K", "Q6_K"),
                                         ("Q4_K", "Q5_0", "Q8_0", "Q4_1")], ids=["q4_k_m", "three-layouts"])
def test_native_decode_with_x_packed_by_each_thread_is_bit_identical(tmp_path, isa, layer_types):
    """A decode step whose fused matrices have parts in two formats, with x packed by each thread for
    itself (sk_gemv.h's mm_gemv_own_team: one share space over the parts' columns; the second file
    needs two layouts of x, Q4_K's and Q8_0's, and a Q4_1 one elsewhere), gives the logits of the
    same step with x packed as the team's shares, bit for bit."""
    from streamkit.engine.native.model import NativeLlamaModel

    if not native.available(isa):
        pytest.skip(f"native {isa} path unavailable here: {native.error(isa)}")
    path = str(tmp_path / "parts.gguf")
    write_model(path, layer_types=layer_types)
    model = NativeLlamaModel(load_gguf(path, raw=True, progress=False), "native", isa=isa)
    assert len({p.fmt for p in model._layers[0][2]}) == 2  # the fused QKV in two formats
    lib = native.load(isa)
    default = lib.sk_gemv_own_x(-1)
    ids = [5, 17, 200, 3, 99, 150, 42, 7, 8, 250]
    try:
        runs = []
        for own in (1, 0):
            lib.sk_gemv_own_x(own)
            runs.append(_run(model, ids))
    finally:
        lib.sk_gemv_own_x(default)
    assert torch.equal(*runs)


@pytest.mark.parametrize("isa", native.ISAS)
@pytest.mark.parametrize("heads, kv, dim", [(2, 2, 128), (8, 2, 384), (10, 2, 800), (7, 1, 896)])
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16, torch.int8])
def test_native_attention_head_layouts_match_torch(tmp_path, isa, heads, kv, dim, kv_dtype):
    """Attention's passes are unrolled by query heads a KV head and by 16-value chunks of a head, and
    the tiny models above all have 2 heads a KV head of 64 values: here 1 of 64, 4 of 48, 5 of 80 (a
    width that does not split into whole passes) and 7 of 128 (the 0.5B draft's group size, the
    1.5B's width), with exact F32 weights against torch on each path: a 39-position prefill (the
    (row, KV head) units) and a decode step over 40 positions (query heads split over the threads),
    with float32, float16 and int8 K/V (int8 rotated in chunks of 64, 16, 16 and 128 values)."""
    from streamkit.engine.native.model import NativeLlamaModel

    if not native.available(isa):
        pytest.skip(f"native {isa} path unavailable here: {native.error(isa)}")
    path = str(tmp_path / "heads.gguf")
    write_model(path, layer_types=("F32",), dim=dim, ffn=256, heads=heads, kv=kv, layers=1)
    ids = np.random.default_rng(heads).integers(0, 300, 40).tolist()
    ref = _run(LlamaModel(load_gguf(path, progress=False), "cpu", weights="fp32"), ids)
    model = NativeLlamaModel(load_gguf(path, raw=True, progress=False), "native-fp32", isa=isa)
    assert model.cfg.head_dim == dim // heads
    model.kv_dtype = kv_dtype
    err = ((_run(model, ids) - ref).abs().max() / ref.abs().max()).item()
    assert err < {torch.float32: 1e-5, torch.float16: 2e-3, torch.int8: 3e-2}[kv_dtype], err


@pytest.mark.skipif(not native.available(), reason=f"native kernels unavailable: {native.error()}")
def test_native_fused_matrix_parts_must_add_up(tmp_path):
    """A part past a fused matrix's rows is refused, and a forward of a layer whose parts are
    missing raises instead of reading what was never set."""
    from streamkit.engine.native.model import NativeLlamaModel

    path = str(tmp_path / "kquants.gguf")
    write_model(path, layer_types=("Q4_K", "Q4_K", "Q6_K", "Q4_K", "Q4_K", "Q4_K", "Q6_K"))
    model = NativeLlamaModel(load_gguf(path, raw=True, progress=False), "native")
    lib, m, P = model._lib, model._m, native.ptr
    an, fn, (qk, v), o, gu, down = model._layers[0]
    assert lib.sk_model_add_part(m, 0, 0, v.fmt, v.n, P(v.qs), P(v.sc)) == -1  # QKV is whole already
    lib.sk_model_set_layer(m, 0, P(an), P(fn), o.fmt, P(o.qs), P(o.sc), down.fmt, P(down.qs), P(down.sc))
    assert lib.sk_model_add_part(m, 0, 0, qk.fmt, qk.n, P(qk.qs), P(qk.sc)) == 0
    with pytest.raises(RuntimeError, match="lacks parts"):
        _run(model, [5, 17, 200])


@pytest.mark.skipif(not native.available(), reason=f"native kernels unavailable: {native.error()}")
def test_tiny_llama3_with_rope_factors_native_matches_torch(tmp_path):
    """A llama file with Llama 3.1's rope_freqs: detected as llama (no permutation, no biases); both
    paths rotate with the factors."""
    from streamkit.engine.model import rope_angles
    from streamkit.engine.native.model import NativeLlamaModel

    path = str(tmp_path / "llama3.gguf")
    write_model(path, arch="llama", biases=False, rope_freqs=True, layer_types=("Q4_K", "Q6_K", "Q8_0"))
    gm = load_gguf(path, progress=False)
    assert (gm.config.arch, gm.config.qkv_bias) == ("llama", False)
    plain = rope_angles(gm.config)
    assert not torch.allclose(rope_angles(gm.config, gm.tensors["rope_freqs.weight"]), plain)
    ids = [5, 17, 200, 3, 99, 150, 42, 7, 8, 250, 1, 64]
    ref = _run(LlamaModel(gm, "cpu", weights="fp32"), ids)
    mine = _run(NativeLlamaModel(load_gguf(path, raw=True, progress=False), "native-fp32"), ids)
    assert ((mine - ref).abs().max() / ref.abs().max()).item() < 1e-5  # fp32, summation order only


def test_unknown_pre_tokenizer_is_refused_by_name():
    from streamkit.engine.tokenizer import Tokenizer

    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "deepseek-coder",
            "tokenizer.ggml.tokens": ["a", "b"], "tokenizer.ggml.merges": []}
    with pytest.raises(NotImplementedError, match="deepseek-coder"):
        Tokenizer(meta)
