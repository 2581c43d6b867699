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


def _k_scales(flat: np.ndarray) -> np.ndarray:
    """Per Q4_K / Q5_K super-block float32 d, dmin and the unpacked uint8 scales and mins (24 bytes)."""
    from gguf.quants import Q4_K

    sc, mn = Q4_K.get_scale_min(np.ascontiguousarray(flat[:, 4:16]))
    head = np.stack([_f16(flat, 0), _f16(flat, 2)], -1).astype(np.float32)
    return np.ascontiguousarray(np.concatenate([head.view(np.uint8), sc.astype(np.uint8), mn.astype(np.uint8)], -1))


def _nibbles(ql: np.ndarray) -> np.ndarray:
    """128 bytes of GGUF K-quant nibbles per super-block -> [..., 8 blocks, 32] values 0..15 (block
    2j: the low nibbles of bytes 32j.., 2j+1: their high nibbles)."""
    q = ql.reshape(-1, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    return (q & 0x0F).reshape(-1, 32)


def _q4_k_blocks(data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K super-blocks (256 values: f16 d, dmin, 8 six-bit scale/min pairs, 128 nibble bytes) in the
    kernels' SK_Q4_K layout (sk_kernels.c): 32-value blocks with Q4_1's nibble order, and per
    super-block float32 d, dmin and the unpacked uint8 scales and mins (24 bytes). The kernels form
    (d * scale) * q - dmin * min in fp32, as gguf's reference does: bit-identical values."""
    n = data.shape[0]
    flat = data.reshape(n, -1, 144).reshape(-1, 144)
    nsb = flat.shape[0] // n
    q = _nibbles(flat[:, 16:])
    qs = (q[:, :16] | (q[:, 16:] << 4)).astype(np.uint8).reshape(n, nsb * 8, 16)
    return qs, _k_scales(flat).view(np.float32).reshape(n, nsb, 6)


def _q5_k_blocks(data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q5_K super-blocks (Q4_K's with 32 bytes of fifth bits before the nibbles: bit j of byte l is
    value l of block j) in the kernels' SK_Q5_K layout: per block the Q4_K nibbles and a uint32 of
    fifth bits (value i at bit i); the scales as Q4_K's. Bit-identical values, as for Q4_K."""
    n = data.shape[0]
    flat = data.reshape(n, -1, 176).reshape(-1, 176)
    nsb = flat.shape[0] // n
    q = _nibbles(flat[:, 48:])
    high = (flat[:, 16:48].reshape(-1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1
    bits = np.packbits(high.reshape(-1, 32), axis=-1, bitorder="little")  # 4 bytes: value i at bit i
    qs = np.concatenate([(q[:, :16] | (q[:, 16:] << 4)).astype(np.uint8), bits], -1).reshape(n, nsb * 8, 20)
    return np.ascontiguousarray(qs), _k_scales(flat).view(np.float32).reshape(n, nsb, 6)


def _q6_k_blocks(data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q6_K super-blocks (128 bytes of low nibbles, 64 of high bit pairs, 16 int8 scales, f16 d) in the
    kernels' SK_Q6_K layout (sk_dequant.h): per pair of blocks of 32 values (A, B), A's 16 nibble
    bytes and B's in Q4_1's order, then 16 bytes h with h[j] = A[j] | B[j] << 2 | A[16 + j] << 4 |
    B[16 + j] << 6 (the values' high bit pairs); per super-block float32 d and the int8 scales (24 bytes)."""
    n = data.shape[0]
    flat = data.reshape(-1, 210)
    nsb = flat.shape[0] // n
    ql = flat[:, :128].reshape(-1, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    qh = flat[:, 128:192].reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    q = ((ql & 0x0F).reshape(-1, 256) | ((qh & 0x03).reshape(-1, 256) << 4)).reshape(-1, 2, 32)  # [pairs, A/B, 32]
    nib = ((q[..., :16] & 0x0F) | ((q[..., 16:] & 0x0F) << 4)).reshape(-1, 32)
    top = q >> 4
    high = top[:, 0, :16] | (top[:, 1, :16] << 2) | (top[:, 0, 16:] << 4) | (top[:, 1, 16:] << 6)
    qs = np.concatenate([nib.astype(np.uint8), high.astype(np.uint8)], -1).reshape(n, nsb * 8, 24)
    head = np.zeros((flat.shape[0], 2), np.float32)
    head[:, 0] = _f16(flat, 208)
    scales = np.concatenate([head.view(np.uint8), flat[:, 192:208]], -1)
    return np.ascontiguousarray(qs), np.ascontiguousarray(scales).view(np.float32).reshape(n, nsb, 6)


def _q5_0_as_q8_0(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q5_0 blocks (f16 d, 32 high bits, 16 nibble bytes) as Q8_0: int8 q - 16 with the same d."""
    n, nb = blocks.shape[:2]
    flat = blocks.reshape(n * nb, 22)
    qh = flat[:, 2:6].copy().view(np.uint32) >> np.arange(32, dtype=np.uint32)
    ql = flat[:, 6:].reshape(-1, 1, 16) >> np.array([0, 4], np.uint8).reshape(1, 2, 1)
    q = (ql & 0x0F).reshape(-1, 32) | (((qh & 1).astype(np.uint8)) << 4)
    qs = (q.astype(np.int16) - 16).astype(np.int8).view(np.uint8).reshape(n, nb, 32)
    return qs, _f16(blocks, 0)


def pack(type_name: str, data: np.ndarray) -> PackedWeight:
    """data: the tensor as GGUF stores it, [n, row bytes] uint8 for block formats and BF16, [n, k]
    float32 / float16 for F32 / F16. Q4_K, Q5_K and Q6_K are repacked exactly into the kernels'
    SK_Q4_K / SK_Q5_K / SK_Q6_K layouts, Q5_0 into Q8_0; F16 and BF16 are read as stored."""
    if type_name in ("F16", "BF16"):
        qs = np.ascontiguousarray(data).view(np.uint16).reshape(data.shape[0], -1)
        return PackedWeight(FORMATS[type_name], qs.shape[0], qs.shape[1], qs, np.empty(0, np.float32))
    if type_name in ("Q4_K", "Q5_K"):
        qs, sc = (_q4_k_blocks if type_name == "Q4_K" else _q5_k_blocks)(data)
        return PackedWeight(FORMATS[type_name], data.shape[0], qs.shape[1] * BLOCK, qs, sc)
    if type_name == "Q6_K":
        qs, sc = _q6_k_blocks(data)
        return PackedWeight(FORMATS["Q6_K"], data.shape[0], qs.shape[1] * BLOCK, qs, sc)
    if type_name == "Q5_0":
        nb = data.shape[1] // 22
        qs, sc = _q5_0_as_q8_0(data.reshape(data.shape[0], nb, 22))
        return PackedWeight(FORMATS["Q8_0"], data.shape[0], nb * BLOCK, qs, np.ascontiguousarray(sc))
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
