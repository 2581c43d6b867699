"""streamkit's decode engine for Llama-architecture GGUF models.

Paged KV cache, continuous batching with chunked prefill, batched sampling, an async token
stream API, CUDA graphs for decode on GPU, and a Redis worker so many hosts share one engine.
"""
from streamkit.engine.api import Engine, default_model_path, get_engine
from streamkit.engine.params import SamplingParams

__all__ = ["SamplingParams", "Engine", "get_engine", "default_model_path"]
