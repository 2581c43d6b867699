"""Llama / qwen2 forward pass in torch over a paged KV cache (qwen2 adds Q/K/V biases).

One forward handles a flattened batch: the first n_decode tokens are single-token segments of
distinct sequences (batched paged decode attention); the rest are prefill chunks, one sequence
each. RMSNorm, RoPE on GGUF's interleaved-pair Q/K layout (llama.cpp "normal" rope; attention scores are
invariant to that fixed permutation of head dims, so results equal the HF half-split layout), GQA, SwiGLU.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from streamkit.engine.config import LlamaConfig
from streamkit.engine.gguf_loader import GGUFModel
from streamkit.engine.linear import Linear, LogitHead, resolve_weights
from streamkit.engine.paged_attention import (
    HAVE_TRITON,
    decode_attention_hm,
    decode_attention_triton,
    decode_plan,
    default_scale,
    prefill_attention,
)

log = logging.getLogger("streamkit.engine")
_HAS_RMS = hasattr(F, "rms_norm")


@dataclass
class Layer:
    attn_norm: torch.Tensor
    qkv: Linear
    o: Linear
    ffn_norm: torch.Tensor
    gate_up: Linear
    down: Linear
    qkv_bias: torch.Tensor | None = None  # qwen2


@dataclass
class StepBatch:
    ids: torch.Tensor  # [T] long
    positions: torch.Tensor  # [T] long
    slots: torch.Tensor  # [T] long
    n_decode: int = 0
    block_tables: torch.Tensor | None = None  # [n_decode, NB] long
    ctx_lens: torch.Tensor | None = None  # [n_decode] long
    # (token offset, n tokens, start position, slots of positions [0, start) or None when start == 0)
    prefills: list = field(default_factory=list)
    logit_rows: torch.Tensor | None = None  # [S] long rows of T whose logits are wanted


def rope_angles(cfg: LlamaConfig, rope_freqs=None) -> torch.Tensor:
    """[context_length, head_dim / 2] rotation angles: the GGUF's base, llama3-style frequency
    factors (`rope_freqs.weight`) and linear position scaling when present."""
    hd = cfg.head_dim
    inv = 1.0 / (cfg.rope_base ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    if rope_freqs is not None:
        inv = inv / torch.as_tensor(rope_freqs).float()
    pos = torch.arange(cfg.context_length, dtype=torch.float32)
    if cfg.rope_scaling and cfg.rope_scaling.get("type") == "linear" and cfg.rope_scaling.get("factor"):
        pos = pos / float(cfg.rope_scaling["factor"])
    return torch.outer(pos, inv)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """x and w fp32 (the residual stream and the norm weights stay fp32 on every device)."""
    if _HAS_RMS:
        return F.rms_norm(x, (x.shape[-1],), w, eps)
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


class LlamaModel:
    def __init__(self, gm: GGUFModel, device: str | torch.device = "cpu", weights: str | None = None,
                 attn_backend: str | None = None):
        self.cfg: LlamaConfig = gm.config
        self.device = torch.device(device)
        cuda = self.device.type == "cuda"
        self.weights = resolve_weights(weights, cuda, native_ok=False)
        # dtype of the bf16 formats' matmul operands and of the KV cache; the residual stream, norms,
        # RoPE and logits are fp32 whatever it is
        self.act_dtype = torch.bfloat16 if (cuda and self.weights != "fp32") else torch.float32
        self.attn_backend = attn_backend or ("triton" if cuda and HAVE_TRITON else "torch")
        cfg = self.cfg
        if cfg.rope_dim is not None and cfg.rope_dim != cfg.head_dim:
            raise NotImplementedError("partial rotary embeddings are not supported")
        T = gm.tensors
        dev, mode = self.device, self.weights

        def t(name):
            return torch.from_numpy(T[name])

        def norm(name):
            return t(name).to(device=dev, dtype=torch.float32)

        # the residual stream stays fp32 on every device; only matmul operands are bf16 (CUDA)
        self.embed = t("token_embd.weight").to(device=dev, dtype=torch.float32)
        head_w = t("output.weight") if "output.weight" in T else t("token_embd.weight")
        self.lm_head = LogitHead(head_w, dev, self.act_dtype)
        if "output.weight" not in T and self.lm_head.w.dtype == torch.float32:
            self.lm_head.w = self.embed  # tied: share storage
        self.norm = norm("output_norm.weight")
        self.layers: list[Layer] = []
        for i in range(cfg.n_layers):
            p = f"blk.{i}."
            qkv = torch.cat([t(p + "attn_q.weight"), t(p + "attn_k.weight"), t(p + "attn_v.weight")], 0)
            gu = torch.cat([t(p + "ffn_gate.weight"), t(p + "ffn_up.weight")], 0)
            bias = None
            if cfg.qkv_bias:
                bias = torch.cat([t(p + "attn_q.bias"), t(p + "attn_k.bias"), t(p + "attn_v.bias")]).to(
                    device=dev, dtype=torch.float32)
            self.layers.append(Layer(norm(p + "attn_norm.weight"), Linear(qkv, mode, dev),
                                     Linear(t(p + "attn_output.weight"), mode, dev), norm(p + "ffn_norm.weight"),
                                     Linear(gu, mode, dev), Linear(t(p + "ffn_down.weight"), mode, dev), bias))
        hd = cfg.head_dim
        freqs = rope_angles(cfg, T.get("rope_freqs.weight"))
        self.freqs_cis = torch.polar(torch.ones_like(freqs), freqs).to(dev)  # complex64 [ctx, hd/2]
        self.scale = default_scale(hd)
        self.kv_cache = None  # PagedKVCache, attached by the engine

    # ------------------------------------------------------------------ info
    @property
    def weight_bytes_per_step(self) -> int:
        n = self.lm_head.nbytes_read
        for L in self.layers:
            n += L.qkv.nbytes_read + L.o.nbytes_read + L.gate_up.nbytes_read + L.down.nbytes_read
        return n

    # ------------------------------------------------------------------ forward
    def _rope(self, x: torch.Tensor, rot: torch.Tensor) -> torch.Tensor:
        """x: [T, NH, hd] fp32 with (even, odd) dim pairs rotated together, as one complex multiply by
        rot ([T, 1, hd / 2] complex64, the step's rows of freqs_cis). In fp32 on every device: bf16
        cos/sin at large positions would move every key."""
        T, NH, hd = x.shape
        xc = torch.view_as_complex(x.reshape(T, NH, hd // 2, 2))
        return torch.view_as_real(xc * rot).reshape(T, NH, hd)

    def _decode_attn(self, q, kp, vp, bt, cl, pre):
        if self.attn_backend == "triton":
            return decode_attention_triton(q, kp, vp, bt, cl, self.kv_cache.block_size, self.scale, head_major=True)
        return decode_attention_hm(q, kp, vp, pre, self.scale)

    @torch.inference_mode()
    def forward(self, b: StepBatch) -> torch.Tensor:
        """Returns float32 logits [S, V] for b.logit_rows (all rows when None)."""
        cfg = self.cfg
        H, KV, hd, eps = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.norm_eps
        T = b.ids.shape[0]
        nd = b.n_decode
        x = F.embedding(b.ids, self.embed)
        pre = None
        kc, vc = self.kv_cache.k, self.kv_cache.v
        NL, _, S, _ = kc.shape
        # write index into a layer's pool viewed as [KV * S, D] (dim-0 index_copy_ is the fast path)
        wslots = (torch.arange(KV, device=b.slots.device)[:, None] * S + b.slots[None, :]).reshape(-1)
        if nd and self.attn_backend != "triton":  # gather index, mask and buffers shared by all layers
            pre = decode_plan(b.block_tables, b.ctx_lens, self.kv_cache.block_size, KV, kc.shape[2], hd, kc.dtype)
        qk_w = (H + KV) * hd
        rot = self.freqs_cis[b.positions].unsqueeze(1)  # every layer rotates by the same angles
        for li, L in enumerate(self.layers):
            h = rms_norm(x, L.attn_norm, eps)
            qkv = L.qkv(h)
            if L.qkv_bias is not None:
                qkv = qkv + L.qkv_bias
            qk = self._rope(qkv[:, :qk_w].reshape(T, H + KV, hd), rot)
            q, k = qk[:, :H], qk[:, H:]
            v = qkv[:, qk_w:].view(T, KV, hd)
            kp, vp = kc[li], vc[li]
            kp.view(KV * S, hd).index_copy_(0, wslots, k.transpose(0, 1).reshape(KV * T, hd).to(kp.dtype))
            vp.view(KV * S, hd).index_copy_(0, wslots, v.transpose(0, 1).reshape(KV * T, hd).to(vp.dtype))
            if nd == T:
                attn = self._decode_attn(q, kp, vp, b.block_tables, b.ctx_lens, pre)
            else:
                attn = torch.empty((T, H, hd), dtype=q.dtype, device=q.device)
                if nd:
                    attn[:nd] = self._decode_attn(q[:nd], kp, vp, b.block_tables, b.ctx_lens, pre)
                ad = self.act_dtype  # bf16 flash attention on CUDA, fp32 on the CPU
                for t0, n, start, prev_slots in b.prefills:
                    qq, kk, vv = (t[t0:t0 + n].to(ad) for t in (q, k, v))
                    if start:
                        kk = torch.cat([kp[:, prev_slots].transpose(0, 1).to(ad), kk], 0)
                        vv = torch.cat([vp[:, prev_slots].transpose(0, 1).to(ad), vv], 0)
                    attn[t0:t0 + n] = prefill_attention(qq, kk, vv, start)
            x.add_(L.o(attn.reshape(T, H * hd)))  # x is this forward's own buffer (embedding output)
            h = rms_norm(x, L.ffn_norm, eps)
            gu = L.gate_up(h)
            g, u = gu.chunk(2, dim=-1)
            x.add_(L.down(F.silu(g).mul_(u)))
        if b.logit_rows is not None:
            x = x.index_select(0, b.logit_rows)
        x = rms_norm(x, self.norm, eps)
        return self.lm_head(x)

    @torch.inference_mode()
    def decode_step(self, ids, positions, slots, block_tables, ctx_lens) -> torch.Tensor:
        """Pure decode (one token per sequence), static shapes: the body captured by CUDA graphs."""
        return self.forward(StepBatch(ids=ids, positions=positions, slots=slots, n_decode=ids.shape[0],
                                      block_tables=block_tables, ctx_lens=ctx_lens))
