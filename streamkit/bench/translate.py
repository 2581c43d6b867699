"""streamkit bench translate: English -> Spanish on everyday and meeting sentences with reference
translations (tests/data/translate_en_es.tsv). chrF (sacrebleu) and latency per sentence and to the
first token for SmolLM2-135M and Qwen2.5-Coder-1.5B on our engine, Debian's rule-based apertium
(eng-spa) as a non-LLM peer, and the same 1.5B GGUF on llama.cpp (xllamacpp, in a process of its
own) in the same run, with the same prompt and greedy decoding. Each LLM is warmed with one
sentence first, so its system prompt and examples are prefix-cached as they are in a dubbing
session; then the LLMs answer each sentence in turn, so a noisy host's slow minutes fall on all of
them alike. `--speculative draft` adds the 1.5B with speculative decoding (its packaged 0.5B draft)
to the same run, with the acceptance rate and its speed against llama.cpp's plain decode.

Decode rates count alike on both engines: the tokens after the first, the end-of-turn token that
stopped an answer included (it cost a step; llama.cpp's `predicted_n` counts it), over the time
after the first token, summed over the answers; and over 64 tokens of free text, the median of
three runs."""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
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


@dataclass
class Answer:
    text: str
    latency_s: float
    ttft_s: float | None
    tokens: int  # generated, the end-of-turn token that stopped the answer included
    decode_s: float  # after the first token


class Ours:
    """A model on our engine, answering one sentence at a time on its own asyncio loop."""

    def __init__(self, name: str, model_path: str, weights: str | None, repetition_penalty: float,
                 **engine_options) -> None:
        from streamkit.engine import Engine, SamplingParams

        self.name = name
        self.engine = Engine(model_path, "cpu", weights=weights, kv_cache_tokens=8192, **engine_options)
        t0 = time.perf_counter()
        self.engine.load()
        self.load_s = time.perf_counter() - t0
        self.params = SamplingParams(max_tokens=64, temperature=0.0, repetition_penalty=repetition_penalty,
                                     stop=["\n"])
        self.loop = asyncio.new_event_loop()

    def one(self, text: str) -> Answer:
        """Tokens generated include the end-of-turn token that stopped the answer: it cost a step,
        and llama.cpp's `predicted_n` counts it too."""
        return self.loop.run_until_complete(self._one(text))

    async def _one(self, text: str) -> Answer:
        from streamkit.engine.tokenizer import IncrementalDecoder

        dec = IncrementalDecoder(self.engine.tokenizer)
        t0 = time.perf_counter()
        first = None
        pieces, info = [], {}
        async for tok in self.engine.generate_tokens(messages(text), self.params, info=info):
            if first is None:
                first = time.perf_counter()
            pieces.append(dec.push(tok))
        end = time.perf_counter()
        return Answer("".join(pieces).split("\n")[0].strip(), end - t0, (first - t0) if first else None,
                      info.get("completion_tokens", len(pieces)), end - (first or end))

    def decode_rate(self, n: int = 64) -> float:
        """tok/s over n tokens of free text, the first excluded."""
        from streamkit.engine import SamplingParams

        async def go() -> list[float]:
            stamps = []
            async for _ in self.engine.generate_tokens(messages("Tell me about your day."),
                                                       SamplingParams(max_tokens=n), ignore_eos=True):
                stamps.append(time.perf_counter())
            return stamps

        t = self.loop.run_until_complete(go())
        return (len(t) - 1) / (t[-1] - t[0])

    def extra(self) -> dict:
        st = self.engine.stats()
        if not st.get("speculative"):
            return {}
        return {k: st[k] for k in ("speculative", "spec_k", "spec_adaptive", "spec_proposed_tokens", "spec_acceptance",
                                   "spec_drafted_steps", "spec_plain_steps", "spec_policy", "steps",
                                   "tokens_generated", "draft_forward_s") if k in st}

    def close(self) -> None:
        self.engine.close()
        self.loop.close()


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


def _llamacpp_request(server, msgs: list[dict], n: int, ignore_eos: bool) -> tuple[str, float, float, dict]:
    import json

    req = {"messages": msgs, "max_tokens": n, "temperature": 0.0, "stream": True,
           "stop": ["\n"], "cache_prompt": True, "ignore_eos": ignore_eos}
    state: dict = {"first": None, "text": [], "timings": {}, "error": None}
    t = time.perf_counter()

    def on_chunk(s):
        d = json.loads(s) if isinstance(s, str) else s
        for c in d if isinstance(d, list) else [d]:
            if not isinstance(c, dict):
                continue
            if "error" in c:
                state["error"] = str(c["error"])
            delta = (c.get("choices") or [{}])[0].get("delta", {}).get("content")
            if delta:
                state["first"] = state["first"] or time.perf_counter()
                state["text"].append(delta)
            state["timings"] = c.get("timings") or state["timings"]

    server.handle_chat_completions(req, on_chunk)
    end = time.perf_counter()
    if state["error"]:
        raise RuntimeError(f"llama.cpp: {state['error']}")
    return "".join(state["text"]).split("\n")[0].strip(), end - t, (state["first"] or end) - t, state["timings"]


def _llamacpp_serve(conn, model_path: str, threads: int) -> None:
    """The child process of `LlamaCpp`: llama.cpp's server, answering the parent's requests in order."""
    try:
        import xllamacpp as xlc

        p = xlc.CommonParams()
        p.model.path = model_path
        p.n_ctx = 2048
        p.n_parallel = 1
        p.cpuparams.n_threads = threads
        p.cpuparams_batch.n_threads = threads
        t0 = time.perf_counter()
        server = xlc.Server(p)
        conn.send(("ready", time.perf_counter() - t0))
    except Exception as e:  # noqa: BLE001 - the parent raises it
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    while True:
        req = conn.recv()
        if req is None:
            return
        try:
            conn.send(("ok", _llamacpp_request(server, *req)))
        except Exception as e:  # noqa: BLE001 - the parent raises it
            conn.send(("error", f"{type(e).__name__}: {e}"))


class LlamaCpp:
    """The same GGUF on llama.cpp's server (xllamacpp), one slot, in a process of its own.

    Not in this process: xllamacpp's ggml uses the system libgomp, which is the libgomp torch loads
    too, and libgomp cuts its spin-waiting once the process holds more OpenMP threads than CPUs.
    With our engine loaded beside it (idle), llama.cpp decoded the 1.5B at 21-22 tok/s instead of
    30-32 on 2 Zen 5 cores (docs/engine.md, *llama.cpp in its own process*)."""

    name = "llama.cpp (xllamacpp)"

    def __init__(self, model_path: str, threads: int) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")  # a fresh interpreter: no torch, no OpenMP threads of ours
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_llamacpp_serve, args=(child, model_path, threads), daemon=True)
        self._proc.start()
        child.close()
        self.load_s = self._reply()

    def _reply(self):
        try:
            kind, value = self._conn.recv()
        except EOFError:
            raise RuntimeError(f"llama.cpp's process exited (code {self._proc.exitcode})") from None
        if kind == "error":
            raise RuntimeError(f"llama.cpp: {value}")
        return value

    def _request(self, text: str, n: int = 64, ignore_eos: bool = False) -> tuple[str, float, float, dict]:
        self._conn.send((messages(text), n, ignore_eos))
        return self._reply()

    def one(self, text: str) -> Answer:
        """Counted as ours: predicted_n includes the end-of-turn token, predicted_ms is the time
        after the first token."""
        out, latency, ttft, timings = self._request(text)
        return Answer(out, latency, ttft, int(timings.get("predicted_n", 0)), timings.get("predicted_ms", 0.0) / 1000)

    def decode_rate(self, n: int = 64) -> float:
        timings = self._request("Tell me about your day.", n, ignore_eos=True)[3]
        return (timings["predicted_n"] - 1) / (timings["predicted_ms"] / 1000)

    def extra(self) -> dict:
        return {}

    def close(self) -> None:
        if self._proc.is_alive():
            try:
                self._conn.send(None)
            except OSError:
                pass
            self._proc.join(timeout=30)
            if self._proc.is_alive():
                self._proc.kill()
        self._conn.close()


def run_interleaved(systems: list, pairs, rate_rounds: int = 3) -> list[dict]:
    """Every system answers each sentence in turn (the order rotating from sentence to sentence),
    then the 64-token runs alternate likewise: a noisy host's slow minutes fall on every system
    alike, so the ratios hold even where the absolute rates drift."""
    for s in systems:
        s.one("Hello, nice to meet you.")  # warm: the system prompt gets cached
    answers: dict[str, list[Answer]] = {s.name: [] for s in systems}
    for i, (en, _) in enumerate(pairs):
        for s in systems[i % len(systems):] + systems[:i % len(systems)]:
            answers[s.name].append(s.one(en))
    rates: dict[str, list[float]] = {s.name: [] for s in systems}
    for r in range(rate_rounds):
        for s in systems[r % len(systems):] + systems[:r % len(systems)]:
            rates[s.name].append(s.decode_rate())
    out = []
    for s in systems:
        res = answers[s.name]
        timed = [a for a in res if a.tokens > 1 and a.decode_s > 0]
        toks = sum(a.tokens - 1 for a in timed)
        dec_s = sum(a.decode_s for a in timed)
        out.append(_summary(s.name, [a.text for a in res], [es for _, es in pairs], [a.latency_s for a in res],
                            [a.ttft_s for a in res if a.ttft_s is not None], load_s=round(s.load_s, 1),
                            decode_tok_s_in_answers=round(toks / dec_s, 2) if dec_s else None,
                            decode_tok_s_64=round(statistics.median(rates[s.name]), 2),
                            decode_tok_s_64_runs=[round(x, 2) for x in rates[s.name]], **s.extra()))
    return out


PLAIN_NAME = "ours Qwen2.5-Coder-1.5B Q4_K_M"


def spec_name(speculative: str, policy: str) -> str:
    return f"{PLAIN_NAME}, speculative {speculative}" + (" (drafting always)" if policy == "always" else "")


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
    ap.add_argument("--spec-policy", choices=["adaptive", "always", "both"], default="adaptive",
                    help="adaptive: draft only where it measures faster than plain decoding (the engine's "
                         "default, spec_policy.py); always: draft at every step; both: run the two")
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
    policies = ("adaptive", "always") if args.spec_policy == "both" else (args.spec_policy,)
    llms: list = []
    try:
        if "smollm2" in systems:
            from streamkit.engine.api import default_model_path

            log("loading ours: SmolLM2-135M ...")
            llms.append(Ours("ours SmolLM2-135M Q4_1", default_model_path(), args.weights, args.repetition_penalty))
        qwen = None
        if "qwen" in systems or "llamacpp" in systems or args.speculative:
            from streamkit.engine.model_store import ensure_model

            qwen = ensure_model()
        if "qwen" in systems:
            log("loading ours: Qwen2.5-Coder-1.5B ...")
            llms.append(Ours(PLAIN_NAME, qwen, args.weights, args.repetition_penalty))
        if args.speculative:
            for policy in policies:
                log(f"loading ours: Qwen2.5-Coder-1.5B, speculative {args.speculative} ({policy}) ...")
                llms.append(Ours(spec_name(args.speculative, policy), qwen, args.weights, args.repetition_penalty,
                                 speculative=args.speculative, spec_k=args.spec_k, draft_model=args.draft_model,
                                 spec_adaptive=policy == "adaptive"))
        if "llamacpp" in systems:
            log("loading llama.cpp: Qwen2.5-Coder-1.5B ...")
            try:
                llms.append(LlamaCpp(qwen, threads))
            except ImportError:
                runs.append({"system": LlamaCpp.name,
                             "skipped": "xllamacpp is not installed (pip install 'streamkit[bench]')"})
        if llms:
            log(f"{len(pairs)} sentences, each answered by {', '.join(s.name for s in llms)} in turn ...")
            runs.extend(run_interleaved(llms, pairs))
    finally:
        for s in llms:
            s.close()
    result["runs"] = runs
    by = {r["system"]: r for r in runs}
    ours, peer = by.get(PLAIN_NAME), by.get(LlamaCpp.name)
    specs = [(f"speculative_{p}_" if len(policies) > 1 else "speculative_", by.get(spec_name(args.speculative, p)))
             for p in policies] if args.speculative else []
    for key, mine in [("", ours)] + specs:
        if mine and peer and peer.get("decode_tok_s_64"):
            result[f"{key}decode_ratio_vs_llamacpp"] = round(mine["decode_tok_s_64"] / peer["decode_tok_s_64"], 3)
        if mine and peer and peer.get("decode_tok_s_in_answers") and mine.get("decode_tok_s_in_answers"):
            result[f"{key}answer_decode_ratio_vs_llamacpp"] = round(
                mine["decode_tok_s_in_answers"] / peer["decode_tok_s_in_answers"], 3)
        if mine and peer:
            result[f"{key}latency_ratio_vs_llamacpp"] = round(peer["latency_ms_mean"] / mine["latency_ms_mean"], 3)
        if key and mine and ours:  # greedy: speculative decoding should not change a word
            same = sum(a == b for a, b in zip(ours["outputs"], mine["outputs"]))
            result[f"{key}same_outputs"] = f"{same}/{len(pairs)}"
    result["loadavg_end"] = list(os.getloadavg())
    if not args.json:
        for r in runs:
            log(" ".join(f"{k}={v}" for k, v in r.items() if k != "outputs"))
    print_result(result, args.json)
    return 0
