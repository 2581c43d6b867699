"""Speculative decoding: a cheap proposal of the next k tokens, checked by the target model in one
batched step, so several tokens can come out of one forward pass.

Proposals come from a draft model (draft.py: a small model with the target's vocabulary, its own
paged KV cache) or, where no draft model fits, from n-gram prompt lookup (here): the last n tokens
(n = 3, 2, 1) are looked up earlier in the sequence's own context and the tokens that followed them
are proposed. Prompt lookup pays off where output repeats its input (summaries, quotes, code).

Verification keeps the output distribution exactly the target's (the standard rejection rule,
Leviathan et al. / Chen et al. 2023): draft token d, proposed with probability q(d), is accepted with
probability min(1, p(d) / q(d)); on rejection the token is drawn from max(p - q, 0), normalised.
A prompt-lookup proposal is deterministic (q is one-hot on d), so d is accepted with probability
p(d) and a rejection draws from p with d removed. Under greedy decoding p is one-hot on argmax and
the rule reduces to "accept while the draft equals the argmax", giving the plain greedy output.
"""
from __future__ import annotations

import torch

from streamkit.engine.params import SamplingParams
from streamkit.engine.sampling import apply_repetition_penalty, sample_one, target_probs


def propose_ngram(tokens: list[int], k: int, max_n: int = 3, min_n: int = 1, window: int = 1024) -> list[int]:
    """Up to k tokens that followed the most recent earlier occurrence of the sequence's last n
    tokens (longest n first), searched in the last `window` tokens; [] when there is none."""
    if k <= 0:
        return []
    ctx = tokens[-window:]
    for n in range(max_n, min_n - 1, -1):
        if len(ctx) <= n:
            continue
        pattern = ctx[-n:]
        for start in range(len(ctx) - n - 1, -1, -1):
            if ctx[start:start + n] == pattern:
                follow = ctx[start + n:start + n + k]
                if follow:
                    return follow
    return []


def accept_or_resample(p: torch.Tensor, q: torch.Tensor | None, draft: int,
                       generator: torch.Generator | None) -> tuple[bool, int]:
    """One step of the rejection rule. p: the target's probabilities [V]; q: the draft's [V], or
    None for a deterministic proposal (one-hot on `draft`). Returns (accepted, token)."""
    p_d = float(p[draft])
    q_d = 1.0 if q is None else float(q[draft])
    u = float(torch.rand((), generator=generator))
    if q_d > 0 and u < min(1.0, p_d / q_d):
        return True, draft
    residual = p.clone() if q is None else torch.clamp(p - q, min=0.0)
    if q is None:
        residual[draft] = 0.0
    total = float(residual.sum())
    if total <= 0.0:  # p equals q where it matters: any draw from p is exact
        residual, total = p, float(p.sum())
    return False, int(torch.multinomial(residual / total, 1, generator=generator))


def verify(logits: torch.Tensor, draft: list[int], params: SamplingParams, prev: list[int],
           generator: torch.Generator | None, qs: list[torch.Tensor] | None = None) -> list[int]:
    """The tokens a step with `draft` produces: the accepted prefix of the draft, then one token
    from the target (the correction at the first rejection, or the bonus after a full accept).
    logits: [len(draft) + 1, V] float32, row i predicting the token after prev + draft[:i].
    qs: the draft model's distribution each draft token was sampled from, or None for a
    deterministic proposal (greedy drafts, prompt lookup)."""
    out: list[int] = []
    for i, d in enumerate(draft):
        context = prev + out
        if params.greedy:
            tok = int(torch.argmax(apply_repetition_penalty(logits[i].float(), context, params.repetition_penalty)))
            out.append(tok)
            if tok != d:
                return out
            continue
        accepted, tok = accept_or_resample(target_probs(logits[i].float(), params, context),
                                           qs[i] if qs else None, d, generator)
        out.append(tok)
        if not accepted:
            return out
    out.append(sample_one(logits[len(draft)].float(), params, prev + out, generator))
    return out
