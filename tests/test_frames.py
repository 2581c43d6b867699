import numpy as np
import pytest

from streamkit.frames import (
    AudioFrame,
    Control,
    ControlKind,
    EventFrame,
    FrameDecodeError,
    TextFrame,
    TextRole,
    VideoFrame,
    Word,
    decode_frame,
    encode_frame,
    frames_equal,
)

rng = np.random.default_rng(7)

FRAMES = [
    AudioFrame(rng.uniform(-1, 1, 1601).astype(np.float32), 16000, pts=1.25, source="capture"),
    AudioFrame(rng.uniform(-1, 1, (480, 2)).astype(np.float32), 48000, channels=2, pts=0.01),
    VideoFrame(rng.integers(0, 255, (72, 128, 3), dtype=np.uint8), pts=3.0333, index=91, source="cam"),
    TextFrame("hola, ¿qué tal? 你好", final=False, language="es", start=0.5, end=1.75, utterance=3, source="translate"),
    TextFrame("the quick brown fox", words=[Word("the", 0.0, 0.2, 0.99), Word("quick", 0.2, 0.5, 0.8)], utterance=0,
              role=TextRole.TRANSCRIPT),
    EventFrame("detections", {"pts": 1.0, "objects": [{"label": "face", "box": [1, 2, 30, 40], "score": 0.9}]}),
    EventFrame("speech_start", {}, pts=12.5, source="vad"),
    *[Control(kind) for kind in ControlKind],
]


@pytest.mark.parametrize("frame", FRAMES, ids=lambda f: f"{f.kind}")
def test_every_frame_type_round_trips_exactly(frame):
    decoded = decode_frame(encode_frame(frame))
    assert type(decoded) is type(frame)
    assert frames_equal(decoded, frame)


def test_audio_samples_round_trip_bit_for_bit():
    samples = np.array([0.0, -0.0, 1e-38, np.float32(1 / 3), -1.0], dtype=np.float32)
    decoded = decode_frame(encode_frame(AudioFrame(samples, 8000)))
    assert decoded.samples.tobytes() == samples.tobytes()


def test_frames_equal_notices_differences():
    a = FRAMES[0]
    b = AudioFrame(a.samples.copy(), a.sample_rate, pts=a.pts, source=a.source)
    b.samples[100] += 1e-6
    assert not frames_equal(a, b)
    assert not frames_equal(FRAMES[3], FRAMES[4])


def test_s16le_conversion_round_trips_pcm():
    pcm = (np.arange(-32768, 32768, 97, dtype=np.int16)).astype("<i2").tobytes()
    frame = AudioFrame.from_s16le(pcm, 16000)
    assert frame.to_s16le() == pcm
    assert AudioFrame(np.array([1.5, -2.0], np.float32), 16000).to_s16le() == np.array([32767, -32768], "<i2").tobytes()
    with pytest.raises(ValueError, match="whole number"):
        AudioFrame.from_s16le(b"\x00\x01\x02", 16000)


@pytest.mark.parametrize("data, message", [
    (b"\xc1", "not valid msgpack"),
    (b"\x93\x01\x02\x03", "must be a msgpack map"),
    (b"\x81\xa1k\xa4nope", "unknown frame kind"),
])
def test_garbage_is_a_clear_decode_error(data, message):
    with pytest.raises(FrameDecodeError, match=message):
        decode_frame(data)


def test_malformed_fields_are_decode_errors():
    import msgpack

    bad_array = msgpack.packb({"k": "audio", "samples": {"dtype": "<f4", "shape": [3], "data": b"\x00" * 5},
                               "sample_rate": 16000})
    with pytest.raises(FrameDecodeError, match="bad array"):
        decode_frame(bad_array)
    unknown_field = msgpack.packb({"k": "text", "text": "x", "colour": "red"})
    with pytest.raises(FrameDecodeError, match="unknown fields"):
        decode_frame(unknown_field)
    object_array = msgpack.packb({"k": "video", "image": {"dtype": "|O", "shape": [1], "data": b"\x00" * 8}})
    with pytest.raises(FrameDecodeError):
        decode_frame(object_array)


def test_text_role_travels_and_defaults_to_generated():
    import msgpack

    transcript = decode_frame(encode_frame(TextFrame("hello", role=TextRole.TRANSCRIPT)))
    assert transcript.role is TextRole.TRANSCRIPT
    # a frame written before roles existed reads as generated text
    assert decode_frame(msgpack.packb({"k": "text", "text": "hola"})).role is TextRole.GENERATED
    with pytest.raises(FrameDecodeError, match="malformed"):
        decode_frame(msgpack.packb({"k": "text", "text": "x", "role": "poem"}))
