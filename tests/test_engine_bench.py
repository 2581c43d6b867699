"""`streamkit bench engine` runs ours end to end and prints its JSON (no peer here: transformers'
side is exercised by tests/test_engine_hf.py; the numbers are in docs/engine.md)."""

from __future__ import annotations

import json
import statistics

from streamkit.bench.engine import main


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
    # only the chat template's system block (one 16-token block) with each other, not whole
    # prompts from the previous run
    assert result["prefix_hit_tokens_c3"] <= 2 * 16
    assert result["ratio_b1"] is None and result["peer_b16_tps"] is None  # no peer ran
