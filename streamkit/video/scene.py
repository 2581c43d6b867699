"""Frame sampling: a fixed rate, or on scene change.

    scorer = SceneScorer("hist")         # or "diff"
    score = scorer.score(image)          # 0 (same as the previous frame) .. 1 (nothing alike)

    sampler = FixedRateSampler(fps=5)    # by pts, so 30 fps in gives every 6th frame
    sampler.take(pts) -> bool

    sampler = SceneSampler(threshold=0.35, method="hist", min_gap_s=0.5)
    sampler.take(pts, image) -> bool     # True on the first frame and on each cut

Scores are computed on a small thumbnail (about 0.1 ms a 720p frame), so scoring every frame
costs little next to decoding it.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

Method = Literal["hist", "diff"]


def thumbnail(image: np.ndarray, width: int = 96) -> np.ndarray:
    """A small copy of a BGR image for cheap whole-frame statistics."""
    import cv2

    h, w = image.shape[:2]
    height = max(1, int(round(h * width / w)))
    # stride straight down to about the thumbnail's size, then area-resize the remainder: the
    # cost is the rows touched (every row of a frame is a few cache lines), so reading only
    # ~`height` rows makes this ~0.1 ms a 720p frame; the colour statistics it feeds (16x4x4
    # histograms, mean differences) do not need area averaging
    step = max(1, min(w // width, h // height))
    src = image[::step, ::step] if step > 1 else image
    return cv2.resize(src, (width, height), interpolation=cv2.INTER_AREA)


class SceneScorer:
    """How different each frame is from the one before it, in [0, 1].

    hist: Bhattacharyya distance between hue/saturation/value histograms (robust to motion
    within a shot, sensitive to a change of content or lighting). diff: mean absolute
    difference of colour thumbnails (sensitive to any change, including fast motion)."""

    def __init__(self, method: Method = "hist", width: int = 96) -> None:
        if method not in ("hist", "diff"):
            raise ValueError(f"scene method must be 'hist' or 'diff', got {method!r}")
        self.method = method
        self.width = width
        self._prev: np.ndarray | None = None

    def features(self, image: np.ndarray) -> np.ndarray:
        import cv2

        small = thumbnail(image, self.width)
        if self.method == "diff":
            return small.astype(np.float32)  # colour: a cut between equally bright scenes counts
        hsv = cv2.cvtColor(small, cv2.COLOR_BGR2HSV)
        hist = cv2.calcHist([hsv], [0, 1, 2], None, [16, 4, 4], [0, 180, 0, 256, 0, 256])
        return cv2.normalize(hist, None, alpha=1.0, norm_type=cv2.NORM_L1).flatten()

    def score(self, image: np.ndarray) -> float:
        import cv2

        feats = self.features(image)
        prev, self._prev = self._prev, feats
        if prev is None:
            return 1.0
        if self.method == "diff":
            return float(np.mean(np.abs(feats - prev)) / 255.0)
        return float(min(1.0, max(0.0, cv2.compareHist(prev, feats, cv2.HISTCMP_BHATTACHARYYA))))

    def reset(self) -> None:
        self._prev = None


class FixedRateSampler:
    """Takes frames at `fps` by presentation time (independent of the input frame rate)."""

    def __init__(self, fps: float) -> None:
        if fps <= 0:
            raise ValueError(f"sample fps must be positive, got {fps}")
        self.period = 1.0 / fps
        self._next: float | None = None

    def take(self, pts: float) -> bool:
        eps = 1e-6
        if self._next is None or pts + eps >= self._next:
            if self._next is None or pts - self._next > self.period:
                self._next = pts  # first frame, or a gap in the input: restart the grid here
            self._next += self.period
            return True
        return False


class SceneSampler:
    """Takes the first frame and every frame whose scene score reaches `threshold`.

    `min_gap_s` merges the several high-scoring frames of one cut (a fade or a partly
    decoded cut); `max_interval_s`, when set, also takes a frame if none was taken for
    that long, so detections stay fresh within a long shot."""

    def __init__(
        self,
        threshold: float = 0.35,
        method: Method = "hist",
        min_gap_s: float = 0.5,
        max_interval_s: float | None = None,
    ) -> None:
        self.scorer = SceneScorer(method)
        self.threshold = threshold
        self.min_gap_s = min_gap_s
        self.max_interval_s = max_interval_s
        self._last_taken: float | None = None
        self._last_cut: float | None = None
        self.last_score = 0.0
        self.last_was_cut = False

    def take(self, pts: float, image: np.ndarray) -> bool:
        score = self.scorer.score(image)
        self.last_score = score
        first = self._last_taken is None
        cut = not first and score >= self.threshold and (
            self._last_cut is None or pts - self._last_cut >= self.min_gap_s
        )
        self.last_was_cut = cut
        if cut:
            self._last_cut = pts
        stale = (
            not first
            and self.max_interval_s is not None
            and pts - self._last_taken >= self.max_interval_s
        )
        if first or cut or stale:
            self._last_taken = pts
            return True
        return False
