"""Attention over the paged KV cache.

decode_attention_torch: portable (CPU / CUDA fallback) - gathers each sequence's blocks into a
padded [B, L] view and masks; static shapes given a fixed max_blocks, so it is CUDA-graph safe.
decode_attention_triton: CUDA - one program per (sequence, kv head) walks the block table with an
online softmax, reading K/V straight from the pool (nothing materialised).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def decode_gather_index(block_tables: torch.Tensor, ctx_lens: torch.Tensor, block_size: int):
    """Flat slot index [B*L] and validity mask [B, 1, 1, L] for a padded gather of each sequence."""
    B, NB = block_tables.shape
    L = NB * block_size
    ar = torch.arange(block_size, device=block_tables.device)
    idx = (block_tables[:, :, None] * block_size + ar).reshape(B * L)
    valid = torch.arange(L, device=block_tables.device)[None, :] < ctx_lens[:, None]
    return idx, valid.view(B, 1, 1, L)


def decode_attention_torch(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                           block_tables: torch.Tensor, ctx_lens: torch.Tensor, block_size: int,
                           scale: float, pre=None) -> torch.Tensor:
    """q: [B, H, D]; pools: [S, KV, D]; block_tables: [B, NB] long; ctx_lens: [B] long -> [B, H, D]."""
    B, H, D = q.shape
    KV = k_pool.shape[1]
    idx, valid = pre if pre is not None else decode_gather_index(block_tables, ctx_lens, block_size)
    L = valid.shape[-1]
    k = k_pool.index_select(0, idx).view(B, L, KV, D).transpose(1, 2)  # [B, KV, L, D]
    v = v_pool.index_select(0, idx).view(B, L, KV, D).transpose(1, 2)
    out = F.scaled_dot_product_attention(q.unsqueeze(2).to(k.dtype), k, v, attn_mask=valid, scale=scale,
                                         enable_gqa=KV != H)  # [B, H, 1, D]
    return out.reshape(B, H, D).to(q.dtype)


def decode_plan(block_tables: torch.Tensor, ctx_lens: torch.Tensor, block_size: int, n_kv: int,
                pool_slots: int, head_dim: int, dtype: torch.dtype):
    """Per-step plan for decode_attention_hm, shared by every layer: a flat (kv head, block) row index
    into a head-major pool viewed as [KV * n_blocks, block_size * D], an additive mask [1, B, 1, L]
    and two preallocated gather buffers (filled in place each layer: no fresh pages per layer)."""
    B, NB = block_tables.shape
    L = NB * block_size
    dev = block_tables.device
    n_blocks = pool_slots // block_size
    rows = (torch.arange(n_kv, device=dev)[:, None] * n_blocks + block_tables.reshape(1, B * NB)).reshape(-1)
    valid = torch.arange(L, device=dev)[None, :] < ctx_lens[:, None]
    bias = torch.zeros((B, L), dtype=dtype, device=dev).masked_fill_(~valid, float("-inf")).view(1, B, 1, L)
    kb = torch.empty((n_kv * B * NB, block_size * head_dim), dtype=dtype, device=dev)
    vb = torch.empty_like(kb)
    return rows, bias, kb, vb


def decode_attention_hm(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, plan, scale: float) -> torch.Tensor:
    """Decode attention over a head-major pool. q: [B, H, D]; pools: [KV, S, D] (S = blocks * block_size).

    Gathers whole 16-token blocks per (kv head, block) into the plan's buffers, giving K/V as
    [KV, B, L, D] views; the query group of each KV head is SDPA's query axis, so GQA needs no
    repeat: SDPA sees batch KV, "heads" B, G queries, L keys."""
    B, H, D = q.shape
    KV, S, _ = k_pool.shape
    rows, bias, kb, vb = plan
    L = bias.shape[-1]
    bsD = kb.shape[1]
    torch.index_select(k_pool.view(S * KV * D // bsD, bsD), 0, rows, out=kb)
    torch.index_select(v_pool.view(S * KV * D // bsD, bsD), 0, rows, out=vb)
    qq = q.view(B, KV, H // KV, D).transpose(0, 1).to(kb.dtype)  # [KV, B, G, D]
    out = F.scaled_dot_product_attention(qq, kb.view(KV, B, L, D), vb.view(KV, B, L, D), attn_mask=bias, scale=scale)
    return out.transpose(0, 1).reshape(B, H, D).to(q.dtype)


def prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int) -> torch.Tensor:
    """One sequence chunk. q: [n, H, D] at positions start..start+n-1; k, v: [start+n, KV, D]."""
    n, H, D = q.shape
    L, KV, _ = k.shape
    qh = q.transpose(0, 1).unsqueeze(0)
    kh = k.transpose(0, 1).unsqueeze(0)
    vh = v.transpose(0, 1).unsqueeze(0)
    if KV != H:
        kh = kh.repeat_interleave(H // KV, dim=1)
        vh = vh.repeat_interleave(H // KV, dim=1)
    if start == 0:
        out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True)
    else:
        qpos = torch.arange(start, start + n, device=q.device)[:, None]
        mask = torch.arange(L, device=q.device)[None, :] <= qpos
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask)
    return out[0].transpose(0, 1)


# ---------------------------------------------------------------- Triton (CUDA) ----
try:  # pragma: no cover - needs triton (CUDA builds of torch ship it)
    import triton
    import triton.language as tl

    @triton.jit
    def _paged_decode_kernel(Q, K, V, BT, CL, O, scale,
                             stride_qb, stride_qh, stride_ks, stride_kh, stride_bt, stride_ob, stride_oh,
                             BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, GROUP: tl.constexpr,
                             GROUP_PAD: tl.constexpr):
        b = tl.program_id(0)
        kvh = tl.program_id(1)
        ctx = tl.load(CL + b)
        offs_d = tl.arange(0, HEAD_DIM)
        offs_g = tl.arange(0, GROUP_PAD)
        offs_t = tl.arange(0, BLOCK_SIZE)
        gmask = offs_g < GROUP
        heads = kvh * GROUP + offs_g
        q = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                    mask=gmask[:, None], other=0.0).to(tl.float32)  # [G, D]
        m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
        l_i = tl.zeros([GROUP_PAD], tl.float32)
        acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
        nblocks = tl.cdiv(ctx, BLOCK_SIZE)
        for i in range(0, nblocks):
            blk = tl.load(BT + b * stride_bt + i)
            slots = blk * BLOCK_SIZE + offs_t
            tmask = (i * BLOCK_SIZE + offs_t) < ctx
            kk = tl.load(K + slots[:, None] * stride_ks + kvh * stride_kh + offs_d[None, :],
                         mask=tmask[:, None], other=0.0).to(tl.float32)  # [T, D]
            vv = tl.load(V + slots[:, None] * stride_ks + kvh * stride_kh + offs_d[None, :],
                         mask=tmask[:, None], other=0.0).to(tl.float32)
            s = tl.sum(q[:, None, :] * kk[None, :, :], axis=2) * scale  # [G, T]
            s = tl.where(tmask[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * vv[None, :, :], axis=1)
            m_i = m_new
        out = acc / l_i[:, None]
        tl.store(O + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
                 out.to(O.dtype.element_ty), mask=gmask[:, None])

    HAVE_TRITON = True
except Exception:  # ImportError on CPU-only installs
    HAVE_TRITON = False


def decode_attention_triton(q, k_pool, v_pool, block_tables, ctx_lens, block_size, scale, head_major=False):
    """Same contract as decode_attention_torch (pools [S, KV, D]; [KV, S, D] with head_major=True);
    needs q/pools on CUDA (or TRITON_INTERPRET=1)."""
    if not HAVE_TRITON:
        raise RuntimeError("triton is not available")
    B, H, D = q.shape
    KV = k_pool.shape[0 if head_major else 1]
    s_slot, s_head = (k_pool.stride(1), k_pool.stride(0)) if head_major else (k_pool.stride(0), k_pool.stride(1))
    G = H // KV
    q = q.contiguous()
    out = torch.empty_like(q)
    bt = block_tables.contiguous()
    cl = ctx_lens.contiguous()
    _paged_decode_kernel[(B, KV)](
        q, k_pool, v_pool, bt, cl, out, scale,
        q.stride(0), q.stride(1), s_slot, s_head, bt.stride(0), out.stride(0), out.stride(1),
        BLOCK_SIZE=block_size, HEAD_DIM=D, GROUP=G, GROUP_PAD=max(1, 1 << (G - 1).bit_length()),
    )
    return out


def default_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)
