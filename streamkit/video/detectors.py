"""Object detectors: faces (Haar cascade), people (HOG), motion regions, and any ONNX model.

Every detector takes a batch of full-size BGR images and returns, per image, a list of objects
`{"label": str, "box": [x, y, w, h], "score": float}` with boxes in *source* pixel coordinates
(each detector works on a downscaled copy and scales its boxes back).

    dets = [HaarFaceDetector(), HogPeopleDetector(), MotionDetector(),
            OnnxDetector("/models/yolov8n.onnx")]          # a user's own model (onnx_detector.py)
    objects = detect_all(dets, [image1, image2])            # -> [[...], [...]]

Box and image helpers live in geometry.py.
"""

from __future__ import annotations

import math
import os
import threading
from typing import Any, Sequence

import numpy as np

from streamkit.video.geometry import (
    Obj,
    Pyramid,
    Rect,
    clip_box,
    dedupe,
    downscale,
    expand_box,
    make_obj,
    merge_rects,
    overlaps,
    rects_touch,
    scaled_rect,
    source_image,
)


class Detector:
    """Base class: subclasses implement detect() or, when batching helps, detect_batch()."""

    name = "detector"

    def detect(self, image: np.ndarray) -> list[Obj]:
        raise NotImplementedError

    def detect_batch(self, images: Sequence[np.ndarray]) -> list[list[Obj]]:
        return [self.detect(image) for image in images]

    def reset(self) -> None:
        """Forget state between streams (the motion detector's previous frame)."""


def _require_cv2_objdetect() -> Any:
    import cv2

    if not hasattr(cv2, "CascadeClassifier") or not hasattr(cv2, "HOGDescriptor"):
        raise RuntimeError(
            f"OpenCV {cv2.__version__} has no CascadeClassifier/HOGDescriptor (OpenCV 5 moved them out "
            "of the main package); install opencv-python-headless>=4.8,<5"
        )
    return cv2


class HaarFaceDetector(Detector):
    """Frontal faces with OpenCV's Haar cascade from cv2.data (or a cascade XML by path)."""

    name = "face"

    def __init__(
        self,
        width: int | None = 640,
        scale_factor: float = 1.15,
        min_neighbors: int = 5,
        min_size: int = 24,
        cascade: str = "haarcascade_frontalface_default.xml",
    ) -> None:
        cv2 = _require_cv2_objdetect()
        path = cascade if os.path.isabs(cascade) or os.path.exists(cascade) else os.path.join(cv2.data.haarcascades, cascade)
        if not os.path.exists(path):
            raise FileNotFoundError(f"Haar cascade not found: {path}")
        self._cascade = cv2.CascadeClassifier(path)
        if self._cascade.empty():
            raise ValueError(f"Haar cascade {path} could not be loaded")
        self._lock = threading.Lock()  # CascadeClassifier keeps per-call buffers
        self.width, self.scale_factor, self.min_neighbors, self.min_size = width, scale_factor, min_neighbors, min_size

    def detect(self, image: np.ndarray, rois: Sequence[Rect] | None = None,
               sizes: Sequence[tuple[float, float] | None] | None = None) -> list[Obj]:
        """Faces in the whole image, or only inside `rois` (source-pixel rectangles, searched
        at the same detection scale, so a face is found there as in a whole-frame pass);
        `sizes[i]`, when given, limits region i to faces of (min, max) source pixels."""
        import cv2

        small, k = downscale(image, self.width)
        sh, sw = small.shape[:2]
        regions = [(0, 0, sw, sh)] if rois is None else [scaled_rect(r, k, sw, sh) for r in rois]
        limits = list(sizes) if sizes is not None else [None] * len(regions)
        out = []
        for (x0, y0, x1, y1), limit in zip(regions, limits):
            lo, hi = self.min_size, 0
            if limit is not None:
                lo, hi = max(self.min_size, int(limit[0] / k)), int(math.ceil(limit[1] / k))
            if x1 - x0 < lo or y1 - y0 < lo:
                continue
            gray = cv2.cvtColor(small[y0:y1, x0:x1], cv2.COLOR_BGR2GRAY)
            with self._lock:
                boxes, neighbors = self._cascade.detectMultiScale2(
                    gray, scaleFactor=self.scale_factor, minNeighbors=self.min_neighbors,
                    minSize=(lo, lo), maxSize=(hi, hi),
                )
            for (x, y, w, h), n in zip(np.asarray(boxes).reshape(-1, 4), np.asarray(neighbors).reshape(-1)):
                score = float(n) / (float(n) + self.min_neighbors)
                out.append(make_obj("face", ((x + x0) * k, (y + y0) * k, w * k, h * k), score))
        return out if rois is None else dedupe(out)


class HogPeopleDetector(Detector):
    """Standing people with OpenCV's HOG + linear SVM people detector (64x128 window)."""

    name = "person"

    def __init__(self, width: int | None = 640, stride: int = 8, scale: float = 1.1, hit_threshold: float = 0.0,
                 min_score: float = 0.5) -> None:
        cv2 = _require_cv2_objdetect()
        self._hog = cv2.HOGDescriptor()
        self._hog.setSVMDetector(cv2.HOGDescriptor_getDefaultPeopleDetector())
        self.width, self.stride, self.scale = width, stride, scale
        self.hit_threshold, self.min_score = hit_threshold, min_score

    def detect(self, image: np.ndarray, rois: Sequence[Rect] | None = None, sizes: Any = None) -> list[Obj]:
        """People in the whole image, or only inside `rois` (source-pixel rectangles; each is
        widened to at least one 64x128 detection window at the detection scale)."""
        small, k = downscale(image, self.width)
        sh, sw = small.shape[:2]
        if sh < 128 or sw < 64:
            return []
        regions = [(0, 0, sw, sh)] if rois is None else [
            _at_least(scaled_rect(r, k, sw, sh), 64 + 2 * self.stride, 128 + 2 * self.stride, sw, sh) for r in rois]
        out = []
        for x0, y0, x1, y1 in merge_rects(regions) if rois is not None else regions:
            boxes, weights = self._hog.detectMultiScale(
                np.ascontiguousarray(small[y0:y1, x0:x1]), hitThreshold=self.hit_threshold,
                winStride=(self.stride, self.stride), padding=(8, 8), scale=self.scale,
            )
            for (x, y, w, h), wt in zip(np.asarray(boxes).reshape(-1, 4), np.asarray(weights).reshape(-1)):
                score = 1.0 / (1.0 + math.exp(-2.0 * float(wt)))
                if score >= self.min_score:
                    out.append(make_obj("person", ((x + x0) * k, (y + y0) * k, w * k, h * k), score))
        return out if rois is None else dedupe(out)


def _at_least(rect: Rect, min_w: int, min_h: int, width: int, height: int) -> Rect:
    """`rect` grown about its centre to at least min_w x min_h (kept inside the image)."""
    x0, y0, x1, y1 = rect
    if x1 - x0 < min_w:
        c = (x0 + x1) // 2
        x0 = max(0, min(c - min_w // 2, width - min_w))
        x1 = min(width, x0 + min_w)
    if y1 - y0 < min_h:
        c = (y0 + y1) // 2
        y0 = max(0, min(c - min_h // 2, height - min_h))
        y1 = min(height, y0 + min_h)
    return x0, y0, x1, y1


class MotionDetector(Detector):
    """Regions that changed since the previous image it was given (frame differencing).

    Works on a `width`-pixel copy, blurred; pixels whose largest channel difference exceeds
    `threshold` (0..255) are grouped into regions (dilated contours); regions smaller than `min_area`
    (a fraction of the frame) are ignored. score = changed fraction of the region."""

    name = "motion"

    def __init__(self, width: int = 320, threshold: int = 25, min_area: float = 0.002, max_regions: int = 8,
                 blur: int = 5) -> None:
        self.width, self.threshold, self.min_area = width, threshold, min_area
        self.max_regions, self.blur = max_regions, blur | 1
        self._prev: np.ndarray | None = None

    def reset(self) -> None:
        self._prev = None

    def detect(self, image: np.ndarray) -> list[Obj]:
        import cv2

        h, w = source_image(image).shape[:2]
        small, k = downscale(image, self.width)
        # colour, not gray: a red object on a background of the same brightness still moves
        blurred = cv2.GaussianBlur(small, (self.blur, self.blur), 0)
        prev, self._prev = self._prev, blurred
        if prev is None or prev.shape != blurred.shape:
            return []
        b, g, r = cv2.split(cv2.absdiff(blurred, prev))
        diff = cv2.max(cv2.max(b, g), r)  # largest channel difference (numpy's max(axis=2) is 15x slower)
        gray = diff
        _, mask = cv2.threshold(diff, self.threshold, 255, cv2.THRESH_BINARY)
        grown = cv2.dilate(mask, None, iterations=2)
        contours, _ = cv2.findContours(grown, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
        min_px = self.min_area * gray.shape[0] * gray.shape[1]
        regions = []
        for c in contours:
            x, y, bw, bh = cv2.boundingRect(c)
            if bw * bh < min_px:
                continue
            changed = float(np.count_nonzero(mask[y:y + bh, x:x + bw])) / float(bw * bh)
            regions.append((bw * bh, make_obj("motion", clip_box(x * k, y * k, bw * k, bh * k, w, h), changed)))
        regions.sort(key=lambda r: -r[0])
        return [obj for _, obj in regions[: self.max_regions]]


class RegionTracker:
    """Whole-frame detection every `full_every` analysed frames; in between, the detector
    searches only regions of interest: around what it found in the last `memory` frames and
    where something moved (the motion detector's regions of the same frame).

    What was found and has not moved since (no motion region touches the area around it) is
    still where it was: it is reported again without a search. Nothing changes in a region
    without its pixels changing, so this loses nothing that a region search would find, and a
    still face or person costs nothing between whole-frame passes.

    A new object shows up by moving into view (a motion region), by a scene cut (`reset()`,
    whose next frame is a whole-frame pass) or, if it appears without either, at the next
    whole-frame pass; objects already found are followed in their regions. When the regions
    cover more than `max_area` of the frame, or no motion information is given, the whole
    frame is searched. Order-dependent: give it frames in stream order."""

    def __init__(self, detector: Any, full_every: int = 10, margin: float = 0.3, motion_margin: float = 0.1,
                 pad: int = 8, memory: int = 3, max_area: float = 0.5) -> None:
        self.detector = detector
        self.name = detector.name
        self.full_every, self.margin, self.motion_margin = max(1, int(full_every)), margin, motion_margin
        self.pad, self.memory, self.max_area = pad, max(1, int(memory)), max_area
        self.full_scans = self.roi_scans = self.skipped = self.held = 0
        self.reset()

    def reset(self) -> None:
        self._since: int | None = None  # analysed frames since the last whole-frame pass
        self._recent: list[tuple[Obj, int]] = []  # (object found, frames since it was seen)

    def detect(self, image: "np.ndarray | Pyramid", motion: Sequence[Obj] | None = None) -> list[Obj]:
        h, w = source_image(image).shape[:2]
        full = motion is None or self.full_every <= 1 or self._since is None or self._since + 1 >= self.full_every
        rois: list[Rect] = []
        sizes: list[tuple[float, float] | None] = []
        still: list[Obj] = []
        if not full:
            moved = merge_rects([expand_box(o["box"], self.motion_margin, self.pad, w, h) for o in motion or ()],
                                gap=self.pad)
            for obj, age in self._recent:
                b = obj["box"]
                around = expand_box(b, self.margin, self.pad, w, h)
                if age == 0 and not any(rects_touch(around, m) for m in moved):
                    still.append(obj)  # seen last frame and nothing moved around it
                    continue
                # around what was found: objects of about the same size (it moves: a motion region)
                rois.append(around)
                side = max(b[2], b[3])
                sizes.append((side * 0.7, side * 1.45))
            rois += moved
            sizes += [None] * len(moved)
            full = sum((r[2] - r[0]) * (r[3] - r[1]) for r in rois) > self.max_area * w * h
        if full:
            objs = self.detector.detect(image)
            still = []
            self._since = 0
            self.full_scans += 1
        else:
            self._since = (self._since or 0) + 1
            if rois:
                objs = self.detector.detect(image, rois=rois, sizes=sizes)
                self.roi_scans += 1
            else:
                objs = []
                self.skipped += 1
            still = [o for o in still if not any(overlaps(o["box"], f["box"]) for f in objs)]
            self.held += len(still)
            objs = objs + still
        kept = [(o, age + 1) for o, age in self._recent if age + 1 < self.memory]
        kept = [(o, age) for o, age in kept if not any(overlaps(o["box"], f["box"]) for f in objs)]
        self._recent = [(o, 0) for o in objs] + kept
        return objs

    def stats(self) -> dict[str, int]:
        """Whole-frame passes, region passes, frames with nothing to search, and still objects
        reported again without a search."""
        return {"full": self.full_scans, "regions": self.roi_scans, "skipped": self.skipped, "held": self.held}


def detect_all(detectors: Sequence[Detector], images: Sequence[np.ndarray]) -> list[list[Obj]]:
    """Run every detector over the batch; objects of all detectors per image, in order."""
    results: list[list[Obj]] = [[] for _ in images]
    if len(detectors) > 1:
        images = [Pyramid(im) if not isinstance(im, Pyramid) else im for im in images]
    for det in detectors:
        for i, objs in enumerate(det.detect_batch(images)):
            results[i].extend(objs)
    return results
