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

    def at(self, width: int | None) -> tuple[np.ndarray, float]:
        import cv2

        h, w = self.image.shape[:2]
        if not width or w <= width:
            return self.image, 1.0
        small = self._cache.get(width)
        if small is None:
            larger = [k for k in self._cache if k > width]
            src = self._cache[min(larger)] if larger else self.image
            height = max(1, int(round(h * width / w)))
            small = self._cache[width] = cv2.resize(src, (width, height), interpolation=cv2.INTER_AREA)
        return small, w / width


def _downscale(image: "np.ndarray | Pyramid", width: int | None) -> tuple[np.ndarray, float]:
    """(resized image, factor from resized to source coordinates)."""
    pyramid = image if isinstance(image, Pyramid) else Pyramid(image)
    return pyramid.at(width)


def _source(image: "np.ndarray | Pyramid") -> np.ndarray:
    return image.image if isinstance(image, Pyramid) else image


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

    def detect(self, image: np.ndarray) -> list[Obj]:
        import cv2

        small, k = _downscale(image, self.width)
        gray = cv2.cvtColor(small, cv2.COLOR_BGR2GRAY)
        with self._lock:
            boxes, neighbors = self._cascade.detectMultiScale2(
                gray, scaleFactor=self.scale_factor, minNeighbors=self.min_neighbors,
                minSize=(self.min_size, self.min_size),
            )
        out = []
        for (x, y, w, h), n in zip(np.asarray(boxes).reshape(-1, 4), np.asarray(neighbors).reshape(-1)):
            score = float(n) / (float(n) + self.min_neighbors)
            out.append(make_obj("face", (x * k, y * k, w * k, h * k), score))
        return out


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

    def detect(self, image: np.ndarray) -> list[Obj]:
        small, k = _downscale(image, self.width)
        if small.shape[0] < 128 or small.shape[1] < 64:
            return []
        boxes, weights = self._hog.detectMultiScale(
            small, hitThreshold=self.hit_threshold, winStride=(self.stride, self.stride),
            padding=(8, 8), scale=self.scale,
        )
        out = []
        for (x, y, w, h), wt in zip(np.asarray(boxes).reshape(-1, 4), np.asarray(weights).reshape(-1)):
            score = 1.0 / (1.0 + math.exp(-2.0 * float(wt)))
            if score >= self.min_score:
                out.append(make_obj("person", (x * k, y * k, w * k, h * k), score))
        return out


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
        diff = cv2.absdiff(blurred, prev).max(axis=2)
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
