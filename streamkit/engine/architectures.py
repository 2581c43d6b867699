"""Which GGUF models the engine runs: architecture and tensor-type checks, config from metadata.

Supported: `llama` (SmolLM2, Llama 3 with its rope frequency factors / linear rope scaling) and
`qwen2` (Q/K/V biases, untied output head, NEOX rope). Anything else is refused with an error that
names what is unsupported: a GGUF file is untrusted input and a half-understood model writes garbage.
"""
from __future__ import annotations

import numpy as np

from streamkit.engine.config import LlamaConfig

ARCHITECTURES = ("llama", "qwen2")
TENSOR_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
# llama.cpp's GGUF writer permutes llama Q/K rows to the interleaved-pair rope layout the engine uses;
# qwen2 files keep HF's half-split (NEOX) layout, so their Q/K rows are permuted the same way at load
NEOX_ROPE = ("qwen2",)
ROPE_SCALING = (None, "none", "linear")


class UnsupportedModelError(ValueError):
    """The GGUF file describes a model this engine cannot run correctly."""


def _required(meta: dict, key: str):
    if key not in meta:
        raise UnsupportedModelError(f"GGUF metadata lacks {key!r}")
    return meta[key]


def config_from_metadata(meta: dict, tensor_names: set[str]) -> LlamaConfig:
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise UnsupportedModelError(f"GGUF architecture {arch!r} is not supported (supported: {', '.join(ARCHITECTURES)})")

    def g(key, default=None):
        return meta.get(f"{arch}.{key}", default)

    n_heads = int(_required(meta, f"{arch}.attention.head_count"))
    vocab = g("vocab_size") or len(meta.get("tokenizer.ggml.tokens", []))
    scaling_type = g("rope.scaling.type")
    if scaling_type not in ROPE_SCALING:
        raise UnsupportedModelError(f"rope scaling {scaling_type!r} ({arch}) is not supported")
    scaling = {"type": "linear", "factor": g("rope.scaling.factor")} if scaling_type == "linear" else None
    biases = {f"blk.0.attn_{x}.bias" for x in "qkv"} & tensor_names
    if arch == "qwen2" and len(biases) != 3:
        raise UnsupportedModelError("a qwen2 GGUF must have attn_q/k/v biases; this one has "
                                    f"{sorted(biases) or 'none'}")
    if arch == "llama" and biases:
        raise UnsupportedModelError(f"llama GGUF with attention biases ({sorted(biases)}) is not supported")
    cfg = LlamaConfig(
        n_layers=int(_required(meta, f"{arch}.block_count")),
        dim=int(_required(meta, f"{arch}.embedding_length")),
        ffn_dim=int(_required(meta, f"{arch}.feed_forward_length")),
        n_heads=n_heads,
        n_kv_heads=int(g("attention.head_count_kv", n_heads)),
        vocab_size=int(vocab),
        rope_base=float(g("rope.freq_base", 10000.0)),
        rope_dim=g("rope.dimension_count"),
        norm_eps=float(g("attention.layer_norm_rms_epsilon", 1e-5)),
        context_length=int(g("context_length", 2048)),
        tied_embeddings="output.weight" not in tensor_names,
        rope_scaling=scaling,
        arch=arch,
        qkv_bias=bool(biases),
    )
    if cfg.dim % cfg.n_heads or cfg.n_heads % cfg.n_kv_heads:
        raise UnsupportedModelError(f"{arch}: {cfg.n_heads} heads / {cfg.n_kv_heads} KV heads do not divide width {cfg.dim}")
    return cfg


def check_tensor_type(name: str, type_name: str) -> None:
    if type_name not in TENSOR_TYPES:
        raise UnsupportedModelError(f"tensor {name!r} has type {type_name}, which the engine does not read "
                                    f"(supported: {', '.join(TENSOR_TYPES)})")


def neox_to_interleaved(rows: np.ndarray, n_head: int) -> np.ndarray:
    """Reorder the rows of a Q or K weight (any row format: float, or GGUF blocks per row) or bias
    from the half-split rope layout to interleaved pairs: llama.cpp's own permutation for llama files."""
    n = rows.shape[0]
    return np.ascontiguousarray(rows.reshape(n_head, 2, n // n_head // 2, *rows.shape[1:])
                                .swapaxes(1, 2).reshape(rows.shape))


def needs_qk_permute(cfg: LlamaConfig, name: str) -> int:
    """Heads to permute over for tensor `name` (0: leave it as stored)."""
    if cfg.arch not in NEOX_ROPE:
        return 0
    if ".attn_q." in name:
        return cfg.n_heads
    if ".attn_k." in name:
        return cfg.n_kv_heads
    return 0
