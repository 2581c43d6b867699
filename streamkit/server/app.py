"""`streamkit serve`: the websocket protocol on /ws, web/ files, /healthz and /metrics on one port.

    server = StreamServer(port=0, pipelines_dir="pipelines")
    await server.start()          # loads every pipeline and its models once, then listens
    ... ws://127.0.0.1:{server.port}/ws ...
    await server.shutdown()       # flushes open sessions (final transcripts are sent), then stops

Tests use `async with serve(port=0, ...) as server:`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import websockets
from websockets.asyncio.server import ServerConnection

from streamkit import resources
from streamkit.server import metrics as M
from streamkit.server import routes as H
from streamkit.server.limits import Limits, Security, is_loopback
from streamkit.server.protocol import DEFAULT_MAX_MESSAGE
from streamkit.server.session import Connection
from streamkit.shutdown import stop_on_signals

log = logging.getLogger("streamkit.server")


class StreamServer:
    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 8765,
        pipelines_dir: str | Path | None = None,
        redis_url: str | None = None,
        web_dir: str | Path | None = None,
        limits: Limits | None = None,
        security: Security | None = None,
        preload: bool = True,
        plugins: list[str] | None = None,
        remote_stages: list[str] | None = None,
        engine_url: str | None = None,
        progress=None,
    ) -> None:
        from streamkit.pipeline import default_pipelines_dir

        self.host = host
        self.requested_port = port
        self.pipelines_dir = Path(pipelines_dir) if pipelines_dir else default_pipelines_dir()
        self.redis_url = redis_url
        self.web_dir = Path(web_dir) if web_dir else H.default_web_dir()
        self.limits = limits or Limits()
        self.security = security or Security()
        self.preload = preload
        self.plugins = list(plugins or [])
        self.remote_stages = set(remote_stages or [])
        self.engine_url = engine_url  # text generation runs on the engine workers there
        self.routed_to_engine: dict[str, list[str]] = {}  # pipeline -> its stages routed there
        self.live_workers: dict[str, int] | None = None  # role -> live workers; None: not checked yet
        self.workers_error: str | None = None
        self._liveness_task: asyncio.Task | None = None
        self.progress = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.pipelines: dict[str, Any] = {}
        self.pipeline_errors: dict[str, str] = {}
        self.connections: set[Connection] = set()
        self.sessions: set[Connection] = set()
        self.shutting_down = False
        self.started_at = time.time()
        self._ws_server = None
        self._transport = None
        self._closed = asyncio.Event()
        M.track(self)

    # ------------------------------------------------------------------ state
    def session_count(self) -> int:
        return len(self.sessions)

    def connection_count(self) -> int:
        return len(self.connections)

    def session_opened(self, conn: Connection) -> None:
        self.sessions.add(conn)

    def session_closed(self, conn: Connection) -> None:
        self.sessions.discard(conn)

    def pipeline_names(self) -> list[str]:
        return sorted({spec.name for spec in self.pipelines.values()})

    def transport(self):
        if self._transport is None:
            if self.redis_url:
                from streamkit.transport.redis import (
                    RedisTransport,  # imported only when asked for
                )

                self._transport = RedisTransport(self.redis_url, remote_stages=self.remote_stages)
            else:
                from streamkit.transport.memory import MemoryTransport

                self._transport = MemoryTransport()
        return self._transport

    @property
    def port(self) -> int:
        if self._ws_server is None:
            return self.requested_port
        return self._ws_server.sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        host = self.host if ":" not in self.host else f"[{self.host}]"
        if host in ("0.0.0.0", "[::]", ""):
            host = "127.0.0.1"
        return f"ws://{host}:{self.port}/ws"

    def required_workers(self) -> set[str]:
        """Liveness roles the pipelines cannot run without (Redis only)."""
        from streamkit.transport.liveness import ENGINE_ROLE, stage_role

        roles = {stage_role(cfg.name) for spec in self.pipelines.values() for cfg in spec.stages
                 if self.redis_url and (cfg.transport == "redis" or cfg.name in self.remote_stages)}
        if any(self.routed_to_engine.values()):
            roles.add(ENGINE_ROLE)
        return roles

    def missing_workers(self) -> list[str]:
        if self.live_workers is None:
            return []
        return sorted(role for role in self.required_workers() if not self.live_workers.get(role))

    def degraded(self) -> bool:
        return bool(self.pipeline_errors or self.missing_workers() or self.workers_error)

    def health(self) -> dict[str, Any]:
        status = "shutting_down" if self.shutting_down else ("degraded" if self.degraded() else "ok")
        return {
            "status": status,
            "models": resources.loaded() + _engines_loaded(),
            "sessions": self.session_count(),
            "connections": self.connection_count(),
            "max_sessions": self.limits.max_sessions,
            "pipelines": self.pipeline_names(),
            "pipeline_inputs": {spec.name: [k for k in ("audio", "video") if getattr(spec.input, k) is not None]
                                for spec in self.pipelines.values()},
            "pipeline_errors": self.pipeline_errors,
            "transport": "redis" if self.redis_url else "memory",
            **({"workers": self.live_workers or {}, "workers_missing": self.missing_workers(),
                "workers_error": self.workers_error} if (self.redis_url or self.engine_url) else {}),
            "engine": self.engine_url or "local",
            "uptime_s": round(time.time() - self.started_at, 1),
        }

    # ------------------------------------------------------------------ start
    def load_pipelines(self) -> None:
        from streamkit.pipeline import PipelineError, load_pipeline
        from streamkit.stage import load_plugins

        if self.plugins:
            load_plugins(self.plugins)
        files = sorted(list(self.pipelines_dir.glob("*.yaml")) + list(self.pipelines_dir.glob("*.yml")))
        if not files:
            self.progress(f"no pipelines in {self.pipelines_dir}")
        for path in files:
            try:
                spec = load_pipeline(path)
            except PipelineError as exc:
                self.pipeline_errors[path.stem] = str(exc)
                self.progress(f"pipeline {path.name}: invalid, skipped:\n{exc}")
                continue
            except Exception as exc:  # an unimportable stage module, for instance
                self.pipeline_errors[path.stem] = f"{type(exc).__name__}: {exc}"
                self.progress(f"pipeline {path.name}: cannot load ({exc}), skipped")
                continue
            if self.engine_url:
                self.routed_to_engine[spec.name] = route_text_generation(spec, self.engine_url)
            self.pipelines[spec.name] = spec
            self.pipelines.setdefault(path.stem, spec)

    async def preload_models(self) -> None:
        """Start (then stop) every stage once so shared models load now, not in the first session."""
        from streamkit.stage import StageContext, get_stage_class

        specs = {spec.name: spec for spec in self.pipelines.values()}
        todo = [(spec, cfg) for spec in specs.values() for cfg in spec.stages
                if not (self.redis_url and (cfg.transport == "redis" or cfg.name in self.remote_stages))]
        for i, (spec, cfg) in enumerate(todo, 1):
            started = time.perf_counter()
            self.progress(f"[{i}/{len(todo)}] loading {spec.name}.{cfg.name} ({cfg.type}) ...")
            context = StageContext(spec.name, "preload", {}, spec.output_audio.sample_rate)
            try:
                stage = get_stage_class(cfg.type)(cfg, context)
                await stage.start()
                await _warm(stage)
                await stage.stop()
            except Exception as exc:
                self.pipeline_errors[spec.name] = f"stage {cfg.name!r} failed to start: {exc}"
                self.progress(f"[{i}/{len(todo)}] {spec.name}.{cfg.name} FAILED: {exc}")
                continue
            self.progress(f"[{i}/{len(todo)}] {spec.name}.{cfg.name} ready in {time.perf_counter() - started:.1f}s")

    async def _watch_workers(self) -> None:
        """Refresh `live_workers` from the workers' liveness keys (in the transport's Redis and the
        engine's, when they differ), for /healthz."""
        import redis.asyncio as aioredis

        from streamkit.transport.liveness import BEAT_S, live_workers

        urls = sorted({u for u in (self.redis_url, self.engine_url) if u})
        clients = [aioredis.from_url(u, socket_timeout=3, socket_connect_timeout=3) for u in urls]
        try:
            while True:
                try:
                    live: dict[str, int] = {}
                    for r in clients:
                        for role, n in (await live_workers(r)).items():
                            live[role] = live.get(role, 0) + n
                    self.live_workers, self.workers_error = live, None
                except Exception as exc:  # Redis down: degraded until it answers again
                    self.workers_error = f"redis unreachable: {exc}"
                await asyncio.sleep(BEAT_S)
        finally:
            for r in clients:
                await r.aclose()

    async def start(self) -> "StreamServer":
        self.load_pipelines()
        if self.redis_url or self.engine_url:
            self._liveness_task = asyncio.create_task(self._watch_workers())
        if self.preload:
            await self.preload_models()
        if not is_loopback(self.host) and not self.security.token:
            self.progress(f"WARNING: listening on {self.host} without a token: anyone who can reach it may use it")
        self._ws_server = await websockets.serve(
            self._handler,
            self.host,
            self.requested_port,
            process_request=self._process_request,
            # Messages up to twice the limit are read so the client hears which message was too
            # big (error event, then close 1009); beyond that the protocol layer closes with 1009.
            max_size=2 * self.limits.max_message,
            max_queue=16,
            compression=None,
            ping_interval=20,
            close_timeout=5,
            server_header="streamkit",
        )
        self.progress(f"streamkit serving {', '.join(self.pipeline_names()) or 'no pipelines'} on "
                      f"http://{self.host}:{self.port}/ (websocket {self.url})")
        return self

    # ------------------------------------------------------------------ HTTP
    def _process_request(self, connection: ServerConnection, request):
        path = request.path
        route = path.split("?", 1)[0]
        headers = request.headers
        if route == "/ws":
            if self.security.token and not self.security.token_ok(path, headers):
                return H.json_response(401, {"type": "error", "code": "unauthorized",
                                             "message": "a valid token is required (?token= or Authorization: Bearer)"})
            if not self.security.origin_ok(headers.get("Origin"), headers.get("Host")):
                return H.json_response(403, {"type": "error", "code": "forbidden_origin",
                                             "message": f"origin {headers.get('Origin')!r} is not allowed"})
            if self.shutting_down:
                return H.json_response(503, {"type": "error", "code": "shutting_down",
                                             "message": "the server is shutting down"})
            if self.connection_count() >= self.limits.max_sessions + 16:
                return H.json_response(503, {"type": "error", "code": "too_many_connections",
                                             "message": "too many open connections"})
            return None  # go on with the websocket handshake
        if headers.get("Upgrade", "").lower() == "websocket":
            return H.response(404, "the websocket endpoint is /ws\n")
        if route == "/healthz":
            health = self.health()
            return H.json_response(200 if health["status"] == "ok" else 503, health)
        if route == "/metrics":
            if self.security.token and not self.security.token_ok(path, headers):
                return H.response(401, "token required\n")
            return H.response(200, M.render(), "text/plain; version=0.0.4; charset=utf-8")
        return H.static_file(self.web_dir, path)

    async def _handler(self, ws: ServerConnection) -> None:
        conn = Connection(self, ws)
        self.connections.add(conn)
        try:
            await conn.run()
        finally:
            self.connections.discard(conn)

    # ------------------------------------------------------------------ stop
    async def shutdown(self) -> None:
        """Stop listening, let every open session flush and end, then close."""
        if self.shutting_down:
            await self._closed.wait()
            return
        self.shutting_down = True
        if self._ws_server is not None:
            self._ws_server.close(close_connections=False)
        conns = list(self.connections)
        if conns:
            self.progress(f"shutting down: flushing {len(conns)} open connection(s)")
        results = await asyncio.wait_for(
            asyncio.gather(*(c.shutdown() for c in conns), return_exceptions=True),
            self.limits.shutdown_timeout + 10) if conns else []
        for r in results:
            if isinstance(r, Exception):
                log.warning("session shutdown failed: %s", r)
        if self._ws_server is not None:
            self._ws_server.close(close_connections=True)
            try:
                await asyncio.wait_for(self._ws_server.wait_closed(), 10)
            except (asyncio.TimeoutError, TimeoutError):
                pass
        if self._liveness_task is not None:
            self._liveness_task.cancel()
            await asyncio.gather(self._liveness_task, return_exceptions=True)
        close = getattr(self._transport, "aclose", None) or getattr(self._transport, "close", None)
        if close is not None:  # RedisTransport has aclose, MemoryTransport close
            try:
                res = close()
                if asyncio.iscoroutine(res):
                    await res
            except Exception as exc:
                log.warning("closing the transport failed: %s", exc)
        self._closed.set()

    async def wait_closed(self) -> None:
        await self._closed.wait()

    async def __aenter__(self) -> "StreamServer":
        if self._ws_server is None:
            await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.shutdown()


async def _warm(stage) -> None:
    """Load what a stage loads lazily: its own preload() if it has one, or its decode engine."""
    hook = getattr(stage, "preload", None)
    if callable(hook):
        res = hook()
        if asyncio.iscoroutine(res):
            await res
        return
    engine = getattr(stage, "engine", None)
    if engine is not None and callable(getattr(engine, "load", None)) and not getattr(engine, "loaded", True):
        await asyncio.to_thread(engine.load)


def _engines_loaded() -> list[str]:
    api = sys.modules.get("streamkit.engine.api")
    if api is None:
        return []
    return [f"engine:{os.path.basename(path)}@{device}" for (path, device), e in list(getattr(api, "_engines", {}).items())
            if getattr(e, "loaded", False)]


def route_text_generation(spec: Any, engine_url: str) -> list[str]:
    """Point every stage that would generate text on an engine in this process (an `engine`
    option left at `local`: llm, describe) at the engine workers at `engine_url`. Returns the
    names of the stages routed."""
    routed = []
    for cfg in spec.stages:
        if getattr(cfg, "engine", None) == "local":
            cfg.engine = engine_url
            routed.append(cfg.name)
    return routed


def serve(**kwargs) -> StreamServer:
    """A server to `await server.start()` or use as `async with serve(port=0) as server:`."""
    return StreamServer(**kwargs)


# ---------------------------------------------------------------------- CLI

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
    p.add_argument("--shutdown-timeout", type=float, default=Limits.shutdown_timeout)
    p.add_argument("--no-preload", action="store_true", help="load models on first use instead of at start")
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE", help="import MODULE to register stages")
    return p


def server_from_args(args: argparse.Namespace) -> StreamServer:
    limits = Limits(max_message=args.max_message, max_sessions=args.max_sessions, rate=args.rate,
                    burst=args.burst, send_timeout=args.send_timeout,
                    metrics_interval=args.metrics_interval, shutdown_timeout=args.shutdown_timeout)
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
