"""`streamkit bench video` runs and prints its JSON (a small clip here; the 720p numbers are in docs/video.md)."""

from __future__ import annotations

import json

from streamkit.bench.video import main
from streamkit.video.synthetic import make_clip


def test_bench_video_json(tmp_path, capsys):
    clip = tmp_path / "c.mp4"
    make_clip(clip, width=320, height=180, fps=30, seconds=2.0)
    assert main(["--json", "--input", str(clip), "--seconds", "2", "--rounds", "2"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("fps", "decode_only_fps", "ratio", "frames", "analysed", "live"):
        assert key in result
    assert result["frames"] == 60 and result["analysed"] == 10
    assert result["ratio"] == round(result["fps"] / result["decode_only_fps"], 3)
    assert result["rounds"] == 2 and len(result["ratio_rounds"]) == 2
    assert result["live"]["frames"] + result["live"]["dropped"] == 60
