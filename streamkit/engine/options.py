"""An engine's settings, resolved in one place: what the caller passed, else the environment
(STREAMKIT_ENGINE_THREADS, STREAMKIT_KV_TOKENS, STREAMKIT_PREFIX_CACHING, STREAMKIT_SPECULATIVE,
STREAMKIT_SPEC_K, STREAMKIT_SPEC_ADAPTIVE, STREAMKIT_DRAFT_MODEL, STREAMKIT_DRAFT_STOP_P, STREAMKIT_DRAFT_Q4,
STREAMKIT_NATIVE_ISA, STREAMKIT_DECODE_BURST_MS), else the device's default. The KV cache size left unset here is derived from
the model and the free memory once the model is loaded (EngineCore)."""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


@dataclass(frozen=True)
class EngineOptions:
    weights: str | None  # see linear.resolve_weights
    threads: int  # 0: adaptive (ThreadTuner) on a CPU with several threads
    kv_cache_tokens: int | None  # None: sized from memory at load
    kv_dtype: torch.dtype | None  # None: the model's own
    block_size: int
    max_num_seqs: int
    max_batched_tokens: int
    max_model_len: int  # before the model's context length caps it
    cuda_graphs: bool | str  # "emulate": the CPU test mode of the graph runner
    attn_backend: str | None
    prefix_caching: bool
    speculative: str | None  # "ngram", "draft" or None
    spec_k: int
    spec_adaptive: bool  # draft only where it has measured faster than plain decoding (spec_policy.py)
    draft_model: str | None  # speculative="draft": a packaged model's name or a GGUF path
    draft_stop_p: float  # a draft stops at a token it gave less than this probability (0: always k)
    draft_q4: bool  # `native` drafts re-quantized to Q4_0 at load, one-term int8 activations (draft.py)
    native_isa: str | None  # the native kernels' path (amx | avx512 | avx2); None: the best the CPU has
    # the longest a CPU engine waits before a step while urgent compute (streamkit.cores: the
    # first spoken piece of an answer, an ASR final) runs; 0: never waits
    urgent_pause_s: float
    # while nothing else is scheduled the native model runs decode steps in one call (a decode
    # burst, EngineCore._decode_burst), handing their tokens to the streams every decode_burst_ms
    # as it goes; 0: one step a call, no bursts
    decode_burst_ms: float


SPECULATIVE = ("ngram", "draft")
DEFAULT_DRAFT = "qwen2.5-coder-0.5b"  # the 1.5B's packaged draft (model_store.QWEN_0_5B_DRAFT)
# tokens proposed per round at most, and the draft's probability below which a draft stops after
# the token it just proposed. For the 1.5B + 0.5B pair a second draft token pays only where the
# draft is sure of the first: a 3-row verify costs ~5 ms more than a 2-row one (Zen 5: 31.1 against
# 26.1 ms). k = 2 stopping below 0.8, drafting always, against plain decoding in the same run (Zen
# 5, `bench translate`, 2026-12-05): 1.16-1.19x over 64 tokens and 1.01-1.03x in one-sentence
# answers, where k = 1 gave 1.06-1.11x and 0.97-1.06x; k = 3 at 0.8 1.20x / 1.05x in a noisier
# run (docs/engine.md, *k = 2, stopping below 0.8*). n-gram proposals have no probabilities.
DEFAULT_SPEC_K = {"ngram": 4, "draft": 2}
DEFAULT_DRAFT_STOP_P = 0.8
# tokens then reach a stream in runs of about one display frame
DEFAULT_DECODE_BURST_MS = 16.0


# kv_dtype's names (int8: the native kernels only, a float32 scale a slot's K and V)
KV_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "int8": torch.int8}


def resolve_options(device: torch.device, weights: str | None = None, kv_cache_tokens: int | None = None,
                    block_size: int = 16, max_num_seqs: int | None = None, max_batched_tokens: int | None = None,
                    max_model_len: int | None = None, cuda_graphs: bool | str | None = None,
                    attn_backend: str | None = None, threads: int | None = None, kv_dtype: str | None = None,
                    prefix_caching: bool | None = None, speculative: str | None = None,
                    spec_k: int | None = None, spec_adaptive: bool | None = None,
                    draft_model: str | None = None, draft_stop_p: float | None = None, draft_q4: bool | None = None,
                    native_isa: str | None = None, urgent_pause_s: float | None = None,
                    decode_burst_ms: float | None = None) -> EngineOptions:
    cuda = device.type == "cuda"
    speculative = speculative if speculative is not None else (os.environ.get("STREAMKIT_SPECULATIVE") or None)
    if speculative not in (None, *SPECULATIVE):
        raise ValueError(f"speculative must be one of {SPECULATIVE} or None, got {speculative!r}")
    from streamkit.engine.native import requested_isa

    native_isa = requested_isa(native_isa)  # ValueError for a name that is no path
    draft_model = draft_model or os.environ.get("STREAMKIT_DRAFT_MODEL") or None
    if draft_model and speculative is None:
        speculative = "draft"
    if speculative == "draft":
        draft_model = draft_model or DEFAULT_DRAFT
    if decode_burst_ms is None:
        decode_burst_ms = 0.0 if cuda else float(os.environ.get("STREAMKIT_DECODE_BURST_MS", DEFAULT_DECODE_BURST_MS))
    if not decode_burst_ms >= 0:
        raise ValueError(f"decode_burst_ms must be a number of milliseconds >= 0, got {decode_burst_ms!r}")
    kv_dtype = kv_dtype or os.environ.get("STREAMKIT_KV_DTYPE") or None
    if kv_dtype is not None and kv_dtype not in KV_DTYPES:
        raise ValueError(f"kv_dtype (or STREAMKIT_KV_DTYPE) must be one of {sorted(KV_DTYPES)}, got {kv_dtype!r}")
    return EngineOptions(
        weights=weights,
        threads=threads or _env_int("STREAMKIT_ENGINE_THREADS", 0),
        kv_cache_tokens=kv_cache_tokens or _env_int("STREAMKIT_KV_TOKENS", 0) or None,
        kv_dtype=KV_DTYPES.get(kv_dtype or ""),
        block_size=block_size,
        max_num_seqs=max_num_seqs or (256 if cuda else 64),
        max_batched_tokens=max_batched_tokens or (2048 if cuda else 256),
        max_model_len=max_model_len or (4096 if cuda else 2048),
        cuda_graphs=cuda_graphs if cuda_graphs is not None else cuda,
        attn_backend=attn_backend,
        prefix_caching=prefix_caching if prefix_caching is not None else _env_int("STREAMKIT_PREFIX_CACHING", 1) != 0,
        speculative=speculative,
        spec_k=spec_k or _env_int("STREAMKIT_SPEC_K", DEFAULT_SPEC_K.get(speculative or "ngram", 4)),
        spec_adaptive=(spec_adaptive if spec_adaptive is not None
                       else _env_int("STREAMKIT_SPEC_ADAPTIVE", 1) != 0),
        draft_model=draft_model if speculative == "draft" else None,
        draft_stop_p=(draft_stop_p if draft_stop_p is not None
                      else float(os.environ.get("STREAMKIT_DRAFT_STOP_P", DEFAULT_DRAFT_STOP_P))),
        draft_q4=draft_q4 if draft_q4 is not None else _env_int("STREAMKIT_DRAFT_Q4", 1) != 0,
        native_isa=native_isa,
        urgent_pause_s=(urgent_pause_s if urgent_pause_s is not None
                        else 0.0 if cuda else float(os.environ.get("STREAMKIT_URGENT_PAUSE_S", 2.0))),
        decode_burst_ms=decode_burst_ms,
    )
