"""Server metrics on top of the process registry, and the /metrics text.

Rendered by GET /metrics (Prometheus text format 0.0.4):
  streamkit_sessions                      open sessions (started, not yet ended)
  streamkit_connections                   open websocket connections
  streamkit_connections_total             connections accepted
  streamkit_ws_messages_in_total{kind}    client messages by kind (audio, video, text)
  streamkit_ws_messages_out_total{kind}   server messages by kind (audio, json)
  streamkit_ws_errors_total{code}         error events sent to clients, by code
  streamkit_server_dropped_total{kind}    server-side drops by the documented policy
                                          (video input frames, detections, coalesced partials)
  streamkit_stage_frames_in_total / _out_total / streamkit_stage_latency_seconds  (runtime)
  streamkit_engine_tokens_per_second / streamkit_engine_batch_size                (decode engine)
"""

from __future__ import annotations

import sys
import weakref

from streamkit.metrics import REGISTRY

SESSIONS = REGISTRY.gauge("streamkit_sessions", "Open streaming sessions")
CONNECTIONS = REGISTRY.gauge("streamkit_connections", "Open websocket connections")
CONNECTIONS_TOTAL = REGISTRY.counter("streamkit_connections_total", "Websocket connections accepted")
MESSAGES_IN = REGISTRY.counter("streamkit_ws_messages_in_total", "Client websocket messages by kind")
MESSAGES_OUT = REGISTRY.counter("streamkit_ws_messages_out_total", "Server websocket messages by kind")
ERRORS = REGISTRY.counter("streamkit_ws_errors_total", "Error events sent to clients by code")
SERVER_DROPPED = REGISTRY.counter("streamkit_server_dropped_total", "Messages the server dropped by policy")
ENGINE_TPS = REGISTRY.gauge("streamkit_engine_tokens_per_second", "Decode engine throughput")
ENGINE_BATCH = REGISTRY.gauge("streamkit_engine_batch_size", "Sequences in the engine's last decode step")
ENGINE_SPEC = REGISTRY.gauge("streamkit_engine_spec_acceptance",
                             "Share of speculative draft tokens the model accepted (speculative decoding)")

_servers: "weakref.WeakSet" = weakref.WeakSet()


def track(server) -> None:
    _servers.add(server)


def _sessions():
    return {(): float(sum(s.session_count() for s in list(_servers)))}


def _connections():
    return {(): float(sum(s.connection_count() for s in list(_servers)))}


def _engine_values(key: str):
    api = sys.modules.get("streamkit.engine.api")  # never import the engine just to report on it
    out = {}
    if api is None:
        return out
    for engine in api.loaded_engines():
        try:
            stats = engine.stats()
        except Exception:
            continue
        labels = (("device", str(engine.device)), ("model", engine.model_path.rsplit("/", 1)[-1]))
        out[labels] = float(stats.get(key, 0) or 0)
    return out


SESSIONS.add_callback(_sessions)
CONNECTIONS.add_callback(_connections)
ENGINE_TPS.add_callback(lambda: _engine_values("tokens_per_s"))
ENGINE_BATCH.add_callback(lambda: _engine_values("batch_size"))
ENGINE_SPEC.add_callback(lambda: _engine_values("spec_acceptance"))


def render() -> str:
    return REGISTRY.render()
