"""Tokens drawn from logits by the native kernels (sk_sample.h): the distribution of
streamkit.engine.sampling.target_probs (repetition penalty, temperature, top-k, top-p), each draw's
uniform number a hash of the sequence's seed and the position of the token whose logits it reads,
so a seeded sequence gets the same tokens from single steps and from decode bursts."""
from __future__ import annotations

import ctypes

import numpy as np
import torch

from streamkit.engine import native
from streamkit.engine.params import SamplingParams

SEED_MASK = 2**64 - 1


def sampling_arrays(params: list[SamplingParams], seeds: list[int], prevs: list[list[int]], vocab: int) -> tuple:
    """The per-row arrays sk_sample_rows and sk_decode_sample take: temperature, top_k, top_p,
    penalty, seed, and the rows' seen-token bits (bit t of row i: token t is in prevs[i]; None where
    no row has a repetition penalty)."""
    seen = None
    if any(p.repetition_penalty != 1.0 for p in params):
        seen = np.zeros((len(params), (vocab + 7) // 8), np.uint8)
        for i, prev in enumerate(prevs):
            bits = np.zeros(seen.shape[1] * 8, bool)
            bits[np.asarray(prev, np.int64)] = True
            seen[i] = np.packbits(bits, bitorder="little")
    return (np.asarray([p.temperature for p in params], np.float32),
            np.asarray([p.top_k for p in params], np.int32),
            np.asarray([p.top_p for p in params], np.float32),
            np.asarray([p.repetition_penalty for p in params], np.float32),
            np.asarray([s & SEED_MASK for s in seeds], np.uint64), seen)


def sample_rows(lib: ctypes.CDLL, logits: torch.Tensor, params: list[SamplingParams], seeds: list[int],
                positions: list[int], prevs: list[list[int]]) -> list[int]:
    """Each row's token from logits [S, V] (float32, contiguous; overwritten) as params[i] asks (the
    argmax where the temperature is 0), drawn with seeds[i] at positions[i] (the position of the
    token the row's logits came from); prevs[i]: the tokens its repetition penalty counts."""
    S = len(params)
    if logits.dtype != torch.float32 or not logits.is_contiguous() or logits.shape[0] != S:
        raise ValueError(f"logits must be contiguous float32 [{S}, vocab], not {logits.dtype} {tuple(logits.shape)}")
    arrays = sampling_arrays(params, seeds, prevs, logits.shape[1])
    pos = np.asarray(positions, np.int32)
    out = np.empty(S, np.int32)
    P = native.ptr
    rc = lib.sk_sample_rows(P(logits), S, logits.shape[1], *(P(a) for a in arrays[:5]), P(pos),
                            P(arrays[5]) if arrays[5] is not None else None, P(out), torch.get_num_threads())
    if rc:
        raise MemoryError("native sampling could not allocate its settings")
    return out.tolist()
