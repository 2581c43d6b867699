"""The peers of `streamkit bench engine`, each in a process of its own (its memory and threads are
its own, and a crash stays there): transformers' generate on the same GGUF (the correctness
reference and throughput peer), and llama.cpp through the xllamacpp wheel (the CPU speed peer)."""
from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time

# the sampled batch-1 runs' settings (a chat's usual), ours and llama.cpp's
SAMPLED = {"temperature": 0.7, "top_p": 0.9}


def rss_peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def peer_main(spec_path: str) -> int:
    import torch

    spec = json.load(open(spec_path))
    from streamkit.engine.reference import hf_greedy, load_hf

    res = {}
    t = time.perf_counter()
    model = load_hf(spec["model_path"])
    res["peer_load_s"] = round(time.perf_counter() - t, 1)
    eos = spec["eos_id"]
    pad = spec["pad_id"] if spec["pad_id"] is not None else eos
    prompts = spec["prompt_ids"]
    n = spec["n_tokens"]

    def gen(batch, n_new):
        L = max(len(p) for p in batch)
        ids = torch.full((len(batch), L), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), L), dtype=torch.long)
        for i, p in enumerate(batch):  # left padding
            ids[i, L - len(p):] = torch.tensor(p)
            mask[i, L - len(p):] = 1
        ids, mask = ids.to(model.device), mask.to(model.device)
        if model.device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.inference_mode():
            model.generate(ids, attention_mask=mask, max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False,
                           pad_token_id=pad, top_p=None, top_k=None, temperature=None)
        if model.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    greedy = [hf_greedy(model, ids, spec["greedy_tokens"], eos) for ids in spec["greedy_ids"]]  # CPU fp32
    dev = spec.get("device", "cpu")
    if dev.startswith("cuda"):
        model = model.to(device=dev, dtype=torch.bfloat16)

    # the peer gets the same thread choice our engine makes adaptively: best of 1 and all threads
    best = None
    for nt in sorted({1, torch.get_num_threads()}, reverse=True) if not dev.startswith("cuda") else [None]:
        if nt:
            torch.set_num_threads(nt)
        gen([prompts[0]], 2)  # warm-up
        t1 = [gen([prompts[i % len(prompts)]], 1) for i in range(2)]
        tn = gen([prompts[0]], n)
        tps = (n - 1) / max(tn - min(t1), 1e-6)
        print(f"[bench engine] peer b1 ({nt} threads): {tps:.2f} tok/s", file=sys.stderr, flush=True)
        if best is None or tps > best[0]:
            best = (tps, nt, t1, tn)
    tps, nt, t1, tn = best
    if nt:
        torch.set_num_threads(nt)
        res["peer_threads"] = nt
    res["peer_ttft_ms_p50"] = round(statistics.median(t1) * 1000, 1)
    res["peer_b1_tps"] = round(tps, 2)
    for c in spec["concurrency"]:
        if c == 1:
            res["peer_c1_tps"] = round(n / tn, 2)
            continue
        batch = [prompts[i % len(prompts)] for i in range(c)]
        dt = gen(batch, n)
        res[f"peer_c{c}_tps"] = round(c * n / dt, 2)
        print(f"[bench engine] peer batch {c}: {res[f'peer_c{c}_tps']} tok/s", file=sys.stderr, flush=True)
    res["peer_greedy"] = greedy
    if dev.startswith("cuda"):
        res["peer_peak_mem_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    res["peer_peak_rss_mb"] = round(rss_peak_mb(), 1)
    print(json.dumps(res))
    return 0


def llamacpp_main(spec_path: str) -> int:
    """The CPU peer, in a process of its own: llama.cpp (the xllamacpp wheel, its server with
    parallel slots) on the same GGUF: one stream greedy and sampled (SAMPLED), then 16 concurrent
    greedy requests, EOS ignored."""
    spec = json.load(open(spec_path))
    try:
        import xllamacpp as xlc  # type: ignore
    except ImportError:
        print(json.dumps({"llamacpp_error": "xllamacpp is not installed (pip install 'streamkit[bench]')"}))
        return 0
    n, prompts = spec["n_tokens"], spec["prompt_ids"]
    p = xlc.CommonParams()
    p.model.path = spec["model_path"]
    p.n_parallel = 16
    p.n_ctx = 16 * (max(len(x) for x in prompts) + n + 16)  # split between the slots
    p.cpuparams.n_threads = p.cpuparams_batch.n_threads = os.cpu_count() or 1
    server = xlc.Server(p)

    def complete(ids: list[int], sampling: dict | None = None) -> dict:
        out: dict = {}

        def collect(chunk):
            d = json.loads(chunk) if isinstance(chunk, str) else chunk
            if isinstance(d, dict):
                out.update(d)

        server.handle_completions({"prompt": ids, "n_predict": n, "temperature": 0.0, "ignore_eos": True,
                                   "cache_prompt": False, **(sampling or {})}, collect)
        return out

    complete(prompts[0])  # warm-up
    rates = [complete(ids).get("timings", {}).get("predicted_per_second", 0.0) for ids in prompts[:5]]
    b1 = round(statistics.median(rates), 2)
    print(f"[bench engine] llama.cpp b1: {b1} tok/s (decode, median of {len(rates)})", file=sys.stderr, flush=True)
    sampling = {**SAMPLED, "top_k": 0, "min_p": 0.0}  # its default top-k 40 and min-p 0.05 off: ours' distribution
    rates = [complete(ids, {**sampling, "seed": i}).get("timings", {}).get("predicted_per_second", 0.0)
             for i, ids in enumerate(prompts[:5])]
    b1_sampled = round(statistics.median(rates), 2)
    print(f"[bench engine] llama.cpp b1 sampled: {b1_sampled} tok/s", file=sys.stderr, flush=True)
    batch = [prompts[i % len(prompts)] for i in range(16)]
    t0 = time.perf_counter()
    threads = [threading.Thread(target=complete, args=(ids,)) for ids in batch]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    c16 = round(16 * n / (time.perf_counter() - t0), 2)  # prompts included, as for ours
    print(f"[bench engine] llama.cpp 16 streams: {c16} tok/s", file=sys.stderr, flush=True)
    print(json.dumps({"llamacpp_b1_tps": b1, "llamacpp_b1_sampled_tps": b1_sampled, "llamacpp_c16_tps": c16,
                      "llamacpp_build": "xllamacpp"}))
    return 0


def run_peer(spec: dict, timeout: float, flag: str = "--peer-spec", name: str = "peer") -> dict:
    """Run a peer in its own process (its memory and threads are its own, and a crash stays there)."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec, f)
        path = f.name
    try:
        # llama.cpp logs every slot event to stderr: keep it out of the bench's own progress lines
        p = subprocess.run([sys.executable, "-m", "streamkit.bench.engine", flag, path], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL if name == "llamacpp" else None, text=True, timeout=timeout)
        lines = [line for line in p.stdout.strip().splitlines() if line.startswith("{")]
        return json.loads(lines[-1]) if lines else {f"{name}_error": f"exit {p.returncode}"}
    except subprocess.TimeoutExpired:
        return {f"{name}_error": "timeout"}
    finally:
        os.unlink(path)


