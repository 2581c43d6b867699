"""Video analysis stages: video_capture, sampler, detect, describe, annotate.

    capture (VideoFrames, drop policy) -> sampler (5 fps or scene cuts) -> detect -> describe
                                   \\-> annotate (+ detect's events) -> boxes drawn on every frame

The logic lives in streamkit/video/; these classes adapt it to the Stage API. cv2,
onnxruntime and av are imported inside functions (the registry imports this module).
"""

from __future__ import annotations

import asyncio
import collections
import time
from contextlib import aclosing
from dataclasses import replace
from typing import Any, AsyncIterator, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from streamkit.frames import Control, EventFrame, Frame, TextFrame, VideoFrame
from streamkit.metrics import FRAMES_DROPPED
from streamkit.stage import Stage, StageConfig, register_stage
from streamkit.stages.engine_client import make_engine


# ------------------------------------------------------------------ video_capture
@register_stage("video_capture")
class VideoCapture(Stage):
    """Where video enters a pipeline, with an explicit drop policy.

    Push mode (no `url`): passes the session's VideoFrames on. With policy `latest` a frame
    that reaches this stage more than `max_lag_s` behind the stream's clock is dropped, so
    when the stages behind fall behind, the queued backlog is skipped and the newest frame
    wins; `none` passes every frame (backpressure instead). Gaps in `index` (frames dropped
    before this stage) are counted as well.

    URL mode (`url:` a file or a stream FFmpeg opens): decodes it with PyAV in a thread
    (threaded decoding) and emits its frames, starting at the first input frame of any kind
    or at a FLUSH / end of input (a pipeline run with no input streams its URL at once).

    Policy `auto` is `latest` for live input (a network URL, or session params `live: true`,
    which the server sets) and `none` for files. Drops are reported as
    `EventFrame("video_dropped", {"dropped", "total_dropped", "frames", "policy", "reason", "pts"})`
    at most once per `report_interval_s`, and counted in the frames-dropped metric."""

    class Config(StageConfig):
        type: Literal["video_capture"] = "video_capture"
        url: str | None = None
        drop: Literal["auto", "none", "latest"] = "auto"
        threads: bool = True
        max_lag_s: float = Field(default=0.5, gt=0, le=60)
        resync_s: float = Field(default=3.0, gt=0, le=600)
        realtime: bool = False  # URL mode: pace a file at its frame rate, as a camera would
        report_interval_s: float = Field(default=1.0, ge=0, le=3600)

    accepts = (VideoFrame,)

    async def start(self) -> None:
        from streamkit.video.capture import resolve_policy

        live = self.context.params.get("live")
        self.policy = resolve_policy(self.config.drop, self.config.url, None if live is None else bool(live))
        self.frames = 0
        self.total_dropped = 0
        self._pending: dict[str, int] = {}
        self._last_report = 0.0
        self._last_index: int | None = None
        self._offset: float | None = None  # min(arrival - pts) seen: the stream's clock
        self._late_since: float | None = None
        self._streamed = False
        self._source = None
        self._last_pts = 0.0

    def wants(self, frame: Frame) -> bool:
        if self.config.url:
            return not self._streamed and not isinstance(frame, Control)
        return isinstance(frame, VideoFrame)

    # -------------------------------------------------------------- drop accounting
    def _drop(self, n: int, reason: str) -> None:
        if n <= 0:
            return
        self.total_dropped += n
        self._pending[reason] = self._pending.get(reason, 0) + n
        FRAMES_DROPPED.inc(n, stage=self.name, kind="video")

    def _report(self, pts: float, force: bool = False) -> EventFrame | None:
        if not self._pending:
            return None
        now = time.monotonic()
        if not force and now - self._last_report < self.config.report_interval_s:
            return None
        self._last_report = now
        pending, self._pending = self._pending, {}
        return EventFrame("video_dropped", {
            "pts": pts, "dropped": sum(pending.values()), "reasons": pending,
            "reason": max(pending, key=pending.get), "total_dropped": self.total_dropped,
            "frames": self.frames, "policy": self.policy,
        }, pts=pts)

    def _admit(self, frame: VideoFrame) -> bool:
        """Count the frame, note index gaps, apply the latest-frame-wins rule."""
        self.frames += 1
        self._last_pts = frame.pts
        if self._last_index is not None and frame.index > self._last_index + 1:
            self._drop(frame.index - self._last_index - 1, "gap")
        self._last_index = frame.index if self._last_index is None else max(self._last_index, frame.index)
        if self.policy != "latest":
            return True
        now = time.monotonic()
        delay = now - frame.pts
        if self._offset is None or delay < self._offset:
            self._offset = delay
        lag = delay - self._offset
        if lag <= self.config.max_lag_s:
            self._late_since = None
            return True
        if self._late_since is None:
            self._late_since = now
        elif now - self._late_since >= self.config.resync_s:
            # every frame late for a while: the source's delay grew (network); accept it
            self._offset, self._late_since = delay, None
            return True
        self._drop(1, "late")
        return False

    # -------------------------------------------------------------- frames
    async def process(self, frame: Frame) -> AsyncIterator[Frame]:
        if self.config.url:
            if not isinstance(frame, VideoFrame):
                yield frame
            async for out in self._stream_url():
                yield out
            return
        assert isinstance(frame, VideoFrame)
        if self._admit(frame):
            yield replace(frame, source=self.name)
        report = self._report(frame.pts)
        if report is not None:
            yield report

    async def _stream_url(self) -> AsyncIterator[Frame]:
        from streamkit.video.capture import VideoSource

        if self._streamed:
            return
        self._streamed = True
        source = self._source = VideoSource(
            self.config.url, drop=self.policy, threads=self.config.threads, realtime=self.config.realtime
        ).start()
        last_pts = 0.0
        reported_drops = 0
        try:
            while (frame := await source.aget()) is not None:
                last_pts = frame.pts
                if source.dropped > reported_drops:
                    self._drop(source.dropped - reported_drops, "latest")
                    reported_drops = source.dropped
                self.frames += 1
                yield replace(frame, source=self.name)
                report = self._report(frame.pts)
                if report is not None:
                    yield report
        finally:
            source.close()
        self._drop(source.dropped - reported_drops, "latest")
        report = self._report(last_pts, force=True)
        if report is not None:
            yield report

    async def flush(self) -> AsyncIterator[Frame]:
        if self.config.url and not self._streamed:
            async for out in self._stream_url():
                yield out
        report = self._report(self._last_pts, force=True)
        if report is not None:
            yield report

    async def stop(self) -> None:
        if getattr(self, "_source", None) is not None:
            self._source.close()

    def stats(self) -> dict[str, Any]:
        return {"frames": self.frames, "dropped": self.total_dropped, "policy": self.policy}


# ------------------------------------------------------------------ sampler
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


# ------------------------------------------------------------------ detect
class FaceOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    width: int | None = Field(default=640, ge=64)
    scale_factor: float = Field(default=1.15, gt=1.0, le=2.0)
    min_neighbors: int = Field(default=5, ge=0)
    min_size: int = Field(default=24, ge=8)
    cascade: str = "haarcascade_frontalface_default.xml"
    # with motion among the detectors: a whole-frame pass every `full_every` analysed frames
    # (5 s at 5 fps; a Haar pass over a textured 720p frame costs ~55 ms of CPU) and after each
    # scene cut, in between only around recent faces and motion regions (1 = always the whole frame)
    full_every: int = Field(default=25, ge=1, le=10_000)


class PersonOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    width: int | None = Field(default=640, ge=64)
    stride: int = Field(default=8, ge=4, le=64)
    scale: float = Field(default=1.1, gt=1.0, le=2.0)
    hit_threshold: float = 0.0
    min_score: float = Field(default=0.5, ge=0, le=1)
    full_every: int = Field(default=25, ge=1, le=10_000)  # as for faces


class MotionOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    width: int = Field(default=320, ge=32)
    threshold: int = Field(default=25, ge=1, le=255)
    min_area: float = Field(default=0.002, ge=0, le=1)
    max_regions: int = Field(default=8, ge=1)


class OnnxOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str
    labels: list[str] | None = None
    input_size: int | None = Field(default=None, ge=32)
    score_threshold: float = Field(default=0.35, ge=0, le=1)
    iou_threshold: float = Field(default=0.45, ge=0, le=1)
    format: Literal["auto", "yolov8", "yolov5", "xyxy"] = "auto"
    threads: int = Field(default=0, ge=0)


@register_stage("detect")
class Detect(Stage):
    """Faces (Haar), people (HOG), motion regions, and/or a user's ONNX model, in batches.

    Emits, for every VideoFrame it receives, `EventFrame("detections", {"pts", "objects":
    [{"label", "box": [x, y, w, h], "score"}], "width", "height"})` in source pixels.
    Frames are grouped into batches of `batch_size` (a batch also closes when its first
    frame is `max_batch_delay_s` older than the newest); detection runs in worker threads
    (OpenCV and onnxruntime release the GIL), so decoding goes on meanwhile. With `motion`
    among the detectors, faces and people are region-tracked: the whole frame every
    `full_every` analysed frames and after each scene cut, otherwise only around recent
    finds and this frame's motion regions (see streamkit.video.detectors.RegionTracker)."""

    class Config(StageConfig):
        type: Literal["detect"] = "detect"
        detectors: list[Literal["face", "person", "motion", "onnx"]] = Field(
            default_factory=lambda: ["face", "person", "motion"], min_length=1)
        face: FaceOptions = Field(default_factory=FaceOptions)
        person: PersonOptions = Field(default_factory=PersonOptions)
        motion: MotionOptions = Field(default_factory=MotionOptions)
        onnx: OnnxOptions | None = None
        batch_size: int = Field(default=1, ge=1, le=64)
        max_batch_delay_s: float = Field(default=0.5, ge=0)
        workers: int = Field(default=2, ge=1, le=64)  # batches detected at once (threads)
        # keep up to workers - 1 batches in flight while the next frames arrive: the most frames per
        # second, but a batch's detections then leave with the next frame's arrival (a sample period
        # later, 200 ms at 5 fps). None: off for live input (session param live: true), on otherwise
        overlap: bool | None = None
        cv_threads: int | None = Field(default=None, ge=0, le=64)

        @model_validator(mode="after")
        def _onnx_needs_path(self):
            if "onnx" in self.detectors and self.onnx is None:
                raise ValueError("detector 'onnx' needs an `onnx: {path: model.onnx}` section")
            return self

    FORWARDED = ("video_dropped", "scene_change")

    def wants(self, frame: Frame) -> bool:
        # upstream analysis events are re-emitted by this stage so they reach the session output
        return isinstance(frame, VideoFrame) or (isinstance(frame, EventFrame) and frame.name in self.FORWARDED)

    async def start(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        from streamkit.video.detectors import MotionDetector, RegionTracker

        self._batch: list[VideoFrame] = []
        self._pending: collections.deque[tuple[list[VideoFrame], Any]] = collections.deque()
        self.detectors = await asyncio.to_thread(self._build)
        c = self.config
        overlap = c.overlap if c.overlap is not None else not self.context.params.get("live")
        self._in_flight = c.workers - 1 if overlap else 0  # batches left running when process() returns
        # motion (it compares with the previous analysed frame) runs on its own FIFO thread;
        # faces and people are region-tracked (order-dependent too), each on its own FIFO
        # thread, so the two run at the same time, after the same frame's motion; stateless
        # detectors (onnx) run on `workers` threads, batches in parallel
        self._motion = next((d for d in self.detectors if isinstance(d, MotionDetector)), None)
        self._tracked: dict[str, Any] = {}
        self._parallel: list[Any] = []
        for kind, det in zip(c.detectors, self.detectors):
            if kind in ("face", "person"):
                self._tracked[kind] = RegionTracker(det, full_every=getattr(c, kind).full_every)
            elif kind == "onnx":
                self._parallel.append(det)
        widths = [w for w in (c.face.width if "face" in c.detectors else None,
                              c.person.width if "person" in c.detectors else None,
                              c.motion.width if "motion" in c.detectors else None) if w]
        self._widths = sorted(set(widths), reverse=True)  # pyramid levels, largest first
        prefix = f"detect-{self.name}"
        self._pool = ThreadPoolExecutor(c.workers, thread_name_prefix=prefix)
        self._serial = ThreadPoolExecutor(1, thread_name_prefix=f"{prefix}-motion")
        self._track_exec = {k: ThreadPoolExecutor(1, thread_name_prefix=f"{prefix}-{k}") for k in self._tracked}

    def _build(self) -> list[Any]:
        from streamkit.resources import shared
        from streamkit.video import detectors as d

        c = self.config
        if c.cv_threads is not None:
            import cv2

            cv2.setNumThreads(c.cv_threads)
        built: list[Any] = []
        for kind in c.detectors:
            if kind == "face":
                built.append(d.HaarFaceDetector(**c.face.model_dump(exclude={"full_every"})))
            elif kind == "person":
                built.append(d.HogPeopleDetector(**c.person.model_dump(exclude={"full_every"})))
            elif kind == "motion":
                built.append(d.MotionDetector(**c.motion.model_dump()))
            elif kind == "onnx":
                o = c.onnx.model_dump()
                session = shared(("onnx", o["path"], o["threads"]), lambda: d.load_onnx_session(o["path"], o["threads"]))
                built.append(d.OnnxDetector(session=session, **o))
        return built

    async def process(self, frame: Frame) -> AsyncIterator[Frame]:
        if isinstance(frame, EventFrame):
            if frame.name == "scene_change":
                # a cut is not motion: what came before is compared with the old scene, then reset
                # (and the trackers search the whole of the new scene's first frame)
                self._submit()
                async for out in self._drain(0):
                    yield out
                for det in self.detectors:
                    det.reset()
                for tracker in self._tracked.values():
                    tracker.reset()
            yield replace(frame, data={**frame.data, "stage": frame.data.get("stage", frame.source)})
            return
        assert isinstance(frame, VideoFrame)
        self._batch.append(frame)
        if len(self._batch) >= self.config.batch_size or frame.pts - self._batch[0].pts >= self.config.max_batch_delay_s:
            self._submit()
        async for out in self._drain(self._in_flight):
            yield out

    def _motion_job(self, images: list[Any]) -> list[list[dict[str, Any]]]:
        for im in images:  # downscaled copies, each from the next larger one
            for w in self._widths:
                im.at(w)
        return [self._motion.detect(im) for im in images]

    @staticmethod
    def _tracked_job(tracker: Any, images: list[Any], motion: Any) -> list[list[dict[str, Any]]]:
        regions = motion.result() if motion is not None else [None] * len(images)
        return [tracker.detect(im, regions[i]) for i, im in enumerate(images)]

    def _submit(self) -> None:
        from streamkit.video.detectors import Pyramid, detect_all

        batch, self._batch = self._batch, []
        if not batch:
            return
        images = [Pyramid(f.image) for f in batch]
        jobs: dict[str, Any] = {}
        motion = self._serial.submit(self._motion_job, images) if self._motion is not None else None
        if motion is not None:
            jobs["motion"] = motion
        for kind, tracker in self._tracked.items():
            jobs[kind] = self._track_exec[kind].submit(self._tracked_job, tracker, images, motion)
        if self._parallel:
            jobs["onnx"] = self._pool.submit(detect_all, self._parallel, images)
        order = [k for k in dict.fromkeys(self.config.detectors) if k in jobs]
        futures = [asyncio.wrap_future(jobs[k]) for k in order]
        self._pending.append((batch, asyncio.gather(*futures)))

    async def _drain(self, keep: int) -> AsyncIterator[Frame]:
        """Emit finished batches in order; wait while more than `keep` are in flight."""
        while self._pending and (len(self._pending) > keep or self._pending[0][1].done()):
            batch, job = self._pending[0]
            parts = await job
            self._pending.popleft()
            for i, frame in enumerate(batch):
                objects = [o for part in parts for o in part[i]]
                yield EventFrame("detections", {"pts": frame.pts, "objects": objects,
                                                "width": frame.width, "height": frame.height}, pts=frame.pts)

    def stats(self) -> dict[str, Any]:
        return {kind: t.stats() for kind, t in getattr(self, "_tracked", {}).items()}

    async def flush(self) -> AsyncIterator[Frame]:
        self._submit()
        async for out in self._drain(0):
            yield out

    async def interrupt(self) -> None:
        self._batch = []
        self._pending.clear()

    async def stop(self) -> None:
        pools = [getattr(self, "_pool", None), getattr(self, "_serial", None), *getattr(self, "_track_exec", {}).values()]
        for pool in pools:
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)


# ------------------------------------------------------------------ describe
DEFAULT_SYSTEM = "You describe what a video camera sees. Answer with one short, plain sentence."
DEFAULT_PROMPT = (
    "Detections from a camera over the last {window:g} seconds: {summary}\n"
    "In one short sentence, describe what is happening."
)


def _where(box: list[int], width: int) -> str:
    cx = box[0] + box[2] / 2
    return "left" if cx < width / 3 else ("right" if cx > 2 * width / 3 else "center")


def summarize(events: list[dict[str, Any]], cuts: int = 0) -> str:
    """Plain-language facts from detections events (what the LLM turns into a sentence)."""
    if not events:
        return "nothing was analysed."
    most: dict[str, int] = {}
    places: dict[str, collections.Counter] = {}
    frames_with: collections.Counter = collections.Counter()
    for ev in events:
        counts = collections.Counter(o["label"] for o in ev["objects"])
        for label, n in counts.items():
            most[label] = max(most.get(label, 0), n)
            frames_with[label] += 1
        for o in ev["objects"]:
            places.setdefault(o["label"], collections.Counter())[_where(o["box"], ev.get("width") or 1)] += 1
    parts = []
    for label in sorted(most, key=lambda k: (k == "motion", -frames_with[k])):
        where = ", ".join(p for p, _ in places[label].most_common(2))
        share = frames_with[label] / len(events)
        how_often = "all the time" if share > 0.8 else ("often" if share > 0.4 else "briefly")
        if label == "motion":
            parts.append(f"movement on the {where} side, {how_often}")
        else:
            noun = label if most[label] == 1 else (label + "s" if not label.endswith("s") else label)
            if label == "person" and most[label] > 1:
                noun = "people"
            parts.append(f"up to {most[label]} {noun} ({where}), seen {how_often}")
    text = "; ".join(parts) if parts else "no faces, people or movement"
    if cuts:
        text += f"; {cuts} scene cut{'s' if cuts > 1 else ''}"
    return text + "."


def first_sentence(text: str, limit: int = 200) -> str:
    text = " ".join(text.replace("\n", " ").split()).strip().strip('"').strip()
    for end in (". ", "! ", "? "):
        i = text.find(end)
        if 0 < i < limit:
            return text[: i + 1]
    return text[:limit].rstrip()


@register_stage("describe")
class Describe(Stage):
    """Turns the last `window_s` seconds of detections into one short sentence with the
    shared LLM engine, at most once per `interval_s` of stream time. Streams TextFrames
    (final=False pieces as tokens arrive, then one final=True sentence)."""

    class Config(StageConfig):
        type: Literal["describe"] = "describe"
        interval_s: float = Field(default=5.0, gt=0)
        window_s: float = Field(default=5.0, gt=0)
        max_tokens: int = Field(default=32, ge=1, le=512)
        temperature: float = Field(default=0.0, ge=0, le=2)
        prompt: str = DEFAULT_PROMPT
        system: str = DEFAULT_SYSTEM
        model: str | None = None  # GGUF path; default: the shared engine's model
        device: str | None = None
        engine: str = "local"  # local | redis://host:port/db (engine workers), as for the llm stage
        engine_prefix: str | None = None
        stream: bool = True
        skip_unchanged: bool = True  # no new sentence while the summary stays the same

    interruptible = True  # long generation per frame: cancelled at once on INTERRUPT

    def wants(self, frame: Frame) -> bool:
        return isinstance(frame, EventFrame) and frame.name in ("detections", "scene_change")

    async def start(self) -> None:
        from streamkit.engine import SamplingParams

        c = self.config
        self._engine = make_engine(c.engine, c.model, c.device, c.engine_prefix)
        self._params = SamplingParams(max_tokens=self.config.max_tokens, temperature=self.config.temperature,
                                      stop=["\n"])
        self._window: collections.deque[dict[str, Any]] = collections.deque()
        self._cuts: collections.deque[float] = collections.deque()
        self._last_time: float | None = None
        self._last_summary: str | None = None
        self.sentences: list[str] = []

    async def process(self, frame: Frame) -> AsyncIterator[Frame]:
        assert isinstance(frame, EventFrame)
        pts = float(frame.data.get("pts", frame.pts))
        if frame.name == "scene_change":
            self._cuts.append(pts)
            return
        self._window.append(frame.data)
        horizon = pts - self.config.window_s
        while self._window and self._window[0]["pts"] < horizon:
            self._window.popleft()
        while self._cuts and self._cuts[0] < horizon:
            self._cuts.popleft()
        if self._last_time is not None and pts - self._last_time < self.config.interval_s:
            return
        if self._last_time is None and pts - self._window[0]["pts"] < min(self.config.interval_s, self.config.window_s) - 1e-6:
            return  # the first sentence waits for a full window
        async for out in self._describe(pts):
            yield out

    async def _describe(self, pts: float) -> AsyncIterator[Frame]:
        events = list(self._window)
        if not events:
            return
        self._last_time = pts
        summary = summarize(events, len(self._cuts))
        if self.config.skip_unchanged and summary == self._last_summary:
            return
        self._last_summary = summary
        start = events[0]["pts"]
        messages = [
            {"role": "system", "content": self.config.system},
            {"role": "user", "content": self.config.prompt.format(summary=summary, window=self.config.window_s)},
        ]
        pieces: list[str] = []
        # aclosing: an interrupt closes the stream at once, which frees the engine's sequence
        async with aclosing(self._engine.generate(messages, self._params)) as stream:
            async for piece in stream:
                pieces.append(piece)
                if self.config.stream and piece:
                    yield TextFrame(piece, final=False, start=start, end=pts, pts=pts)
        sentence = first_sentence("".join(pieces)) or summary
        self.sentences.append(sentence)
        yield TextFrame(sentence, final=True, start=start, end=pts, pts=pts)

    async def flush(self) -> AsyncIterator[Frame]:
        # the tail is described too, but never sooner than interval_s after the last sentence
        if self._window and (self._last_time is None
                             or self._window[-1]["pts"] - self._last_time >= self.config.interval_s):
            async for out in self._describe(self._window[-1]["pts"]):
                yield out


# ------------------------------------------------------------------ annotate
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
