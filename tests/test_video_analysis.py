"""Sampling, detection and the video_analysis pipeline on video the tests make.

Synthetic clips (moving square and disc, scene cuts, and a real face photograph shipped by
scikit-image, when installed) are encoded to H.264 MP4 with PyAV and decoded back."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from streamkit.frames import EventFrame, VideoFrame
from streamkit.media import iter_video
from streamkit.pipeline import load_pipeline, parse_pipeline
from streamkit.runtime import Session
from streamkit.transport import MemoryTransport
from streamkit.video.detect_options import FaceOptions
from streamkit.video.detectors import HaarFaceDetector, HogPeopleDetector, MotionDetector, detect_all
from streamkit.video.scene import FixedRateSampler, SceneSampler
from streamkit.video.synthetic import face_image_path, make_clip

PIPELINE = Path(__file__).resolve().parents[1] / "pipelines" / "video_analysis.yaml"


def iou(a, b):
    ax, ay, aw, ah = a
    bx, by, bw, bh = b
    x0, y0, x1, y1 = max(ax, bx), max(ay, by), min(ax + aw, bx + bw), min(ay + ah, by + bh)
    inter = max(0, x1 - x0) * max(0, y1 - y0)
    return inter / float(aw * ah + bw * bh - inter)


def contains(outer, inner, slack=4):
    ox, oy, ow, oh = outer
    ix, iy, iw, ih = inner
    return ox - slack <= ix and oy - slack <= iy and ix + iw <= ox + ow + slack and iy + ih <= oy + oh + slack


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    path = tmp_path_factory.mktemp("video") / "shapes.mp4"
    truth = make_clip(path, width=640, height=360, fps=30, seconds=4.0, cuts=[1.5, 3.0])
    frames = list(iter_video(path))
    return path, truth, frames


def test_clip_decodes_with_pts(clip):
    _, truth, frames = clip
    assert len(frames) == len(truth.frames) == 120
    assert [f.pts for f in frames] == pytest.approx([t["pts"] for t in truth.frames], abs=1e-3)
    assert truth.cuts == [45, 90]


def test_fixed_rate_sampler_by_pts():
    s = FixedRateSampler(5)
    taken = [i for i in range(90) if s.take(i / 30)]
    assert taken == list(range(0, 90, 6))
    s = FixedRateSampler(5)  # a gap in the input restarts the grid instead of bursting
    taken = [p for p in [0.0, 0.2, 0.4, 3.0, 3.1, 3.2, 3.4] if s.take(p)]
    assert taken == [0.0, 0.2, 0.4, 3.0, 3.2, 3.4]


@pytest.mark.parametrize("method", ["hist", "diff"])
def test_scene_changes_where_the_cuts_are(clip, method):
    _, truth, frames = clip
    threshold = 0.35 if method == "hist" else 0.12
    sampler = SceneSampler(threshold=threshold, method=method)
    cuts = []
    for f in frames:
        sampler.take(f.pts, f.image)
        if sampler.last_was_cut:
            cuts.append(f.index)
    assert cuts == truth.cuts


def test_motion_boxes_cover_the_moving_shapes(clip):
    _, truth, frames = clip
    motion = MotionDetector()
    hits = checked = 0
    for i in range(0, 45, 6):  # within the first shot, 5 fps
        objs = motion.detect(frames[i].image)
        if i == 0:
            assert objs == []  # nothing to compare with yet
            continue
        for name in ("square", "disc"):
            checked += 1
            box = truth.frames[i]["boxes"][name]
            if any(contains(o["box"], box) for o in objs):
                hits += 1
        for o in objs:
            assert o["label"] == "motion" and 0 <= o["score"] <= 1
            x, y, w, h = o["box"]
            assert x >= 0 and y >= 0 and x + w <= 640 and y + h <= 360
    assert hits == checked


@pytest.mark.skipif(face_image_path() is None, reason="no face photograph installed (scikit-image ships one)")
def test_face_found_where_the_face_is(clip):
    _, truth, frames = clip
    face = HaarFaceDetector(width=640)
    region = truth.frames[0]["boxes"]["face_region"]
    for i in (0, 50, 100):  # every scene
        faces = [o for o in face.detect(frames[i].image) if o["label"] == "face"]
        assert len(faces) == 1, faces
        assert contains(region, faces[0]["box"]), (region, faces[0])
        assert faces[0]["box"][2] > region[2] * 0.4  # the face, not a speck inside it


@pytest.mark.skipif(face_image_path() is None, reason="no face photograph installed (scikit-image ships one)")
def test_boxes_are_in_source_pixels_whatever_the_detection_size(clip):
    _, _, frames = clip
    big = HaarFaceDetector(width=None).detect(frames[0].image)
    small = HaarFaceDetector(width=480).detect(frames[0].image)
    assert len(big) == len(small) == 1
    assert iou(big[0]["box"], small[0]["box"]) > 0.6
    # the same frame at twice the size: boxes scale with the source
    import cv2

    up = cv2.resize(frames[0].image, (1280, 720))
    up_faces = HaarFaceDetector(width=640).detect(up)
    assert len(up_faces) == 1
    assert iou([v / 2 for v in up_faces[0]["box"]], big[0]["box"]) > 0.6


def test_people_detector_runs_batched(clip):
    _, _, frames = clip
    det = HogPeopleDetector(width=320)
    batch = [frames[0].image, frames[6].image, frames[12].image]
    results = detect_all([det, MotionDetector()], batch)
    assert len(results) == 3
    for objs in results:
        for o in objs:
            assert o["label"] in ("person", "motion")
            assert set(o) == {"label", "box", "score"} and len(o["box"]) == 4


def _onnx_model(path, num_classes=2, size=64):
    """A tiny YOLOv8-shaped model: the same boxes for every image of the batch."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    anchors = 3
    table = np.zeros((1, 4 + num_classes, anchors), np.float32)
    # anchor 0: class 1 at centre (32, 32) of the 64x64 input, 16x16, score 0.9
    table[0, :4, 0] = [32, 32, 16, 16]
    table[0, 4 + 1, 0] = 0.9
    # anchor 1: class 0, weak (below threshold); anchor 2: overlaps anchor 0 (suppressed by NMS)
    table[0, :4, 1] = [10, 10, 8, 8]
    table[0, 4, 1] = 0.1
    table[0, :4, 2] = [33, 33, 16, 16]
    table[0, 4 + 1, 2] = 0.8
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["images"], ["m"], axes=[1, 2, 3], keepdims=1),
         helper.make_node("Reshape", ["m", "shape"], ["m3"]),
         helper.make_node("Mul", ["m3", "zero"], ["z"]),
         helper.make_node("Add", ["z", "table"], ["output0"])],
        "tiny_yolo",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 3, size, size])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, ["batch", 4 + num_classes, anchors])],
        initializer=[numpy_helper.from_array(table, "table"),
                     numpy_helper.from_array(np.array([-1, 1, 1], np.int64), "shape"),
                     numpy_helper.from_array(np.zeros((1,), np.float32), "zero")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_onnx_detector_by_path_maps_boxes_to_source(tmp_path):
    from streamkit.video.onnx_detector import OnnxDetector

    path = _onnx_model(tmp_path / "tiny.onnx")
    det = OnnxDetector(str(path), labels=["cat", "dog"])
    assert det.size == (64, 64)
    white = np.full((100, 200, 3), 255, np.uint8)  # letterboxed: scale 0.32, 16 px bands top/bottom
    results = det.detect_batch([white, white])
    assert len(results) == 2
    for objs in results:
        assert [o["label"] for o in objs] == ["dog"]
        # centre (32, 32) in the input is (100, 50) in the source; 16 px / 0.32 = 50 px
        assert objs[0]["box"] == [75, 25, 50, 50]
        assert objs[0]["score"] == pytest.approx(0.9)


def _spec(**changes):
    data = yaml.safe_load(PIPELINE.read_text())
    data["stages"] = [s for s in data["stages"] if s["type"] != "describe"]
    for s in data["stages"]:
        s.update(changes.get(s["name"], {}))
    data["output"] = [o for o in data["output"] if o != "describe"]
    return parse_pipeline(yaml.safe_dump(data))


def test_pipeline_yaml_validates():
    spec = load_pipeline(PIPELINE)
    assert [s.type for s in spec.stages] == ["video_capture", "sampler", "detect", "describe", "annotate"]
    assert spec.inputs_of["annotate"] == ["capture", "detect"]


async def test_pipeline_detections_and_annotated_frames(clip):
    _, truth, frames = clip
    spec = _spec()
    session = await Session.open(spec, MemoryTransport())
    out = await asyncio.wait_for(session.run_to_end(frames), 120)
    errors = [f.data for f in out if isinstance(f, EventFrame) and f.name == "error"]
    assert not errors
    dets = [f for f in out if isinstance(f, EventFrame) and f.name == "detections"]
    annotated = [f for f in out if isinstance(f, VideoFrame) and f.source == "annotate"]
    cuts = [f for f in out if isinstance(f, EventFrame) and f.name == "scene_change"]
    # 5 fps of a 4 s clip, pts kept exactly
    assert [d.data["pts"] for d in dets] == pytest.approx([i / 30 for i in range(0, 120, 6)], abs=1e-3)
    assert all(d.data["width"] == 640 and d.data["height"] == 360 for d in dets)
    assert [c.data["index"] for c in cuts] == truth.cuts
    # every input frame comes out annotated, in order, with its pts
    assert [f.pts for f in annotated] == pytest.approx([f.pts for f in frames], abs=1e-6)
    # boxes are drawn: the annotated frame differs from the source around a detection
    d = next(d for d in dets if d.data["objects"])
    frame_no = int(round(d.data["pts"] * 30))
    x, y, w, h = d.data["objects"][0]["box"]
    diff = np.abs(annotated[frame_no].image.astype(int) - frames[frame_no].image.astype(int))
    assert diff[max(0, y - 2):y + h + 2, max(0, x - 2):x + w + 2].sum() > 0
    # motion where the square is, mid-shot
    d = dets[3]
    square = truth.frames[18]["boxes"]["square"]
    assert any(o["label"] == "motion" and contains(o["box"], square) for o in d.data["objects"])
    # no motion reported across a cut: the detector restarts with the new scene
    at_cut = next(d for d in dets if abs(d.data["pts"] - 1.6) < 1e-3)
    assert not any(o["label"] == "motion" and o["box"][2] >= 600 for o in at_cut.data["objects"])


async def test_capture_latest_drops_backlog_and_reports():
    spec = parse_pipeline(yaml.safe_dump({
        "name": "cap", "input": {"video": {}},
        "stages": [{"name": "capture", "type": "video_capture", "drop": "latest", "max_lag_s": 0.2,
                    "report_interval_s": 0}],
        "output": ["capture"],
    }))
    session = await Session.open(spec, MemoryTransport(), params={"live": True})
    img = np.zeros((32, 32, 3), np.uint8)
    t0 = time.monotonic()
    frames = [VideoFrame(img, pts=0.0, index=0)]
    # frames 1..4 arrive a second late (a stalled network); 6 skips index 5 (dropped upstream)
    frames += [VideoFrame(img, pts=0.1 * i - 1.0, index=i) for i in range(1, 5)]
    frames += [VideoFrame(img, pts=time.monotonic() - t0 + 0.05, index=6)]
    out = await asyncio.wait_for(session.run_to_end(frames), 10)
    passed = [f.index for f in out if isinstance(f, VideoFrame)]
    reports = [f.data for f in out if isinstance(f, EventFrame) and f.name == "video_dropped"]
    assert passed[0] == 0 and 6 in passed
    assert reports and reports[-1]["total_dropped"] == 5
    assert reports[-1]["policy"] == "latest"
    assert sum(r["dropped"] for r in reports) == 5


@pytest.mark.parametrize("live", [True, False])
async def test_live_detections_leave_before_the_next_frame_arrives(clip, live):
    """Live input: a frame's detections go out as soon as they are done, not when the next
    sampled frame arrives to push them (which kept them a sample period, 200 ms, behind). File
    input keeps a batch in flight for throughput, so there they wait for the next frame or the end."""
    _, _, frames = clip
    spec = parse_pipeline(yaml.safe_dump({
        "name": "det", "input": {"video": {}},
        "stages": [{"name": "capture", "type": "video_capture", "drop": "none"},
                   {"name": "detect", "type": "detect", "detectors": ["motion"]}],
        "output": ["detect"],
    }))
    session = await Session.open(spec, MemoryTransport(), params={"live": live})

    async def next_detection():
        while True:
            out = await session.next_output()
            if isinstance(out, EventFrame) and out.name == "detections":
                return out

    first = frames[0]
    await session.push(VideoFrame(first.image, pts=first.pts, index=0))
    waiting = asyncio.ensure_future(next_detection())
    if live:
        assert (await asyncio.wait_for(waiting, 10)).pts == first.pts  # with no more input at all
    else:
        done, _ = await asyncio.wait({waiting}, timeout=1)
        assert not done  # held until more input or the end of the stream
        await session.end()
        assert (await asyncio.wait_for(waiting, 10)).pts == first.pts
    await session.close()


async def test_capture_none_policy_passes_everything():
    spec = parse_pipeline(yaml.safe_dump({
        "name": "cap", "input": {"video": {}},
        "stages": [{"name": "capture", "type": "video_capture"}], "output": ["capture"],
    }))
    session = await Session.open(spec, MemoryTransport())
    img = np.zeros((8, 8, 3), np.uint8)
    frames = [VideoFrame(img, pts=i / 30 - 5.0, index=i) for i in range(20)]  # "late" but a file
    out = await session.run_to_end(frames)
    assert [f.index for f in out if isinstance(f, VideoFrame)] == list(range(20))
    assert not [f for f in out if isinstance(f, EventFrame) and f.name == "video_dropped"]


async def test_capture_url_mode_streams_the_file(clip):
    path, truth, _ = clip
    spec = parse_pipeline(yaml.safe_dump({
        "name": "cap", "input": {"video": {}},
        "stages": [{"name": "capture", "type": "video_capture", "url": str(path)},
                   {"name": "sampler", "type": "sampler", "mode": "scene", "threshold": 0.35}],
        "output": ["sampler"],
    }))
    session = await Session.open(spec, MemoryTransport())
    out = await asyncio.wait_for(session.run_to_end([]), 60)
    taken = [f.index for f in out if isinstance(f, VideoFrame)]
    assert taken == [0] + truth.cuts  # scene mode: the first frame and each cut


def test_detect_config_errors_are_reported():
    from streamkit.pipeline import PipelineError

    text = yaml.safe_dump({"name": "x", "stages": [{"name": "d", "type": "detect", "detectors": ["onnx"]}]})
    with pytest.raises(PipelineError, match="onnx"):
        parse_pipeline(text)
    text = yaml.safe_dump({"name": "x", "stages": [{"name": "d", "type": "detect", "detectors": ["cars"]}]})
    with pytest.raises(PipelineError):
        parse_pipeline(text)


def test_merge_rects_and_dedupe():
    from streamkit.video.geometry import dedupe, merge_rects

    # overlapping, and merging costs no more than searching apart: one box
    assert merge_rects([(0, 0, 100, 100), (50, 0, 150, 100)]) == [(0, 0, 150, 100)]
    # touching at a corner only: the bounding box would be far bigger, so they stay apart
    assert sorted(merge_rects([(0, 0, 100, 100), (90, 90, 300, 300)])) == [(0, 0, 100, 100), (90, 90, 300, 300)]
    assert merge_rects([(0, 0, 10, 10), (40, 0, 50, 10)], gap=0) == [(0, 0, 10, 10), (40, 0, 50, 10)]
    objs = [{"label": "face", "box": [10, 10, 50, 50], "score": 0.6},
            {"label": "face", "box": [12, 11, 50, 50], "score": 0.8},
            {"label": "person", "box": [12, 11, 50, 50], "score": 0.7}]
    kept = dedupe(objs)
    assert [(o["label"], o["score"]) for o in kept] == [("face", 0.8), ("person", 0.7)]


@pytest.mark.skipif(face_image_path() is None, reason="no face photograph installed (scikit-image ships one)")
def test_face_search_in_regions_only(clip):
    _, truth, frames = clip
    face = HaarFaceDetector(width=640)
    region = truth.frames[0]["boxes"]["face_region"]
    x, y, w, h = region
    whole = face.detect(frames[0].image)
    inside = face.detect(frames[0].image, rois=[(x - 10, y - 10, x + w + 10, y + h + 10)])
    assert len(inside) == 1 and iou(inside[0]["box"], whole[0]["box"]) > 0.8
    # a region elsewhere finds nothing; a size limit that excludes the face finds nothing
    assert face.detect(frames[0].image, rois=[(0, 0, 200, 150)]) == []
    side = whole[0]["box"][2]
    assert face.detect(frames[0].image, rois=[(x - 10, y - 10, x + w + 10, y + h + 10)],
                       sizes=[(side * 2, side * 3)]) == []


def _moving_face_frames(n=12, enter_at=4):
    """A textured 640x360 scene; a face (held still for the first frames) and, from frame
    `enter_at`, a second face sliding in from the right edge."""
    import cv2

    from streamkit.video.synthetic import face_image

    rng = np.random.default_rng(1)
    bg = cv2.resize(rng.integers(40, 200, (23, 40, 3), dtype=np.uint8), (640, 360), interpolation=cv2.INTER_CUBIC)
    face = face_image(height=120)
    fh, fw = face.shape[:2]
    frames, truth = [], []
    for i in range(n):
        img = bg.copy()
        boxes = [[40, 200 - fh // 2 + 10, fw, fh]]
        img[boxes[0][1]:boxes[0][1] + fh, 40:40 + fw] = face
        if i >= enter_at:
            x = 640 - fw - 30 * (i - enter_at)  # 30 px a sample towards the left
            img[40:40 + fh, x:x + fw] = face
            boxes.append([x, 40, fw, fh])
        frames.append(img)
        truth.append(boxes)
    return frames, truth


@pytest.mark.skipif(face_image_path() is None, reason="no face photograph installed (scikit-image ships one)")
def test_region_tracking_keeps_face_recall():
    """Whole-frame search only on the first frame: the still face is followed in its region,
    the face that slides in is found in the motion region, exactly as whole-frame search
    finds them on every frame."""
    from streamkit.video.detectors import RegionTracker
    from streamkit.video.geometry import Pyramid

    frames, truth = _moving_face_frames()
    whole = HaarFaceDetector(width=640)
    tracked = RegionTracker(HaarFaceDetector(width=640), full_every=1000)
    motion = MotionDetector()
    for i, img in enumerate(frames):
        pyr = Pyramid(img)
        got = tracked.detect(pyr, motion.detect(pyr))
        ref = whole.detect(img)
        assert len(ref) == len(truth[i]), (i, ref)  # the reference finds every face
        assert len(got) == len(ref), (i, got, ref)
        for r in ref:
            assert any(iou(r["box"], g["box"]) > 0.6 for g in got), (i, r, got)
        for box in truth[i]:
            assert any(contains(box, g["box"], slack=12) for g in got), (i, box, got)
    # the still face is reported again without a search (11 later frames); the 8 frames where the
    # second face slides in are region searches; the 3 before it have nothing to search
    assert tracked.stats() == {"full": 1, "regions": 8, "skipped": 3, "held": 11}
    # without motion information every frame is a whole-frame search
    plain = RegionTracker(HaarFaceDetector(width=640), full_every=1000)
    for img in frames[:3]:
        plain.detect(img, None)
    assert plain.stats()["full"] == 3
    # a cut (reset) makes the next frame a whole-frame search again
    tracked.reset()
    tracked.detect(Pyramid(frames[0]), [])
    assert tracked.stats()["full"] == 2


@pytest.mark.skipif(face_image_path() is None, reason="no face photograph installed (scikit-image ships one)")
def test_held_face_is_searched_again_once_it_moves():
    """A face held without search while still is looked for again when it moves: it is reported
    where it went, and never at the place it left."""
    import cv2

    from streamkit.video.detectors import RegionTracker
    from streamkit.video.geometry import Pyramid
    from streamkit.video.synthetic import face_image

    rng = np.random.default_rng(2)
    bg = cv2.resize(rng.integers(40, 200, (23, 40, 3), dtype=np.uint8), (640, 360), interpolation=cv2.INTER_CUBIC)
    face = face_image(height=120)
    fh, fw = face.shape[:2]
    frames = []
    for x in (40, 40, 40, 300, 300):  # still for three frames, then it moves 260 px right
        img = bg.copy()
        img[120:120 + fh, x:x + fw] = face
        frames.append(img)
    tracked = RegionTracker(HaarFaceDetector(width=640), full_every=1000)
    motion = MotionDetector()
    boxes = [[o["box"] for o in tracked.detect(Pyramid(img), motion.detect(Pyramid(img)))] for img in frames]
    whole = HaarFaceDetector(width=640)
    before, after = whole.detect(frames[0])[0]["box"], whole.detect(frames[3])[0]["box"]
    assert boxes[1] == boxes[2] == [before]  # held
    for got in boxes[3:]:
        assert len(got) == 1 and iou(got[0], after) > 0.8, got
    # frame 3 searches where it moved; frame 4 holds it there and still searches once around the
    # place it left (looked for there for `memory` frames)
    assert tracked.stats() == {"full": 1, "regions": 2, "skipped": 2, "held": 3}


@pytest.mark.skipif(face_image_path() is None, reason="no face photograph installed (scikit-image ships one)")
async def test_pipeline_tracked_faces_match_whole_frame_search(clip):
    """The pipeline's face detections (region-tracked, whole frame every full_every) are the
    ones whole-frame search gives on every analysed frame of the test clip."""
    path, truth, frames = clip

    async def faces(full_every):
        spec = _spec(detect={"face": {"width": 640, "min_neighbors": 5, "full_every": full_every}})
        session = await Session.open(spec, MemoryTransport())
        out = await asyncio.wait_for(session.run_to_end(frames), 120)
        dets = [f for f in out if isinstance(f, EventFrame) and f.name == "detections"]
        stats = session.hosts["detect"].stage.stats()
        await session.close()
        return [[o["box"] for o in d.data["objects"] if o["label"] == "face"] for d in dets], stats

    tracked, stats = await faces(FaceOptions().full_every)
    whole, whole_stats = await faces(1)
    assert stats["face"]["regions"] > 0 and whole_stats["face"]["regions"] == 0
    assert len(tracked) == len(whole) == 20
    region = truth.frames[0]["boxes"]["face_region"]
    for t, w in zip(tracked, whole):
        assert len(t) == len(w) == 1, (t, w)
        assert iou(t[0], w[0]) > 0.8 and contains(region, t[0])
