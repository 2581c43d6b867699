"""GPU self-test (run by scripts/gpu_check.sh on a CUDA machine).

1. Triton paged decode attention == torch gather reference on random paged data.
2. Greedy output through CUDA-graph decode == eager decode (same bf16 weights), 8 prompts x 32 tokens,
   run concurrently so several batch buckets are replayed.
Exits non-zero on mismatch. Prints one JSON line.
"""
from __future__ import annotations

import asyncio
import json
import sys
import time


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print(json.dumps({"ok": False, "error": "CUDA not available"}))
        return 2
    from streamkit.engine import Engine, SamplingParams, default_model_path
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
    # 2. graphs vs eager
    path = default_model_path()
    prompts = [chat(p) for p in PROMPTS[:8]]

    async def run(eng):
        async def one(m):
            return [t async for t in eng.generate_tokens(m, SamplingParams(max_tokens=32))]
        return await asyncio.gather(*[one(m) for m in prompts])

    outs = {}
    for name, graphs in (("eager", False), ("graphs", True)):
        t = time.perf_counter()
        eng = Engine(path, "cuda", cuda_graphs=graphs, max_num_seqs=64)
        eng.load()
        res[f"{name}_load_s"] = round(time.perf_counter() - t, 1)
        asyncio.run(run(eng))  # warm-up
        t = time.perf_counter()
        outs[name] = asyncio.run(run(eng))
        res[f"{name}_s"] = round(time.perf_counter() - t, 3)
        eng.close()
        del eng
        torch.cuda.empty_cache()
    match = [a == b for a, b in zip(outs["eager"], outs["graphs"])]
    res["graphs_equal_eager"] = sum(match) / len(match)
    # bf16 eager vs bf16 graphs must be identical token for token (same kernels, same shapes per row)
    res["ok"] = res["graphs_equal_eager"] == 1.0 and res.get("triton_ok", True)
    print(json.dumps(res))
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
