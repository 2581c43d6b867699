"""`streamkit bench step`: how long one native decode step takes at a few row counts, on the
few-row int8 kernels (`sk_gemv.h`) against the fp32 path they replace, timed alternately in the
same run so both see the same machine. It answers "up to how many rows does the int8 path win on
this CPU" (`SK_GEMV_MAX_ROWS`, `SK_GEMV_BLOCK_ROWS`) and times speculative verify chunks
(k + 1 rows) without a whole engine around them. Row counts past those limits take the same
kernels either way (speedup ~1). With --last-logits only the last row's logits are computed, as
in a prefill step, so the time is the layers' batched matmuls without the LM head on every row.
With --argmax it times, the same way, a greedy step that asks for each row's argmax alone (the
greedy head of `sk_greedy.h`, from 5 rows on a Q8_0 head) against every logit and numpy's argmax.

    streamkit bench step --model qwen2.5-coder-1.5b --rows 1,2,3,4,5 [--isa avx2] [--last-logits] [--json]
    streamkit bench step --rows 8,16,32 --argmax
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from streamkit.bench import print_result


def log(msg: str) -> None:
    print(f"[bench step] {msg}", file=sys.stderr, flush=True)


def _decode_batch(rows: int, context: int, block_size: int, per_seq: int):
    """`rows` sequences, each decoding the token at position context - 1, in its own per_seq blocks."""
    from streamkit.engine.model import StepBatch

    tables = torch.stack([torch.arange(1 + r * per_seq, 1 + (r + 1) * per_seq) for r in range(rows)])
    pos = context - 1
    return StepBatch(ids=torch.randint(0, 1000, (rows,)), positions=torch.full((rows,), pos),
                     slots=tables[:, pos // block_size] * block_size + pos % block_size, n_decode=rows,
                     block_tables=tables, ctx_lens=torch.full((rows,), context))


def main(argv: list[str]) -> int:
    from streamkit.engine.options import KV_DTYPES

    ap = argparse.ArgumentParser(prog="streamkit bench step", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="packaged model name or GGUF path (default: SmolLM2-135M)")
    ap.add_argument("--rows", default="1,2,3,4,5", help="comma list of rows per step")
    ap.add_argument("--context", type=int, default=300, help="positions each row attends to")
    ap.add_argument("--steps", type=int, default=30, help="timed steps per row count and path")
    ap.add_argument("--isa", default=None,
                    help="auto, amx, avx512, avx2, or a path as a CPU without some flags builds it ('avx2 without avx_vnni')")
    ap.add_argument("--last-logits", action="store_true",
                    help="logits of the last row only (a prefill step's shape), not of every row")
    ap.add_argument("--argmax", action="store_true",
                    help="time argmax-only steps (forward_argmax) against every logit + argmax, not the two paths")
    ap.add_argument("--kv-dtype", choices=sorted(KV_DTYPES), default="fp16",
                    help="the K/V cache's type (int8: a float32 scale a position and KV head; opt-in, docs/engine.md)")
    ap.add_argument("--json", action="store_true", help="last stdout line is one JSON object")
    a = ap.parse_args(argv)
    rows = sorted({int(r) for r in a.rows.split(",") if r.strip()})
    if not rows or rows[0] < 1 or a.context < 1 or a.steps < 1:
        ap.error("--rows must list positive integers; --context and --steps must be positive")

    from streamkit.bench.engine import cpu_name
    from streamkit.engine import default_model_path, native
    from streamkit.engine.gguf_loader import load_gguf
    from streamkit.engine.kv_cache import PagedKVCache
    from streamkit.engine.model_store import resolve_model
    from streamkit.engine.native.model import INT8_GEMV, NativeLlamaModel

    path = str(resolve_model(a.model)) if a.model else default_model_path()
    log(f"loading {path} ...")
    gm = load_gguf(path, raw=True)
    cfg = gm.config
    try:
        model = NativeLlamaModel(gm, "native", isa=None if a.isa in (None, "auto") else a.isa)
    except (RuntimeError, ValueError) as e:  # no native kernels here, or a path this CPU lacks
        log(f"cannot run: {e}")
        return 2
    del gm
    block_size = 16
    per_seq = (a.context + block_size - 1) // block_size
    cache = PagedKVCache(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, 1 + rows[-1] * per_seq, block_size,
                         KV_DTYPES[a.kv_dtype], "cpu")
    try:
        model.kv_cache = cache
    except ValueError as e:  # a K/V type the native kernels do not read (bf16)
        log(f"cannot run: {e}")
        return 2
    model.reuse_logits = True
    default_mask = model.int8_mask
    if a.argmax:  # name -> (int8 mask, step): both on the default kernels
        variants = {"argmax": (default_mask, model.forward_argmax),
                    "logits_argmax": (default_mask, lambda b: model.forward(b).numpy().argmax(-1))}
    else:
        variants = {"few_row_int8": (default_mask | INT8_GEMV, model.forward),
                    "fp32": (default_mask & ~INT8_GEMV, model.forward)}
    result: dict = {"model": path.rsplit("/", 1)[-1], "cpu": cpu_name(), "native_path": native.describe(model.isa),
                    "threads": torch.get_num_threads(), "context": a.context, "steps": a.steps, "kv_dtype": a.kv_dtype,
                    "logit_rows": "last" if a.last_logits else "all"}
    new_name, old_name = variants
    for m in rows:
        batch = _decode_batch(m, a.context, block_size, per_seq)
        if a.last_logits:
            batch.logit_rows = torch.tensor([m - 1])
        times: dict[str, list[float]] = {k: [] for k in variants}
        for i in range(a.steps + 3):  # the first 3 of each warm up
            for name, (mask, step) in variants.items():  # alternate, so both see the same machine
                model.int8_mask = mask
                t0 = time.perf_counter()
                out = step(batch)
                if i >= 3:
                    times[name].append(time.perf_counter() - t0)
        result[f"rows{m}_logit_rows"] = len(out)
        new, old = (round(1000 * statistics.median(times[k]), 3) for k in (new_name, old_name))
        result[f"rows{m}_{new_name}_ms"] = new
        result[f"rows{m}_{old_name}_ms"] = old
        result[f"rows{m}_speedup"] = round(old / new, 3)
        log(f"{m} rows: {new_name} {new} ms, {old_name} {old} ms (x{old / new:.2f})")
    model.int8_mask = default_mask
    print_result(result, a.json)
    return 0
