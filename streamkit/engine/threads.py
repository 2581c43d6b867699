"""Adaptive intra-op thread count for the CPU engine.

On a small shared machine (e.g. 2 cores also running ASR/TTS or other processes) OpenMP's
barriers with spinning threads make multi-threaded steps collapse: measured here under load,
a batch-1 decode step took 35-55 ms with 1 thread and 500-1100 ms with 2. Uncontended, 2 threads
are ~1.7x faster, and the gain grows with rows per step (a 16-row step is GEMM-bound). So the
engine keeps a running cost per (step-size bucket, thread count) - a 1-row decode step is never
compared with a 256-token prefill step - picks the cheaper setting per bucket before each step,
and re-explores the other setting for a few steps every `explore_every` steps of that bucket. Each
exploration that leaves the choice as it was doubles that interval (up to `max_backoff` times): on
an idle machine the 1-thread steps it kept exploring cost ~6 % of SmolLM2's batch-1 speed (375 vs
400 tok/s, Zen 5). A setting that gets slower is still left at once, since its own cost is
measured every step, and a change of choice brings the interval back to `explore_every`.

Two kinds of step mislead a running cost, so neither is counted where a fair one can be: the first
step of each size at each setting (the scratch buffers' first touch: SmolLM2's first 37-token
prefill on 2 threads took 172 ms, later ones ~23), and a step that starts workers which sat idle
while fewer threads ran (a 1-thread prefill left the second core asleep and the 2-thread decode
steps after it took 4.7-5 ms against 2.8). Counted, each made 1 thread the choice on an idle
2-core machine: prefills for the next 32 of them, batch-1 decoding at 2.3x its step time.
"""
from __future__ import annotations

import logging

import torch

from streamkit import cores

log = logging.getLogger("streamkit.engine")


def _bucket(n_tokens: int) -> int:
    return min(max(int(n_tokens), 1).bit_length(), 10)  # 1, 2-3, 4-7, 8-15, 16-31, ..., 512+


class ThreadTuner:
    def __init__(self, max_threads: int, explore_every: int = 32, explore_steps: int = 2, margin: float = 0.9,
                 max_backoff: int = 16):
        self.choices = sorted({1, max(1, max_threads)})
        self.current = self.choices[-1]
        self.explore_every = explore_every
        self.explore_steps = explore_steps
        self.max_backoff = max_backoff
        self.margin = margin
        self.cost: dict[tuple[int, int], float] = {}  # (bucket, threads) -> EMA seconds per token
        self._pref: dict[int, int] = {}  # bucket -> preferred thread count
        self._interval: dict[int, int] = {}  # bucket -> steps between explorations now
        self._since: dict[int, int] = {}  # bucket -> steps since its last exploration
        self._explore_left: dict[int, int] = {}  # bucket -> steps left of the exploration under way
        self._exploring_from: dict[int, int] = {}  # bucket -> the preference when its exploration began
        self._changes: int | None = None  # cores.changes() at before(); None: cores were held
        self._seen: set[tuple[int, int]] = set()  # (bucket, threads) run at least once: past the warm-up
        self._warm: set[tuple[int, int]] = set()  # (bucket, threads) whose cost has a warm step in it
        self._cold = False  # the step under way started workers that sat idle before it
        torch.set_num_threads(self.current)

    @property
    def enabled(self) -> bool:
        return len(self.choices) > 1

    def _other(self, threads: int) -> int:
        return self.choices[0] if threads == self.choices[-1] else self.choices[-1]

    def before(self, n_tokens: int) -> int:
        """Pick the thread count for a step of n_tokens rows (call before the forward). While other
        compute of this process holds cores (streamkit.cores) the step leaves them theirs; a step
        during which any did is not measured, so contention it knows of never counts against a setting."""
        held = cores.held()
        self._changes = cores.changes() if not held else None
        if not self.enabled:
            return self.current
        if held:
            self._set(cores.engine_threads(self.choices[-1]))
            return self.current
        b = _bucket(n_tokens)
        pref = self._pref.get(b, self.choices[-1])
        pick = self._next_pick(b)
        if (b, pref) in self.cost and (b, self._other(pref)) in self.cost:  # both measured: explore or count
            if pick != pref:
                left = self._explore_left.get(b, 0)
                if left == 0:
                    left, self._since[b], self._exploring_from[b] = self.explore_steps, 0, pref
                self._explore_left[b] = left - 1
            else:
                self._since[b] = self._since.get(b, 0) + 1
        self._set(pick)
        return pick

    def _next_pick(self, b: int) -> int:
        """The setting before() runs next for bucket b: the preferred one until it is measured, then
        the other until it is, then the other during an exploration (under way, or due after
        `interval` steps), else the preferred one. Changes nothing."""
        pref = self._pref.get(b, self.choices[-1])
        other = self._other(pref)
        if (b, pref) not in self.cost:
            return pref
        if (b, other) not in self.cost:
            return other
        due = self._since.get(b, 0) >= self._interval.get(b, self.explore_every)
        return other if self._explore_left.get(b, 0) > 0 or due else pref

    def explores_next(self, n_tokens: int) -> bool:
        """Whether before(n_tokens) runs the setting not preferred: the engine then runs one step, not
        a decode burst (at batch 1 an exploration was two 16 ms bursts at 1 thread, ~12 steps at
        1.7x the time; the first exploration fell inside the second or third 64-token answer)."""
        if not self.enabled or cores.held():
            return False
        b = _bucket(n_tokens)
        return self._next_pick(b) != self._pref.get(b, self.choices[-1])

    def observe(self, seconds: float, n_tokens: int) -> None:
        if not self.enabled or self._changes is None or self._changes != cores.changes():
            return
        b = _bucket(n_tokens)
        c = seconds / (n_tokens + 8.0)
        key = (b, self.current)
        if key not in self._seen:
            self._seen.add(key)
            return
        if self._cold and key in self._warm:
            return
        # a cold step counts only for a setting no warm step has measured (steps of two sizes that
        # alternate between settings start their workers every time: that is their cost)
        old = None if not self._cold and key not in self._warm else self.cost.get(key)
        if not self._cold:
            self._warm.add(key)
        self.cost[key] = c if old is None else 0.6 * old + 0.4 * c
        pref = self._pref.get(b, self.choices[-1])
        other = self._other(pref)
        cp, co = self.cost.get((b, pref)), self.cost.get((b, other))
        if cp is not None and co is not None and co < self.margin * cp:
            log.info("engine: intra-op threads %d -> %d for %d-token steps (cost %.2g vs %.2g s/token)", pref, other,
                     1 << (b - 1), co, cp)
            self._pref[b] = other
            self._interval[b], self._since[b] = self.explore_every, 0  # the load changed: look again soon
        began = self._exploring_from.get(b)
        if began is not None and self._explore_left.get(b, 0) == 0:  # an exploration has ended
            kept = self._pref.get(b, self.choices[-1]) == began
            interval = self._interval.get(b, self.explore_every)
            self._interval[b] = min(2 * interval, self.max_backoff * self.explore_every) if kept else self.explore_every
            del self._exploring_from[b]

    def _set(self, n: int) -> None:
        self._cold = n > self.current
        if n != self.current:
            torch.set_num_threads(n)
            self.current = n
