"""streamkit bench translate: English -> Spanish on everyday and meeting sentences with reference
translations (tests/data/translate_en_es.tsv). chrF (sacrebleu) and latency per sentence and to the
first token for SmolLM2-135M and Qwen2.5-Coder-1.5B on our engine, Debian's rule-based apertium
(eng-spa) as a non-LLM peer, and the same 1.5B GGUF on llama.cpp (xllamacpp) in the same run, with
the same prompt and greedy decoding. Each LLM is warmed with one sentence first, so its system
prompt and examples are prefix-cached as they are in a dubbing session. `--speculative draft` adds the
1.5B with speculative decoding (its packaged 0.5B draft) to the same run, with the acceptance rate
and its speed against llama.cpp's plain decode."""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from streamkit.bench import print_result

DATA = Path(__file__).resolve().parents[2] / "tests" / "data" / "translate_en_es.tsv"


def log(msg: str) -> None:
    print(f"[bench translate] {msg}", file=sys.stderr, flush=True)


def load_pairs(path: str | os.PathLike = DATA) -> list[tuple[str, str]]:
    pairs = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            en, es = line.split("\t")
            pairs.append((en.strip(), es.strip()))
    return pairs


def chrf(hyps: list[str], refs: list[str]) -> float:
    import sacrebleu

    return round(sacrebleu.corpus_chrf(hyps, [refs]).score, 1)


def _summary(name: str, hyps: list[str], refs: list[str], lat: list[float], ttft: list[float] | None = None,
             **extra) -> dict:
    out = {"system": name, "chrf": chrf(hyps, refs), "latency_ms_p50": round(1000 * statistics.median(lat), 1),
           "latency_ms_mean": round(1000 * statistics.fmean(lat), 1)}
    if ttft:
        out["ttft_ms_p50"] = round(1000 * statistics.median(ttft), 1)
        out["ttft_ms_p95"] = round(1000 * sorted(ttft)[int(0.95 * (len(ttft) - 1))], 1)
    out.update(extra)
    out["outputs"] = hyps
    return out


def messages(text: str) -> list[dict[str, str]]:
    from streamkit.stages.llm import chat_messages

    return chat_messages("translate", "Spanish", text)


async def _ours_one(eng, text: str, params) -> tuple[str, float, float | None, int, float]:
    from streamkit.engine.tokenizer import IncrementalDecoder

    dec = IncrementalDecoder(eng.tokenizer)
    t0 = time.perf_counter()
    first = None
    pieces, n = [], 0
    async for tok in eng.generate_tokens(messages(text), params):
        if first is None:
            first = time.perf_counter()
        n += 1
        pieces.append(dec.push(tok))
    end = time.perf_counter()
    return "".join(pieces).split("\n")[0].strip(), end - t0, (first - t0) if first else None, n, end - (first or end)


async def _ours_decode_rate(eng, n: int = 64) -> float:
    from streamkit.engine import SamplingParams

    t = []
    async for _ in eng.generate_tokens(messages("Tell me about your day."), SamplingParams(max_tokens=n),
                                       ignore_eos=True):
        t.append(time.perf_counter())
    return round((len(t) - 1) / (t[-1] - t[0]), 2)


def run_ours(name: str, model_path: str, pairs, weights: str | None, repetition_penalty: float,
             **engine_options) -> dict:
    from streamkit.engine import Engine, SamplingParams

    eng = Engine(model_path, "cpu", weights=weights, kv_cache_tokens=8192, **engine_options)
    t0 = time.perf_counter()
    eng.load()
    load_s = time.perf_counter() - t0
    params = SamplingParams(max_tokens=64, temperature=0.0, repetition_penalty=repetition_penalty, stop=["\n"])

    async def go():
        await _ours_one(eng, "Hello, nice to meet you.", params)  # warm: the system prompt gets cached
        res = [await _ours_one(eng, en, params) for en, _ in pairs]
        return res, await _ours_decode_rate(eng)

    try:
        res, rate = asyncio.run(go())
        st = eng.stats()
    finally:
        eng.close()
    spec = {k: st.get(k) for k in ("speculative", "spec_k", "spec_proposed_tokens", "spec_acceptance", "steps",
                                   "tokens_generated", "draft_forward_s")} if st.get("speculative") else {}
    toks = sum(r[3] - 1 for r in res)
    dec_s = sum(r[4] for r in res)
    return _summary(name, [r[0] for r in res], [es for _, es in pairs], [r[1] for r in res],
                    [r[2] for r in res if r[2] is not None], load_s=round(load_s, 1),
                    decode_tok_s_in_answers=round(toks / dec_s, 2) if dec_s else None, decode_tok_s_64=rate, **spec)


def run_apertium(pairs) -> dict:
    if shutil.which("apertium") is None:
        return {"system": "apertium eng-spa", "skipped": "apertium is not installed (apt-get install apertium-eng-spa)"}
    hyps, lat = [], []
    for en, _ in pairs:
        t0 = time.perf_counter()
        out = subprocess.run(["apertium", "-u", "eng-spa"], input=en, capture_output=True, text=True, check=True)
        lat.append(time.perf_counter() - t0)
        hyps.append(out.stdout.strip())
    return _summary("apertium eng-spa", hyps, [es for _, es in pairs], lat)


def run_llamacpp(model_path: str, pairs, threads: int) -> dict:
    try:
        import xllamacpp as xlc
    except ImportError:
        return {"system": "llama.cpp", "skipped": "xllamacpp is not installed (pip install 'streamkit[bench]')"}
    import json

    p = xlc.CommonParams()
    p.model.path = model_path
    p.n_ctx = 2048
    p.n_parallel = 1
    p.cpuparams.n_threads = threads
    p.cpuparams_batch.n_threads = threads
    t0 = time.perf_counter()
    server = xlc.Server(p)
    load_s = time.perf_counter() - t0

    def one(text: str, n: int = 64, ignore_eos: bool = False):
        req = {"messages": messages(text), "max_tokens": n, "temperature": 0.0, "stream": True,
               "stop": ["\n"], "cache_prompt": True, "ignore_eos": ignore_eos}
        state = {"first": None, "text": [], "timings": None}
        t = time.perf_counter()

        def on_chunk(s):
            d = json.loads(s) if isinstance(s, str) else s
            for c in d if isinstance(d, list) else [d]:
                if not isinstance(c, dict):
                    continue
                if "error" in c:
                    raise RuntimeError(f"llama.cpp: {c['error']}")
                delta = (c.get("choices") or [{}])[0].get("delta", {}).get("content")
                if delta:
                    state["first"] = state["first"] or time.perf_counter()
                    state["text"].append(delta)
                state["timings"] = c.get("timings") or state["timings"]

        server.handle_chat_completions(req, on_chunk)
        end = time.perf_counter()
        return "".join(state["text"]).split("\n")[0].strip(), end - t, (state["first"] or end) - t, state["timings"]

    one("Hello, nice to meet you.")
    res = [one(en) for en, _ in pairs]
    rate = one("Tell me about your day.", 64, ignore_eos=True)[3] or {}
    rates = [r[3]["predicted_per_second"] for r in res if r[3] and r[3].get("predicted_n", 0) > 1]
    return _summary("llama.cpp (xllamacpp)", [r[0] for r in res], [es for _, es in pairs], [r[1] for r in res],
                    [r[2] for r in res], load_s=round(load_s, 1),
                    decode_tok_s_in_answers=round(statistics.median(rates), 2) if rates else None,
                    decode_tok_s_64=round(rate.get("predicted_per_second", 0.0), 2))


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="streamkit bench translate", description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the result as JSON on the last line")
    ap.add_argument("--data", default=str(DATA), help="TSV of English<TAB>reference Spanish")
    ap.add_argument("--limit", type=int, default=0, help="use only the first N sentences")
    ap.add_argument("--systems", default="smollm2,qwen,apertium,llamacpp",
                    help="comma-separated subset of smollm2, qwen, apertium, llamacpp")
    ap.add_argument("--weights", default=None, help="engine weight mode (default: auto)")
    ap.add_argument("--repetition-penalty", type=float, default=1.0)
    ap.add_argument("--speculative", choices=["draft", "ngram"], default=None,
                    help="also run the 1.5B with speculative decoding (draft: its packaged 0.5B draft)")
    ap.add_argument("--spec-k", type=int, default=None, help="tokens proposed per step (default: the engine's)")
    ap.add_argument("--draft-model", default=None, help="draft model name or GGUF path (default: qwen2.5-coder-0.5b)")
    args = ap.parse_args(argv)
    pairs = load_pairs(args.data)[: args.limit or None]
    systems = args.systems.split(",")
    threads = len(os.sched_getaffinity(0))
    result: dict = {"sentences": len(pairs), "threads": threads, "loadavg_start": list(os.getloadavg())}
    runs = []
    if "apertium" in systems:
        log("apertium ...")
        runs.append(run_apertium(pairs))
    if "smollm2" in systems:
        from streamkit.engine.api import default_model_path

        log("ours: SmolLM2-135M ...")
        runs.append(run_ours("ours SmolLM2-135M Q4_1", default_model_path(), pairs, args.weights,
                             args.repetition_penalty))
    qwen = None
    if "qwen" in systems or "llamacpp" in systems or args.speculative:
        from streamkit.engine.model_store import ensure_model

        qwen = ensure_model()
    if "qwen" in systems:
        log("ours: Qwen2.5-Coder-1.5B ...")
        runs.append(run_ours("ours Qwen2.5-Coder-1.5B Q4_K_M", qwen, pairs, args.weights, args.repetition_penalty))
    spec_name = f"ours Qwen2.5-Coder-1.5B Q4_K_M, speculative {args.speculative}"
    if args.speculative:
        log(f"ours: Qwen2.5-Coder-1.5B, speculative {args.speculative} ...")
        runs.append(run_ours(spec_name, qwen, pairs, args.weights, args.repetition_penalty,
                             speculative=args.speculative, spec_k=args.spec_k, draft_model=args.draft_model))
    if "llamacpp" in systems:
        log("llama.cpp: Qwen2.5-Coder-1.5B ...")
        runs.append(run_llamacpp(qwen, pairs, threads))
    result["runs"] = runs
    by = {r["system"]: r for r in runs}
    ours, peer = by.get("ours Qwen2.5-Coder-1.5B Q4_K_M"), by.get("llama.cpp (xllamacpp)")
    for key, mine in (("", ours), ("speculative_", by.get(spec_name))):
        if mine and peer and peer.get("decode_tok_s_64"):
            result[f"{key}decode_ratio_vs_llamacpp"] = round(mine["decode_tok_s_64"] / peer["decode_tok_s_64"], 3)
        if mine and peer and peer.get("decode_tok_s_in_answers") and mine.get("decode_tok_s_in_answers"):
            result[f"{key}answer_decode_ratio_vs_llamacpp"] = round(
                mine["decode_tok_s_in_answers"] / peer["decode_tok_s_in_answers"], 3)
        if mine and peer:
            result[f"{key}latency_ratio_vs_llamacpp"] = round(peer["latency_ms_mean"] / mine["latency_ms_mean"], 3)
    if ours and by.get(spec_name):  # greedy: speculative decoding should not change a word
        same = sum(a == b for a, b in zip(ours["outputs"], by[spec_name]["outputs"]))
        result["speculative_same_outputs"] = f"{same}/{len(pairs)}"
    result["loadavg_end"] = list(os.getloadavg())
    if not args.json:
        for r in runs:
            log(" ".join(f"{k}={v}" for k, v in r.items() if k != "outputs"))
    print_result(result, args.json)
    return 0
