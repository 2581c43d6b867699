"""Output processing: what a step's sampled tokens do to their sequences. A token is accepted
(appended, detokenized, checked against stop tokens and stop strings, emitted as text) or, for a
speculative draft, the draft is verified first; finished sequences are released."""
from __future__ import annotations

import torch

from streamkit.engine.scheduler import Scheduler
from streamkit.engine.sequence import Sequence, State
from streamkit.engine.speculative import verify


class OutputProcessor:
    def __init__(self, stop_ids: set[int], max_model_len: int, scheduler: Scheduler,
                 seqs: dict[int, Sequence]) -> None:
        self.stop_ids = stop_ids
        self.max_model_len = max_model_len
        self.scheduler = scheduler
        self.cache = scheduler.cache
        self.seqs = seqs  # the engine's live sequences by id
        self.spec_proposed = 0
        self.spec_accepted = 0

    def verify(self, seq: Sequence, logits: torch.Tensor, now: float) -> int:
        """Keep the accepted part of a sequence's draft and the token after it; returns how many
        tokens it produced. The cache holds K/V for every draft position; only those of accepted
        tokens count as computed (the rest is overwritten by later steps)."""
        draft, qs = seq.draft, seq.draft_q
        seq.drop_draft()
        base = len(seq.tokens)  # the real tokens; K/V computed for all but the last one before this step
        out = verify(logits, draft, seq.params, seq.tokens, seq.generator, qs)
        accepted = len(out) - 1 if out[:-1] == draft[:len(out) - 1] and len(out) - 1 <= len(draft) else 0
        self.spec_proposed += len(draft)
        self.spec_accepted += accepted
        seq.num_computed = base + accepted
        produced = 0
        for tok in out:
            if seq.state is not State.RUNNING:
                break
            self.accept(seq, tok, now)
            produced += 1
        if seq.state is State.RUNNING:
            self.cache.register_computed(seq.tokens, seq.blocks, seq.block_keys, seq.num_computed)
        return produced

    def accept(self, seq: Sequence, tok: int, now: float) -> None:
        if seq.t_first is None:
            seq.t_first = now
        seq.n_generated += 1
        if tok in self.stop_ids and not seq.ignore_eos:
            self.finish(seq, "stop")
            return
        seq.tokens.append(tok)
        if seq.want_tokens:
            seq.emit("token", tok)
        piece = seq.decoder.push(tok)
        if piece:
            out, stopped = seq.stopper.push(piece)
            if out:
                seq.emit("text", out)
            if stopped:
                self.finish(seq, "stop", flush=False)
                return
        if seq.n_generated >= seq.params.max_tokens or len(seq.tokens) >= self.max_model_len:
            self.finish(seq, "length")

    def finish(self, seq: Sequence, reason: str, flush: bool = True) -> None:
        if flush and seq.decoder is not None:
            tail = seq.decoder.flush()
            out, stopped = seq.stopper.push(tail) if tail else ("", False)
            out += "" if stopped else seq.stopper.flush()
            if out:
                seq.emit("text", out)
        seq.finish_reason = reason
        self.seqs.pop(seq.id, None)
        self.scheduler.free(seq)
        seq.emit("done", {"finish_reason": reason, "prompt_tokens": len(seq.prompt_ids),
                          "completion_tokens": seq.n_generated,
                          "ttft_s": (seq.t_first - seq.t_submit) if seq.t_first else None})
