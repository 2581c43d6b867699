"""Benchmarks: `streamkit bench NAME` runs streamkit.bench.NAME.main(argv)."""

from __future__ import annotations

import json
from typing import Any


def print_result(result: dict[str, Any], as_json: bool) -> None:
    """The result on stdout: with --json one JSON object as the last line, else `key: value` lines."""
    if as_json:
        print(json.dumps(result), flush=True)
    else:
        for key, value in result.items():
            print(f"{key}: {value}")
