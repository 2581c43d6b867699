"""Property-based fuzz of the frame codec: valid frames round-trip, any bytes decode or fail cleanly."""

import msgpack
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from streamkit.frames import (
    AudioFrame,
    Control,
    ControlKind,
    EventFrame,
    FrameDecodeError,
    TextFrame,
    VideoFrame,
    Word,
    decode_frame,
    encode_frame,
    frames_equal,
)

finite = st.floats(allow_nan=False, allow_infinity=False, width=32)
times = st.floats(min_value=0, max_value=1e6, allow_nan=False)
json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-2**53, 2**53) | finite | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


@st.composite
def audio_frames(draw):
    channels = draw(st.sampled_from([1, 2]))
    n = draw(st.integers(0, 300))
    shape = (n,) if channels == 1 else (n, channels)
    samples = draw(st.lists(finite, min_size=int(np.prod(shape)), max_size=int(np.prod(shape))))
    return AudioFrame(np.array(samples, np.float32).reshape(shape), draw(st.integers(1, 192000)), channels,
                      draw(times), draw(st.text(max_size=10)))


@st.composite
def video_frames(draw):
    h, w = draw(st.integers(1, 8)), draw(st.integers(1, 8))
    pixels = draw(st.binary(min_size=h * w * 3, max_size=h * w * 3))
    return VideoFrame(np.frombuffer(pixels, np.uint8).reshape(h, w, 3).copy(), draw(times), draw(st.integers(0, 10**6)))


words = st.builds(Word, st.text(max_size=10), times, times, st.floats(0, 1))
text_frames = st.builds(TextFrame, st.text(max_size=50), st.booleans(), st.none() | st.text(max_size=5),
                        st.none() | times, st.none() | times, st.lists(words, max_size=4),
                        st.none() | st.integers(0, 10**6), times, st.text(max_size=10))
event_frames = st.builds(EventFrame, st.text(max_size=20), st.dictionaries(st.text(max_size=8), json_value, max_size=5),
                         times)
controls = st.builds(Control, st.sampled_from(list(ControlKind)), times)
any_frame = st.one_of(audio_frames(), video_frames(), text_frames, event_frames, controls)


@settings(max_examples=300, deadline=None)
@given(any_frame)
def test_every_valid_frame_round_trips(frame):
    assert frames_equal(decode_frame(encode_frame(frame)), frame)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_decode_or_raise_frame_decode_error(data):
    try:
        decode_frame(data)
    except FrameDecodeError:
        pass


wire_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats() | st.text(max_size=10)
    | st.binary(max_size=16),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3), max_leaves=10)


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(["audio", "video", "text", "event", "control"]),
       st.dictionaries(st.sampled_from(["samples", "image", "sample_rate", "channels", "pts", "text", "final", "words",
                                        "name", "data", "control", "index", "source", "start", "end"]),
                       wire_values, max_size=6))
def test_well_formed_msgpack_with_wrong_fields_never_escapes(kind, body):
    try:
        decode_frame(msgpack.packb({"k": kind, **body}, use_bin_type=True))
    except FrameDecodeError:
        pass
