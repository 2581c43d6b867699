"""`streamkit serve`: its command line, and running a StreamServer until SIGINT/SIGTERM."""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from streamkit.server.app import StreamServer
from streamkit.server.limits import Limits, Security
from streamkit.server.protocol import DEFAULT_MAX_MESSAGE
from streamkit.shutdown import stop_on_signals


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="streamkit serve", description="Serve pipelines over websockets (protocol: DESIGN.md)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback only)")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--pipelines", default=None, help="directory of pipeline YAML files (default: ./pipelines of the package)")
    p.add_argument("--redis", default=None, metavar="URL", help="run stages over Redis Streams at URL")
    p.add_argument("--remote-stage", action="append", default=[], metavar="STAGE",
                   help="with --redis: this stage runs in `streamkit worker --stage STAGE` processes (repeatable)")
    p.add_argument("--engine", default=os.environ.get("STREAMKIT_ENGINE") or None, metavar="URL",
                   help="generate text (llm, describe stages) on `streamkit worker --stage engine` processes "
                        "at this redis:// URL instead of an engine in this process (default: $STREAMKIT_ENGINE)")
    p.add_argument("--web", default=None, help="directory served over HTTP (default: the installed web/)")
    p.add_argument("--token", default=os.environ.get("STREAMKIT_TOKEN"),
                   help="shared token required on /ws and /metrics (default: $STREAMKIT_TOKEN)")
    p.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                   help="browser origin allowed besides this server's own (repeatable; '*' for any)")
    p.add_argument("--max-sessions", type=int, default=Limits.max_sessions)
    p.add_argument("--max-message", type=int, default=DEFAULT_MAX_MESSAGE, help="bytes per message (default 1 MiB)")
    p.add_argument("--rate", type=float, default=Limits.rate, help="messages per second per session (0: unlimited)")
    p.add_argument("--burst", type=int, default=Limits.burst)
    p.add_argument("--send-timeout", type=float, default=Limits.send_timeout,
                   help="close a client that reads nothing for this many seconds")
    p.add_argument("--metrics-interval", type=float, default=Limits.metrics_interval)
    p.add_argument("--shutdown-timeout", type=float, default=Limits.shutdown_timeout,
                   help="on SIGTERM, seconds open sessions get to flush in all")
    p.add_argument("--flush-stall-timeout", type=float, default=Limits.flush_stall_timeout,
                   help="after a client's stop, end the flush once the pipeline has sent nothing for this many seconds")
    p.add_argument("--no-preload", action="store_true", help="load models on first use instead of at start")
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE", help="import MODULE to register stages")
    return p


def server_from_args(args: argparse.Namespace) -> StreamServer:
    limits = Limits(max_message=args.max_message, max_sessions=args.max_sessions, rate=args.rate,
                    burst=args.burst, send_timeout=args.send_timeout,
                    metrics_interval=args.metrics_interval, shutdown_timeout=args.shutdown_timeout,
                    flush_stall_timeout=args.flush_stall_timeout)
    security = Security(token=args.token or None, allow_origins=args.allow_origin)
    return StreamServer(host=args.host, port=args.port, pipelines_dir=args.pipelines, redis_url=args.redis,
                        web_dir=args.web, limits=limits, security=security, preload=not args.no_preload,
                        plugins=args.plugin, remote_stages=args.remote_stage, engine_url=args.engine)


async def run_until_signal(server: StreamServer) -> None:
    stop = stop_on_signals()
    await server.start()
    await stop.wait()
    server.progress("signal received: flushing sessions and stopping")
    await server.shutdown()


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING)
    try:
        asyncio.run(run_until_signal(server_from_args(args)))
    except OSError as exc:
        print(f"streamkit serve: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
