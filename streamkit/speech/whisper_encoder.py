"""Whisper's audio encoder in torch, with bf16 matmuls, for CPUs that multiply bf16 natively.

Why it exists: Whisper was trained on 30 s windows, and a short utterance decoded in a shortened
context is misheard ("All but a pound key" for "Followed by the pound key"): on the Asterisk
prompts, streaming WER 0.042 against 0.028 with every final decoded in the full 30 s context. But
CTranslate2's int8 encoder takes ~200 ms for 30 s on 2 cores, which a final cannot afford.
torch's oneDNN matmuls run bf16 on AMX (and AVX512_BF16) tiles: the same 30 s in ~60 ms.

The residual stream and the layer norms stay float32; the linear layers, the convolutions and the
attention run in bf16. The weights are CTranslate2's own (`model.bin`'s `encoder/*`), and the
output is what `ctranslate2.models.Whisper.encode` returns, so the CTranslate2 decoder, its beam
search and its word alignment take it unchanged. tests/test_whisper_encoder.py checks the
float32 build against CTranslate2's float32 encoder and the bf16 one's transcripts against it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from streamkit import cores
from streamkit.speech.ct2_model import dense, read_variables

_LAYER = ("self_attention/layer_norm/gamma", "self_attention/layer_norm/beta", "self_attention/linear_0/weight",
          "self_attention/linear_0/bias", "self_attention/linear_1/weight", "self_attention/linear_1/bias",
          "ffn/layer_norm/gamma", "ffn/layer_norm/beta", "ffn/linear_0/weight", "ffn/linear_0/bias",
          "ffn/linear_1/weight", "ffn/linear_1/bias")


def bf16_native() -> bool:
    """Whether this CPU multiplies bf16 in hardware (AMX tiles or AVX512_BF16 dot products)."""
    flags = cores.cpu_flags()
    return "amx_bf16" in flags or "avx512_bf16" in flags


class TorchEncoder:
    """Whisper's encoder from a CTranslate2 model directory; `matmul_dtype` "bfloat16" or "float32"."""

    def __init__(self, model_dir: str | Path, matmul_dtype: str = "bfloat16") -> None:
        import torch

        if matmul_dtype not in ("bfloat16", "float32"):
            raise ValueError(f"matmul_dtype {matmul_dtype!r}: expected 'bfloat16' or 'float32'")
        self.dtype = getattr(torch, matmul_dtype)
        v = read_variables(Path(model_dir) / "model.bin", "encoder/")

        def weight(name: str, dtype: Any = self.dtype) -> Any:
            return torch.from_numpy(dense(v, "encoder/" + name)).to(dtype)

        if "encoder/num_heads" not in v:
            raise ValueError(f"{model_dir}: not a CTranslate2 Whisper model (no encoder/num_heads)")
        self.heads = int(v["encoder/num_heads"])
        self.conv1 = weight("conv1/weight"), weight("conv1/bias")
        self.conv2 = weight("conv2/weight"), weight("conv2/bias")
        self.positions = weight("position_encodings/encodings", torch.float32)
        self.norm = weight("layer_norm/gamma", torch.float32), weight("layer_norm/beta", torch.float32)
        count = sum(1 for k in v if k.startswith("encoder/layer_") and k.endswith("/ffn/linear_0/weight"))
        self.layers = [{k: weight(f"layer_{i}/{k}", torch.float32 if "layer_norm" in k else self.dtype)
                        for k in _LAYER} for i in range(count)]
        self.width = self.positions.shape[1]
        if self.width % self.heads or not count:
            raise ValueError(f"{model_dir}: encoder width {self.width} with {self.heads} heads and {count} layers")

    def __call__(self, mel: np.ndarray, threads: int = 0) -> np.ndarray:
        """(batch, n_mels, frames) log-mel -> (batch, frames // 2, width) float32, on `threads`
        threads (0: torch's setting for the calling thread)."""
        import torch
        import torch.nn.functional as F

        if threads and torch.get_num_threads() != threads:
            torch.set_num_threads(threads)  # OpenMP's count is per calling thread: the engine's stays
        with torch.inference_mode():
            x = torch.from_numpy(np.ascontiguousarray(mel, np.float32)).to(self.dtype)
            x = F.gelu(F.conv1d(x, *self.conv1, padding=1))
            x = F.gelu(F.conv1d(x, *self.conv2, stride=2, padding=1))
            if x.shape[2] > len(self.positions):
                raise ValueError(f"{mel.shape[2]} log-mel frames: the encoder takes at most {2 * len(self.positions)}")
            x = x.transpose(1, 2).float() + self.positions[: x.shape[2]]
            batch, steps, width = x.shape
            heads = self.heads
            for p in self.layers:
                y = F.layer_norm(x, (width,), p["self_attention/layer_norm/gamma"], p["self_attention/layer_norm/beta"])
                qkv = F.linear(y.to(self.dtype), p["self_attention/linear_0/weight"], p["self_attention/linear_0/bias"])
                q, k, val = qkv.view(batch, steps, 3, heads, width // heads).permute(2, 0, 3, 1, 4)
                a = F.scaled_dot_product_attention(q, k, val).transpose(1, 2).reshape(batch, steps, width)
                x = x + F.linear(a, p["self_attention/linear_1/weight"], p["self_attention/linear_1/bias"]).float()
                y = F.layer_norm(x, (width,), p["ffn/layer_norm/gamma"], p["ffn/layer_norm/beta"])
                h = F.gelu(F.linear(y.to(self.dtype), p["ffn/linear_0/weight"], p["ffn/linear_0/bias"]))
                x = x + F.linear(h, p["ffn/linear_1/weight"], p["ffn/linear_1/bias"]).float()
            return F.layer_norm(x, (width,), *self.norm).numpy()
