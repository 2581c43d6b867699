"""Read a Llama-architecture GGUF file: config, metadata and dequantized tensors."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import numpy as np

from streamkit.engine.config import LlamaConfig

log = logging.getLogger("streamkit.engine")


def _field_value(f):
    try:
        return f.contents()
    except Exception:  # older gguf versions
        import gguf

        if f.types and f.types[0] == gguf.GGUFValueType.STRING:
            return bytes(f.parts[f.data[0]]).decode("utf-8", "replace")
        if f.types and f.types[0] == gguf.GGUFValueType.ARRAY:
            return [f.parts[i].tolist()[0] if f.parts[i].size == 1 else bytes(f.parts[i]).decode("utf-8", "replace")
                    for i in f.data]
        return f.parts[f.data[0]].tolist()[0]


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (GGUF interleaved rope -> HF half-split rope)."""
    rows = w.shape[0]
    return (w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


@dataclass
class GGUFModel:
    path: str
    config: LlamaConfig
    metadata: dict
    tensors: dict[str, np.ndarray] = field(repr=False)
    tensor_types: dict[str, str] = field(default_factory=dict, repr=False)
    # raw=True: 2-D tensors as (block format, data) for the native kernels instead of float32 in `tensors`
    blocks: dict[str, tuple[str, np.ndarray]] = field(default_factory=dict, repr=False)


def read_metadata(path: str) -> dict:
    import gguf

    r = gguf.GGUFReader(path)
    return {k: _field_value(f) for k, f in r.fields.items()}


# block formats the native kernels read as they are; other quantized types are re-quantized to Q8_0
NATIVE_BLOCK_TYPES = ("Q4_1", "Q4_0", "Q8_0")


def load_gguf(path: str, *, progress: bool = True, unpermute_qk: bool = False, raw: bool = False) -> GGUFModel:
    """unpermute_qk=False keeps GGUF's interleaved-pair RoPE layout for Q/K rows (what the engine uses).

    raw=True (the native CPU path) keeps every 2-D tensor in a block format instead of dequantizing
    it: Q4_1 / Q4_0 / Q8_0 as stored, F32 / F16 / BF16 as float32, anything else (K-quants, ...)
    re-quantized to Q8_0 (logged: a small loss against the file, at ~1.06 bytes per weight)."""
    import gguf
    from gguf.quants import dequantize, quantize

    if not os.path.exists(path):
        raise FileNotFoundError(path)
    log.info("engine: reading GGUF %s (%.1f MB)", path, os.path.getsize(path) / 1e6)
    r = gguf.GGUFReader(path)
    meta = {k: _field_value(f) for k, f in r.fields.items()}
    arch = meta.get("general.architecture", "llama")
    if arch not in ("llama",):
        log.warning("engine: architecture %r is treated as llama", arch)

    def g(key, default=None):
        return meta.get(f"{arch}.{key}", default)

    names = {t.name for t in r.tensors}
    n_heads = int(g("attention.head_count"))
    n_kv = int(g("attention.head_count_kv", n_heads))
    vocab = g("vocab_size")
    if vocab is None:
        vocab = len(meta.get("tokenizer.ggml.tokens", []))
    scaling = None
    if g("rope.scaling.type") is not None:
        scaling = {"type": g("rope.scaling.type"), "factor": g("rope.scaling.factor")}
    cfg = LlamaConfig(
        n_layers=int(g("block_count")),
        dim=int(g("embedding_length")),
        ffn_dim=int(g("feed_forward_length")),
        n_heads=n_heads,
        n_kv_heads=n_kv,
        vocab_size=int(vocab),
        rope_base=float(g("rope.freq_base", 10000.0)),
        rope_dim=g("rope.dimension_count"),
        norm_eps=float(g("attention.layer_norm_rms_epsilon", 1e-5)),
        context_length=int(g("context_length", 2048)),
        tied_embeddings="output.weight" not in names,
        rope_scaling=scaling,
    )
    tensors: dict[str, np.ndarray] = {}
    types: dict[str, str] = {}
    blocks: dict[str, tuple[str, np.ndarray]] = {}
    requantized: set[str] = set()
    n = len(r.tensors)
    for i, t in enumerate(r.tensors):
        if progress and i and i % 50 == 0:
            log.info("engine: read %d/%d tensors", i, n)
        shape = tuple(int(s) for s in reversed(t.shape.tolist()))
        kind = t.tensor_type.name
        types[t.name] = kind
        if raw and len(shape) == 2:
            if kind in NATIVE_BLOCK_TYPES:
                blocks[t.name] = (kind, t.data)
                continue
            arr = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
            if kind in ("F32", "F16", "BF16"):
                blocks[t.name] = ("F32", arr)
            else:
                requantized.add(kind)
                blocks[t.name] = ("Q8_0", quantize(arr, gguf.GGMLQuantizationType.Q8_0))
            continue
        arr = dequantize(t.data, t.tensor_type)
        arr = np.asarray(arr, dtype=np.float32).reshape(shape)
        if not arr.flags.writeable:
            arr = arr.copy()
        if unpermute_qk and t.name.endswith("attn_q.weight"):
            arr = _unpermute(arr, cfg.n_heads)
        elif unpermute_qk and t.name.endswith("attn_k.weight"):
            arr = _unpermute(arr, cfg.n_kv_heads)
        tensors[t.name] = arr
    if requantized:
        log.info("engine: %s tensors re-quantized to Q8_0 for the native kernels", ", ".join(sorted(requantized)))
    log.info("engine: loaded %s: %d layers, dim %d, %d heads (%d kv), vocab %d, %.1fM params",
             meta.get("general.name", "?"), cfg.n_layers, cfg.dim, cfg.n_heads, cfg.n_kv_heads,
             cfg.vocab_size, cfg.n_params / 1e6)
    return GGUFModel(path=path, config=cfg, metadata=meta, tensors=tensors, tensor_types=types, blocks=blocks)
