"""A user's own ONNX detection model, by path. Reads YOLO-style outputs: YOLOv8/v11
`(batch, 4 + classes, anchors)`, YOLOv5/v7 `(batch, anchors, 5 + classes)`, or end-to-end
`(batch, n, 6)` rows of `x1, y1, x2, y2, score, class` (format="xyxy"). Inputs are letterboxed RGB
scaled to [0, 1]."""

from __future__ import annotations

import os
from typing import Any, Literal, Sequence

import numpy as np

from streamkit.video.detectors import Detector
from streamkit.video.geometry import Obj, clip_box, make_obj, source_image

COCO_LABELS = (
    "person bicycle car motorcycle airplane bus train truck boat traffic_light fire_hydrant stop_sign "
    "parking_meter bench bird cat dog horse sheep cow elephant bear zebra giraffe backpack umbrella handbag "
    "tie suitcase frisbee skis snowboard sports_ball kite baseball_bat baseball_glove skateboard surfboard "
    "tennis_racket bottle wine_glass cup fork knife spoon bowl banana apple sandwich orange broccoli carrot "
    "hot_dog pizza donut cake chair couch potted_plant bed dining_table toilet tv laptop mouse remote keyboard "
    "cell_phone microwave oven toaster sink refrigerator book clock vase scissors teddy_bear hair_drier toothbrush"
).split()
COCO_LABELS = [name.replace("_", " ") for name in COCO_LABELS]


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
        images = [source_image(im) for im in images]
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
        boxes = [list(clip_box(*b, width, height)) for b in zip(x, y, w, h)]
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
