"""annotate: draws the latest detections onto every video frame."""

from __future__ import annotations

import collections
from dataclasses import replace
from typing import Any, AsyncIterator, Literal

from pydantic import Field

from streamkit.frames import EventFrame, Frame, VideoFrame
from streamkit.stage import Stage, StageConfig, register_stage


@register_stage("annotate")
class Annotate(Stage):
    """Draws the latest detections onto every VideoFrame (source = this stage's name).

    Takes VideoFrames (from capture) and detections events (from detect) as two inputs.
    A frame is held until detections at or after its pts have arrived, or until
    `max_hold` frames are waiting (the latency bound; default 30 for live input, session
    param `live: true`, and 2000 otherwise, so a file run gets every box); boxes are those of
    the latest detections at or before the frame's pts, kept for `hold_s` seconds."""

    class Config(StageConfig):
        type: Literal["annotate"] = "annotate"
        max_hold: int | None = Field(default=None, ge=0, le=100_000)
        hold_s: float = Field(default=1.0, ge=0)
        labels: list[str] | None = None  # draw only these labels (default: all)

    def wants(self, frame: Frame) -> bool:
        return isinstance(frame, VideoFrame) or (isinstance(frame, EventFrame) and frame.name == "detections")

    async def start(self) -> None:
        self._frames: collections.deque[VideoFrame] = collections.deque()
        self._dets: collections.deque[tuple[float, list[dict[str, Any]]]] = collections.deque()
        self._latest_det_pts = float("-inf")
        live = bool(self.context.params.get("live"))
        self._max_hold = self.config.max_hold if self.config.max_hold is not None else (30 if live else 2000)

    async def process(self, frame: Frame) -> AsyncIterator[Frame]:
        if isinstance(frame, VideoFrame):
            self._frames.append(frame)
        else:
            assert isinstance(frame, EventFrame)
            pts = float(frame.data.get("pts", frame.pts))
            self._dets.append((pts, list(frame.data.get("objects", []))))
            self._latest_det_pts = max(self._latest_det_pts, pts)
        for out in self._release(force=False):
            yield out

    def _objects_for(self, pts: float) -> list[dict[str, Any]]:
        best: list[dict[str, Any]] = []
        found = None
        for det_pts, objects in self._dets:
            if det_pts <= pts + 1e-6:
                found, best = det_pts, objects
            else:
                break
        if found is None or pts - found > self.config.hold_s:
            return []
        if self.config.labels is not None:
            return [o for o in best if o["label"] in self.config.labels]
        return best

    def _release(self, force: bool) -> list[VideoFrame]:
        from streamkit.video.draw import draw_objects

        out = []
        while self._frames and (force or self._frames[0].pts <= self._latest_det_pts + 1e-6
                                or len(self._frames) > self._max_hold):
            frame = self._frames.popleft()
            image = draw_objects(frame.image, self._objects_for(frame.pts))
            out.append(replace(frame, image=image, source=self.name))
            # detections older than this frame's predecessor can go, keeping one at or before it
            while len(self._dets) > 1 and self._dets[1][0] <= frame.pts + 1e-6:
                self._dets.popleft()
        return out

    async def flush(self) -> AsyncIterator[Frame]:
        for out in self._release(force=True):
            yield out
