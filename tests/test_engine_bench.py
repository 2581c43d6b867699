"""`streamkit bench engine` runs ours end to end and prints its JSON (no peer here: transformers'
side is exercised by tests/test_engine_hf.py; the numbers are in docs/engine.md); `streamkit bench
step` times one decode step on the few-row and fp32 paths."""

from __future__ import annotations

import importlib.util
import json
import statistics

import pytest

from streamkit.bench.engine import main
from streamkit.engine import default_model_path
from streamkit.engine.chat_template import ChatTemplate
from streamkit.engine.gguf_file import read_metadata
from streamkit.engine.reference import PROMPTS, chat
from streamkit.engine.tokenizer import Tokenizer


def _shared_prefix(prompts: list[str]) -> int:
    """The tokens the chat prompts of `prompts` all start with."""
    meta = read_metadata(default_model_path())
    tok = Tokenizer(meta)
    template = ChatTemplate.from_metadata(meta, tok.tokens)
    ids = [tok.encode(template.render(chat(p), add_generation_prompt=True)) for p in prompts]
    return next(i for i in range(min(map(len, ids))) if len({x[i] for x in ids}) > 1)


def test_bench_engine_json_reports_medians_of_its_runs(capsys):
    assert main(["--json", "--no-peer", "--tokens", "6", "--concurrency", "1,3", "--greedy-prompts", "0"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("ours_b1_tps", "ours_b1_tps_best", "ttft_ms_p50", "roofline_fraction", "device", "ours_b16_tps",
                "ratio_b1", "ratio_b16", "greedy_match"):
        assert key in result
    assert 0 < result["ours_b1_tps"] <= result["ours_b1_tps_best"]
    for c in (1, 3):
        runs = result[f"ours_c{c}_tps_runs"]
        assert len(runs) == 3 and all(r > 0 for r in runs)
        assert result[f"ours_c{c}_tps"] == round(statistics.median(runs), 2)
    # each run starts from an empty prefix cache, so three streams of different prompts can share
    # only what their chat prompts have in common (the template's system prompt: the first stream
    # computes it, the others wait a step and take it), not whole prompts from the previous run
    assert result["prefix_hit_tokens_c3"] == 2 * _shared_prefix(PROMPTS[:3])
    assert result["ratio_b1"] is None and result["peer_b16_tps"] is None  # no peer ran
    if result["device"] == "cpu":  # each batch-1 run against the read bandwidth sampled just before it
        fractions, tps, bws = (result[k] for k in ("roofline_fraction_runs", "ours_b1_tps_runs",
                                                    "b1_read_bandwidth_gbs_runs"))
        assert len(fractions) == len(tps) == len(bws) == 5 and min(bws) > 0
        for f, t, b in zip(fractions, tps, bws):
            assert f == pytest.approx(t * result["bytes_per_step_b1_mb"] * 1e6 / (b * 1e9), rel=0.01)
        assert result["roofline_fraction"] == pytest.approx(statistics.median(fractions), abs=1e-3)
        assert result["bandwidth_gbs_measured"] == pytest.approx(statistics.median(bws), abs=0.1)
        assert result["copy_bandwidth_gbs"] > 0  # the old measure, reported beside it
        # and against memory, past the last-level cache
        assert result["roofline_fraction_dram"] == pytest.approx(
            result["ours_b1_tps"] * result["bytes_per_step_b1_mb"] * 1e6 / (result["dram_read_bandwidth_gbs"] * 1e9),
            rel=0.01)


def test_read_bandwidth_probe_reads_its_buffer():
    """The roofline's probe: a positive rate from the native kernels' streaming read, whose sum
    counts every byte of its buffer (all ones), on one thread and on several."""
    from streamkit.bench.engine import ReadBandwidth
    from streamkit.engine import native

    probe = ReadBandwidth(1 << 20)
    assert probe(reps=2) > 0
    if native.available():
        lib = native.load()
        words = probe.nbytes // 8 * 0x0101010101010101  # each 8 bytes of ones, summed as int64 (wrapping)
        for threads in (1, 2, 3):
            got = lib.sk_read_sum(native.ptr(probe.buf), probe.nbytes, threads)
            assert got == (words + 2**63) % 2**64 - 2**63


def test_bench_step_times_both_paths_at_each_row_count(capsys):
    """`streamkit bench step`: every requested row count gets a few-row int8 time, an fp32 time and
    their ratio (what the limits in sk_gemv.h are set from); a row count of 0 is refused."""
    from streamkit.bench.step import main as step_main
    from streamkit.engine import native

    if native.resolve_isa() is None:
        pytest.skip(f"no native kernels here: {native.error()}")
    assert step_main(["--json", "--rows", "2,1", "--steps", "2", "--context", "40"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["context"] == 40 and result["native_path"]
    for m in (1, 2):
        few, fp32 = result[f"rows{m}_few_row_int8_ms"], result[f"rows{m}_fp32_ms"]
        assert few > 0 and fp32 > 0
        assert result[f"rows{m}_speedup"] == round(fp32 / few, 3)
        assert result[f"rows{m}_logit_rows"] == m  # a decode step: logits on every row
    with pytest.raises(SystemExit):
        step_main(["--rows", "0"])


def test_bench_step_last_logits_skips_the_head_on_all_but_one_row(capsys):
    """--last-logits times a prefill-shaped step: the LM head runs on one row, not on each, so a
    24-row step reads SmolLM2's 49,152 x 576 head once instead of 24 times; its time is reported
    under the same keys, with the rows of logits the step returned."""
    from streamkit.bench.step import main as step_main
    from streamkit.engine import native

    if native.resolve_isa() is None:
        pytest.skip(f"no native kernels here: {native.error()}")
    assert step_main(["--json", "--rows", "24", "--steps", "2", "--context", "40", "--last-logits"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["logit_rows"] == "last" and result["rows24_logit_rows"] == 1
    assert result["rows24_few_row_int8_ms"] > 0


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("xllamacpp") is None, reason="xllamacpp (the bench extra) not installed")
def test_bench_engine_pairs_rounds_of_ours_and_llamacpp(capsys):
    """`--paired-rounds 2`: two rounds of ours then llama.cpp back to back, each round's ratios
    reported, and their median as the figure."""
    assert main(["--json", "--no-transformers", "--tokens", "8", "--concurrency", "1,16", "--greedy-prompts", "0",
                 "--paired-rounds", "2"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["llamacpp_b1_tps"] > 0 and result["ratio_llamacpp_b1"] > 0
    for key in ("b1", "c16"):
        runs = result[f"paired_ratio_llamacpp_{key}_runs"]
        assert len(runs) == 2 and all(r > 0 for r in runs)
        assert result[f"paired_ratio_llamacpp_{key}"] == statistics.median(runs)
