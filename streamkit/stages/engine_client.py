"""The decode engine a text-generating stage (llm, describe) talks to, from its `engine` option.

`local` (default): the process-wide engine of `model` (streamkit.engine.get_engine), loaded once
and shared by every session. A redis:// URL: `streamkit worker --stage engine` processes reached
over Redis Streams (`streamkit serve --engine URL` sets it on every stage left at `local`)."""
from __future__ import annotations

from typing import Any

REMOTE_SCHEMES = ("redis://", "rediss://", "unix://")


def make_engine(engine: str, model: str | None = None, device: str | None = None,
                engine_prefix: str | None = None) -> Any:
    """An object with `generate(prompt, params)` (an async iterator of text pieces)."""
    if engine.startswith(REMOTE_SCHEMES):
        from streamkit.engine.service.remote import RemoteEngine

        if engine_prefix:
            return RemoteEngine(engine, prefix=engine_prefix, model=model)
        return RemoteEngine(engine, model=model)
    if engine != "local":
        raise ValueError(f"engine must be 'local' or a redis:// URL, got {engine!r}")
    from streamkit.engine import get_engine

    return get_engine(model_path=model, device=device)
