"""Plain HTTP on the websocket port: web/ files, GET /healthz, GET /metrics."""

from __future__ import annotations

import json
import mimetypes
from http import HTTPStatus
from pathlib import Path
from urllib.parse import unquote, urlsplit

from websockets.datastructures import Headers
from websockets.http11 import Response

from streamkit.shipped import shipped_dir

CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".json": "application/json",
    ".png": "image/png",
    ".svg": "image/svg+xml",
    ".ico": "image/x-icon",
    ".wav": "audio/wav",
    ".txt": "text/plain; charset=utf-8",
}


def response(status: int, body: bytes | str, content_type: str = "text/plain; charset=utf-8",
             extra: dict[str, str] | None = None) -> Response:
    if isinstance(body, str):
        body = body.encode()
    headers = Headers()
    headers["Content-Type"] = content_type
    headers["Content-Length"] = str(len(body))
    headers["Cache-Control"] = "no-store"
    headers["X-Content-Type-Options"] = "nosniff"
    for k, v in (extra or {}).items():
        headers[k] = v
    return Response(status, HTTPStatus(status).phrase, headers, body)


def json_response(status: int, obj) -> Response:
    return response(status, json.dumps(obj, indent=1) + "\n", "application/json")


def default_web_dir() -> Path:
    return shipped_dir("web")


def static_file(web_dir: Path, raw_path: str) -> Response:
    path = unquote(urlsplit(raw_path).path)
    if path in ("", "/"):
        path = "/index.html"
    root = web_dir.resolve()
    try:
        target = (root / path.lstrip("/")).resolve()
    except (OSError, ValueError):
        return response(404, "not found\n")
    if not target.is_relative_to(root) or not target.is_file():
        return response(404, "not found\n")
    ctype = CONTENT_TYPES.get(target.suffix.lower()) or mimetypes.guess_type(target.name)[0] or "application/octet-stream"
    extra = {}
    if target.suffix == ".html":
        # the page talks only to this server; microphone and camera are asked for by the page itself
        extra["Content-Security-Policy"] = (
            "default-src 'self'; connect-src 'self' ws: wss:; img-src 'self' data: blob:; "
            "media-src 'self' blob:; style-src 'self' 'unsafe-inline'; worker-src 'self' blob:")
    return response(200, target.read_bytes(), ctype, extra)
