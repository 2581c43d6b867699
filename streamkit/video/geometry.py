"""Boxes and images for the detectors: objects, rectangles, IoU, merging, an image pyramid."""

from __future__ import annotations

import math
import threading
from typing import Any, Sequence

import numpy as np

Obj = dict[str, Any]


def make_obj(label: str, box: Sequence[float], score: float) -> Obj:
    x, y, w, h = (int(round(float(v))) for v in box)
    return {"label": label, "box": [x, y, w, h], "score": round(float(score), 4)}


def clip_box(x: float, y: float, w: float, h: float, width: int, height: int) -> tuple[float, float, float, float]:
    x0, y0 = max(0.0, x), max(0.0, y)
    x1, y1 = min(float(width), x + w), min(float(height), y + h)
    return x0, y0, max(0.0, x1 - x0), max(0.0, y1 - y0)


class Pyramid:
    """One source image and its downscaled copies, made once and shared by the detectors
    (each smaller copy is made from the nearest larger one, which is much cheaper)."""

    def __init__(self, image: np.ndarray) -> None:
        self.image = image
        self._cache: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()  # detectors on several threads share one pyramid

    def at(self, width: int | None) -> tuple[np.ndarray, float]:
        h, w = self.image.shape[:2]
        if not width or w <= width:
            return self.image, 1.0
        small = self._cache.get(width)
        if small is None:
            with self._lock:
                return self._make(width)
        return small, w / width

    def _make(self, width: int) -> tuple[np.ndarray, float]:
        import cv2

        h, w = self.image.shape[:2]
        small = self._cache.get(width)
        if small is None:
            # from a level an integer multiple of this width if there is one (OpenCV's fast
            # box-filter path: 640 -> 320 costs 0.07 ms, 480 -> 320 0.5 ms), else the nearest
            # larger one; a fractional step under 2x is bilinear (5x cheaper than INTER_AREA
            # there, and with little to alias at that ratio)
            sources = {k: v for k, v in self._cache.items() if k > width}
            sources[w] = self.image
            whole = [k for k in sources if k % width == 0]
            src_w = min(whole) if whole else min(sources)
            height = max(1, int(round(h * width / w)))
            interp = cv2.INTER_AREA if src_w % width == 0 or src_w >= 2 * width else cv2.INTER_LINEAR
            small = self._cache[width] = cv2.resize(sources[src_w], (width, height), interpolation=interp)
        return small, w / width


def downscale(image: "np.ndarray | Pyramid", width: int | None) -> tuple[np.ndarray, float]:
    """(resized image, factor from resized to source coordinates)."""
    pyramid = image if isinstance(image, Pyramid) else Pyramid(image)
    return pyramid.at(width)


def source_image(image: "np.ndarray | Pyramid") -> np.ndarray:
    return image.image if isinstance(image, Pyramid) else image


Rect = tuple[int, int, int, int]  # x0, y0, x1, y1 (exclusive), source pixels


def expand_box(box: Sequence[float], margin: float, pad: int, width: int, height: int) -> Rect:
    """[x, y, w, h] grown by `margin` of its size plus `pad` pixels on every side, clipped."""
    x, y, w, h = (float(v) for v in box)
    dx, dy = w * margin + pad, h * margin + pad
    return (max(0, int(x - dx)), max(0, int(y - dy)),
            min(width, int(math.ceil(x + w + dx))), min(height, int(math.ceil(y + h + dy))))


def merge_rects(rects: Sequence[Rect], gap: int = 0) -> list[Rect]:
    """Overlapping rectangles (or within `gap` pixels) merged into their bounding box where that
    box is no bigger than the two searched apart; repeated until no pair merges. (Regions that
    stay apart may overlap a little: detections are deduplicated afterwards.)"""
    out = [r for r in rects if r[2] > r[0] and r[3] > r[1]]

    def area(r: Rect) -> int:
        return (r[2] - r[0]) * (r[3] - r[1])

    merged = True
    while merged and len(out) > 1:
        merged = False
        for i in range(len(out)):
            for j in range(i + 1, len(out)):
                a, b = out[i], out[j]
                if a[0] <= b[2] + gap and b[0] <= a[2] + gap and a[1] <= b[3] + gap and b[1] <= a[3] + gap:
                    box = (min(a[0], b[0]), min(a[1], b[1]), max(a[2], b[2]), max(a[3], b[3]))
                    if area(box) <= area(a) + area(b):
                        out[i] = box
                        del out[j]
                        merged = True
                        break
            if merged:
                break
    return out


def dedupe(objs: Sequence[Obj], iou: float = 0.3) -> list[Obj]:
    """Objects found twice (in two overlapping search regions): keep the higher score."""
    kept: list[Obj] = []
    for o in sorted(objs, key=lambda o: -o["score"]):
        if all(o["label"] != k["label"] or box_iou(o["box"], k["box"]) <= iou for k in kept):
            kept.append(o)
    return kept


def box_iou(a: Sequence[float], b: Sequence[float]) -> float:
    x0, y0 = max(a[0], b[0]), max(a[1], b[1])
    x1, y1 = min(a[0] + a[2], b[0] + b[2]), min(a[1] + a[3], b[1] + b[3])
    inter = max(0.0, x1 - x0) * max(0.0, y1 - y0)
    union = a[2] * a[3] + b[2] * b[3] - inter
    return inter / union if union > 0 else 0.0


def scaled_rect(rect: Rect, k: float, width: int, height: int) -> Rect:
    """A source-pixel rectangle in the coordinates of a copy downscaled by 1/k (clipped)."""
    x0, y0, x1, y1 = rect
    return (max(0, int(x0 / k)), max(0, int(y0 / k)), min(width, int(math.ceil(x1 / k))), min(height, int(math.ceil(y1 / k))))


def rects_touch(a: Rect, b: Rect) -> bool:
    """(x0, y0, x1, y1) rectangles that overlap or share an edge."""
    return a[0] <= b[2] and b[0] <= a[2] and a[1] <= b[3] and b[1] <= a[3]


def overlaps(a: Sequence[float], b: Sequence[float]) -> bool:
    return a[0] < b[0] + b[2] and b[0] < a[0] + a[2] and a[1] < b[1] + b[3] and b[1] < a[1] + a[3]
