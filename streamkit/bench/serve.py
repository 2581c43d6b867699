"""`streamkit bench serve`: concurrent sessions against one server on loopback.

    streamkit bench serve [--sessions 8] [--pipeline dubbing] [--json]
    streamkit bench serve --soak 60 [--sessions 8]

Starts `streamkit serve` on a free loopback port (or uses --url), then N clients each stream the
same speech at real-time pace (streamkit.client) and stop. Reports per session: first-audio
latency (first audio chunk sent -> first audio chunk back), first-output latency (-> first
transcript/text/audio), frames lost (audio messages sent minus those the server reports having
received, plus any must-keep message the server dropped: must be 0), and the server process's CPU
and memory per session. With --soak SECONDS sessions connect and leave at random (some hang up
without stop) for that long; it reports errors (0), frames lost (0) and server memory at start
and end. The last line of --json output is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

SENTENCES = [
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Please remember to close the window before you leave the house.",
]


def log(*args: Any) -> None:
    print(*args, file=sys.stderr, flush=True)


def pct(values: list[float], q: float) -> float | None:
    vals = [v for v in values if v is not None]
    return round(float(np.percentile(vals, q)), 4) if vals else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load_audio(path: str | None, rate: int = 16000) -> np.ndarray:
    if path:
        from streamkit.media import read_audio

        return read_audio(path, rate)
    from streamkit.audio import resample_array
    from streamkit.speech.synth import get_hibari, synthesize_sentence

    tts = get_hibari("heart")
    gap = np.zeros(int(0.8 * rate), np.float32)
    parts = [np.zeros(int(0.3 * rate), np.float32)]
    for s in SENTENCES:
        parts += [resample_array(synthesize_sentence(tts, s, seed=0), 24000, rate), gap]
    return np.concatenate(parts)


class ServerProcess:
    def __init__(self, pipelines: str | None, extra: list[str]) -> None:
        self.port = free_port()
        cmd = [sys.executable, "-m", "streamkit.cli", "serve", "--port", str(self.port), "--metrics-interval", "1"]
        if pipelines:
            cmd += ["--pipelines", pipelines]
        self.proc = subprocess.Popen(cmd + extra, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.url = f"ws://127.0.0.1:{self.port}/ws"

    def wait_ready(self, timeout: float = 300) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.proc.stderr.read().decode()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2) as r:
                    return json.loads(r.read())
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("server did not become healthy")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class ProcWatch:
    """CPU and memory of the server process (psutil), sampled while the bench runs."""

    def __init__(self, pid: int | None) -> None:
        import psutil

        self.p = psutil.Process(pid) if pid else None
        self.rss_samples: list[float] = []
        self.cpu0 = self._cpu()
        self.t0 = time.monotonic()

    def _cpu(self) -> float:
        if self.p is None:
            return 0.0
        t = self.p.cpu_times()
        return t.user + t.system

    def rss_mb(self) -> float | None:
        if self.p is None:
            return None
        rss = self.p.memory_info().rss / 2**20
        self.rss_samples.append(rss)
        return round(rss, 1)

    def cpu_s(self) -> float:
        return self._cpu() - self.cpu0

    async def sample(self, stop: asyncio.Event, every: float = 0.25) -> None:
        while not stop.is_set():
            self.rss_mb()
            try:
                await asyncio.wait_for(stop.wait(), every)
            except (asyncio.TimeoutError, TimeoutError):
                pass


def _lost(result, sent_msgs: int) -> int:
    m = result.last_metrics() or {}
    counters = m.get("counters") or {}
    received = counters.get("audio_in_msgs")
    if received is None:
        return sent_msgs  # never heard back: count everything as lost
    return max(0, sent_msgs - int(received))


async def one_session(url: str, pipeline: str, audio: np.ndarray, speed: float, token: str | None,
                      leave_early_s: float | None = None) -> dict[str, Any]:
    from streamkit.client import StartRefused, StreamClient

    c = StreamClient(url, token=token)
    await c.connect()
    try:
        try:
            await c.start(pipeline)
        except StartRefused as exc:
            if exc.code != "too_many_sessions":
                raise
            return {"refused": True}  # the pipeline's session limit: nothing was sent
        if leave_early_s is not None:  # soak: hang up mid-stream without stop
            chunk = 1600
            t0 = time.monotonic()
            for i in range(0, int(leave_early_s * 16000), chunk):
                await c.send_audio(audio[i % len(audio):i % len(audio) + chunk])
                delay = t0 + (i + chunk) / 16000 / speed - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            await c.ws.close()
            await c.wait_closed(10)
            r = c.result
            return {"left_early": True, "errors": len(r.errors), "lost": 0, "first_audio_s": None,
                    "first_output_s": r.first_output_s, "ended": r.ended}
        r = await c.stream_audio(audio, speed=speed, chunk_s=0.1, timeout=600)
    finally:
        await c.close()
    return {
        "left_early": False, "ended": r.ended, "close_code": r.close_code, "errors": len(r.errors),
        "error_codes": sorted({str(e.get("code")) for e in r.errors}),
        "error_examples": [f"{e.get('code')}: {str(e.get('message'))[:160]}" for e in r.errors[:2]],
        "lost": _lost(r, r.messages_sent),
        "first_audio_s": r.first_audio_s, "first_output_s": r.first_output_s,
        "audio_out_s": round(len(r.audio) / 2 / r.output_rate, 3), "transcript": r.transcript,
        "messages_sent": r.messages_sent,
    }


async def bench(args, url: str, watch: ProcWatch, audio: np.ndarray) -> dict[str, Any]:
    rss_before = watch.rss_mb()
    stop = asyncio.Event()
    sampler = asyncio.create_task(watch.sample(stop))
    cpu0, t0 = watch.cpu_s(), time.monotonic()
    sessions = await asyncio.gather(*(one_session(url, args.pipeline, audio, args.speed, args.token)
                                      for _ in range(args.sessions)), return_exceptions=True)
    wall = time.monotonic() - t0
    cpu = watch.cpu_s() - cpu0
    stop.set()
    await sampler
    failures = [repr(s) for s in sessions if isinstance(s, BaseException)]
    refused = sum(1 for s in sessions if isinstance(s, dict) and s.get("refused"))
    ok = [s for s in sessions if isinstance(s, dict) and not s.get("refused")]
    first_audio = [s["first_audio_s"] for s in ok]
    first_output = [s["first_output_s"] for s in ok]
    peak = max(watch.rss_samples) if watch.rss_samples else None
    n = args.sessions
    return {
        "bench": "serve", "pipeline": args.pipeline, "sessions": n, "audio_s": round(len(audio) / 16000, 2),
        "speed": args.speed, "wall_s": round(wall, 2),
        "first_audio_s": {"p50": pct(first_audio, 50), "p95": pct(first_audio, 95),
                          "sessions_with_audio": sum(v is not None for v in first_audio)},
        "first_output_s": {"p50": pct(first_output, 50), "p95": pct(first_output, 95)},
        "frames_lost": sum(s["lost"] for s in ok) + len(failures),
        "errors": sum(s["errors"] for s in ok) + len(failures),
        "sessions_ended": sum(bool(s["ended"]) for s in ok),
        "sessions_refused": refused,  # by the pipeline's sessions_per_core, before any audio was sent
        "cpu_percent_per_session": round(100 * cpu / wall / max(1, len(ok)), 1) if watch.p else None,
        "server_cpu_s": round(cpu, 2) if watch.p else None,
        "rss_mb_before": rss_before, "rss_mb_peak": round(peak, 1) if peak else None,
        "mem_mb_per_session": round((peak - rss_before) / max(1, len(ok)), 2) if peak and rss_before else None,
        "error_codes": sorted({c for s in ok for c in s.get("error_codes", [])}),
        "error_examples": sorted({m for s in ok for m in s.get("error_examples", [])})[:3],
        "failures": failures[:5],
        "example_transcript": next((s["transcript"] for s in ok if s.get("transcript")), ""),
    }


async def soak(args, url: str, watch: ProcWatch, audio: np.ndarray) -> dict[str, Any]:
    rng = random.Random(args.seed)
    deadline = time.monotonic() + args.soak
    totals = {"sessions": 0, "left_early": 0, "errors": 0, "lost": 0, "not_ended": 0, "refused": 0, "failures": []}
    clip_s = len(audio) / 16000
    # warm-up session first so "start" memory is the steady state, not the first model touch
    await one_session(url, args.pipeline, audio[: int(16000 * min(clip_s, 2.0))], 0, args.token)
    rss_start = watch.rss_mb()
    stop = asyncio.Event()
    sampler = asyncio.create_task(watch.sample(stop, 1.0))

    async def worker(k: int) -> None:
        while time.monotonic() < deadline:
            await asyncio.sleep(rng.uniform(0, 0.5))
            early = rng.random() < 0.25
            length = rng.uniform(0.5, clip_s)
            piece = audio[: int(16000 * length)]
            try:
                s = await one_session(url, args.pipeline, piece, args.speed, args.token,
                                      leave_early_s=rng.uniform(0.2, 1.5) if early else None)
            except Exception as exc:
                totals["failures"].append(repr(exc))
                continue
            if s.get("refused"):
                totals["refused"] += 1
                continue
            totals["sessions"] += 1
            totals["left_early"] += int(s["left_early"])
            totals["errors"] += s["errors"]
            totals["lost"] += s["lost"]
            if not s["left_early"] and not s["ended"]:
                totals["not_ended"] += 1

    await asyncio.gather(*(worker(k) for k in range(args.sessions)))
    await asyncio.sleep(1.0)
    stop.set()
    await sampler
    rss_end = watch.rss_mb()
    health = await asyncio.to_thread(_healthz, url.replace("ws://", "http://").replace("/ws", "/healthz"))
    growth = (rss_end - rss_start) if (rss_end is not None and rss_start is not None) else None
    return {
        "bench": "serve-soak", "pipeline": args.pipeline, "soak_s": args.soak, "concurrency": args.sessions,
        "sessions": totals["sessions"], "left_early": totals["left_early"], "sessions_refused": totals["refused"],
        "errors": totals["errors"] + len(totals["failures"]) + totals["not_ended"],
        "frames_lost": totals["lost"], "rss_mb_start": rss_start, "rss_mb_end": rss_end,
        "rss_mb_peak": round(max(watch.rss_samples), 1) if watch.rss_samples else None,
        "rss_growth_mb": round(growth, 1) if growth is not None else None,
        "memory_bounded": growth is not None and growth < max(50.0, 0.1 * (rss_start or 0)),
        "open_sessions_after": health.get("sessions") if health else None,
        "failures": totals["failures"][:5],
    }


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="streamkit bench serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--sessions", type=int, default=8, help="concurrent sessions (default 8)")
    p.add_argument("--pipeline", default=None, help="pipeline to run (default: dubbing, else transcribe)")
    p.add_argument("--pipelines", default=None, help="pipelines directory for the server it starts")
    p.add_argument("--url", default=None, help="use a running server instead of starting one")
    p.add_argument("--token", default=os.environ.get("STREAMKIT_TOKEN"))
    p.add_argument("--audio", default=None, help="speech file to stream (default: hibari speech, ~9 s)")
    p.add_argument("--speed", type=float, default=1.0, help="1.0 = real-time pace")
    p.add_argument("--soak", type=float, default=None, metavar="SECONDS", help="sessions come and go at random for SECONDS")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="end with one JSON line")
    args = p.parse_args(argv)

    from streamkit.pipeline import default_pipelines_dir

    pdir = Path(args.pipelines) if args.pipelines else default_pipelines_dir()
    if args.pipeline is None:
        args.pipeline = next((n for n in ("dubbing", "transcribe") if (pdir / f"{n}.yaml").exists()), "dubbing")
    log(f"preparing audio ({args.audio or 'hibari speech'})")
    audio = load_audio(args.audio)
    server = None
    if args.url:
        url, pid = args.url, None
    else:
        server = ServerProcess(args.pipelines, [])
        log(f"starting server on port {server.port} (models load once) ...")
        health = server.wait_ready()
        log(f"server up: pipelines {health.get('pipelines')}")
        url, pid = server.url, server.proc.pid
    try:
        watch = ProcWatch(pid)
        report = asyncio.run(soak(args, url, watch, audio) if args.soak else bench(args, url, watch, audio))
    finally:
        if server is not None:
            server.stop()
    for k, v in report.items():
        if k != "failures" or v:
            log(f"{k:>26}: {v}")
    if args.json:
        print(json.dumps(report), flush=True)
    bad = report["errors"] or report["frames_lost"] or (args.soak and not report.get("memory_bounded"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


def _healthz(url: str) -> dict | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return json.loads(r.read())
    except OSError:
        return None
