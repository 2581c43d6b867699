"""One engine step's batch: the scheduler's decode tokens and prefill chunks flattened into a
StepBatch (token ids, positions, cache slots, block tables), plus which logit rows each sequence
samples from."""
from __future__ import annotations

import torch

from streamkit.engine.kv_cache import PagedKVCache
from streamkit.engine.model import StepBatch
from streamkit.engine.scheduler import ScheduledStep
from streamkit.engine.sequence import Sequence


def build_step(st: ScheduledStep, cache: PagedKVCache, dev: torch.device
               ) -> tuple[StepBatch, list[tuple[Sequence, int]], list[tuple[Sequence, int]]]:
    """The step's batch, its prefill chunks, and (sequence, logit rows) for every sequence that
    samples this step: one row, or 1 + its draft's length for a draft being verified."""
    bs = cache.block_size
    ids, pos, slots = [], [], []
    for seq in st.decode:
        p = seq.num_computed
        ids.append(seq.tokens[p])
        pos.append(p)
        slots.append(seq.blocks[p // bs] * bs + p % bs)
    nd = len(ids)
    bt = cl = None
    if nd:
        nb = max(len(s.blocks) for s in st.decode)
        bt = torch.tensor([s.blocks + [0] * (nb - len(s.blocks)) for s in st.decode], dtype=torch.long)
        cl = torch.tensor([s.num_computed + 1 for s in st.decode], dtype=torch.long)
    logit_rows = list(range(nd))
    sampled = [(s, 1) for s in st.decode]
    prefills = []
    for seq, n in st.prefill:
        t0 = len(ids)
        p0 = seq.num_computed
        ids.extend(seq.tokens[p0:p0 + n])
        pos.extend(range(p0, p0 + n))
        slots.extend(cache.slots(seq.blocks, p0, p0 + n))
        prev = torch.tensor(cache.slots(seq.blocks, 0, p0), dtype=torch.long, device=dev) if p0 else None
        prefills.append((t0, n, p0, prev))
        if seq.draft:  # every position of the verified chunk predicts a token
            logit_rows.extend(range(t0, t0 + n))
            sampled.append((seq, n))
        elif p0 + n == len(seq.tokens):
            logit_rows.append(t0 + n - 1)
            sampled.append((seq, 1))
    b = StepBatch(ids=torch.tensor(ids, dtype=torch.long, device=dev),
                  positions=torch.tensor(pos, dtype=torch.long, device=dev),
                  slots=torch.tensor(slots, dtype=torch.long, device=dev), n_decode=nd,
                  block_tables=bt.to(dev) if bt is not None else None,
                  ctx_lens=cl.to(dev) if cl is not None else None, prefills=prefills,
                  logit_rows=None if len(logit_rows) == len(ids) else torch.tensor(logit_rows, dtype=torch.long,
                                                                                    device=dev))
    return b, st.prefill, sampled
