"""`streamkit bench video`: 720p H.264 decode plus analysis vs plain PyAV decode, same file, same run.

    streamkit bench video [--json] [--input clip.mp4] [--seconds 10] [--no-live]

fps             frames per second through capture (PyAV, threaded) -> sampler -> detect, as
                pipelines/video_analysis.yaml configures them, run as fast as it goes
decode_only_fps plain PyAV decode of the same file to BGR arrays (what every pipeline frame
                is), threaded
                Both are measured `--rounds` times (3), interleaved (decode, pipeline, decode,
                pipeline, ...), and each is the median of its rounds: a 10 s clip passes in
                about a second, so one run is at the mercy of whatever else the machine does
ratio           fps / decode_only_fps; ratio_rounds: the ratio within each round
decode_cpu_ms, pipeline_cpu_ms, cpu_ratio
                CPU time of the process (all threads) per frame in those same runs (medians),
                and their ratio: less sensitive to other jobs on the machine than wall-clock fps
tracking        per region-tracked detector: whole-frame passes, region passes, frames skipped
frames_with     analysed frames with at least one object of each label
live            the same pipeline fed at the clip's own frame rate (a 30 fps camera) with
                latest-frame-wins: frames dropped, and how far detections trail the frame
                (from the captured frame reaching the output to its detections)

Progress goes to stderr; with --json the last stdout line is the JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

import yaml

from streamkit.bench import print_result
from streamkit.shipped import shipped_dir


def log(msg: str) -> None:
    print(f"[bench video] {msg}", file=sys.stderr, flush=True)


def make_bench_clip(width: int, height: int, fps: float, seconds: float) -> Path:
    from streamkit.video.synthetic import make_clip

    cache = Path(os.environ.get("STREAMKIT_CACHE", Path(tempfile.gettempdir()) / "streamkit-cache"))
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"bench-video-{width}x{height}-{fps:g}fps-{seconds:g}s-v2.mp4"
    if not path.exists():
        log(f"encoding a {seconds:g} s {width}x{height} H.264 clip to {path}")
        tmp = path.with_suffix(".part.mp4")
        # like a fixed 720p30 camera: a background with a natural image's 1/f detail and hard
        # edges, moving shapes, a face, fresh sensor noise every frame (sd 5), encoded the
        # way cameras do, at a target bitrate (3 Mbit/s, VBV-capped; crf 23 lands at ~3.5)
        make_clip(tmp, width, height, fps, seconds, cuts=[seconds / 2], texture="natural", noise_sd=5.0,
                  preset="veryfast", bitrate_kbps=3000)
        tmp.replace(path)
    return path


def decode_only(path: Path) -> tuple[float, int, float]:
    """(frames per second, frames, process CPU ms per frame) of plain threaded PyAV decode."""
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        started = time.perf_counter()
        cpu = time.process_time()
        n = 0
        for frame in container.decode(stream):
            frame.to_ndarray(format="bgr24")
            n += 1
        cpu_ms = 1000 * (time.process_time() - cpu) / max(1, n)
        return n / (time.perf_counter() - started), n, cpu_ms


def analysis_spec(pipeline: str, url: str, drop: str, realtime: bool):
    from streamkit.pipeline import parse_pipeline

    data = yaml.safe_load(Path(pipeline).read_text(encoding="utf-8"))
    keep = []
    for stage in data["stages"]:
        if stage["type"] == "video_capture":
            stage = {**stage, "url": url, "drop": drop, "realtime": realtime}
        if stage["type"] in ("video_capture", "sampler", "detect"):
            keep.append(stage)
    names = [s["name"] for s in keep]
    data["stages"] = keep
    data["output"] = [n for n in names if n != names[0]] + [names[0]]
    return parse_pipeline(yaml.safe_dump(data, sort_keys=False), pipeline)


async def run_pipeline(spec, live: bool) -> dict[str, Any]:
    from streamkit.frames import EventFrame, VideoFrame
    from streamkit.runtime import Session
    from streamkit.transport import MemoryTransport

    session = await Session.open(spec, MemoryTransport(), params={"live": live})
    while not all(getattr(h, "_started", True) for h in session.hosts.values()):  # noqa: ASYNC110 (hosts expose no event)
        await asyncio.sleep(0.01)  # detectors loaded: time decode + analysis only
    capture = spec.stages[0].name
    frames = detections = 0
    frames_with: dict[str, int] = {}
    dropped = 0
    lags: list[float] = []
    errors: list[str] = []
    started = time.perf_counter()
    cpu_started = time.process_time()
    frame_seen: dict[float, float] = {}  # pts -> when the captured frame reached the output
    await session.end()  # a url capture streams its source at end of input
    async for out in session.outputs():
        now = time.perf_counter()
        if isinstance(out, VideoFrame) and out.source == capture:
            frames += 1
            frame_seen[round(out.pts, 6)] = now
        elif isinstance(out, EventFrame) and out.name == "detections":
            detections += 1
            for label in {o["label"] for o in out.data.get("objects", [])}:
                frames_with[label] = frames_with.get(label, 0) + 1
            seen = frame_seen.pop(round(out.pts, 6), None)
            if seen is not None:
                lags.append(now - seen)
        elif isinstance(out, EventFrame) and out.name == "video_dropped":
            dropped = max(dropped, int(out.data.get("total_dropped", 0)))
        elif isinstance(out, EventFrame) and out.name == "error":
            errors.append(out.data.get("message", ""))
    finished = time.perf_counter()
    cpu_s = time.process_time() - cpu_started
    stats = session.stats()
    detect_host = session.hosts.get("detect")
    tracking = detect_host.stage.stats() if detect_host is not None and hasattr(detect_host.stage, "stats") else {}
    await session.close()
    if errors:
        raise RuntimeError("pipeline errors: " + "; ".join(errors))
    lags.sort()
    result = {
        "frames": frames, "detections": detections, "seconds": round(finished - started, 3),
        "fps": frames / max(1e-9, finished - started), "dropped": dropped,
        "detect_ms_p50": stats.get("detect", {}).get("latency_ms_p50"),
        "cpu_ms_per_frame": 1000 * cpu_s / max(1, frames), "tracking": tracking,
        "frames_with": dict(sorted(frames_with.items())),
    }
    if live and lags:
        result["lag_ms_p50"] = round(1000 * lags[len(lags) // 2], 1)
        result["lag_ms_max"] = round(1000 * lags[-1], 1)
    return result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="streamkit bench video", description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print the result as one JSON line")
    parser.add_argument("--input", help="an H.264 file to use instead of the synthetic 720p clip")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of the synthetic clip")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=720)
    parser.add_argument("--fps", type=float, default=30.0, help="frame rate of the synthetic clip")
    parser.add_argument("--pipeline", default=str(shipped_dir("pipelines") / "video_analysis.yaml"))
    parser.add_argument("--rounds", type=int, default=3,
                        help="interleaved decode-only and pipeline runs; each side is the median of its rounds")
    parser.add_argument("--no-live", action="store_true", help="skip the real-time (live camera) run")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")

    import av

    clip = Path(args.input) if args.input else make_bench_clip(args.width, args.height, args.fps, args.seconds)
    with av.open(str(clip)) as c:
        vs = c.streams.video[0]
        width, height = vs.codec_context.width, vs.codec_context.height
        clip_fps = float(vs.average_rate or args.fps)
        duration = float(c.duration or 0) / 1e6 or args.seconds
    bitrate = os.path.getsize(clip) * 8 / max(duration, 1e-9) / 1000

    spec = analysis_spec(args.pipeline, str(clip), "none", realtime=False)
    log(f"{args.rounds} rounds of plain PyAV decode of {clip.name} ({width}x{height}, {bitrate:.0f} kbit/s) "
        "then the pipeline: " + " -> ".join(s.name for s in spec.stages))
    decodes: list[tuple[float, float]] = []  # (fps, CPU ms a frame)
    runs: list[dict[str, Any]] = []
    n = 0
    for round_no in range(1, args.rounds + 1):
        dec_fps, n, dec_cpu = decode_only(clip)
        decodes.append((dec_fps, dec_cpu))
        run = asyncio.run(run_pipeline(spec, live=False))
        runs.append(run)
        log(f"round {round_no}: decode only {dec_fps:.1f} fps, pipeline {run['fps']:.1f} fps "
            f"({run['detections']} frames analysed)")
    decode_fps = median(fps for fps, _ in decodes)
    decode_cpu = median(cpu for _, cpu in decodes)
    pipeline_fps = median(r["fps"] for r in runs)
    pipeline_cpu = median(r["cpu_ms_per_frame"] for r in runs)
    run = runs[-1]
    result: dict[str, Any] = {
        "fps": round(pipeline_fps, 1),
        "decode_only_fps": round(decode_fps, 1),
        "ratio": round(round(pipeline_fps, 1) / round(decode_fps, 1), 3),
        "ratio_rounds": [round(r["fps"] / fps, 3) for r, (fps, _) in zip(runs, decodes)],
        "rounds": len(runs),
        "frames": run["frames"],
        "analysed": run["detections"],
        "detect_ms_p50": run["detect_ms_p50"],
        "width": width, "height": height, "clip_fps": clip_fps, "bitrate_kbps": round(bitrate),
        "cpus": os.cpu_count(),
        # load-independent view of the same runs: CPU time (all threads) per frame, and
        # decode-only CPU / pipeline CPU (what `ratio` would be on otherwise idle cores)
        "decode_cpu_ms": round(decode_cpu, 2), "pipeline_cpu_ms": round(pipeline_cpu, 2),
        "cpu_ratio": round(decode_cpu / max(1e-9, pipeline_cpu), 3),
        "load_avg": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "tracking": run["tracking"],
        # analysed frames with at least one object of each label (the clip has a face in all)
        "frames_with": run["frames_with"],
    }
    if not args.no_live:
        log(f"live: the clip at {clip_fps:g} fps, latest-frame-wins")
        live_spec = analysis_spec(args.pipeline, str(clip), "latest", realtime=True)
        live = asyncio.run(run_pipeline(live_spec, live=True))
        expected = n
        drop_rate = live["dropped"] / max(1, expected)
        result["live"] = {
            "input_fps": clip_fps, "frames": live["frames"], "dropped": live["dropped"],
            "drop_rate": round(drop_rate, 4), "analysed": live["detections"],
            "lag_ms_p50": live.get("lag_ms_p50"), "lag_ms_max": live.get("lag_ms_max"),
            # kept up: (almost) nothing dropped and detections trail the frame by under a sample period
            "keeps_up": drop_rate <= 0.01 and (live.get("lag_ms_p50") or 0) < 1000 / 5,
        }
        log(f"live: {live['frames']}/{expected} frames, {live['dropped']} dropped, lag p50 {live.get('lag_ms_p50')} ms")
    print_result(result, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
