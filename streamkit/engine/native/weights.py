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


def _f16(blocks: np.ndarray, at: int) -> np.ndarray:
    return np.ascontiguousarray(blocks[..., at:at + 2]).view(np.float16)[..., 0].astype(np.float32)


def pack(type_name: str, data: np.ndarray) -> PackedWeight:
    """data: the tensor as GGUF stores it, [n, row bytes] uint8 for block formats, [n, k] float32 for F32."""
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


def dequantize(w: PackedWeight) -> np.ndarray:
    """[n, k] float32, exactly the values the kernels multiply with."""
    from streamkit.engine import native

    out = np.empty((w.n, w.k), np.float32)
    native.load().sk_dequant(w.fmt, native.ptr(w.qs), native.ptr(w.sc), w.n, w.k, native.ptr(out))
    return out


def stack(ws: list[PackedWeight]) -> PackedWeight:
    """Row-wise concatenation (fused QKV, gate+up). Mixed formats fall back to F32, which is exact."""
    if len({w.fmt for w in ws}) == 1:
        return PackedWeight(ws[0].fmt, sum(w.n for w in ws), ws[0].k, np.concatenate([w.qs for w in ws]),
                            np.concatenate([w.sc for w in ws]))
    return pack("F32", np.concatenate([dequantize(w) for w in ws]))
