"""The describe stage: detections of the last seconds -> one short sentence via the shared engine."""

from __future__ import annotations

import asyncio

import pytest
import yaml

from streamkit.frames import EventFrame, TextFrame
from streamkit.video.describe_text import first_sentence, summarize


def _events(seconds=12.0, fps=5.0):
    out = []
    for i in range(int(seconds * fps)):
        pts = i / fps
        objects = [{"label": "face", "box": [600, 200, 90, 90], "score": 0.9}]
        if pts > 6:
            objects.append({"label": "motion", "box": [50, 50, 100, 100], "score": 0.7})
        out.append(EventFrame("detections", {"pts": pts, "objects": objects, "width": 1280, "height": 720}, pts=pts))
    return out


def test_summary_is_plain_facts():
    text = summarize([e.data for e in _events(4)])
    assert "1 face (center)" in text and "all the time" in text
    assert "movement" not in text
    assert "movement on the left" in summarize([e.data for e in _events(12)][-20:])
    assert summarize([]) == "nothing was analysed."
    assert "scene cut" in summarize([e.data for e in _events(2)], cuts=1)


def test_first_sentence():
    assert first_sentence(' "A person sits at a desk. Then more." ') == "A person sits at a desk."
    assert first_sentence("no stop at all") == "no stop at all"


async def test_describe_through_the_shared_engine():
    pytest.importorskip("streamkit.engine")
    from streamkit.engine import default_model_path

    try:
        default_model_path()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    from streamkit.pipeline import parse_pipeline
    from streamkit.runtime import Session
    from streamkit.transport import MemoryTransport

    spec = parse_pipeline(yaml.safe_dump({
        "name": "describe_only",
        "stages": [{"name": "describe", "type": "describe", "interval_s": 5, "window_s": 5, "max_tokens": 24}],
        "output": ["describe"],
    }))
    session = await Session.open(spec, MemoryTransport())
    out = await asyncio.wait_for(session.run_to_end(_events(12)), 240)
    errors = [f.data for f in out if isinstance(f, EventFrame) and f.name == "error"]
    assert not errors, errors
    finals = [f for f in out if isinstance(f, TextFrame) and f.final]
    partial = [f for f in out if isinstance(f, TextFrame) and not f.final]
    # at most once per 5 s of stream time: at 5 s and 10 s, plus the tail at flush
    assert 1 <= len(finals) <= 3
    ends = [f.end for f in finals]
    assert all(b - a >= 5 - 1e-6 for a, b in zip(ends, ends[1:]))
    for f in finals:
        assert f.source == "describe" and f.text.strip()
        assert len(f.text) <= 200 and "\n" not in f.text
        assert f.start is not None and f.end - f.start <= 5 + 1e-6
    assert partial  # streamed token by token
