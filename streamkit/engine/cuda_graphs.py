"""CUDA-graph capture of the decode step, one graph per batch-size bucket.

Static input buffers (token ids, positions, KV slots, block tables padded to max_blocks, context
lengths) are allocated once at the largest bucket; each bucket's graph is captured on views of
their first B rows and shares one memory pool. At replay the live rows are copied in, padded rows
point at block 0 (reserved trash block) with context length 1, and the first B logits rows are
returned. Requires the decode attention to be shape-static: the Triton paged kernel reads the
block tables / context lengths from device memory, so one graph serves any sequence length.
"""
from __future__ import annotations

import logging
import time

import torch

log = logging.getLogger("streamkit.engine")

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 448, 512)


class CUDAGraphRunner:
    def __init__(self, model, max_batch: int, max_blocks: int, buckets=DEFAULT_BUCKETS, emulate: bool = False):
        """emulate=True (CPU tests): same static buffers, bucketing and padding, no graph capture."""
        self.model = model
        self.emulate = emulate
        self.buckets = sorted(b for b in buckets if b <= max_batch) or [1]
        if self.buckets[-1] < max_batch:
            self.buckets.append(max_batch)
        self.max_batch = self.buckets[-1]
        self.max_blocks = max_blocks
        dev = model.device
        B = self.max_batch
        self.ids = torch.zeros(B, dtype=torch.long, device=dev)
        self.pos = torch.zeros(B, dtype=torch.long, device=dev)
        self.slots = torch.zeros(B, dtype=torch.long, device=dev)
        self.bt = torch.zeros(B, max_blocks, dtype=torch.long, device=dev)
        self.cl = torch.ones(B, dtype=torch.long, device=dev)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool = None

    def can_run(self, n: int) -> bool:
        return 0 < n <= self.max_batch and bool(self.graphs)

    def _bucket(self, n: int) -> int:
        for b in self.buckets:
            if b >= n:
                return b
        raise ValueError(n)

    def _reset_pad(self, start: int, end: int) -> None:
        self.ids[start:end] = 0
        self.pos[start:end] = 0
        self.slots[start:end] = 0  # block 0 slot 0: trash
        self.bt[start:end] = 0
        self.cl[start:end] = 1

    @torch.inference_mode()
    def capture(self) -> None:
        t0 = time.perf_counter()
        m = self.model
        self._reset_pad(0, self.max_batch)
        if self.emulate:
            self.graphs = {B: (None, None) for B in self.buckets}
            return
        for B in reversed(self.buckets):  # largest first so smaller graphs reuse its pool
            args = (self.ids[:B], self.pos[:B], self.slots[:B], self.bt[:B], self.cl[:B])
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(2):
                    m.decode_step(*args)
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=self.pool):
                out = m.decode_step(*args)
            if self.pool is None:
                self.pool = g.pool()
            self.graphs[B] = (g, out)
        torch.cuda.synchronize()
        log.info("engine: captured %d CUDA graphs (batch buckets %s) in %.1fs", len(self.graphs), self.buckets,
                 time.perf_counter() - t0)

    @torch.inference_mode()
    def run(self, ids, positions, slots, block_tables, ctx_lens) -> torch.Tensor:
        n = ids.shape[0]
        B = self._bucket(n)
        nb = block_tables.shape[1]
        if nb > self.max_blocks:
            raise ValueError("sequence longer than the captured block table")
        self.ids[:n].copy_(ids, non_blocking=True)
        self.pos[:n].copy_(positions, non_blocking=True)
        self.slots[:n].copy_(slots, non_blocking=True)
        self.bt[:n, :nb].copy_(block_tables, non_blocking=True)
        self.bt[:n, nb:] = 0
        self.cl[:n].copy_(ctx_lens, non_blocking=True)
        if B > n:
            self._reset_pad(n, B)
        g, out = self.graphs[B]
        if g is None:  # emulation: run the captured body eagerly on the static buffers
            out = self.model.decode_step(self.ids[:B], self.pos[:B], self.slots[:B], self.bt[:B], self.cl[:B])
        else:
            g.replay()
        return out[:n]
