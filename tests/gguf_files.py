"""Small GGUF files written with gguf's own writer: every tensor type the engine reads, tiny models."""
from __future__ import annotations

import gguf
import numpy as np
from gguf.quants import quantize

QT = gguf.GGMLQuantizationType
K_QUANTS = {"Q4_K": (144, (0, 2)), "Q5_K": (176, (0, 2)), "Q6_K": (210, (208,))}


def random_blocks(kind: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """[rows, row bytes] of `kind` blocks. K-quants (which gguf cannot quantize) get random bits with
    small finite f16 scales; the others are gguf's quantization of random weights."""
    if kind in K_QUANTS:
        size, scale_at = K_QUANTS[kind]
        b = rng.integers(0, 256, (rows, cols // 256, size), dtype=np.uint8)
        for at in scale_at:
            b[..., at:at + 2] = rng.uniform(1e-4, 2e-2, (rows, cols // 256, 1)).astype(np.float16).view(np.uint8)
        return b.reshape(rows, -1)
    w = (rng.standard_normal((rows, cols)) * rng.uniform(0.01, 0.1, (rows, 1))).astype(np.float32)
    if kind == "F32":
        return w
    return quantize(w, QT[kind])


def write_model(path, *, arch: str = "qwen2", layer_types: tuple[str, ...] = ("Q4_K", "Q5_0", "Q8_0", "Q4_1"),
                extra_types: tuple[str, ...] = (), dim: int = 256, ffn: int = 512, heads: int = 4, kv: int = 2,
                layers: int = 2, vocab: int = 300, biases: bool | None = None, rope_freqs: bool = False,
                seed: int = 0) -> None:
    """A random model in `arch`'s tensor layout (llama: `rope_freqs` adds Llama 3.1's rope factors). Layer weights cycle through `layer_types`; each of
    `extra_types` adds one stand-alone tensor `extra.<TYPE>.weight` [16, 512]."""
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(layers)
    w.add_context_length(256)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(1e6)
    w.add_vocab_size(vocab)
    w.add_layer_norm_rms_eps(1e-6)
    hd = dim // heads
    cycle = iter(layer_types * 100)

    def add(name, kind, rows, cols):
        data = random_blocks(kind, rows, cols, rng)
        w.add_tensor(name, data, raw_dtype=None if kind == "F32" else QT[kind])

    add("token_embd.weight", "Q8_0", vocab, dim)
    add("output.weight", "Q6_K" if "Q6_K" in layer_types else "Q8_0", vocab, dim)
    w.add_tensor("output_norm.weight", rng.uniform(0.5, 1.5, dim).astype(np.float32))
    if rope_freqs:  # Llama 3.1's per-frequency rope factors
        w.add_tensor("rope_freqs.weight", rng.uniform(1.0, 8.0, (dim // heads) // 2).astype(np.float32))
    for i in range(layers):
        p = f"blk.{i}."
        for name, rows, cols in (("attn_q", dim, dim), ("attn_k", kv * hd, dim), ("attn_v", kv * hd, dim),
                                 ("attn_output", dim, dim), ("ffn_gate", ffn, dim), ("ffn_up", ffn, dim),
                                 ("ffn_down", dim, ffn)):
            add(p + name + ".weight", next(cycle), rows, cols)
        if biases if biases is not None else arch == "qwen2":
            for name, n in (("attn_q", dim), ("attn_k", kv * hd), ("attn_v", kv * hd)):
                w.add_tensor(p + name + ".bias", rng.standard_normal(n).astype(np.float32) * 0.5)
        w.add_tensor(p + "attn_norm.weight", rng.uniform(0.5, 1.5, dim).astype(np.float32))
        w.add_tensor(p + "ffn_norm.weight", rng.uniform(0.5, 1.5, dim).astype(np.float32))
    for kind in extra_types:
        add(f"extra.{kind}.weight", kind, 16, 512)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
