"""Write VideoFrames to an H.264 MP4 with PyAV.

    with Mp4Writer("out/annotate.mp4", fps=30, width=1280, height=720) as w:
        for frame in frames:          # streamkit VideoFrame, uint8 BGR
            w.write(frame)
    # or w = Mp4Writer(...); w.write(f); ...; w.close()

Timestamps come from each frame's pts (seconds, relative to the first written frame), so a
stream with dropped or sampled frames keeps its timing; a pts that does not move forward is
bumped by one tick. Frames of another size are resized to the writer's size; odd sizes are
rounded down to even (yuv420p needs even dimensions).
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np

from streamkit.frames import VideoFrame

TIME_BASE = Fraction(1, 90000)


class Mp4Writer:
    def __init__(
        self,
        path: str | Path,
        fps: float,
        width: int,
        height: int,
        codec: str = "libx264",
        preset: str = "superfast",
        crf: int = 23,
        threads: int = 0,
        bitrate_kbps: int | None = None,
    ) -> None:
        import av

        if width < 2 or height < 2:
            raise ValueError(f"Mp4Writer: size {width}x{height} is too small")
        if not fps or fps <= 0:
            raise ValueError(f"Mp4Writer: fps must be positive, got {fps}")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fps = float(fps)
        self.width = int(width) - int(width) % 2
        self.height = int(height) - int(height) % 2
        self.frames_written = 0
        self._closed = False
        self._first_pts: float | None = None
        self._last_ticks = -1
        self._container = av.open(str(self.path), mode="w")
        try:
            rate = Fraction(self.fps).limit_denominator(1001)
            try:
                self._stream = self._container.add_stream(codec, rate=rate)
            except (ValueError, av.error.FFmpegError):
                self._stream = self._container.add_stream("mpeg4", rate=rate)  # no H.264 encoder
            self._stream.width = self.width
            self._stream.height = self.height
            self._stream.pix_fmt = "yuv420p"
            self._stream.time_base = TIME_BASE
            self._stream.codec_context.time_base = TIME_BASE
            if self._stream.codec_context.name == "libx264":
                if bitrate_kbps:  # a camera's rate control: average bitrate, VBV-capped at it
                    self._stream.bit_rate = int(bitrate_kbps) * 1000
                    self._stream.options = {
                        "preset": preset,
                        "x264-params": f"vbv-maxrate={int(bitrate_kbps)}:vbv-bufsize={int(bitrate_kbps)}",
                    }
                else:
                    self._stream.options = {"preset": preset, "crf": str(crf)}
            elif bitrate_kbps:
                self._stream.bit_rate = int(bitrate_kbps) * 1000
            if threads:
                self._stream.codec_context.thread_count = threads
            self._stream.thread_type = "AUTO"
        except Exception:
            self._container.close()
            raise

    def write(self, frame: VideoFrame | np.ndarray, pts: float | None = None) -> None:
        import av
        import cv2

        if self._closed:
            raise ValueError("Mp4Writer: write() after close()")
        image = frame.image if isinstance(frame, VideoFrame) else np.asarray(frame)
        if pts is None:
            pts = frame.pts if isinstance(frame, VideoFrame) else self.frames_written / self.fps
        if image.shape[1] != self.width or image.shape[0] != self.height:
            if image.shape[1] - image.shape[1] % 2 == self.width and image.shape[0] - image.shape[0] % 2 == self.height:
                image = image[: self.height, : self.width]
            else:
                image = cv2.resize(image, (self.width, self.height), interpolation=cv2.INTER_AREA)
        if self._first_pts is None:
            self._first_pts = pts
        ticks = int(round((pts - self._first_pts) / TIME_BASE))
        if ticks <= self._last_ticks:
            ticks = self._last_ticks + 1
        self._last_ticks = ticks
        av_frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="bgr24")
        av_frame.pts = ticks
        av_frame.time_base = TIME_BASE
        for packet in self._stream.encode(av_frame):
            self._container.mux(packet)
        self.frames_written += 1

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            for packet in self._stream.encode(None):
                self._container.mux(packet)
        finally:
            self._container.close()

    def __enter__(self) -> "Mp4Writer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
