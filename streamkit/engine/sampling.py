"""Batched sampling: greedy, temperature, top-k, top-p, repetition penalty, seeded."""
from __future__ import annotations

import torch

from streamkit.engine.params import SamplingParams


def make_generator(seed: int | None, device) -> torch.Generator | None:
    if seed is None:
        return None
    g = torch.Generator(device=device)
    g.manual_seed(int(seed))
    return g


def apply_repetition_penalty(logits: torch.Tensor, prev: list[int], penalty: float) -> torch.Tensor:
    if penalty == 1.0 or not prev:
        return logits
    idx = torch.tensor(sorted(set(prev)), dtype=torch.long, device=logits.device)
    sel = logits.index_select(-1, idx)
    sel = torch.where(sel > 0, sel / penalty, sel * penalty)
    logits = logits.clone()
    logits.index_copy_(-1, idx, sel)
    return logits


def target_probs(logits: torch.Tensor, params: SamplingParams, prev: list[int]) -> torch.Tensor:
    """The distribution a non-greedy step samples from: penalty, temperature, top-k, top-p. [V]."""
    logits = apply_repetition_penalty(logits, prev, params.repetition_penalty)
    logits = logits / max(params.temperature, 1e-5)
    if params.top_k and 0 < params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_l, sorted_i = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_l, -1)
        cum = torch.cumsum(probs, -1)
        drop = (cum - probs) > params.top_p  # keep the smallest set whose mass reaches top_p
        sorted_l = sorted_l.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, sorted_i, sorted_l)
    return torch.softmax(logits, -1)


def sample_one(logits: torch.Tensor, params: SamplingParams, prev: list[int],
               generator: torch.Generator | None) -> int:
    """logits: [V] float32."""
    if params.greedy:
        return int(torch.argmax(apply_repetition_penalty(logits, prev, params.repetition_penalty)))
    return int(torch.multinomial(target_probs(logits, params, prev), 1, generator=generator))


def plain_greedy(params: SamplingParams) -> bool:
    """Whether a row's token is just the argmax of its logits (greedy, no repetition penalty)."""
    return params.greedy and params.repetition_penalty == 1.0


def _argmax_rows(logits: torch.Tensor) -> list[int]:
    """First index of each row's maximum. On the CPU numpy's single-threaded argmax is ~6x faster than
    torch's (0.09 vs 0.6 ms for 16 x 49152, measured), whose OpenMP threads contend with the engine's."""
    if logits.device.type == "cpu":
        return logits.float().numpy().argmax(-1).tolist()
    return torch.argmax(logits, -1).tolist()


def sample_batch(logits: torch.Tensor, params: list[SamplingParams], prevs: list[list[int]],
                 generators: list) -> list[int]:
    """logits: [B, V]. Plain greedy rows are done in one argmax."""
    out = [0] * len(params)
    plain = [i for i, p in enumerate(params) if plain_greedy(p)]
    if plain:
        if len(plain) == len(params):
            return _argmax_rows(logits)
        am = _argmax_rows(logits[plain])
        for i, t in zip(plain, am):
            out[i] = t
    ps = set(plain)
    for i, p in enumerate(params):
        if i not in ps:
            out[i] = sample_one(logits[i].float(), p, prevs[i], generators[i])
    return out
