"""Model configuration read from GGUF metadata."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class LlamaConfig:
    n_layers: int
    dim: int
    ffn_dim: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    rope_base: float = 10000.0
    rope_dim: int | None = None
    norm_eps: float = 1e-5
    context_length: int = 2048
    tied_embeddings: bool = True
    rope_scaling: dict | None = None
    arch: str = "llama"
    qkv_bias: bool = False

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def n_params(self) -> int:
        hd = self.head_dim
        per_layer = (self.dim * hd * (self.n_heads * 2 + self.n_kv_heads * 2)
                     + 3 * self.dim * self.ffn_dim + 2 * self.dim
                     + (hd * (self.n_heads + 2 * self.n_kv_heads) if self.qkv_bias else 0))
        emb = self.vocab_size * self.dim * (1 if self.tied_embeddings else 2)
        return self.n_layers * per_layer + emb + self.dim

    @property
    def flops_per_token(self) -> float:
        """2 * matmul params (embedding lookup excluded, LM head included)."""
        return 2.0 * (self.n_params - self.vocab_size * self.dim * (0 if self.tied_embeddings else 1))
