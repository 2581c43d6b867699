"""Object detectors: faces (Haar cascade), people (HOG), motion regions, and any ONNX model.

Every detector takes a batch of full-size BGR images and returns, per image, a list of objects
`{"label": str, "box": [x, y, w, h], "score": float}` with boxes in *source* pixel coordinates
(each detector works on a downscaled copy and scales its boxes back).

    dets = [HaarFaceDetector(), HogPeopleDetector(), MotionDetector(),
            OnnxDetector("/models/yolov8n.onnx")]          # a user's own model, by path
    objects = detect_all(dets, [image1, image2])            # -> [[...], [...]]

The ONNX detector reads YOLO-style outputs: YOLOv8/v11 `(batch, 4 + classes, anchors)`,
YOLOv5/v7 `(batch, anchors, 5 + classes)`, or end-to-end `(batch, n, 6)` rows of
`x1, y1, x2, y2, score, class` (format="xyxy"). Inputs are letterboxed RGB scaled to [0, 1].
"""

from __future__ import annotations

import math
import os
import threading
from typing import Any, Literal, Sequence

import numpy as np

Obj = dict[str, Any]

COCO_LABELS = (
    "person bicycle car motorcycle airplane bus train truck boat traffic_light fire_hydrant stop_sign "
    "parking_meter bench bird cat dog horse sheep cow elephant bear zebra giraffe backpack umbrella handbag "
    "tie suitcase frisbee skis snowboard sports_ball kite baseball_bat baseball_glove skateboard surfboard "
    "tennis_racket bottle wine_glass cup fork knife spoon bowl banana apple sandwich orange broccoli carrot "
    "hot_dog pizza donut cake chair couch potted_plant bed dining_table toilet tv laptop mouse remote keyboard "
    "cell_phone microwave oven toaster sink refrigerator book clock vase scissors teddy_bear hair_drier toothbrush"
).split()
COCO_LABELS = [name.replace("_", " ") for name in COCO_LABELS]


def make_obj(label: str, box: Sequence[float], score: float) -> Obj:
    x, y, w, h = (int(round(float(v))) for v in box)
    return {"label": label, "box": [x, y, w, h], "score": round(float(score), 4)}


def _clip_box(x: float, y: float, w: float, h: float, width: int, height: int) -> tuple[float, float, float, float]:
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


def _downscale(image: "np.ndarray | Pyramid", width: int | None) -> tuple[np.ndarray, float]:
    """(resized image, factor from resized to source coordinates)."""
    pyramid = image if isinstance(image, Pyramid) else Pyramid(image)
    return pyramid.at(width)


def _source(image: "np.ndarray | Pyramid") -> np.ndarray:
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


def _scaled_rect(rect: Rect, k: float, width: int, height: int) -> Rect:
    """A source-pixel rectangle in the coordinates of a copy downscaled by 1/k (clipped)."""
    x0, y0, x1, y1 = rect
    return (max(0, int(x0 / k)), max(0, int(y0 / k)), min(width, int(math.ceil(x1 / k))), min(height, int(math.ceil(y1 / k))))


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

        small, k = _downscale(image, self.width)
        sh, sw = small.shape[:2]
        regions = [(0, 0, sw, sh)] if rois is None else [_scaled_rect(r, k, sw, sh) for r in rois]
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
        small, k = _downscale(image, self.width)
        sh, sw = small.shape[:2]
        if sh < 128 or sw < 64:
            return []
        regions = [(0, 0, sw, sh)] if rois is None else [
            _at_least(_scaled_rect(r, k, sw, sh), 64 + 2 * self.stride, 128 + 2 * self.stride, sw, sh) for r in rois]
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

        h, w = _source(image).shape[:2]
        small, k = _downscale(image, self.width)
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
            regions.append((bw * bh, make_obj("motion", _clip_box(x * k, y * k, bw * k, bh * k, w, h), changed)))
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
        h, w = _source(image).shape[:2]
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
                if age == 0 and not any(_rects_touch(around, m) for m in moved):
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
            still = [o for o in still if not any(_overlaps(o["box"], f["box"]) for f in objs)]
            self.held += len(still)
            objs = objs + still
        kept = [(o, age + 1) for o, age in self._recent if age + 1 < self.memory]
        kept = [(o, age) for o, age in kept if not any(_overlaps(o["box"], f["box"]) for f in objs)]
        self._recent = [(o, 0) for o in objs] + kept
        return objs

    def stats(self) -> dict[str, int]:
        """Whole-frame passes, region passes, frames with nothing to search, and still objects
        reported again without a search."""
        return {"full": self.full_scans, "regions": self.roi_scans, "skipped": self.skipped, "held": self.held}


def _rects_touch(a: Rect, b: Rect) -> bool:
    """(x0, y0, x1, y1) rectangles that overlap or share an edge."""
    return a[0] <= b[2] and b[0] <= a[2] and a[1] <= b[3] and b[1] <= a[3]


def _overlaps(a: Sequence[float], b: Sequence[float]) -> bool:
    return a[0] < b[0] + b[2] and b[0] < a[0] + a[2] and a[1] < b[1] + b[3] and b[1] < a[1] + a[3]


def letterbox(image: np.ndarray, size: tuple[int, int]) -> tuple[np.ndarray, float, float, float]:
    """Resize keeping aspect ratio and pad to (width, height) with gray 114.
    Returns (padded RGB image, ratio, pad_x, pad_y)."""
    import cv2

    tw, th = size
    h, w = image.shape[:2]
    r = min(tw / w, th / h)
    nw, nh = max(1, int(round(w * r))), max(1, int(round(h * r)))
    resized = cv2.resize(image, (nw, nh), interpolation=cv2.INTER_LINEAR)
    px, py = (tw - nw) // 2, (th - nh) // 2
    out = np.full((th, tw, 3), 114, dtype=np.uint8)
    out[py:py + nh, px:px + nw] = resized
    return cv2.cvtColor(out, cv2.COLOR_BGR2RGB), r, float(px), float(py)


class OnnxDetector(Detector):
    """A user's own detection model (a YOLO export, say) through onnxruntime, batched."""

    name = "onnx"

    def __init__(
        self,
        path: str,
        labels: list[str] | None = None,
        input_size: int | None = None,
        score_threshold: float = 0.35,
        iou_threshold: float = 0.45,
        format: Literal["auto", "yolov8", "yolov5", "xyxy"] = "auto",
        max_objects: int = 100,
        session: Any = None,
        threads: int = 0,
    ) -> None:
        if session is None:
            session = load_onnx_session(path, threads)
        self.session = session
        inp = session.get_inputs()[0]
        self.input_name = inp.name
        shape = list(inp.shape)
        if len(shape) != 4:
            raise ValueError(f"ONNX model {path}: expected an NCHW image input, got shape {shape}")
        fixed_h = shape[2] if isinstance(shape[2], int) and shape[2] > 0 else None
        fixed_w = shape[3] if isinstance(shape[3], int) and shape[3] > 0 else None
        self.size = (fixed_w or input_size or 640, fixed_h or input_size or 640)
        self.fixed_batch = shape[0] if isinstance(shape[0], int) and shape[0] > 0 else None
        self.fp16 = "float16" in inp.type
        self.labels = labels
        self.score_threshold, self.iou_threshold = score_threshold, iou_threshold
        self.format, self.max_objects = format, max_objects
        self.path = path

    def _label(self, cls: int) -> str:
        labels = self.labels if self.labels is not None else (COCO_LABELS if self._num_classes == 80 else None)
        if labels is not None and 0 <= cls < len(labels):
            return labels[cls]
        return f"class_{cls}"

    def detect_batch(self, images: Sequence[np.ndarray]) -> list[list[Obj]]:
        if not images:
            return []
        images = [_source(im) for im in images]
        prepared = [letterbox(im, self.size) for im in images]
        tensor = np.stack([p[0] for p in prepared]).transpose(0, 3, 1, 2).astype(np.float32) / 255.0
        if self.fp16:
            tensor = tensor.astype(np.float16)
        step = self.fixed_batch or len(images)
        outputs = []
        for i in range(0, len(images), step):
            chunk = tensor[i:i + step]
            if self.fixed_batch and len(chunk) < self.fixed_batch:
                pad = np.zeros((self.fixed_batch - len(chunk),) + chunk.shape[1:], chunk.dtype)
                out = self.session.run(None, {self.input_name: np.concatenate([chunk, pad])})[0][: len(chunk)]
            else:
                out = self.session.run(None, {self.input_name: chunk})[0]
            outputs.append(np.asarray(out, dtype=np.float32))
        raw = np.concatenate(outputs)
        return [self._decode(raw[b], prepared[b][1:], images[b].shape) for b in range(len(images))]

    def _decode(self, out: np.ndarray, letter: tuple[float, float, float], shape: tuple[int, ...]) -> list[Obj]:
        import cv2

        r, px, py = letter
        height, width = shape[:2]
        fmt = self.format
        if fmt == "auto":
            nc = len(self.labels) if self.labels else None
            if nc is not None and out.shape[0] == 4 + nc:
                fmt = "yolov8"
            elif nc is not None and out.shape[1] == 5 + nc:
                fmt = "yolov5"
            else:  # anchors outnumber channels in any real model
                fmt = "yolov8" if out.shape[0] < out.shape[1] else "yolov5"
        if fmt == "yolov8":
            rows = out.T  # (anchors, 4 + classes)
            cls_scores = rows[:, 4:]
            self._num_classes = cls_scores.shape[1]
            cls = cls_scores.argmax(axis=1)
            score = cls_scores[np.arange(len(rows)), cls]
            xywh = rows[:, :4]
        elif fmt == "yolov5":
            rows = out
            cls_scores = rows[:, 5:] if rows.shape[1] > 5 else np.ones((len(rows), 1), np.float32)
            self._num_classes = cls_scores.shape[1]
            cls = cls_scores.argmax(axis=1)
            score = rows[:, 4] * cls_scores[np.arange(len(rows)), cls]
            xywh = rows[:, :4]
        elif fmt == "xyxy":
            rows = out
            self._num_classes = int(rows[:, 5].max()) + 1 if len(rows) else 0
            score, cls = rows[:, 4], rows[:, 5].astype(int)
            xywh = np.stack([(rows[:, 0] + rows[:, 2]) / 2, (rows[:, 1] + rows[:, 3]) / 2,
                             rows[:, 2] - rows[:, 0], rows[:, 3] - rows[:, 1]], axis=1)
        else:
            raise ValueError(f"unknown ONNX output format {fmt!r}")
        keep = score >= self.score_threshold
        xywh, score, cls = xywh[keep], score[keep], cls[keep]
        if not len(score):
            return []
        # centre boxes in letterboxed input pixels -> corner boxes in source pixels
        x = (xywh[:, 0] - xywh[:, 2] / 2 - px) / r
        y = (xywh[:, 1] - xywh[:, 3] / 2 - py) / r
        w, h = xywh[:, 2] / r, xywh[:, 3] / r
        boxes = [list(_clip_box(*b, width, height)) for b in zip(x, y, w, h)]
        if fmt != "xyxy":
            idx = cv2.dnn.NMSBoxesBatched(boxes, score.tolist(), cls.tolist(), self.score_threshold, self.iou_threshold)
            order = np.asarray(idx, dtype=int).reshape(-1)
        else:
            order = np.argsort(-score)
        return [make_obj(self._label(int(cls[i])), boxes[i], float(score[i])) for i in order[: self.max_objects]]

    _num_classes = 0


def load_onnx_session(path: str, threads: int = 0) -> Any:
    import onnxruntime as ort

    if not os.path.exists(path):
        raise FileNotFoundError(f"ONNX model not found: {path}")
    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    return ort.InferenceSession(path, sess_options=options, providers=ort.get_available_providers())


def detect_all(detectors: Sequence[Detector], images: Sequence[np.ndarray]) -> list[list[Obj]]:
    """Run every detector over the batch; objects of all detectors per image, in order."""
    results: list[list[Obj]] = [[] for _ in images]
    if len(detectors) > 1:
        images = [Pyramid(im) if not isinstance(im, Pyramid) else im for im in images]
    for det in detectors:
        for i, objs in enumerate(det.detect_batch(images)):
            results[i].extend(objs)
    return results
