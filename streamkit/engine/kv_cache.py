"""Paged KV cache: fixed-size blocks in one pool, a block table per sequence."""
from __future__ import annotations

import torch


class BlockAllocator:
    """Free list of block ids. Block 0 is reserved (a trash slot for padded rows)."""

    def __init__(self, num_blocks: int):
        if num_blocks < 2:
            raise ValueError("need at least 2 KV blocks")
        self.num_blocks = num_blocks
        self._free = list(range(num_blocks - 1, 0, -1))  # pop() hands out low ids first

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        if not self._free:
            raise MemoryError("KV cache full")
        return self._free.pop()

    def free(self, blocks: list[int]) -> None:
        self._free.extend(reversed(blocks))
        blocks.clear()


class PagedKVCache:
    """k/v pool shaped [n_layers, n_kv_heads, num_blocks * block_size, head_dim] (head-major).

    A token at position p of a sequence lives at slot block_table[p // bs] * bs + p % bs. Head-major
    blocks make one (kv head, block) a contiguous block_size x head_dim tile, so decode attention
    gathers whole tiles and the gathered K/V is already [KV, B, L, D] (no transpose copy).
    """

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, num_blocks: int, block_size: int,
                 dtype: torch.dtype, device: torch.device | str):
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.n_layers = n_layers
        shape = (n_layers, n_kv_heads, num_blocks * block_size, head_dim)
        # zeros: masked-out (never written) slots must stay finite
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.allocator = BlockAllocator(num_blocks)

    @property
    def bytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.n_layers * self.k.shape[1] * self.k.shape[3] * self.k.element_size()

    def blocks_needed(self, n_tokens: int) -> int:
        return -(-n_tokens // self.block_size)

    def ensure_capacity(self, blocks: list[int], n_tokens: int) -> bool:
        """Grow `blocks` so it covers n_tokens; False (nothing allocated) if the pool is short."""
        need = self.blocks_needed(n_tokens) - len(blocks)
        if need <= 0:
            return True
        if need > self.allocator.num_free:
            return False
        for _ in range(need):
            blocks.append(self.allocator.allocate())
        return True

    def free(self, blocks: list[int]) -> None:
        self.allocator.free(blocks)

    def slots(self, blocks: list[int], start: int, end: int) -> list[int]:
        bs = self.block_size
        return [blocks[p // bs] * bs + p % bs for p in range(start, end)]
