"""Paged KV cache: fixed-size blocks in one pool, a block table per sequence, and prefix caching.

Prefix caching: a block whose 16 (block_size) tokens are all computed is registered under a hash of
those tokens and of every token before them. A new sequence whose prompt starts with the same full
blocks shares them (reference counts) instead of computing them again: a system prompt or the
history of a conversation is prefilled once. A registered block nobody holds stays cached until
the pool needs it (the least recently released goes first, a sequence's tail before its head).

A shared prefix rarely ends on a block boundary: a system prompt of 356 tokens leaves 4 of its
tokens in a block whose other 12 differ per request. So after the full blocks, a new sequence also
takes the longest run of tokens it shares with any cached block that follows the same prefix,
copied into a block of its own (SGLang's radix cache shares at token granularity; a copy keeps the
blocks here whole). For the dubbing translator that drops the median uncomputed prompt from 18
tokens to 14, one 16-row tile.
"""
from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np
import torch

from streamkit.engine.arena import HugePageArena


def block_hash(parent: bytes, tokens: Sequence[int]) -> bytes:
    """The key of a full block: its tokens and (through `parent`, the previous block's key, b"" for
    the first) all tokens before it. 128-bit BLAKE2b: a collision would silently hand a sequence
    another prompt's K/V, so no 64-bit hash."""
    h = hashlib.blake2b(parent, digest_size=16)
    h.update(array("q", tokens).tobytes())
    return h.digest()


class BlockAllocator:
    """Reference-counted block ids. Block 0 is reserved (a trash slot for padded rows).

    `num_free` counts blocks that can be handed out: never used or released ones, and cached ones
    that nobody holds (allocate() evicts those when nothing else is left)."""

    def __init__(self, num_blocks: int):
        if num_blocks < 2:
            raise ValueError("need at least 2 KV blocks")
        self.num_blocks = num_blocks
        self._free = list(range(num_blocks - 1, 0, -1))  # pop() hands out low ids first
        self._refs = [0] * num_blocks
        self._key_of: dict[int, bytes] = {}  # registered block -> its key
        self._by_key: dict[bytes, int] = {}
        # partial-block reuse: the registered blocks after each parent key, by their first token:
        # parent -> first token -> {block: its tokens}
        self._children: dict[bytes, dict[int, dict[int, tuple[int, ...]]]] = {}
        self._parent_of: dict[int, tuple[bytes, int]] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()  # registered, held by nobody; oldest first
        self.evicted = 0  # cached blocks handed out again for other tokens

    @property
    def num_free(self) -> int:
        return len(self._free) + len(self._evictable)

    @property
    def num_cached(self) -> int:
        return len(self._by_key)

    def allocate(self) -> int:
        if self._free:
            block = self._free.pop()
        elif self._evictable:
            block, _ = self._evictable.popitem(last=False)
            self._forget(block)
            self.evicted += 1
        else:
            raise MemoryError("KV cache full")
        self._refs[block] = 1
        return block

    def free(self, blocks: list[int]) -> None:
        """Drop one reference to each block and clear the list; the tail goes first, so a cached
        sequence's last blocks are evicted before the prefix others are likelier to share."""
        for block in reversed(blocks):
            self._refs[block] -= 1
            if self._refs[block] == 0:
                if block in self._key_of:
                    self._evictable[block] = None
                else:
                    self._free.append(block)
        blocks.clear()

    def lookup(self, key: bytes) -> int | None:
        return self._by_key.get(key)

    def share(self, block: int) -> None:
        """One more holder of a cached block (taken back from the evictable ones if nobody held it)."""
        if self._refs[block] == 0:
            del self._evictable[block]
        self._refs[block] += 1

    def register(self, block: int, key: bytes, parent: bytes = b"", tokens: Sequence[int] = ()) -> None:
        """Make a full, computed block findable by its key (the first block with a key keeps it), and
        by its `tokens` among the blocks after `parent` (the previous block's key)."""
        if key not in self._by_key and block not in self._key_of:
            self._by_key[key] = block
            self._key_of[block] = key
            if tokens:
                self._children.setdefault(parent, {}).setdefault(tokens[0], {})[block] = tuple(tokens)
                self._parent_of[block] = (parent, tokens[0])

    def children(self, parent: bytes, first: int) -> dict[int, tuple[int, ...]]:
        """The registered blocks that follow the block keyed `parent` (b"": first blocks) and start
        with token `first`, with their tokens."""
        return self._children.get(parent, {}).get(first, {})

    def _forget(self, block: int) -> None:
        del self._by_key[self._key_of.pop(block)]
        if block not in self._parent_of:
            return
        parent, first = self._parent_of.pop(block)
        by_first = self._children[parent]
        del by_first[first][block]
        if not by_first[first]:
            del by_first[first]
        if not by_first:
            del self._children[parent]

    def drop_cached(self) -> None:
        """Forget every cached block nobody holds (held ones stay registered)."""
        while self._evictable:
            block, _ = self._evictable.popitem(last=False)
            self._forget(block)
            self._free.append(block)


_NUMPY_DTYPES = {torch.float32: np.float32, torch.float16: np.float16, torch.int8: np.int8}


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zeroed pool: on the CPU in 2 MB pages where the kernel grants them (attention streams it
    as a batch-1 step streams the weights: arena.py), elsewhere torch's own."""
    if device.type == "cpu" and dtype in _NUMPY_DTYPES:
        pool = HugePageArena().zeros(shape, _NUMPY_DTYPES[dtype])
        # written once, as torch.zeros did, so the pool's pages are faulted in at load: faulted one
        # 2 MB page at a time as sequences reached them, the dubbing bench's first audio went from
        # 1327 to 1573 ms (p50) and its silences inside the speech from 34 to 308 ms
        pool.fill(0)
        return torch.from_numpy(pool)
    return torch.zeros(shape, dtype=dtype, device=device)


def kv_bytes_per_token(n_layers: int, n_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """Bytes a token's K and V take in every layer: int8 pools add a float32 scale a K column / V row."""
    per_head = head_dim * torch.tensor([], dtype=dtype).element_size() + (4 if dtype == torch.int8 else 0)
    return 2 * n_layers * n_kv_heads * per_head


class PagedKVCache:
    """k/v pool shaped [n_layers, n_kv_heads, num_blocks * block_size, head_dim] (head-major).

    A token at position p of a sequence lives at slot block_table[p // bs] * bs + p % bs. Head-major
    blocks make one (kv head, block) a contiguous block_size x head_dim tile, so decode attention
    gathers whole tiles and the gathered K/V is already [KV, B, L, D] (no transpose copy).

    dtype torch.int8 (the native CPU kernels only): each slot's K and V of a KV head are int8 with one
    float32 scale each, in k_scale / v_scale [n_layers, n_kv_heads, num_blocks * block_size]; about
    half float16's bytes, which attention at many streams or long contexts waits on.
    """

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, num_blocks: int, block_size: int,
                 dtype: torch.dtype, device: torch.device | str, prefix_caching: bool = True):
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.num_blocks = num_blocks
        self.n_layers = n_layers
        shape = (n_layers, n_kv_heads, num_blocks * block_size, head_dim)
        # zeros: masked-out (never written) slots must stay finite
        self.k, self.v = (_zeros(shape, dtype, torch.device(device)) for _ in range(2))
        self.k_scale = self.v_scale = None
        if dtype == torch.int8:
            self.k_scale, self.v_scale = (_zeros(shape[:3], torch.float32, torch.device(device)) for _ in range(2))
        self.allocator = BlockAllocator(num_blocks)

    @property
    def bytes(self) -> int:
        return self.bytes_per_token * self.k.shape[2]  # every slot

    @property
    def bytes_per_token(self) -> int:
        return kv_bytes_per_token(self.n_layers, self.k.shape[1], self.k.shape[3], self.k.dtype)

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

    def reuse_prefix(self, tokens: list[int], blocks: list[int], keys: list[bytes]) -> int:
        """Give a sequence with nothing computed yet (`blocks` and `keys` empty) the cached blocks of
        the longest run of full blocks its `tokens` start with, then a copy of the longest run of
        tokens after them that a cached block shares, leaving at least its last token to compute
        (that token's logits are wanted). Returns the number of tokens they cover."""
        if not self.prefix_caching:
            return 0
        bs = self.block_size
        for i in range((len(tokens) - 1) // bs):
            key = block_hash(keys[-1] if keys else b"", tokens[i * bs:(i + 1) * bs])
            block = self.allocator.lookup(key)
            if block is None:
                break
            self.allocator.share(block)
            blocks.append(block)
            keys.append(key)
        start = len(blocks) * bs
        return start + self._reuse_part(tokens[start:len(tokens) - 1], keys[-1] if keys else b"", blocks)

    def _reuse_part(self, rest: list[int], parent: bytes, blocks: list[int]) -> int:
        """Copy the cached block after `parent` that shares the longest run of tokens with `rest`
        (fewer than a block) into a new block appended to `blocks`; returns the tokens it covers."""
        best, best_n = None, 0
        for block, toks in (self.allocator.children(parent, rest[0]) if rest else {}).items():
            n = 0
            for a, b in zip(toks, rest):
                if a != b:
                    break
                n += 1
            if n > best_n:
                best, best_n = block, n
        if best is None:
            return 0
        held = [best]
        self.allocator.share(best)  # so that the allocation below cannot evict it
        try:
            new = self.allocator.allocate()
        except MemoryError:
            return 0
        finally:
            self.allocator.free(held)
        bs = self.block_size
        # the whole block: its slots past best_n are overwritten before anything attends to them
        for pool in (self.k, self.v, self.k_scale, self.v_scale):
            if pool is not None:
                pool[:, :, new * bs:(new + 1) * bs] = pool[:, :, best * bs:(best + 1) * bs]
        blocks.append(new)
        return best_n

    def register_computed(self, tokens: list[int], blocks: list[int], keys: list[bytes], num_computed: int) -> None:
        """Register the blocks that a sequence's first `num_computed` tokens fill and that are not
        registered yet (`keys` holds the keys of those that are)."""
        if not self.prefix_caching:
            return
        bs = self.block_size
        for i in range(len(keys), num_computed // bs):
            parent, block_tokens = keys[-1] if keys else b"", tokens[i * bs:(i + 1) * bs]
            key = block_hash(parent, block_tokens)
            self.allocator.register(blocks[i], key, parent, block_tokens)
            keys.append(key)

    def slots(self, blocks: list[int], start: int, end: int) -> list[int]:
        bs = self.block_size
        return [blocks[p // bs] * bs + p % bs for p in range(start, end)]
