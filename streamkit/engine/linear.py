"""Weight formats for the matmuls.

fp32: reference (correctness tests). bf16: the CUDA format. int4+bf16 (CPU default, "auto"): 4-bit
groups of 32 with scale+min - the Q4_1 grid of the GGUF itself, so re-quantizing its dequantized
values is exact up to bf16 scales - via torch._weight_int4pack_mm_for_cpu for up to 4 rows, bf16
GEMM above. int8+bf16: keep
weight-only int8 (per-row scales, torch._weight_int8pack_mm) and bf16 copies and pick per step by
rows (int8 up to 8, bf16 above). int8: weight-only int8 only. w8a8 (opt-in): int8 weights and
per-tensor dynamically quantized activations via the x86/fbgemm quantized linear - fastest at every
batch size measured, but inaccurate on this model (activation outliers).
"""
from __future__ import annotations

import os
import warnings

import torch
import torch.nn.functional as F

INT8_MAX_ROWS = 8
_W8A8 = None


def w8a8_available() -> bool:
    """x86/fbgemm dynamic-quantized linear (int8 weights per row, int8 activations per step)."""
    global _W8A8
    if _W8A8 is None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                w = torch.randn(32, 64)
                q = torch.quantize_per_channel(w, (w.abs().amax(1) / 127).double(), torch.zeros(32, dtype=torch.long),
                                               0, torch.qint8)
                p = torch.ops.quantized.linear_prepack(q, None)
                torch.ops.quantized.linear_dynamic(torch.randn(2, 64), p)
            _W8A8 = True
        except Exception:
            _W8A8 = False
    return _W8A8


INT4_GROUP = 32
INT4_MAX_ROWS = 4


def quantize_int4_groups(w: torch.Tensor, group: int = INT4_GROUP):
    """Asymmetric 4-bit, `group` columns per scale/min (the Q4_1 grid: exact for Q4_1 sources)."""
    N, K = w.shape
    wg = w.float().view(N, K // group, group)
    mn = wg.amin(-1)
    d = ((wg.amax(-1) - mn) / 15).clamp(min=1e-10)
    q = ((wg - mn[..., None]) / d[..., None]).round().clamp(0, 15).to(torch.int32).view(N, K)
    zero = mn + 8 * d  # kernel computes (q - 8) * scale + zero
    sz = torch.stack([d, zero], -1).transpose(0, 1).contiguous().to(torch.bfloat16)  # [K/group, N, 2]
    return torch._convert_weight_to_int4pack_for_cpu(q, 1), sz


_INT4 = None


def int4_available() -> bool:
    global _INT4
    if _INT4 is None:
        try:
            wp, sz = quantize_int4_groups(torch.randn(64, 64))
            torch._weight_int4pack_mm_for_cpu(torch.randn(2, 64, dtype=torch.bfloat16), wp, INT4_GROUP, sz)
            _INT4 = True
        except Exception:
            _INT4 = False
    return _INT4


def resolve_weights(weights: str | None, cuda: bool, native_ok: bool = True, native_isa: str | None = None) -> str:
    """The weight mode an engine runs: bf16 on CUDA unless asked otherwise; on CPU `auto` (the
    default) is the native kernels (streamkit.engine.native) where they build and `native_ok`,
    else the best torch format. `native_isa` (or STREAMKIT_NATIVE_ISA) asking for a kernel path
    this CPU lacks is a ValueError, not a silent torch fallback.

    w8a8 is faster than the other torch formats but its per-tensor activation quantization breaks
    on this model's activation outliers (greedy agreement with fp32: 1/20 prompts vs 16/20 for
    int8+bf16), so it is opt-in only."""
    mode = weights or ("bf16" if cuda else "auto")
    if cuda:
        return mode
    if mode == "auto":
        from streamkit.engine import native

        if native_ok and os.environ.get("STREAMKIT_NATIVE", "1") != "0" and native.resolve_isa(native_isa):
            return "native"
        return "int4+bf16" if int4_available() else "int8+bf16"
    return mode


def quantize_int8_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    w = w.float()
    scale = w.abs().amax(dim=1).clamp(min=1e-8) / 127.0
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
    return q, scale


def _int8_ok() -> bool:
    try:
        x = torch.randn(2, 64, dtype=torch.bfloat16)
        w = torch.randint(-5, 5, (32, 64), dtype=torch.int8)
        torch._weight_int8pack_mm(x, w, torch.ones(32, dtype=torch.bfloat16))
        return True
    except Exception:
        return False


class Linear:
    __slots__ = ("mode", "w", "w8", "s8", "packed", "out_features", "in_features", "_nbytes", "w4", "sz4")

    def __init__(self, w: torch.Tensor, mode: str, device):
        if mode == "auto":
            mode = "int8+bf16"
        self.mode = mode
        self.out_features, self.in_features = w.shape
        self.w = self.w8 = self.s8 = self.packed = self.w4 = self.sz4 = None
        if mode == "int4+bf16" and (w.shape[1] % INT4_GROUP or w.shape[0] % 16):
            mode = self.mode = "int8+bf16"
        if mode == "int4+bf16":
            self.w4, self.sz4 = quantize_int4_groups(w)
            self.w = w.to(device=device, dtype=torch.bfloat16).contiguous()
        elif mode == "w8a8":
            q, s = quantize_int8_rows(w)
            self.w8, self.s8 = q, s.to(torch.bfloat16)  # kept for nbytes only (tiny views)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                qt = torch.quantize_per_channel(w.float(), s.double(), torch.zeros(q.shape[0], dtype=torch.long), 0,
                                                torch.qint8)
                self.packed = torch.ops.quantized.linear_prepack(qt, None)
            self.w8 = None
            self._nbytes = q.numel() + 4 * q.shape[0]
        elif mode == "fp32":
            self.w = w.float().to(device).contiguous()
        elif mode == "bf16":
            self.w = w.to(device=device, dtype=torch.bfloat16).contiguous()
        elif mode in ("int8", "int8+bf16"):
            q, s = quantize_int8_rows(w)
            self.w8, self.s8 = q.to(device), s.to(device=device, dtype=torch.bfloat16)
            if mode == "int8+bf16":
                self.w = w.to(device=device, dtype=torch.bfloat16).contiguous()
        else:
            raise ValueError(f"unknown weight mode {mode!r}")

    @property
    def nbytes_read(self) -> int:
        """Bytes of weights read per step at batch 1 (for the roofline)."""
        if self.mode == "w8a8":
            return self.out_features * self.in_features + 4 * self.out_features
        if self.mode == "int4+bf16":
            return self.w4.numel() * self.w4.element_size() + self.sz4.numel() * 2
        if self.w8 is not None:
            return self.w8.numel() + self.s8.numel() * 2
        return self.w.numel() * self.w.element_size()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, in] float32 (CPU) or bf16 (CUDA); returns x.dtype."""
        m = self.mode
        if m == "int4+bf16":
            if x.shape[0] <= INT4_MAX_ROWS:
                return torch._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), self.w4, INT4_GROUP,
                                                         self.sz4).to(x.dtype)
            return F.linear(x.to(torch.bfloat16), self.w).to(x.dtype)
        if m == "w8a8":
            return torch.ops.quantized.linear_dynamic(x.contiguous(), self.packed)
        if m == "fp32":
            return F.linear(x, self.w)
        if m == "bf16":
            return F.linear(x.to(self.w.dtype), self.w).to(x.dtype)
        if m == "int8" or (m == "int8+bf16" and x.shape[0] <= INT8_MAX_ROWS):
            return torch._weight_int8pack_mm(x.to(torch.bfloat16), self.w8, self.s8).to(x.dtype)
        return F.linear(x.to(torch.bfloat16), self.w).to(x.dtype)


class LogitHead:
    """The LM head, whose output is always float32.

    Logits decide every token. A bf16 output keeps 8 significant bits (values near 25 are 0.125
    apart), which turns near-ties into exact ties that argmax then breaks by token id: on a CPU
    without AMX the torch fallback answered "What is the capital of France?" with "L'Étoile..."
    because "The" (25.33) and "L" (25.24) both rounded to 25.25. On the CPU the head runs in fp32
    (sgemm measured as fast as the int8 and bf16 kernels at 1-64 rows); on CUDA its bf16 weights
    multiply with an fp32 output where torch has `mm(out_dtype=)`, fp32 weights otherwise."""

    __slots__ = ("out_dtype_mm", "w")

    def __init__(self, w: torch.Tensor, device, act_dtype: torch.dtype):
        dev = torch.device(device)
        self.out_dtype_mm = False
        if dev.type == "cuda" and act_dtype == torch.bfloat16:
            wb = w.to(device=dev, dtype=torch.bfloat16).contiguous()
            try:
                torch.mm(torch.zeros(1, wb.shape[1], device=dev, dtype=torch.bfloat16), wb[:8].t(),
                         out_dtype=torch.float32)
                self.w, self.out_dtype_mm = wb, True
                return
            except (RuntimeError, TypeError, NotImplementedError):
                pass
        self.w = w.to(device=dev, dtype=torch.float32).contiguous()

    @property
    def nbytes_read(self) -> int:
        return self.w.numel() * self.w.element_size()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.out_dtype_mm:
            return torch.mm(x.to(torch.bfloat16), self.w.t(), out_dtype=torch.float32)
        return F.linear(x.float(), self.w)
