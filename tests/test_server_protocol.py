"""The protocol parser: unit cases and a hypothesis fuzz (no exception escapes, nothing hangs)."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamkit.server import protocol as P


def test_start_full():
    msg = P.parse_message(json.dumps({"type": "start", "pipeline": "dubbing", "params": {"x": 1},
                                      "audio": {"sample_rate": 16000, "format": "s16le", "channels": 1}}))
    assert isinstance(msg, P.Start)
    assert msg.pipeline == "dubbing" and msg.params == {"x": 1}
    assert (msg.audio.sample_rate, msg.audio.channels, msg.audio.format) == (16000, 1, "s16le")


def test_start_minimal_and_stop():
    msg = P.parse_message('{"type":"start","pipeline":"transcribe"}')
    assert isinstance(msg, P.Start) and msg.audio is None and msg.params == {}
    assert isinstance(P.parse_message('{"type":"stop"}'), P.Stop)


@pytest.mark.parametrize("text,code", [
    ("hello", "bad_json"),
    ('{"type":"start"', "bad_json"),  # truncated
    ("[1,2]", "bad_message"),
    ('{"pipeline":"x"}', "bad_message"),
    ('{"type":5}', "bad_message"),
    ('{"type":"dance"}', "unknown_type"),
    ('{"type":"start"}', "bad_message"),
    ('{"type":"start","pipeline":"../etc"}', "bad_message"),
    ('{"type":"start","pipeline":"x","params":[]}', "bad_message"),
    ('{"type":"start","pipeline":"x","audio":{"sample_rate":"fast"}}', "bad_audio_format"),
    ('{"type":"start","pipeline":"x","audio":{"sample_rate":100}}', "bad_audio_format"),
    ('{"type":"start","pipeline":"x","audio":{"sample_rate":16000,"format":"f32le"}}', "bad_audio_format"),
    ('{"type":"start","pipeline":"x","audio":{"channels":3}}', "bad_audio_format"),
    ('{"type":"start","pipeline":"x","audio":7}', "bad_audio_format"),
    ("[" * 100000 + "]" * 100000, "bad_json"),
])
def test_bad_text(text, code):
    with pytest.raises(P.ProtocolError) as err:
        P.parse_message(text)
    assert err.value.code == code
    assert err.value.message
    assert err.value.close is None


@pytest.mark.parametrize("data,code", [
    (b"", "empty_message"),
    (b"\x03abc", "unknown_kind"),
    (b"\x00", "unknown_kind"),
    (b"\x02", "bad_jpeg"),
])
def test_bad_binary(data, code):
    with pytest.raises(P.ProtocolError) as err:
        P.parse_message(data)
    assert err.value.code == code


def test_binary_kinds():
    assert P.parse_message(b"\x01\x00\x00").pcm == b"\x00\x00"
    assert P.parse_message(b"\x02\xff\xd8").jpeg == b"\xff\xd8"


def test_too_big_closes_1009():
    with pytest.raises(P.ProtocolError) as err:
        P.parse_message(b"\x01" + b"\0" * 100, max_size=64)
    assert err.value.code == "message_too_big" and err.value.close == 1009
    assert "100" in err.value.message or "101" in err.value.message


def test_pcm_odd_bytes():
    with pytest.raises(P.ProtocolError) as err:
        P.pcm_to_array(b"\x00\x00\x00", 1)
    assert err.value.code == "bad_audio"
    with pytest.raises(P.ProtocolError):
        P.pcm_to_array(b"\x00" * 6, 2)
    assert P.pcm_to_array(b"\x00\x40" * 4, 2).shape == (2, 2)


def test_jpeg_size():
    import cv2
    import numpy as np

    ok, buf = cv2.imencode(".jpg", np.zeros((48, 64, 3), np.uint8))
    assert P.jpeg_size(buf.tobytes()) == (64, 48)
    for bad in (b"", b"\xff\xd8", b"GIF89a", buf.tobytes()[:20], b"\xff\xd8\xff\xda\x00\x02"):
        with pytest.raises(P.ProtocolError) as err:
            P.jpeg_size(bad)
        assert err.value.code == "bad_jpeg"


def test_encoders():
    assert P.transcript("hi", True, 0.5, None) == {"type": "transcript", "text": "hi", "final": True, "start": 0.5, "end": 0.5}
    assert P.text_event("llm", "x", False) == {"type": "text", "stage": "llm", "text": "x", "final": False}
    det = P.detections(1.0, [{"label": "face", "box": [1, 2, 3, 4], "score": 0.9}, "junk"])
    assert det == {"type": "detections", "pts": 1.0, "objects": [{"label": "face", "box": [1.0, 2.0, 3.0, 4.0], "score": 0.9}]}
    assert json.loads(P.encode(P.ready("abc", 24000)))["output_audio"] == {"sample_rate": 24000, "format": "s16le", "channels": 1}


# ------------------------------------------------------------------ fuzz

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=30,
)
start_like = st.fixed_dictionaries(
    {"type": st.sampled_from(["start", "stop", "Start", "", "ready"])},
    optional={"pipeline": json_values | st.sampled_from(["transcribe", "dubbing", "x" * 200]),
              "params": json_values,
              "audio": json_values | st.fixed_dictionaries({}, optional={
                  "sample_rate": json_values | st.integers(-10, 400000),
                  "format": st.sampled_from(["s16le", "f32le", 1]),
                  "channels": json_values | st.integers(-1, 4)})},
)
messages = st.one_of(
    st.text(max_size=200),
    st.binary(max_size=200),
    start_like.map(json.dumps),
    json_values.map(lambda v: json.dumps(v)),
    st.binary(max_size=64).map(lambda b: b"\x01" + b),
    st.binary(max_size=64).map(lambda b: b"\x02\xff\xd8" + b),
)


@settings(max_examples=400, deadline=200, suppress_health_check=[HealthCheck.too_slow])
@given(messages)
def test_fuzz_parser(message):
    started = time.perf_counter()
    try:
        msg = P.parse_message(message, max_size=150)
    except P.ProtocolError as err:
        assert isinstance(err.code, str) and err.code
        assert isinstance(err.message, str) and err.message
        json.dumps(err.event())
    else:
        assert isinstance(msg, (P.Start, P.Stop, P.Audio, P.Video))
        if isinstance(msg, P.Audio):
            try:
                P.pcm_to_array(msg.pcm, 1)
            except P.ProtocolError as err:
                assert err.code == "bad_audio"
        if isinstance(msg, P.Video):
            try:
                P.jpeg_size(msg.jpeg)
            except P.ProtocolError as err:
                assert err.code == "bad_jpeg"
    assert time.perf_counter() - started < 0.5
