"""`streamkit serve`: the websocket protocol on /ws, web/ files, /healthz and /metrics on one port.

    server = StreamServer(port=0, pipelines_dir="pipelines")
    await server.start()          # loads every pipeline and its models once, then listens
    ... ws://127.0.0.1:{server.port}/ws ...
    await server.shutdown()       # flushes open sessions (final transcripts are sent), then stops

Tests use `async with serve(port=0, ...) as server:`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import websockets
from websockets.asyncio.server import ServerConnection

from streamkit import cores, resources
from streamkit.pipeline import PipelineSpec
from streamkit.server import routes, telemetry
from streamkit.server.connection import Connection
from streamkit.server.limits import Limits, Security, is_loopback
from streamkit.server.workers import WorkerWatch
from streamkit.transport.base import Transport

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
        self.web_dir = Path(web_dir) if web_dir else routes.default_web_dir()
        self.limits = limits or Limits()
        self.security = security or Security()
        self.preload = preload
        self.plugins = list(plugins or [])
        self.remote_stages = set(remote_stages or [])
        self.engine_url = engine_url  # text generation runs on the engine workers there
        self.routed_to_engine: dict[str, list[str]] = {}  # pipeline -> its stages routed there
        self.workers = WorkerWatch([u for u in (redis_url, engine_url) if u])
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
        telemetry.track(self)

    # ------------------------------------------------------------------ state
    def session_count(self) -> int:
        return len(self.sessions)

    def connection_count(self) -> int:
        return len(self.connections)

    def pipeline_session_limit(self, spec: PipelineSpec) -> int | None:
        """How many sessions of `spec` this server runs at once: its `sessions_per_core` times the
        cores, in-process only (with --redis the workers' cores do the work)."""
        if spec.sessions_per_core is None or self.redis_url:
            return None
        return max(1, int(spec.sessions_per_core * cores.count()))

    def pipeline_session_count(self, name: str) -> int:
        """Sessions of pipeline `name` starting, running or flushing."""
        return sum(1 for c in self.connections
                   if c.spec is not None and c.spec.name == name and c.state in ("starting", "running", "stopping"))

    def session_opened(self, conn: Connection) -> None:
        self.sessions.add(conn)

    def session_closed(self, conn: Connection) -> None:
        self.sessions.discard(conn)

    def pipeline_names(self) -> list[str]:
        return sorted({spec.name for spec in self.pipelines.values()})

    def transport(self) -> Transport:
        if self._transport is None:
            if self.redis_url:
                # imported only when asked for
                from streamkit.transport.redis import RedisTransport

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
        from streamkit.liveness import ENGINE_ROLE, stage_role

        transport = self.transport()
        roles = {stage_role(cfg.name) for spec in self.pipelines.values() for cfg in spec.stages
                 if transport.is_remote(spec, cfg.name)}
        if any(self.routed_to_engine.values()):
            roles.add(ENGINE_ROLE)
        return roles

    def degraded(self) -> bool:
        return bool(self.pipeline_errors or self.workers.missing(self.required_workers()) or self.workers.error)

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
            **(self.workers.report(self.required_workers()) if self.workers.redis_urls else {}),
            "engine": self.engine_url or "local",
            "uptime_s": round(time.time() - self.started_at, 1),
        }

    # ------------------------------------------------------------------ start
    def load_pipelines(self) -> None:
        from streamkit.pipeline import PipelineError, load_pipeline
        from streamkit.stages.catalog import load_plugins

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
        from streamkit.stage import StageContext
        from streamkit.stages.catalog import build_stage

        transport = self.transport()
        specs = {spec.name: spec for spec in self.pipelines.values()}
        todo = [(spec, cfg) for spec in specs.values() for cfg in spec.stages
                if not transport.is_remote(spec, cfg.name)]
        for i, (spec, cfg) in enumerate(todo, 1):
            started = time.perf_counter()
            self.progress(f"[{i}/{len(todo)}] loading {spec.name}.{cfg.name} ({cfg.type}) ...")
            context = StageContext(spec.name, "preload", {}, spec.output_audio.sample_rate)
            try:
                stage = build_stage(cfg, context)
                await stage.start()
                await _warm(stage)
                await stage.stop()
            except Exception as exc:
                self.pipeline_errors[spec.name] = f"stage {cfg.name!r} failed to start: {exc}"
                self.progress(f"[{i}/{len(todo)}] {spec.name}.{cfg.name} FAILED: {exc}")
                continue
            self.progress(f"[{i}/{len(todo)}] {spec.name}.{cfg.name} ready in {time.perf_counter() - started:.1f}s")

    async def start(self) -> "StreamServer":
        self.load_pipelines()
        self.workers.start()
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
                return routes.json_response(401, {"type": "error", "code": "unauthorized",
                                             "message": "a valid token is required (?token= or Authorization: Bearer)"})
            if not self.security.origin_ok(headers.get("Origin"), headers.get("Host")):
                return routes.json_response(403, {"type": "error", "code": "forbidden_origin",
                                             "message": f"origin {headers.get('Origin')!r} is not allowed"})
            if self.shutting_down:
                return routes.json_response(503, {"type": "error", "code": "shutting_down",
                                             "message": "the server is shutting down"})
            if self.connection_count() >= self.limits.max_sessions + 16:
                return routes.json_response(503, {"type": "error", "code": "too_many_connections",
                                             "message": "too many open connections"})
            return None  # go on with the websocket handshake
        if headers.get("Upgrade", "").lower() == "websocket":
            return routes.response(404, "the websocket endpoint is /ws\n")
        if route == "/healthz":
            health = self.health()
            return routes.json_response(200 if health["status"] == "ok" else 503, health)
        if route == "/metrics":
            if self.security.token and not self.security.token_ok(path, headers):
                return routes.response(401, "token required\n")
            return routes.response(200, telemetry.render(), "text/plain; version=0.0.4; charset=utf-8")
        return routes.static_file(self.web_dir, path)

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
        await self.workers.stop()
        if self._transport is not None:
            try:
                await self._transport.aclose()
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
    return [f"engine:{os.path.basename(e.model_path)}@{e.device}" for e in api.loaded_engines()]


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
