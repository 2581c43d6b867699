"""Continuous-batching scheduler with chunked prefill (runs on the engine thread only).

Each step: every running sequence whose prompt is done contributes one decode token; then the
remaining token budget goes to prefill chunks (partially prefilled sequences first, then newly
admitted ones), so a long prompt never stalls running streams for more than one chunk. KV blocks
are allocated lazily; if the pool runs dry the most recently admitted sequence is preempted
(blocks freed, recomputed later from its tokens). A sequence admitted with nothing computed first
takes the cached blocks of its prompt's longest cached prefix (`PagedKVCache.reuse_prefix`).

Requests that arrive together with a prompt prefix nobody has computed yet (a system prompt, a
chat template's preamble) would each compute it in the same step. So a waiting sequence that
shares at least a block of its prompt, beyond what the cache gave it, with a sequence computing
that part in this step waits one step and then takes it from the cache (SGLang's scheduler defers
such requests too, from 32 shared tokens). 16 chat prompts of the engine bench share 24 tokens:
the first step of their prefill took 7 of them whole (256 rows), so 6 computed the 24 again; now it
takes one, and the other 15 follow a step later from the cache.
"""
from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass

from streamkit.engine.kv_cache import PagedKVCache
from streamkit.engine.sequence import Sequence, State

log = logging.getLogger("streamkit.engine")


@dataclass
class ScheduledStep:
    decode: list[Sequence]
    prefill: list[tuple[Sequence, int]]  # (seq, n tokens this step)

    @property
    def empty(self) -> bool:
        return not self.decode and not self.prefill


class Scheduler:
    def __init__(self, cache: PagedKVCache, max_num_seqs: int, max_batched_tokens: int, max_model_len: int):
        self.cache = cache
        self.max_num_seqs = max_num_seqs
        self.max_batched_tokens = max_batched_tokens
        self.max_model_len = max_model_len
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.prefix_hit_tokens = 0  # prompt tokens taken from the prefix cache instead of computed
        self.preemptions = 0
        self.deferred = 0  # admissions put off a step for a prefix another sequence computed (_computed_now)

    def add(self, seq: Sequence) -> None:
        seq.state = State.WAITING
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def free(self, seq: Sequence) -> None:
        """Release everything a sequence holds (finish or cancel)."""
        self.cache.free(seq.blocks)
        if seq in self.running:
            self.running.remove(seq)
        try:
            self.waiting.remove(seq)
        except ValueError:
            pass
        seq.state = State.FINISHED

    def _preempt_one(self, protect: Sequence) -> Sequence | None:
        for victim in reversed(self.running):
            if victim is not protect:
                self.running.remove(victim)
                self.cache.free(victim.blocks)
                victim.block_keys.clear()
                victim.drop_draft()
                victim.num_computed = 0
                victim.state = State.WAITING
                self.waiting.appendleft(victim)
                self.preemptions += 1
                log.warning("engine: KV cache full, preempted sequence %d (will recompute)", victim.id)
                return victim
        return None

    def schedule(self) -> ScheduledStep:
        budget = self.max_batched_tokens
        decode: list[Sequence] = []
        prefill: list[tuple[Sequence, int]] = []
        # 1. decode tokens for running sequences; one with a speculative draft is verified in one
        #    chunk (its next token and the draft) when the budget and the cache allow, else the
        #    draft is dropped and it decodes one token as usual
        for seq in list(self.running):
            if seq not in self.running:
                continue
            if seq.draft:
                need = seq.n_uncomputed
                if need <= budget and self.cache.ensure_capacity(seq.blocks, seq.num_computed + need):
                    prefill.append((seq, need))
                    budget -= need
                    continue
                seq.drop_draft()
            if seq.n_uncomputed != 1:
                continue
            while not self.cache.ensure_capacity(seq.blocks, seq.num_computed + 1):
                victim = self._preempt_one(seq)
                if victim is None:
                    break
                if victim in decode:  # already scheduled this step: take it back out
                    decode.remove(victim)
                    budget += 1
                for i, (scheduled, n) in enumerate(prefill):  # a draft being verified this step
                    if scheduled is victim:
                        del prefill[i]
                        budget += n
                        break
            if seq in self.running and self.cache.ensure_capacity(seq.blocks, seq.num_computed + 1):
                decode.append(seq)
                budget -= 1
        # 2. continue partially prefilled running sequences
        for seq in self.running:
            if budget <= 0:
                break
            if seq.n_uncomputed > 1 and not seq.draft:
                n = min(seq.n_uncomputed, budget)
                if self.cache.ensure_capacity(seq.blocks, seq.num_computed + n):
                    prefill.append((seq, n))
                    budget -= n
        # 3. admit waiting sequences in order, past those that wait for a prefix computed this step
        i = 0
        while i < len(self.waiting) and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[i]
            reused = 0
            if seq.num_computed == 0 and not seq.blocks:
                reused = seq.num_computed = self.cache.reuse_prefix(seq.tokens, seq.blocks, seq.block_keys)
                if self._computed_now(seq, prefill):
                    self._give_back(seq)
                    self.deferred += 1
                    i += 1
                    continue
            n = min(seq.n_uncomputed, budget)
            # keep a little headroom so admitted sequences can decode
            if self.cache.blocks_needed(seq.num_computed + n) - len(seq.blocks) > self.cache.allocator.num_free - 1:
                if reused:  # a waiting sequence holds no blocks (they could be what a running one needs)
                    self._give_back(seq)
                break
            self.prefix_hit_tokens += reused
            self.cache.ensure_capacity(seq.blocks, seq.num_computed + n)
            del self.waiting[i]
            seq.state = State.RUNNING
            self.running.append(seq)
            prefill.append((seq, n))
            budget -= n
        return ScheduledStep(decode, prefill)

    def _computed_now(self, seq: Sequence, prefill: list[tuple[Sequence, int]]) -> bool:
        """Whether a sequence in this step's prefill computes at least a block more of `seq`'s prompt
        than the cache gave it, in blocks the cache will then hold whole: the prefix cache registers
        full blocks only (and copies a part of one, `_reuse_part`, only from those)."""
        bs = self.cache.block_size
        m = seq.num_computed + bs
        if not self.cache.prefix_caching or m > len(seq.tokens) - 1:
            return False
        head = seq.tokens[:m]
        return any(not other.draft and (other.num_computed + n) // bs * bs >= m and other.tokens[:m] == head
                   for other, n in prefill)

    def _give_back(self, seq: Sequence) -> None:
        """Release the cached blocks a waiting sequence took (reuse_prefix): it holds none while it waits."""
        self.cache.free(seq.blocks)
        seq.block_keys.clear()
        seq.num_computed = 0
