"""Admission and limits: shared token, origin allow-list, session count, message rate."""

from __future__ import annotations

import hmac
import ipaddress
import time
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit


@dataclass
class Limits:
    max_message: int = 1 << 20  # bytes per websocket message; over it: error + close 1009
    max_sessions: int = 64  # concurrent websocket connections on /ws
    rate: float = 400.0  # messages per second per connection (token bucket refill)
    burst: int = 800  # bucket size
    send_timeout: float = 30.0  # a client that reads nothing for this long is closed (slow consumer)
    out_queue: int = 256  # messages queued per connection before backpressure reaches the pipeline
    max_video_pixels: int = 4096 * 4096  # larger JPEGs are refused before decoding
    metrics_interval: float = 1.0  # seconds between {"type":"metrics"} events; 0 disables
    shutdown_timeout: float = 30.0  # SIGTERM: how long open sessions get to flush, in all
    # a client's stop: the flush goes on while the pipeline sends something at least this often
    flush_stall_timeout: float = 30.0


@dataclass
class Security:
    token: str | None = None
    allow_origins: list[str] = field(default_factory=list)  # "*" allows any

    def token_ok(self, path: str, headers) -> bool:
        if not self.token:
            return True
        supplied = request_token(path, headers)
        return supplied is not None and hmac.compare_digest(supplied.encode(), self.token.encode())

    def origin_ok(self, origin: str | None, host: str | None) -> bool:
        """No Origin header (a non-browser client) is allowed; a browser page must come from this
        server itself (same host:port) or from an allow-listed origin."""
        if origin is None:
            return True
        if "*" in self.allow_origins:
            return True
        if origin in self.allow_origins:
            return True
        if host:
            parts = urlsplit(origin)
            if parts.scheme in ("http", "https") and parts.netloc.lower() == host.lower():
                return True
        return False


def request_token(path: str, headers) -> str | None:
    auth = headers.get("Authorization") if headers is not None else None
    if auth and auth.lower().startswith("bearer "):
        return auth[7:].strip()
    query = parse_qs(urlsplit(path).query)
    values = query.get("token")
    return values[0] if values else None


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class RateLimiter:
    """Token bucket: `rate` messages per second, bursts up to `burst`."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = float(burst)
        self.stamp = time.monotonic()

    def allow(self) -> bool:
        if self.rate <= 0:
            return True
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False
