"""What a client sends into its session: audio resampled to the pipeline's input format, and
video frames decoded newest-first (a frame replaced before it was decoded is dropped, counted)."""
from __future__ import annotations

import asyncio
import collections
import time
from typing import Any, Awaitable, Callable

from streamkit.audio import StreamResampler
from streamkit.frames import AudioFrame, VideoFrame
from streamkit.metrics import FRAMES_DROPPED
from streamkit.pipeline import PipelineSpec
from streamkit.runtime import Session
from streamkit.server import protocol
from streamkit.server.limits import Limits
from streamkit.server.telemetry import SERVER_DROPPED
from streamkit.video.jpeg import decode_jpeg


class SessionInput:
    def __init__(self, session: Session, spec: PipelineSpec, declared: protocol.AudioFormat | None, limits: Limits,
                 counters: collections.Counter[str], send_event: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
        self.session = session
        self.spec = spec
        self.limits = limits
        self.counters = counters
        self.send_event = send_event
        want = spec.input.audio
        self.format = declared or protocol.AudioFormat(want.sample_rate if want else 16000, want.channels if want else 1)
        self.resampler: StreamResampler | None = None
        if want is not None and (self.format.sample_rate, self.format.channels) != (want.sample_rate, want.channels):
            self.resampler = StreamResampler(want.sample_rate, want.channels)
        self.samples_in = 0
        self.video_slot: bytes | None = None
        self.video_event = asyncio.Event()
        self.video_index = 0
        self.video_busy = False
        self.started = time.monotonic()

    async def push_audio(self, pcm: bytes) -> None:
        fmt = self.format
        if self.spec.input.audio is None and self.spec.input.video is not None:
            raise protocol.ProtocolError("unexpected_audio", f"pipeline {self.spec.name!r} takes video, not audio")
        samples = protocol.pcm_to_array(pcm, fmt.channels)
        if samples.shape[0] == 0:
            return
        frame = AudioFrame(samples, fmt.sample_rate, fmt.channels, pts=self.samples_in / fmt.sample_rate)
        self.samples_in += samples.shape[0]
        self.counters["audio_in_msgs"] += 1
        self.counters["audio_in_samples"] += samples.shape[0]
        for f in self.resampler.process(frame) if self.resampler else [frame]:
            await self.session.push(f)

    def queue_video(self, jpeg: bytes) -> None:
        if self.spec.input.video is None and self.spec.input.audio is not None:
            raise protocol.ProtocolError("unexpected_video", f"pipeline {self.spec.name!r} takes audio, not video")
        width, height = protocol.jpeg_size(jpeg)
        if width * height > self.limits.max_video_pixels:
            raise protocol.ProtocolError(
                "bad_jpeg", f"JPEG of {width}x{height} exceeds the limit of {self.limits.max_video_pixels} pixels")
        self.counters["video_in"] += 1
        if self.video_slot is not None:
            self.counters["video_dropped"] += 1
            SERVER_DROPPED.inc(kind="video")
            FRAMES_DROPPED.inc(stage="server", kind="video")
        self.video_slot = jpeg
        self.video_event.set()

    async def video_loop(self) -> None:
        while True:
            await self.video_event.wait()
            self.video_event.clear()
            jpeg, self.video_slot = self.video_slot, None
            if jpeg is None:
                continue
            self.video_busy = True
            try:
                try:
                    image = await asyncio.to_thread(decode_jpeg, jpeg)
                except ValueError as exc:
                    await self.send_event(protocol.error("bad_jpeg", f"corrupt JPEG frame dropped: {exc}"))
                    continue
                frame = VideoFrame(image, pts=time.monotonic() - self.started, index=self.video_index)
                self.video_index += 1
                await self.session.push(frame)
            finally:
                self.video_busy = False

    async def flush(self) -> None:
        """Everything the client sent is in the pipeline (last video frame, resampler tail)."""
        for _ in range(200):
            if self.video_slot is None and not self.video_busy:
                break
            await asyncio.sleep(0.01)
        if self.resampler is not None:
            for f in self.resampler.flush():
                await self.session.push(f)
