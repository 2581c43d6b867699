"""GPU self-test (run by scripts/gpu_check.sh on a CUDA machine).

1. Triton paged decode attention == torch gather reference on random paged data.
2. Greedy output through CUDA-graph decode == eager decode (same bf16 weights), 8 prompts x 32 tokens,
   run concurrently so several batch buckets are replayed.
3. Speculative decoding (n-gram prompt lookup, k 4) on CUDA against plain decoding. In fp32 weights
   (eager) the outputs must be identical. In bf16 with graphs its verify steps, several rows a
   sequence, round differently from one-row steps, so there the agreement and acceptance are
   reported and only a majority of differing outputs fails.
Exits non-zero on mismatch. Prints one JSON line.
"""
from __future__ import annotations

import asyncio
import json
import sys
import time


async def generate_all(eng, prompts: list, max_tokens: int = 32) -> list[list[int]]:
    """Greedy token ids of every prompt, all submitted at once (continuous batching)."""
    from streamkit.engine import SamplingParams

    async def one(m):
        return [t async for t in eng.generate_tokens(m, SamplingParams(max_tokens=max_tokens))]
    return await asyncio.gather(*[one(m) for m in prompts])


def agreement(a: list[list[int]], b: list[list[int]]) -> float:
    """Share of outputs identical token for token."""
    return sum(x == y for x, y in zip(a, b)) / len(a)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print(json.dumps({"ok": False, "error": "CUDA not available"}))
        return 2
    from streamkit.engine import Engine, default_model_path
    from streamkit.engine.paged_attention import HAVE_TRITON, decode_attention_torch, decode_attention_triton
    from streamkit.engine.reference import PROMPTS, chat

    res = {"device": torch.cuda.get_device_name(0), "triton": HAVE_TRITON}
    # 1. kernel check
    if HAVE_TRITON:
        torch.manual_seed(0)
        B, H, KV, D, bs, NB = 5, 9, 3, 64, 16, 7
        kp = torch.randn(64 * bs, KV, D, device="cuda", dtype=torch.bfloat16)
        vp = torch.randn_like(kp)
        bt = torch.randint(1, 64, (B, NB), device="cuda")
        cl = torch.tensor([1, 17, 50, 112, 33], device="cuda")
        q = torch.randn(B, H, D, device="cuda", dtype=torch.bfloat16)
        a = decode_attention_torch(q, kp, vp, bt, cl, bs, D ** -0.5).float()
        b = decode_attention_triton(q, kp, vp, bt, cl, bs, D ** -0.5).float()
        res["triton_max_err"] = float((a - b).abs().max())
        res["triton_ok"] = res["triton_max_err"] < 2e-2
    # 2. graphs vs eager (bf16); 3. speculative vs plain: bf16 with graphs, and fp32 eager
    path = default_model_path()
    prompts = [chat(p) for p in PROMPTS[:8]]
    outs = {}
    spec = {"speculative": "ngram", "spec_k": 4}
    for name, options in (("eager", {"cuda_graphs": False}), ("graphs", {"cuda_graphs": True}),
                          ("speculative", {"cuda_graphs": True, **spec}),
                          ("fp32", {"cuda_graphs": False, "weights": "fp32"}),
                          ("fp32_speculative", {"cuda_graphs": False, "weights": "fp32", **spec})):
        t = time.perf_counter()
        eng = Engine(path, "cuda", max_num_seqs=64, **options)
        eng.load()
        res[f"{name}_load_s"] = round(time.perf_counter() - t, 1)
        asyncio.run(generate_all(eng, prompts))  # warm-up
        t = time.perf_counter()
        outs[name] = asyncio.run(generate_all(eng, prompts))
        res[f"{name}_s"] = round(time.perf_counter() - t, 3)
        if options.get("speculative"):
            res[f"{name}_acceptance"] = eng.stats()["spec_acceptance"]
        eng.close()
        del eng
        torch.cuda.empty_cache()
    res["graphs_equal_eager"] = agreement(outs["eager"], outs["graphs"])
    res["speculative_equal_plain"] = agreement(outs["graphs"], outs["speculative"])
    res["fp32_speculative_equal_plain"] = agreement(outs["fp32"], outs["fp32_speculative"])
    res["speculative_common_prefix"] = round(sum(
        common_prefix(a, b) / max(len(a), 1) for a, b in zip(outs["graphs"], outs["speculative"])) / len(prompts), 3)
    # bf16 eager vs bf16 graphs must be identical token for token (same kernels, same shapes per row)
    res["ok"] = (res["graphs_equal_eager"] == 1.0 and res["fp32_speculative_equal_plain"] == 1.0
                 and res["speculative_equal_plain"] >= 0.5 and res.get("triton_ok", True))
    print(json.dumps(res))
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
