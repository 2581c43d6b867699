"""Video I/O: JPEG frames from the browser, the MP4 writer, PyAV capture and its drop policy."""

from __future__ import annotations

import time

import av
import numpy as np
import pytest

from streamkit.frames import VideoFrame
from streamkit.video.capture import VideoSource, is_live_source, resolve_policy
from streamkit.video.encode import Mp4Writer
from streamkit.video.jpeg import JpegError, decode_jpeg, encode_jpeg, jpeg_size
from streamkit.video.synthetic import make_clip


def _image(w=160, h=120):
    img = np.zeros((h, w, 3), np.uint8)
    img[:, : w // 2] = (0, 0, 255)
    img[:, w // 2:] = (255, 0, 0)
    return img


def test_decode_jpeg_round_trip():
    img = _image()
    data = encode_jpeg(img, quality=95)
    assert jpeg_size(data) == (160, 120)
    out = decode_jpeg(data)
    assert out.shape == (120, 160, 3) and out.dtype == np.uint8
    assert np.abs(out.astype(int) - img.astype(int)).mean() < 4  # BGR order kept
    assert decode_jpeg(memoryview(data)).shape == out.shape


@pytest.mark.parametrize("bad, words", [
    (b"", "empty"),
    (b"hello world, not a jpeg", "SOI"),
    (b"\x89PNG\r\n\x1a\n0000", "SOI"),
])
def test_decode_jpeg_rejects_non_jpeg(bad, words):
    with pytest.raises(ValueError, match=words):
        decode_jpeg(bad)


def test_decode_jpeg_rejects_truncated_and_garbled():
    data = encode_jpeg(_image())
    with pytest.raises(JpegError, match="truncated|corrupt"):
        decode_jpeg(data[: len(data) // 2])
    garbled = bytearray(data)
    garbled[2:40] = b"\x00" * 38  # headers destroyed
    with pytest.raises(JpegError):
        decode_jpeg(bytes(garbled))


def test_decode_jpeg_refuses_oversized_before_decoding():
    data = encode_jpeg(_image(64, 64))
    with pytest.raises(JpegError, match="pixel limit"):
        decode_jpeg(data, max_pixels=1000)


def _decoded_pts(path):
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        return [float(f.pts * f.time_base) for f in c.decode(s)], (s.codec_context.width, s.codec_context.height)


def test_mp4_writer_keeps_pts_and_size(tmp_path):
    # irregular timing (a gap, as after dropped frames) must survive encoding
    pts = [0.0, 0.1, 0.2, 0.5, 0.6, 1.0]
    path = tmp_path / "a.mp4"
    with Mp4Writer(path, fps=10, width=160, height=120) as w:
        for i, p in enumerate(pts):
            w.write(VideoFrame(_image(), pts=p, index=i))
    got, size = _decoded_pts(path)
    assert size == (160, 120)
    assert got == pytest.approx(pts, abs=1e-3)


def test_mp4_writer_odd_size_and_resize(tmp_path):
    path = tmp_path / "odd.mp4"
    w = Mp4Writer(path, fps=25, width=161, height=121)
    w.write(VideoFrame(_image(161, 121), pts=0.0))
    w.write(VideoFrame(_image(320, 240), pts=0.04))  # another size: resized
    w.close()
    w.close()  # idempotent
    got, size = _decoded_pts(path)
    assert size == (160, 120) and len(got) == 2
    with pytest.raises(ValueError):
        w.write(VideoFrame(_image(), pts=1.0))


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    path = tmp_path_factory.mktemp("clip") / "clip.mp4"
    truth = make_clip(path, width=320, height=180, fps=30, seconds=2.0, with_face=False)
    return path, truth


def test_capture_file_keeps_every_frame_and_pts(clip):
    path, truth = clip
    source = VideoSource(str(path), drop="auto")
    assert source.policy == "none"
    frames = list(source)
    assert [f.index for f in frames] == list(range(len(truth.frames)))
    assert [f.pts for f in frames] == pytest.approx([t["pts"] for t in truth.frames], abs=1e-3)
    assert frames[0].image.shape == (180, 320, 3)
    assert source.stats()["dropped"] == 0


def test_capture_file_decodes_ahead_only_up_to_its_buffer(clip):
    path, _ = clip
    frame_bytes = 320 * 180 * 3
    source = VideoSource(str(path), drop="none", buffer_mb=5.5 * frame_bytes / 2**20).start()
    first = source.get()
    time.sleep(0.5)  # a stalled consumer: the decoder fills the buffer, then waits
    ahead = source.stats()["decoded"] - source.stats()["delivered"]
    rest = list(iter(source.get, None))
    source.close()
    assert ahead == 6  # 5 whole frames fit in 5.5 frames' worth of bytes; a sixth waits for room
    assert first.index == 0 and [f.index for f in rest] == list(range(1, len(rest) + 1))


def test_capture_latest_frame_wins_reports_drops(clip):
    path, truth = clip
    source = VideoSource(str(path), drop="latest").start()
    got = []
    while (f := source.get()) is not None:
        got.append(f)
        time.sleep(0.02)  # a slow consumer: the decoder runs ahead
    source.close()
    stats = source.stats()
    assert stats["policy"] == "latest"
    assert stats["dropped"] > 0
    assert stats["delivered"] + stats["dropped"] == stats["decoded"] == len(truth.frames)
    idx = [f.index for f in got]
    assert idx == sorted(idx) and idx[-1] == len(truth.frames) - 1  # newest frames win


def test_capture_errors_are_clear(tmp_path):
    with pytest.raises(ValueError, match="cannot open"):
        list(VideoSource(str(tmp_path / "missing.mp4")))
    bad = tmp_path / "bad.mp4"
    bad.write_bytes(b"not a video" * 100)
    with pytest.raises(ValueError, match="cannot (open|decode)"):
        list(VideoSource(str(bad)))


def test_drop_policy_resolution():
    assert is_live_source("rtsp://cam/1") and is_live_source("http://host/live.m3u8")
    assert not is_live_source("/data/clip.mp4") and not is_live_source("file:///data/clip.mp4")
    assert resolve_policy("auto", "clip.mp4") == "none"
    assert resolve_policy("auto", "rtsp://x") == "latest"
    assert resolve_policy("auto", None, live=True) == "latest"
    assert resolve_policy("none", "rtsp://x") == "none"
    with pytest.raises(ValueError):
        resolve_policy("sometimes")
