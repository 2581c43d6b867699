"""Draft-model speculative decoding: a small model with the target's vocabulary proposes the next k
tokens of every running sequence, and the target checks them in one batched step (speculative.py's
`verify`, the same path as n-gram proposals).

The draft has a KV cache of its own: a `PagedKVCache` (own pool, block allocator and prefix cache)
sized to the target's number of blocks, and per target sequence a `DraftState` holding the tokens its
K/V stands for, how many of them are computed and its block table. Each round, per sequence:

1. sync: the draft's tokens are compared with the target's from the last point known equal; K/V
   past the first difference no longer counts (the rollback to the accepted length is just
   `num_computed = min(num_computed, common prefix)`: the slots are overwritten later). A sequence
   the draft has never seen takes the draft cache's prefix blocks for its prompt (the system prompt
   is computed once for the draft too), whatever the target's own cache reused.
2. one forward over every sequence's catch-up chunk (the prompt the first time, afterwards the 1-2
   tokens the target accepted since: the last accepted draft token and the target's correction or
   bonus), whose last row gives the first draft token; then k-1 batched decode forwards.
Draft tokens are greedy when the request is greedy, else sampled from the draft's own distribution
q (the request's temperature / top-k / top-p / penalty on the draft's logits), and q is recorded
for the rejection rule. Only blocks of verified tokens are registered in the draft's prefix cache.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import torch

from streamkit.engine.batch import build_step
from streamkit.engine.gguf_file import read_metadata
from streamkit.engine.gguf_loader import load_gguf
from streamkit.engine.kv_cache import PagedKVCache
from streamkit.engine.native.weights import requantize_q4_0
from streamkit.engine.sampling import sample_batch, target_probs
from streamkit.engine.scheduler import ScheduledStep
from streamkit.engine.sequence import Sequence, State

log = logging.getLogger("streamkit.engine")

# what has to be equal for a draft's token ids to mean what the target's mean
VOCAB_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.merges",
              "tokenizer.ggml.token_type")


# tensor types a `native` draft narrows to Q4_0 at load (Q4_K is 4-bit already; the embedding is only
# looked up): a 0.5B draft's step then reads ~280 MB instead of ~525 MB (Q5_0 runs as Q8_0 natively)
NARROW_TYPES = ("Q5_0", "Q8_0", "Q6_K", "Q5_K")
# and its batched int8 steps (the catch-up over a new prompt) take one activation term, not the
# target's two: the 0.5B's 16-row step on Zen 5 40 -> 28 ms; the 1-4 row steps are two-term always
NARROW_INT8_TERMS = 1


def narrow_to_q4_0(blocks: dict[str, tuple[str, np.ndarray]], lib) -> int:
    """Re-quantize a raw-loaded GGUF's matrices to Q4_0 in place (by the native kernels of `lib`, as
    gguf-py would: weights.requantize_q4_0); returns how many. Drafts need not be exact: the target
    verifies every token, so a draft only trades acceptance for speed."""
    n = 0
    for name, (kind, data) in list(blocks.items()):
        if kind in NARROW_TYPES and name != "token_embd.weight" and data.shape[-1] > 0:
            blocks[name] = ("Q4_0", requantize_q4_0(kind, data, lib))
            n += 1
    return n


class DraftVocabularyError(ValueError):
    """The draft model's tokenizer is not the target's: its token ids would mean other strings."""


def check_vocabulary(draft_meta: dict, target_meta: dict, draft_path: str = "the draft model") -> None:
    for key in VOCAB_KEYS:
        a, b = draft_meta.get(key), target_meta.get(key)
        if a != b:
            what = f"{len(a)} vs {len(b)} entries" if isinstance(a, list) and isinstance(b, list) else f"{a!r} vs {b!r}"
            raise DraftVocabularyError(f"{draft_path} cannot draft for this model: its {key} differs ({what}); "
                                       f"a draft must share the target's tokenizer")


@dataclass(eq=False)
class DraftState:
    """A target sequence as the draft model sees it (duck-types the fields `build_step` reads)."""
    tokens: list[int]
    num_computed: int = 0
    blocks: list[int] = field(default_factory=list)
    block_keys: list[bytes] = field(default_factory=list)
    verified: int = 0  # tokens[:verified] equal the target's tokens at the last sync
    draft: list[int] = field(default_factory=list)  # always empty (build_step samples its last row)


class DraftRunner:
    """The draft model, its paged KV cache and one DraftState per target sequence."""

    def __init__(self, path: str, target_meta: dict, target_vocab: int, weights: str, device: torch.device,
                 num_blocks: int, block_size: int, prefix_caching: bool, max_batched_tokens: int,
                 attn_backend: str | None = None, narrow: bool = True, stop_p: float = 0.0,
                 isa: str | None = None) -> None:
        check_vocabulary(read_metadata(path), target_meta, path)  # before any tensor is read
        from streamkit.engine.native.model import MODES as NATIVE_MODES
        from streamkit.engine.native.model import NativeLlamaModel

        native_mode = weights in NATIVE_MODES
        gm = load_gguf(path, raw=native_mode)
        if narrow and weights == "native":
            from streamkit.engine import native

            n = narrow_to_q4_0(gm.blocks, native.load(native.resolve_isa(isa)))
            log.info("engine: draft weights narrowed to Q4_0 (%d matrices)", n)
        if gm.config.vocab_size != target_vocab:
            raise DraftVocabularyError(f"{path} has {gm.config.vocab_size} logits per token; the target has "
                                       f"{target_vocab}")
        self.model: Any
        if native_mode:
            # the target's kernel path
            self.model = NativeLlamaModel(gm, weights, isa=isa, int8_terms=NARROW_INT8_TERMS if narrow else None)
            self.model.reuse_logits = True  # every forward's logits are sampled before the next one
        else:
            from streamkit.engine.model import LlamaModel

            self.model = LlamaModel(gm, device, weights=weights, attn_backend=attn_backend)
        cfg = gm.config
        del gm
        self.path = path
        self.device = device
        kv_dtype = getattr(self.model, "kv_dtype", self.model.act_dtype)
        self.cache = PagedKVCache(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, num_blocks, block_size, kv_dtype,
                                  device, prefix_caching=prefix_caching)
        self.model.kv_cache = self.cache
        self.max_batched_tokens = max_batched_tokens
        self.states: dict[int, tuple[Sequence, DraftState]] = {}
        self.forwards = 0  # draft model forward passes
        self.forward_s = 0.0  # and the time they took
        self.stop_p = stop_p
        self.prefix_hit_tokens = 0
        self.last_catch_up = 0  # the most rows one sequence's first forward took in the last propose()
        log.info("engine: draft model %s ready (%d layers, KV cache %.0f MB)", path, cfg.n_layers,
                 self.cache.bytes / 1e6)

    # ------------------------------------------------------------ per-sequence state
    def _release(self, seq_id: int) -> None:
        _, st = self.states.pop(seq_id)
        self.cache.free(st.blocks)

    def gc(self) -> None:
        """Free the draft states of finished or cancelled sequences."""
        for sid in [sid for sid, (seq, _) in self.states.items() if seq.state is State.FINISHED]:
            self._release(sid)

    def _sync(self, seq: Sequence) -> DraftState:
        """The draft's state for `seq`, rolled back to what still equals the target's tokens."""
        entry = self.states.get(seq.id)
        target = seq.tokens
        if entry is None:
            st = DraftState(tokens=list(target))
            st.num_computed = self.cache.reuse_prefix(st.tokens, st.blocks, st.block_keys)
            self.prefix_hit_tokens += st.num_computed
            self.states[seq.id] = (seq, st)
        else:
            st = entry[1]
            m, n = st.verified, min(len(st.tokens), len(target))
            while m < n and st.tokens[m] == target[m]:
                m += 1
            del st.tokens[m:]
            st.tokens.extend(target[m:])
            # the last token is always fed, so its logits give the first draft token
            st.num_computed = min(st.num_computed, m, len(st.tokens) - 1)
        st.verified = len(target)
        self.cache.register_computed(st.tokens, st.blocks, st.block_keys, st.num_computed)
        return st

    def _room(self, st: DraftState, k: int, protect: Sequence) -> bool:
        """Blocks for the catch-up and k-1 fed draft tokens; states of sequences that are not
        running give theirs back first when the pool is short."""
        n = len(st.tokens) + k - 1
        if self.cache.ensure_capacity(st.blocks, n):
            return True
        for sid in [sid for sid, (s, _) in self.states.items() if s is not protect and s.state is not State.RUNNING]:
            self._release(sid)
        return self.cache.ensure_capacity(st.blocks, n)

    # ------------------------------------------------------------ proposing
    def _forward(self, step: ScheduledStep) -> tuple[torch.Tensor, list[DraftState]]:
        t0 = time.perf_counter()
        b, _prefill, sampled = build_step(step, self.cache, self.device)  # DraftStates in Sequences' place
        logits = self.model.forward(b)
        self.forwards += 1
        self.forward_s += time.perf_counter() - t0
        return logits, [cast(DraftState, st) for st, _ in sampled]

    def _pick(self, logits: torch.Tensor, rows: list[tuple[Sequence, DraftState]], drafts: dict[int, list[int]],
              qs: dict[int, list[torch.Tensor]], more: bool) -> set[int]:
        """One draft token per row: greedy rows in one batch, sampled rows with their q kept.
        Returns the ids of sequences whose draft stops here: the draft's probability of the token it
        picked fell below `stop_p`, so the next ones would likely be rejected (their forwards saved).
        `more`: whether any row may draft another token (else the greedy rows' softmax is skipped)."""
        stop: set[int] = set()
        check_stop = self.stop_p > 0 and more
        greedy = [i for i, (seq, _) in enumerate(rows) if seq.params.greedy]
        if greedy:
            sel = logits if len(greedy) == len(rows) else logits[torch.tensor(greedy)]
            toks = sample_batch(sel, [rows[i][0].params for i in greedy],
                                [rows[i][1].tokens for i in greedy], [None] * len(greedy))
            if check_stop:
                x = sel.numpy() if sel.device.type == "cpu" else sel.float().cpu().numpy()
                top = 1.0 / np.exp(x - x.max(-1, keepdims=True)).sum(-1)  # softmax of the argmax
            for j, (i, tok) in enumerate(zip(greedy, toks)):
                drafts[rows[i][0].id].append(tok)
                rows[i][1].tokens.append(tok)
                if check_stop and top[j] < self.stop_p:
                    stop.add(rows[i][0].id)
        for i, (seq, st) in enumerate(rows):
            if seq.params.greedy:
                continue
            q = target_probs(logits[i].float(), seq.params, st.tokens)
            tok = int(torch.multinomial(q, 1, generator=cast("torch.Generator | None", seq.generator)))
            drafts[seq.id].append(tok)
            qs[seq.id].append(q)
            st.tokens.append(tok)
            if float(q[tok]) < self.stop_p:
                stop.add(seq.id)
        return stop

    def propose(self, work: list[tuple[Sequence, int]]) -> int:
        """Give each (sequence, k) a draft of up to k tokens (appended to `seq.tokens`, listed in
        `seq.draft`, with `seq.draft_q` for sampled requests). A sequence whose catch-up does not fit
        in this step's token budget only advances its draft K/V. Returns the number of sequences
        that got a draft."""
        self.gc()
        budget = self.max_batched_tokens
        chunks: list[tuple[DraftState, int]] = []
        active: list[tuple[Sequence, DraftState, int]] = []
        for seq, k in work:
            st = self._sync(seq)
            need = len(st.tokens) - st.num_computed
            if need > budget:
                if budget > 0 and self.cache.ensure_capacity(st.blocks, st.num_computed + budget):
                    chunks.append((st, budget))  # a partial catch-up: no draft this step
                    budget = 0
                continue
            if not self._room(st, k, seq):
                self._release(seq.id)  # starts over (its prompt from the prefix cache) when there is room
                continue
            chunks.append((st, need))
            budget -= need
            active.append((seq, st, k))
        self.last_catch_up = max((n for _, n in chunks), default=0)
        if not chunks:
            return 0
        drafts: dict[int, list[int]] = {seq.id: [] for seq, _, _ in active}
        qs: dict[int, list[torch.Tensor]] = {seq.id: [] for seq, _, _ in active}
        by_state = {id(st): (seq, st) for seq, st, _ in active}
        logits, sampled = self._forward(ScheduledStep(decode=[], prefill=cast(list, chunks)))
        for st, n in chunks:
            st.num_computed += n
        k_max = max((k for _, _, k in active), default=0)
        stopped = self._pick(logits, [by_state[id(st)] for st in sampled], drafts, qs, k_max > 1)
        for j in range(1, k_max):
            rows = [(seq, st) for seq, st, k in active if k > j and seq.id not in stopped]
            if not rows:
                break
            logits, _ = self._forward(ScheduledStep(decode=cast(list, [st for _, st in rows]), prefill=[]))
            for _, st in rows:
                st.num_computed += 1
            stopped |= self._pick(logits, rows, drafts, qs, k_max > j + 1)
        for seq, _, _ in active:
            seq.draft = drafts[seq.id]
            seq.draft_q = qs[seq.id] or None
            seq.tokens.extend(seq.draft)
        return len(active)

    def stats(self) -> dict:
        return {"draft_forwards": self.forwards, "draft_forward_s": round(self.forward_s, 3), "draft_prefix_cache_hit_tokens": self.prefix_hit_tokens,
                "draft_kv_blocks_free": self.cache.allocator.num_free}
