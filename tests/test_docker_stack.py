"""The docker-compose stack for real: build the image, `docker compose up --wait`, dubbing sessions
through `streamkit client`, the work seen in Redis on both ASR workers and the engine worker, a
stop mid-session that still flushes the last words, `docker compose down -v`.

Marked `docker`: not in the default run. .ci/run runs it wherever a Docker engine can be started,
with the images of scripts/docker_without_hub.sh when no registry is reachable (the environment
variables STREAMKIT_BASE_IMAGE, STREAMKIT_REDIS_IMAGE, STREAMKIT_TORCH_PIP_ARGS)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import free_port

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parent.parent
PROJECT = "streamkit-test"


def _docker_ok() -> str | None:
    if shutil.which("docker") is None:
        return "no docker client"
    for cmd in (["docker", "info"], ["docker", "compose", "version"]):
        if subprocess.run(cmd, capture_output=True, timeout=60).returncode != 0:
            return f"`{' '.join(cmd)}` failed: no Docker engine or no compose plugin"
    return None


def compose(*args: str, env: dict, timeout: float = 900, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", "compose", "-p", PROJECT, "-f", str(ROOT / "docker-compose.yml"), *args],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=check)


def redis_values(env: dict, pattern: str) -> dict[str, dict]:
    script = f'for k in $(redis-cli --scan --pattern "{pattern}"); do echo "$k $(redis-cli get $k)"; done'
    out = compose("exec", "-T", "redis", "sh", "-c", script, env=env, timeout=30).stdout
    return {line.split(" ", 1)[0]: json.loads(line.split(" ", 1)[1]) for line in out.splitlines() if " " in line}


def client(port: int, wav: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "streamkit.cli", "client", "dubbing", str(wav), "--url",
                             f"ws://127.0.0.1:{port}/ws", "--json", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)


def events(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def stack():
    reason = _docker_ok()
    if reason:
        pytest.skip(reason)
    port = free_port()
    env = {**os.environ, "STREAMKIT_PORT": str(port)}
    try:
        t0 = time.monotonic()
        build = compose("build", env=env, timeout=1800, check=False)
        assert build.returncode == 0, build.stderr[-4000:]
        t1 = time.monotonic()
        up = compose("up", "-d", "--wait", "--wait-timeout", "600", env=env, timeout=900, check=False)
        t2 = time.monotonic()
        assert up.returncode == 0, up.stderr[-4000:] + compose("logs", "--tail", "40", env=env, check=False).stdout
        print(f"\ndocker stack: build {t1 - t0:.0f} s, up --wait {t2 - t1:.0f} s", file=sys.stderr)
        yield port, env
    finally:
        compose("down", "-v", "--remove-orphans", env=env, timeout=300, check=False)


def test_stack_serves_the_page_and_reports_healthy(stack):
    port, _ = stack
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as r:
        assert r.status == 200 and b"<html" in r.read().lower()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as r:
        health = json.loads(r.read())
    assert health["status"] == "ok" and health["transport"] == "redis"
    assert health["workers"]["stage:asr"] == 2 and health["workers"]["engine"] == 1
    assert not [m for m in health["models"] if m.startswith("engine:")]  # the server loads no LLM


def test_dubbing_sessions_use_both_asr_workers_and_the_engine_worker(stack, tmp_path):
    from speech import sentences, speech_wav

    port, env = stack
    wav = speech_wav(tmp_path, sentences()[:2])
    procs = [client(port, wav, "--speed", "2") for _ in range(4)]
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        got = events(out)
        assert proc.returncode == 0, (err[-2000:], [e for e in got if e.get("type") in ("error", "summary")])
        summary = got[-1]
        assert summary["errors"] == 0 and summary["ended"], summary
        assert "quick brown fox" in summary["transcript"].lower() and "close the window" in summary["transcript"].lower()
        assert [e for e in got if e.get("type") == "text" and e.get("final")], "no translation"
        assert summary["audio_s"] > 1.0  # dubbed speech came back
    workers = redis_values(env, "sk:alive:*")
    asr = [v for k, v in workers.items() if k.startswith("sk:alive:stage:asr:")]
    engines = [v for k, v in workers.items() if k.startswith("sk:alive:engine:")]
    assert len(asr) == 2 and all(v["sessions_done"] >= 1 for v in asr), workers  # both took sessions
    assert len(engines) == 1 and engines[0]["tokens_generated"] > 0, workers


def test_compose_stop_mid_session_flushes_the_last_words(stack, tmp_path):
    """SIGTERM to the stack while the second sentence is being spoken: the server stops first
    (it depends on the workers), flushes the session through ASR, the engine worker and TTS, and
    the client gets the words heard so far as a final, translated and spoken."""
    from speech import sentences, speech_wav

    port, env = stack
    wav = speech_wav(tmp_path, sentences()[:3])
    proc = client(port, wav, "--speed", "1")
    time.sleep(7.0)  # "Please remember to close the window ..." is being spoken (5.6-8.9 s into the file)
    stop = compose("stop", env=env, timeout=120, check=False)
    out, err = proc.communicate(timeout=120)
    assert stop.returncode == 0, stop.stderr[-2000:]
    assert proc.returncode == 0, err[-2000:]  # a clean close, no traceback
    got = events(out)
    summary = got[-1]
    assert summary["ended"] and summary["cut_short"] and summary["close_code"] == 1001, summary
    assert not [e for e in got if e.get("type") == "error" and e.get("code") != "stopping"], got
    finals = [e for e in got if e.get("type") == "transcript" and e.get("final")]
    assert len(finals) == 2 and "please remember" in finals[1]["text"].lower(), finals  # flushed, not lost
    partials = [e for e in got if e.get("type") == "transcript" and not e.get("final")
                and e["start"] == finals[1]["start"]]
    heard = set(partials[-1]["text"].lower().strip(".,").split()) if partials else set()
    assert heard <= set(finals[1]["text"].lower().replace(".", "").replace(",", "").split()), (partials[-1], finals[1])
    after = got[got.index(finals[1]):]
    assert [e for e in after if e.get("type") == "text" and e.get("final")], "the flushed words were not translated"
