"""`streamkit run`: a pipeline over a media file, results written to a directory.

What is written, by what the output stages produce:
    transcript.json, transcript.srt   final text of `asr` stages, with timings and words
    <stage>.txt, <stage>.json         final text of other stages (translation, answers, descriptions)
    <stage>.wav                       audio a stage produced (the dubbed voice), at its own rate
    <stage>.mp4                       video frames a stage produced (annotated video)
    detections.jsonl                  one `detections` event per line
    events.jsonl                      every other event (speech_start, speech_end, ...)
"""

from __future__ import annotations

import asyncio
import heapq
import json
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from streamkit import events
from streamkit.frames import (
    AudioFrame,
    EventFrame,
    Frame,
    TextFrame,
    TextRole,
    VideoFrame,
)
from streamkit.media import has_stream, iter_audio, iter_video, paced, write_wav
from streamkit.pipeline import PipelineSpec
from streamkit.runtime import Session
from streamkit.stages.catalog import get_stage_class


def input_frames(spec: PipelineSpec, source: str) -> Iterator[AudioFrame | VideoFrame]:
    """The input's audio and/or video as the pipeline declares it, merged in pts order."""
    streams = []
    if spec.input.audio is not None and has_stream(source, "audio"):
        streams.append(iter_audio(source, spec.input.audio.sample_rate, spec.input.audio.channels))
    if spec.input.video is not None and has_stream(source, "video"):
        streams.append(iter_video(source))
    if not streams:
        wanted = [k for k in ("audio", "video") if getattr(spec.input, k) is not None] or ["audio or video"]
        raise ValueError(f"{source} has no {' or '.join(wanted)} stream for pipeline {spec.name!r}")
    return heapq.merge(*streams, key=lambda f: f.pts)


def srt_time(seconds: float) -> str:
    ms = int(round(max(0.0, seconds) * 1000))
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d},{ms:03d}"


def to_srt(segments: list[dict[str, Any]]) -> str:
    blocks = []
    for i, seg in enumerate(segments, 1):
        blocks.append(f"{i}\n{srt_time(seg['start'] or 0)} --> {srt_time(seg['end'] or 0)}\n{seg['text'].strip()}\n")
    return "\n".join(blocks)


class ResultWriter:
    """Collects session output and writes the files listed in the module docstring."""

    def __init__(self, spec: PipelineSpec, out_dir: Path) -> None:
        self.spec = spec
        self.out_dir = out_dir
        self.expects_transcript = any(get_stage_class(s.type).emits_transcripts for s in spec.stages)
        self.transcript: list[dict[str, Any]] = []
        self.texts: dict[str, list[dict[str, Any]]] = {}
        self.audio: dict[str, tuple[int, list[np.ndarray]]] = {}
        self.video: dict[str, Any] = {}
        self.errors: list[str] = []
        self._detections = None
        self._events = None
        self.files: dict[str, str] = {}

    def _jsonl(self, name: str):
        path = self.out_dir / name
        self.files[name] = str(path)
        return path.open("w", encoding="utf-8")

    def add(self, frame: Frame) -> None:
        if isinstance(frame, TextFrame):
            if not frame.final:
                return
            item = {"text": frame.text, "start": frame.start, "end": frame.end, "utterance": frame.utterance}
            if frame.role is TextRole.TRANSCRIPT:
                item["words"] = [{"word": w.text, "start": w.start, "end": w.end, "probability": w.probability}
                                 for w in frame.words]
                self.transcript.append(item)
            else:
                self.texts.setdefault(frame.source, []).append(item)
        elif isinstance(frame, AudioFrame):
            rate, parts = self.audio.setdefault(frame.source, (frame.sample_rate, []))
            parts.append(frame.samples)
        elif isinstance(frame, VideoFrame):
            self._write_video(frame)
        elif isinstance(frame, EventFrame):
            if frame.name == events.ERROR:
                self.errors.append(frame.data.get("message", str(frame.data)))
            if frame.name == events.DETECTIONS:
                if self._detections is None:
                    self._detections = self._jsonl("detections.jsonl")
                self._detections.write(json.dumps({"pts": frame.pts, **frame.data}) + "\n")
            else:
                if self._events is None:
                    self._events = self._jsonl("events.jsonl")
                self._events.write(json.dumps({"name": frame.name, "source": frame.source,
                                               "pts": frame.pts, "data": frame.data}) + "\n")

    def _write_video(self, frame: VideoFrame) -> None:
        from streamkit.video.encode import Mp4Writer

        writer = self.video.get(frame.source)
        if writer is None:
            path = self.out_dir / f"{frame.source}.mp4"
            fps = (self.spec.input.video.fps if self.spec.input.video else None) or 30.0
            writer = self.video[frame.source] = Mp4Writer(path, fps, frame.width, frame.height)
            self.files[f"{frame.source}.mp4"] = str(path)
        writer.write(frame)

    def close(self) -> None:
        if self.transcript or self.expects_transcript:
            (self.out_dir / "transcript.json").write_text(json.dumps(self.transcript, indent=2), encoding="utf-8")
            (self.out_dir / "transcript.srt").write_text(to_srt(self.transcript), encoding="utf-8")
            self.files["transcript.json"] = str(self.out_dir / "transcript.json")
            self.files["transcript.srt"] = str(self.out_dir / "transcript.srt")
        for stage, items in self.texts.items():
            (self.out_dir / f"{stage}.json").write_text(json.dumps(items, indent=2, ensure_ascii=False), encoding="utf-8")
            (self.out_dir / f"{stage}.txt").write_text("\n".join(i["text"].strip() for i in items) + "\n", encoding="utf-8")
            self.files[f"{stage}.txt"] = str(self.out_dir / f"{stage}.txt")
        for stage, (rate, parts) in self.audio.items():
            path = self.out_dir / f"{stage}.wav"
            write_wav(path, np.concatenate(parts), rate)
            self.files[f"{stage}.wav"] = str(path)
        for writer in self.video.values():
            writer.close()
        for f in (self._detections, self._events):
            if f is not None:
                f.close()


async def run_offline(
    spec: PipelineSpec,
    source: str,
    out_dir: str | Path,
    params: dict[str, Any] | None = None,
    redis_url: str | None = None,
    realtime: bool = False,
) -> dict[str, Any]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 (one mkdir before the session starts)
    if redis_url:
        from streamkit.transport.redis import RedisTransport

        transport = RedisTransport(redis_url)
    else:
        from streamkit.transport import MemoryTransport

        transport = MemoryTransport()
    writer = ResultWriter(spec, out)
    session = await Session.open(spec, transport, params=params or {})

    async def collect() -> None:
        async for frame in session.outputs():
            writer.add(frame)

    collector = asyncio.create_task(collect())
    try:
        frames = input_frames(spec, source)
        if realtime:
            async for frame in paced(frames):
                await session.push(frame)
        else:
            for frame in frames:
                await session.push(frame)
        await session.end()
        await collector
    finally:
        collector.cancel()
        await session.close()
        writer.close()
        if hasattr(transport, "aclose"):
            await transport.aclose()
    return {"files": writer.files, "errors": writer.errors}
