"""`streamkit bench serve` runs end to end (small: echo pipeline, a few sessions, short soak)."""

from __future__ import annotations

import json

from streamkit.media import write_wav
from streamkit.server.testing import tone, write_pipelines


def _run(capsys, argv):
    from streamkit.bench.serve import main

    rc = main(argv)
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    return rc, report


def test_bench_serve_json(tmp_path, capsys):
    pipes = write_pipelines(tmp_path / "p", ["echo24"])
    wav = tmp_path / "tone.wav"
    write_wav(wav, tone(1.0), 16000)
    rc, report = _run(capsys, ["--pipelines", str(pipes), "--pipeline", "echo24", "--audio", str(wav),
                               "--sessions", "3", "--json"])
    assert rc == 0, report
    assert report["sessions"] == 3 and report["sessions_ended"] == 3
    assert report["frames_lost"] == 0 and report["errors"] == 0
    assert report["first_audio_s"]["sessions_with_audio"] == 3
    assert report["first_audio_s"]["p50"] is not None and report["first_audio_s"]["p95"] >= report["first_audio_s"]["p50"]
    assert report["cpu_percent_per_session"] is not None and report["mem_mb_per_session"] is not None


def test_bench_serve_soak(tmp_path, capsys):
    pipes = write_pipelines(tmp_path / "p", ["echo"])
    wav = tmp_path / "tone.wav"
    write_wav(wav, tone(1.5), 16000)
    rc, report = _run(capsys, ["--pipelines", str(pipes), "--pipeline", "echo", "--audio", str(wav),
                               "--sessions", "4", "--soak", "5", "--speed", "2", "--json"])
    assert rc == 0, report
    assert report["sessions"] >= 4 and report["left_early"] >= 0
    assert report["errors"] == 0 and report["frames_lost"] == 0
    assert report["memory_bounded"] and report["open_sessions_after"] == 0
    assert report["rss_mb_start"] and report["rss_mb_end"]
