"""The catalog of stage types: every built-in stage module of this package, found and imported
on first use, plus the operator's plugin modules (`--plugin`), looked up by their YAML `type:`."""
from __future__ import annotations

import importlib
import pkgutil
import threading

from streamkit.stage import REGISTRY, Stage, StageConfig, StageContext

_lock = threading.Lock()
_discovered = False


def _discover_builtin() -> None:
    global _discovered
    with _lock:
        if _discovered:
            return
        import streamkit.stages as pkg

        for info in pkgutil.iter_modules(pkg.__path__):
            if info.name != "catalog":
                importlib.import_module(f"{pkg.__name__}.{info.name}")
        _discovered = True


def load_plugins(modules: list[str]) -> None:
    """Import operator-named modules so their @register_stage classes become available."""
    for module in modules:
        importlib.import_module(module)


def stage_types() -> dict[str, type[Stage]]:
    _discover_builtin()
    return dict(REGISTRY)


def get_stage_class(type_name: str) -> type[Stage]:
    types = stage_types()
    try:
        return types[type_name]
    except KeyError:
        raise KeyError(f"unknown stage type {type_name!r}; known types: {', '.join(sorted(types))}") from None


def build_stage(config: StageConfig, context: StageContext) -> Stage:
    """The one place a configured stage is constructed (sessions, stage workers, the server's preload)."""
    return get_stage_class(config.type)(config, context)
