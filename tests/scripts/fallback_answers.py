"""Greedy answers of the engine's torch formats to a few plain questions, as JSON on stdout.

Run in a subprocess by tests/test_engine_fallback.py so that oneDNN's instruction set can be capped
(ONEDNN_MAX_CPU_ISA) before torch loads: that reproduces the matmul kernels of CPUs this machine
is not, e.g. AVX512_CORE_BF16 is what an AMD Zen 4/5 runs.
Usage: python fallback_answers.py MODE [MODE ...]
"""
import asyncio
import json
import sys

from streamkit.engine import Engine, SamplingParams, default_model_path
from streamkit.engine.reference import chat

QUESTIONS = ["What is the capital of France?", "How many legs does a spider have?",
             "Translate to Spanish: good morning"]


def answers(mode: str, max_tokens: int = 8) -> list[list[int]]:
    eng = Engine(default_model_path(), "cpu", weights=mode, kv_cache_tokens=1024)
    try:
        assert eng.core.model.weights == mode, eng.core.model.weights

        async def run(ids):
            return [t async for t in eng.generate_tokens(ids, SamplingParams(max_tokens=max_tokens), ignore_eos=True)]

        return [asyncio.run(run(eng.encode(chat(q)))) for q in QUESTIONS]
    finally:
        eng.close()


if __name__ == "__main__":
    print(json.dumps({mode: answers(mode) for mode in sys.argv[1:]}))
