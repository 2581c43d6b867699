"""video_capture: where video enters a pipeline, with an explicit drop policy (docs/video.md)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, AsyncIterator, Literal

from pydantic import Field

from streamkit.frames import Control, EventFrame, Frame, VideoFrame
from streamkit.metrics import FRAMES_DROPPED
from streamkit.stage import Stage, StageConfig, register_stage


@register_stage("video_capture")
class VideoCapture(Stage):
    """Where video enters a pipeline, with an explicit drop policy.

    Push mode (no `url`): passes the session's VideoFrames on. With policy `latest` a frame
    that reaches this stage more than `max_lag_s` behind the stream's clock is dropped, so
    when the stages behind fall behind, the queued backlog is skipped and the newest frame
    wins; `none` passes every frame (backpressure instead). Gaps in `index` (frames dropped
    before this stage) are counted as well.

    URL mode (`url:` a file or a stream FFmpeg opens): decodes it with PyAV in a thread
    (threaded decoding) and emits its frames, starting at the first input frame of any kind
    or at a FLUSH / end of input (a pipeline run with no input streams its URL at once).

    Policy `auto` is `latest` for live input (a network URL, or session params `live: true`,
    which the server sets) and `none` for files. Drops are reported as
    `EventFrame("video_dropped", {"dropped", "total_dropped", "frames", "policy", "reason", "pts"})`
    at most once per `report_interval_s`, and counted in the frames-dropped metric."""

    class Config(StageConfig):
        type: Literal["video_capture"] = "video_capture"
        url: str | None = None
        drop: Literal["auto", "none", "latest"] = "auto"
        threads: bool = True
        max_lag_s: float = Field(default=0.5, gt=0, le=60)
        resync_s: float = Field(default=3.0, gt=0, le=600)
        realtime: bool = False  # URL mode: pace a file at its frame rate, as a camera would
        report_interval_s: float = Field(default=1.0, ge=0, le=3600)

    accepts = (VideoFrame,)

    async def start(self) -> None:
        from streamkit.video.capture import resolve_policy

        live = self.context.params.get("live")
        self.policy = resolve_policy(self.config.drop, self.config.url, None if live is None else bool(live))
        self.frames = 0
        self.total_dropped = 0
        self._pending: dict[str, int] = {}
        self._last_report = 0.0
        self._last_index: int | None = None
        self._offset: float | None = None  # min(arrival - pts) seen: the stream's clock
        self._late_since: float | None = None
        self._streamed = False
        self._source = None
        self._last_pts = 0.0

    def wants(self, frame: Frame) -> bool:
        if self.config.url:
            return not self._streamed and not isinstance(frame, Control)
        return isinstance(frame, VideoFrame)

    # -------------------------------------------------------------- drop accounting
    def _drop(self, n: int, reason: str) -> None:
        if n <= 0:
            return
        self.total_dropped += n
        self._pending[reason] = self._pending.get(reason, 0) + n
        FRAMES_DROPPED.inc(n, stage=self.name, kind="video")

    def _report(self, pts: float, force: bool = False) -> EventFrame | None:
        if not self._pending:
            return None
        now = time.monotonic()
        if not force and now - self._last_report < self.config.report_interval_s:
            return None
        self._last_report = now
        pending, self._pending = self._pending, {}
        return EventFrame("video_dropped", {
            "pts": pts, "dropped": sum(pending.values()), "reasons": pending,
            "reason": max(pending, key=pending.get), "total_dropped": self.total_dropped,
            "frames": self.frames, "policy": self.policy,
        }, pts=pts)

    def _admit(self, frame: VideoFrame) -> bool:
        """Count the frame, note index gaps, apply the latest-frame-wins rule."""
        self.frames += 1
        self._last_pts = frame.pts
        if self._last_index is not None and frame.index > self._last_index + 1:
            self._drop(frame.index - self._last_index - 1, "gap")
        self._last_index = frame.index if self._last_index is None else max(self._last_index, frame.index)
        if self.policy != "latest":
            return True
        now = time.monotonic()
        delay = now - frame.pts
        if self._offset is None or delay < self._offset:
            self._offset = delay
        lag = delay - self._offset
        if lag <= self.config.max_lag_s:
            self._late_since = None
            return True
        if self._late_since is None:
            self._late_since = now
        elif now - self._late_since >= self.config.resync_s:
            # every frame late for a while: the source's delay grew (network); accept it
            self._offset, self._late_since = delay, None
            return True
        self._drop(1, "late")
        return False

    # -------------------------------------------------------------- frames
    async def process(self, frame: Frame) -> AsyncIterator[Frame]:
        if self.config.url:
            if not isinstance(frame, VideoFrame):
                yield frame
            async for out in self._stream_url():
                yield out
            return
        assert isinstance(frame, VideoFrame)
        if self._admit(frame):
            yield replace(frame, source=self.name)
        report = self._report(frame.pts)
        if report is not None:
            yield report

    async def _stream_url(self) -> AsyncIterator[Frame]:
        from streamkit.video.capture import VideoSource

        if self._streamed:
            return
        self._streamed = True
        source = self._source = VideoSource(
            self.config.url, drop=self.policy, threads=self.config.threads, realtime=self.config.realtime
        ).start()
        last_pts = 0.0
        reported_drops = 0
        try:
            while (frame := await source.aget()) is not None:
                last_pts = frame.pts
                if source.dropped > reported_drops:
                    self._drop(source.dropped - reported_drops, "latest")
                    reported_drops = source.dropped
                self.frames += 1
                yield replace(frame, source=self.name)
                report = self._report(frame.pts)
                if report is not None:
                    yield report
        finally:
            source.close()
        self._drop(source.dropped - reported_drops, "latest")
        report = self._report(last_pts, force=True)
        if report is not None:
            yield report

    async def flush(self) -> AsyncIterator[Frame]:
        if self.config.url and not self._streamed:
            async for out in self._stream_url():
                yield out
        report = self._report(self._last_pts, force=True)
        if report is not None:
            yield report

    async def stop(self) -> None:
        if getattr(self, "_source", None) is not None:
            self._source.close()

    def stats(self) -> dict[str, Any]:
        return {"frames": self.frames, "dropped": self.total_dropped, "policy": self.policy}
