"""The `streamkit` command: validate | run | serve | worker | client | bench."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import os
import sys
from typing import Callable

BENCH_TARGETS = ("engine", "step", "asr", "dubbing", "serve", "video", "translate", "answers")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: machine-readable and quiet by default (warnings and up)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"t": round(record.created, 3), "level": record.levelname, "logger": record.name,
                 "msg": record.getMessage()}
        for key in ("pipeline", "session", "stage"):
            if hasattr(record, key):
                entry[key] = getattr(record, key)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def setup_logging(verbose: int) -> None:
    """-v info, -vv debug; STREAMKIT_LOG_LEVEL=info|debug|... overrides."""
    level = max(logging.DEBUG, logging.WARNING - 10 * verbose)
    named = os.environ.get("STREAMKIT_LOG_LEVEL", "").upper()
    if named in logging.getLevelNamesMapping():
        level = logging.getLevelNamesMapping()[named]
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def _delegate(module: str, argv: list[str]) -> int:
    """Run `module.main(argv)`; commands live next to the code they drive."""
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and module.startswith(exc.name):
            print(f"streamkit: {module} is not available in this build", file=sys.stderr)
            return 2
        raise
    main: Callable[[list[str]], int] = mod.main
    return int(main(argv) or 0)


def cmd_validate(args: argparse.Namespace) -> int:
    from streamkit.pipeline import (
        PipelineError,
        default_pipelines_dir,
        find_pipeline,
        load_pipeline,
    )

    failed = 0
    for path in args.files or sorted(default_pipelines_dir().glob("*.yaml")):
        try:
            spec = load_pipeline(find_pipeline(str(path)))
        except FileNotFoundError as exc:
            failed += 1
            print(f"{path}: {exc}", file=sys.stderr)
            continue
        except PipelineError as exc:
            failed += 1
            for issue in exc.issues:
                print(f"{path}:{issue.line or 0}:{issue.column or 0}: {issue.message}", file=sys.stderr)
            continue
        stages = " -> ".join(f"{s.name}({s.type})" for s in spec.stages)
        print(f"{path}: ok: {spec.name}: {stages}; output {', '.join(spec.output)}")
    return 1 if failed else 0


def cmd_run(args: argparse.Namespace) -> int:
    from streamkit.offline import run_offline
    from streamkit.pipeline import PipelineError, find_pipeline, load_pipeline

    try:
        spec = load_pipeline(find_pipeline(args.pipeline))
    except (PipelineError, FileNotFoundError) as exc:
        print(f"streamkit run: {exc}", file=sys.stderr)
        return 2
    bad = [kv for kv in args.param if "=" not in kv]
    if bad:
        print(f"streamkit run: --param takes KEY=VALUE, got {bad[0]!r}", file=sys.stderr)
        return 2
    params = dict(kv.split("=", 1) for kv in args.param)
    try:
        summary = asyncio.run(run_offline(spec, args.input, args.output, params=params, redis_url=args.redis,
                                          realtime=args.realtime))
    except ValueError as exc:  # MediaError and a missing stream: the input is wrong, not the code
        print(f"streamkit run: {exc}", file=sys.stderr)
        return 2
    for name, path in summary["files"].items():
        print(f"{name}: {path}")
    for err in summary["errors"]:
        print(f"error: {err}", file=sys.stderr)
    return 1 if summary["errors"] else 0


def cmd_worker(args: argparse.Namespace, rest: list[str]) -> int:
    if args.health:
        from streamkit.liveness import (
            ENGINE_ROLE,
            alive_on_this_host,
            stage_role,
        )

        role = ENGINE_ROLE if args.stage == "engine" else stage_role(args.stage)
        try:
            alive = alive_on_this_host(args.redis, role)
        except Exception as exc:  # Redis unreachable
            print(f"unhealthy: {exc}", file=sys.stderr)
            return 1
        print("healthy" if alive else f"unhealthy: no live {role} worker on this host", file=sys.stderr)
        return 0 if alive else 1
    if args.stage == "engine":
        return _delegate("streamkit.engine.service.worker", ["--redis", args.redis, *rest])
    from streamkit.stage_worker import run_stage_worker

    asyncio.run(run_stage_worker(args.redis, args.stage, claim_idle_ms=args.claim_idle_ms,
                                 max_sessions=args.max_sessions))
    return 0


def _plugin_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                        help="import MODULE first, so the stage types it registers can be used")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="streamkit", description=__doc__)
    p.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-v info, -vv debug)")
    sub = p.add_subparsers(dest="command", required=True)

    v = sub.add_parser("validate", help="check pipeline YAML files; every problem with line and column")
    v.add_argument("files", nargs="*", help="YAML paths or names of shipped pipelines (default: every shipped one)")
    _plugin_arg(v)

    r = sub.add_parser("run", help="run a pipeline offline on a media file")
    r.add_argument("pipeline", help="pipeline YAML path or name in pipelines/")
    r.add_argument("--input", required=True, help="file or URL PyAV can open")
    r.add_argument("--output", required=True, help="directory for the results")
    r.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="session parameter")
    r.add_argument("--redis", default=None, help="run over Redis Streams at this URL")
    r.add_argument("--realtime", action="store_true", help="feed the input at real-time pace")
    _plugin_arg(r)

    sub.add_parser("serve", help="websocket server, browser demo, /healthz and /metrics", add_help=False)
    sub.add_parser("client", help="stream a file to a server and print the events", add_help=False)

    w = sub.add_parser("worker", help="run one stage (or the engine) as a Redis consumer")
    w.add_argument("--stage", required=True, help="stage name, or 'engine'")
    w.add_argument("--redis", required=True, help="redis://host:port")
    w.add_argument("--claim-idle-ms", type=int, default=3000, help="take over sessions idle this long")
    w.add_argument("--max-sessions", type=int, default=64)
    w.add_argument("--health", action="store_true",
                   help="exit 0 when a worker of this stage on this host beats in Redis (a container health check)")
    _plugin_arg(w)

    b = sub.add_parser("bench", help="benchmarks against a peer measured in the same run", add_help=False)
    b.add_argument("target", choices=BENCH_TARGETS)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    setup_logging(args.verbose)
    if args.command == "serve":
        return _delegate("streamkit.server.serve_cli", rest)
    if args.command == "client":
        return _delegate("streamkit.client", rest)
    if args.command == "bench":
        return _delegate(f"streamkit.bench.{args.target}", rest)
    if getattr(args, "plugin", None):
        from streamkit.stages.catalog import load_plugins

        load_plugins(args.plugin)
    if args.command == "worker":
        return cmd_worker(args, rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return {"validate": cmd_validate, "run": cmd_run}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
