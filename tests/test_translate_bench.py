"""streamkit bench translate: its sentence set and its JSON, with apertium as the (fast) system."""
import json
import shutil
import subprocess
import sys

import pytest

from streamkit.bench.translate import chrf, load_pairs


def test_sentence_set():
    pairs = load_pairs()
    assert len(pairs) >= 40
    assert len({en for en, _ in pairs}) == len(pairs)
    assert all(en and es and en != es for en, es in pairs)
    assert chrf([es for _, es in pairs], [es for _, es in pairs]) == 100.0
    assert chrf([en for en, _ in pairs], [es for _, es in pairs]) < 30  # untranslated English scores low


@pytest.mark.skipif(shutil.which("apertium") is None, reason="apertium-eng-spa not installed")
def test_bench_translate_json_with_apertium():
    proc = subprocess.run([sys.executable, "-m", "streamkit.cli", "bench", "translate", "--json", "--systems", "apertium",
                           "--limit", "4"], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["sentences"] == 4
    (run,) = result["runs"]
    assert run["system"] == "apertium eng-spa" and len(run["outputs"]) == 4
    assert 20 < run["chrf"] < 100 and run["latency_ms_p50"] > 0
    assert "día" in run["outputs"][0].lower()  # "Good morning, everyone." -> "Buenos días, ..."
