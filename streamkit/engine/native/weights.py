"""GGUF weight blocks -> the (qs, sc) arrays the native kernels read (layouts in sk_kernels.c)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from streamkit.engine.native import FORMATS

BLOCK = 32
_BLOCK_BYTES = {"Q4_1": 20, "Q4_0": 18, "Q8_0": 34}


@dataclass
class PackedWeight:
    fmt: int
    n: int  # output rows
    k: int  # inputs
    qs: np.ndarray  # quantized values (or float32 for F32), C-contiguous
    sc: np.ndarray  # float32 scales (empty for F32)

    @property
    def nbytes(self) -> int:
        return self.qs.nbytes + self.sc.nbytes


def greedy_head_bytes(head: PackedWeight) -> int:
    """What a greedy step of few rows reads of the LM head: its 4-bit copy where sk_head4.h's
    h4_format keeps one (a Q8_0 head's in Q4_1, 24 bytes a block of 32; a Q6_K head's in the kernels'
    Q4_K, 152 bytes a super-block of 256), else the head."""
    if head.n % 16 == 0 and head.fmt == FORMATS["Q8_0"] and head.k % BLOCK == 0:
        return head.n * (head.k // BLOCK) * 24
    if head.n % 16 == 0 and head.fmt == FORMATS["Q6_K"] and head.k % 256 == 0:
        return head.n * (head.k // 256) * 152
    return head.nbytes


def _f16(blocks: np.ndarray, at: int) -> np.ndarray:
    return np.ascontiguousarray(blocks[..., at:at + 2]).view(np.float16)[..., 0].astype(np.float32)


# GGUF bytes of a K-quant super-block (256 values) and the kernels' qs bytes for them (sk_repack.h)
_K_QUANT_BYTES = {"Q4_K": (144, 128), "Q5_K": (176, 160), "Q6_K": (210, 192)}


def _kernels(lib, type_name: str):
    """`lib`, else the default path's kernels, which repack `type_name` (RuntimeError without them)"""
    from streamkit.engine import native

    lib = lib if lib is not None else native.load()
    if lib is None:
        raise RuntimeError(f"repacking {type_name} needs the native kernels: {native.error()}")
    return lib


def _k_quant_blocks(type_name: str, data: np.ndarray, lib) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K / Q6_K super-blocks in the kernels' SK_Q4_K / SK_Q5_K / SK_Q6_K layouts
    (sk_dequant.h), repacked by the kernels' sk_repack: qs [n, blocks of 32, 16 / 20 / 24 bytes],
    sc [n, super-blocks, 6] (24 bytes each). Every value is the file's, bit for bit."""
    from streamkit.engine import native

    file_bytes, qs_bytes = _K_QUANT_BYTES[type_name]
    n = data.shape[0]
    src = np.ascontiguousarray(data)
    nsb = src.nbytes // (n * file_bytes)
    qs = np.empty((n, nsb * 8, qs_bytes // 8), np.uint8)
    sc = np.empty((n, nsb, 6), np.float32)
    if _kernels(lib, type_name).sk_repack(FORMATS[type_name], native.ptr(src), n * nsb, native.ptr(qs),
                                          native.ptr(sc)):
        raise ValueError(f"the native kernels do not repack {type_name}")
    return qs, sc


def _q5_0_as_q8_0(data: np.ndarray, lib) -> tuple[np.ndarray, np.ndarray]:
    """Q5_0 blocks (f16 d, 32 high bits, 16 nibble bytes) as Q8_0 (sk_repack_q5_0): int8 q - 16 with
    the same d, qs [n, blocks, 32] and d [n, blocks]."""
    from streamkit.engine import native

    n = data.shape[0]
    src = np.ascontiguousarray(data)
    nb = src.nbytes // (n * 22)
    qs, d = np.empty((n, nb, 32), np.uint8), np.empty((n, nb), np.float32)
    _kernels(lib, "Q5_0").sk_repack_q5_0(native.ptr(src), n * nb, native.ptr(qs), native.ptr(d))
    return qs, d


def pack(type_name: str, data: np.ndarray, lib=None) -> PackedWeight:
    """data: the tensor as GGUF stores it, [n, row bytes] uint8 for block formats and BF16, [n, k]
    float32 / float16 for F32 / F16. Q4_K, Q5_K and Q6_K are repacked exactly into the kernels'
    SK_Q4_K / SK_Q5_K / SK_Q6_K layouts, Q5_0 into Q8_0, by the kernels of `lib` (default: the
    default path's); F16 and BF16 are read as stored."""
    if type_name in ("F16", "BF16"):
        qs = np.ascontiguousarray(data).view(np.uint16).reshape(data.shape[0], -1)
        return PackedWeight(FORMATS[type_name], qs.shape[0], qs.shape[1], qs, np.empty(0, np.float32))
    if type_name in _K_QUANT_BYTES:
        qs, sc = _k_quant_blocks(type_name, data, lib)
        return PackedWeight(FORMATS[type_name], data.shape[0], qs.shape[1] * BLOCK, qs, sc)
    if type_name == "Q5_0":
        qs, sc = _q5_0_as_q8_0(data, lib)
        return PackedWeight(FORMATS["Q8_0"], data.shape[0], qs.shape[1] * BLOCK, qs, sc)
    if type_name == "F32":
        w = np.ascontiguousarray(data, dtype=np.float32)
        return PackedWeight(FORMATS["F32"], w.shape[0], w.shape[1], w, np.empty(0, np.float32))
    if type_name not in _BLOCK_BYTES:
        raise ValueError(f"the native kernels do not read {type_name} blocks")
    n = data.shape[0]
    nb = data.shape[1] // _BLOCK_BYTES[type_name]
    blocks = data.reshape(n, nb, _BLOCK_BYTES[type_name])
    if type_name == "Q8_0":
        sc = _f16(blocks, 0)
        qs = blocks[..., 2:]
    else:
        d = _f16(blocks, 0)
        m = _f16(blocks, 2) if type_name == "Q4_1" else np.zeros_like(d)
        sc = np.stack([d, m], -1)
        qs = blocks[..., 4:] if type_name == "Q4_1" else blocks[..., 2:]
    return PackedWeight(FORMATS[type_name], n, nb * BLOCK, np.ascontiguousarray(qs), np.ascontiguousarray(sc))


def dequantize(w: PackedWeight, isa: str | None = None) -> np.ndarray:
    """[n, k] float32, exactly the values the kernels (of path `isa`, default the default) multiply with."""
    from streamkit.engine import native

    out = np.empty((w.n, w.k), np.float32)
    native.load(isa).sk_dequant(w.fmt, native.ptr(w.qs), native.ptr(w.sc), w.n, w.k, native.ptr(out))
    return out


def requantize_q4_0(type_name: str, data: np.ndarray, lib) -> np.ndarray:
    """A tensor of GGUF blocks as stored (`pack`'s input) re-quantized to GGUF Q4_0 blocks
    [n, k / 32 * 18]: its values as the kernels of `lib` dequantize them (gguf's, bit for bit),
    quantized as gguf-py's Q4_0 quantizer does it, byte for byte."""
    from streamkit.engine import native

    w = pack(type_name, data, lib)
    out = np.empty((w.n, w.k // BLOCK * 18), np.uint8)
    if lib.sk_requantize_q4_0(w.fmt, native.ptr(w.qs), native.ptr(w.sc), w.n, w.k, native.ptr(out)):
        raise MemoryError(f"re-quantizing a {type_name} weight of {w.n} x {w.k} to Q4_0")
    return out


def stack(ws: list[PackedWeight]) -> list[PackedWeight]:
    """Row-wise concatenation (fused QKV, gate+up) of each run of consecutive parts in one format: one
    matrix where every part shares it, else one a run (a Q4_K_M file's Q4_K q/k, then its Q6_K v),
    each still in its own format, so that nothing is re-quantized."""
    runs: list[list[PackedWeight]] = []
    for w in ws:
        if runs and runs[-1][0].fmt == w.fmt and runs[-1][0].k == w.k:
            runs[-1].append(w)
        else:
            runs.append([w])
    return [PackedWeight(r[0].fmt, sum(w.n for w in r), r[0].k, np.concatenate([w.qs for w in r]),
                         np.concatenate([w.sc for w in r])) if len(r) > 1 else r[0] for r in runs]
