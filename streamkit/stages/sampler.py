"""sampler: which frames are analysed: a fixed rate, or scene changes (docs/video.md)."""

from __future__ import annotations

from dataclasses import replace
from typing import AsyncIterator, Literal

from pydantic import Field

from streamkit.frames import EventFrame, Frame, VideoFrame
from streamkit.stage import Stage, StageConfig, register_stage


@register_stage("sampler")
class Sampler(Stage):
    """Passes on some VideoFrames: at a fixed rate (by pts), or at scene changes.

    Scene change score: `hist` (HSV histogram distance) or `diff` (mean frame difference),
    0..1 on a thumbnail; a cut is a score >= `threshold`. With `scene_events` each cut is
    also reported as `EventFrame("scene_change", {"pts", "index", "score"})`."""

    class Config(StageConfig):
        type: Literal["sampler"] = "sampler"
        mode: Literal["fixed", "scene"] = "fixed"
        fps: float = Field(default=5.0, gt=0, le=240)
        method: Literal["hist", "diff"] = "hist"
        threshold: float = Field(default=0.35, gt=0, le=1)
        min_gap_s: float = Field(default=0.5, ge=0)
        max_interval_s: float | None = Field(default=None, gt=0)
        scene_events: bool = True

    accepts = (VideoFrame,)

    async def start(self) -> None:
        from streamkit.video.scene import FixedRateSampler, SceneSampler

        c = self.config
        self._fixed = FixedRateSampler(c.fps) if c.mode == "fixed" else None
        need_scene = c.mode == "scene" or c.scene_events
        self._scene = SceneSampler(c.threshold, c.method, c.min_gap_s,
                                   c.max_interval_s if c.mode == "scene" else None) if need_scene else None
        self.taken = 0
        self.seen = 0

    async def process(self, frame: Frame) -> AsyncIterator[Frame]:
        assert isinstance(frame, VideoFrame)
        self.seen += 1
        take_scene = self._scene.take(frame.pts, frame.image) if self._scene is not None else False
        if self._scene is not None and self._scene.last_was_cut and self.config.scene_events:
            yield EventFrame("scene_change", {"pts": frame.pts, "index": frame.index,
                                              "score": round(self._scene.last_score, 4)}, pts=frame.pts)
        take = self._fixed.take(frame.pts) if self._fixed is not None else take_scene
        if take:
            self.taken += 1
            yield replace(frame, source=self.name)
