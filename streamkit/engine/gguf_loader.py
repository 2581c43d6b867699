"""Read a GGUF file (llama or qwen2): config, metadata and dequantized (or raw block) tensors."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import numpy as np

from streamkit.engine.architectures import (
    UnsupportedModelError,
    check_tensor_type,
    config_from_metadata,
    needs_qk_permute,
    neox_to_interleaved,
)
from streamkit.engine.config import LlamaConfig
from streamkit.engine.gguf_file import GGUFFile

log = logging.getLogger("streamkit.engine")


@dataclass
class GGUFModel:
    path: str
    config: LlamaConfig
    metadata: dict
    tensors: dict[str, np.ndarray] = field(repr=False)
    tensor_types: dict[str, str] = field(default_factory=dict, repr=False)
    # raw=True: 2-D tensors as (block format, data) for the native kernels instead of float32 in `tensors`
    blocks: dict[str, tuple[str, np.ndarray]] = field(default_factory=dict, repr=False)


# the formats the native kernels read as stored (Q4_K, Q5_K, Q6_K and Q5_0 repacked exactly into
# their own layouts at load): every tensor type the engine accepts (architectures.TENSOR_TYPES)
NATIVE_BLOCK_TYPES = ("Q4_1", "Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "Q5_0", "F16", "BF16")


def load_gguf(path: str, *, progress: bool = True, raw: bool = False) -> GGUFModel:
    """Config and tensors of a supported GGUF (see `architectures`); unsupported files raise
    `UnsupportedModelError` before any tensor is read. Q/K rows end up in the interleaved-pair rope
    layout whatever the file's architecture stores.

    raw=True (the native CPU path) keeps every 2-D tensor as stored for the native kernels
    (NATIVE_BLOCK_TYPES; F32 as float32) instead of dequantizing it."""
    from gguf.quants import dequantize

    if not os.path.exists(path):
        raise FileNotFoundError(path)
    log.info("engine: reading GGUF %s (%.1f MB)", path, os.path.getsize(path) / 1e6)
    try:
        r = GGUFFile(path)
    except ValueError as e:  # GGUFFormatError
        raise UnsupportedModelError(f"{path} is not a readable GGUF file: {e}") from e
    meta = r.metadata
    cfg = config_from_metadata(meta, {t.name for t in r.tensors})
    for t in r.tensors:
        check_tensor_type(t.name, t.tensor_type.name)
    tensors: dict[str, np.ndarray] = {}
    types: dict[str, str] = {}
    blocks: dict[str, tuple[str, np.ndarray]] = {}
    n = len(r.tensors)
    for i, t in enumerate(r.tensors):
        if progress and i and i % 50 == 0:
            log.info("engine: read %d/%d tensors", i, n)
        shape = t.shape
        kind = t.tensor_type.name
        types[t.name] = kind
        heads = needs_qk_permute(cfg, t.name)
        if raw and len(shape) == 2:
            if kind in NATIVE_BLOCK_TYPES:
                blocks[t.name] = (kind, neox_to_interleaved(t.data, heads) if heads else t.data)
            else:  # F32
                arr = np.asarray(t.data, dtype=np.float32).reshape(shape)
                blocks[t.name] = ("F32", neox_to_interleaved(arr, heads) if heads else arr)
            continue
        arr = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
        if heads:
            arr = neox_to_interleaved(arr, heads)
        elif not arr.flags.writeable:
            arr = arr.copy()
        tensors[t.name] = arr
    log.info("engine: loaded %s (%s): %d layers, dim %d, %d heads (%d kv), vocab %d, %.1fM params",
             meta.get("general.name", "?"), cfg.arch, cfg.n_layers, cfg.dim, cfg.n_heads, cfg.n_kv_heads,
             cfg.vocab_size, cfg.n_params / 1e6)
    return GGUFModel(path=path, config=cfg, metadata=meta, tensors=tensors, tensor_types=types, blocks=blocks)
