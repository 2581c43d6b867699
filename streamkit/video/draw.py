"""Draw detection boxes and labels onto BGR images."""

from __future__ import annotations

import zlib
from typing import Any, Iterable

import numpy as np

_FIXED = {"face": (0, 200, 255), "person": (60, 220, 60), "motion": (255, 160, 0)}


def label_color(label: str) -> tuple[int, int, int]:
    if label in _FIXED:
        return _FIXED[label]
    h = zlib.crc32(label.encode())
    return (64 + h % 192, 64 + (h >> 8) % 192, 64 + (h >> 16) % 192)


def draw_objects(image: np.ndarray, objects: Iterable[dict[str, Any]], copy: bool = True) -> np.ndarray:
    """Boxes ([x, y, w, h] in this image's pixels) with `label score` captions."""
    import cv2

    out = image.copy() if copy else image
    thick = max(1, int(round(out.shape[1] / 640)))
    scale = max(0.4, out.shape[1] / 1600)
    for obj in objects:
        x, y, w, h = (int(v) for v in obj["box"])
        color = label_color(str(obj.get("label", "")))
        cv2.rectangle(out, (x, y), (x + w, y + h), color, thick)
        caption = f"{obj.get('label', '')} {float(obj.get('score', 0.0)):.2f}"
        (tw, th), base = cv2.getTextSize(caption, cv2.FONT_HERSHEY_SIMPLEX, scale, 1)
        ty = y - 4 if y - th - 6 >= 0 else y + th + 4
        cv2.rectangle(out, (x, ty - th - 2), (x + tw + 2, ty + base - 2), color, -1)
        cv2.putText(out, caption, (x + 1, ty - 2), cv2.FONT_HERSHEY_SIMPLEX, scale, (0, 0, 0), 1, cv2.LINE_AA)
    return out
