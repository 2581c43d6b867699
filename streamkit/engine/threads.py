"""Adaptive intra-op thread count for the CPU engine.

On a small shared machine (e.g. 2 cores also running ASR/TTS or other processes) OpenMP's
barriers with spinning threads make multi-threaded steps collapse: measured here under load,
a batch-1 decode step took 35-55 ms with 1 thread and 500-1100 ms with 2. Uncontended, 2 threads
are ~1.7x faster. So the engine keeps a running cost per thread count and re-explores the other
setting every `explore_every` steps, switching when it is clearly faster.
"""
from __future__ import annotations

import logging

import torch

log = logging.getLogger("streamkit.engine")


class ThreadTuner:
    def __init__(self, max_threads: int, explore_every: int = 32, explore_steps: int = 3):
        self.choices = sorted({1, max(1, max_threads)})
        self.current = self.choices[-1]
        self.cost = {c: None for c in self.choices}
        self.explore_every = explore_every
        self.explore_steps = explore_steps
        self._step = 0
        self._exploring = 0
        self._home = self.current
        torch.set_num_threads(self.current)

    @property
    def enabled(self) -> bool:
        return len(self.choices) > 1

    def observe(self, seconds: float, n_tokens: int) -> None:
        if not self.enabled:
            return
        c = seconds / (n_tokens + 8.0)
        old = self.cost[self.current]
        self.cost[self.current] = c if old is None else 0.7 * old + 0.3 * c
        self._step += 1
        if self._exploring:
            self._exploring -= 1
            if self._exploring == 0:
                other = self.current
                best = min(self.choices, key=lambda k: self.cost[k] if self.cost[k] is not None else 1e9)
                if best != self._home and self.cost[other] < 0.8 * self.cost[self._home]:
                    log.info("engine: intra-op threads %d -> %d (cost %.2g vs %.2g s/token)", self._home, other,
                             self.cost[other], self.cost[self._home])
                    self._set(other)
                else:
                    self._set(self._home)
        elif self._step % self.explore_every == 0 or self._step == 8:
            self._home = self.current
            other = [k for k in self.choices if k != self.current][0]
            self.cost[other] = None
            self._exploring = self.explore_steps
            self._set(other)

    def _set(self, n: int) -> None:
        if n != self.current:
            torch.set_num_threads(n)
            self.current = n
