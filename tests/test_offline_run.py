"""`streamkit run`: a pipeline over a media file decoded by PyAV, results in a directory."""

import subprocess

import numpy as np
from audio_pipelines import RESAMPLE_GAIN, expected_resample_gain, make_flac

from streamkit.media import iter_audio, read_audio
from streamkit.offline import srt_time, to_srt


def test_run_writes_the_output_stage_audio(tmp_path, streamkit_cmd):
    source = make_flac(tmp_path / "in.flac", seconds=1.5)
    pipeline = tmp_path / "rg.yaml"
    pipeline.write_text(RESAMPLE_GAIN)
    out = tmp_path / "out"
    result = subprocess.run([*streamkit_cmd, "run", str(pipeline), "--input", str(source), "--output", str(out)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert f"g.wav: {out / 'g.wav'}" in result.stdout
    written = read_audio(out / "g.wav", 24000)
    want = expected_resample_gain(list(iter_audio(source, 16000)))
    assert written.shape == want.shape
    # the WAV holds 16-bit PCM: equal to within one quantisation step
    assert np.max(np.abs(written - want)) <= 1 / 32768 + 1e-7


def test_run_reports_a_missing_input_stream_clearly(tmp_path, streamkit_cmd):
    source = make_flac(tmp_path / "in.flac", seconds=0.2)
    pipeline = tmp_path / "v.yaml"
    pipeline.write_text("name: v\ninput: {video: {}}\nstages:\n  - {name: g, type: gain}\n")
    result = subprocess.run([*streamkit_cmd, "run", str(pipeline), "--input", str(source), "--output", str(tmp_path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip() == f"streamkit run: {source} has no video stream for pipeline 'v'"
    missing = subprocess.run([*streamkit_cmd, "run", str(pipeline), "--input", str(tmp_path / "nope.mp4"),
                              "--output", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "cannot open" in missing.stderr and "Traceback" not in missing.stderr


def test_srt_formatting():
    assert srt_time(3723.4567) == "01:02:03,457"
    srt = to_srt([{"text": " hello ", "start": 0.5, "end": 1.25}, {"text": "world", "start": 2, "end": 3}])
    assert srt == "1\n00:00:00,500 --> 00:00:01,250\nhello\n\n2\n00:00:02,000 --> 00:00:03,000\nworld\n"
