"""Where streamkit keeps what it makes once and reuses: models joined from their packages and the
compiled native kernels.

    root        $STREAMKIT_CACHE_DIR, else $XDG_CACHE_HOME/streamkit, else ~/.cache/streamkit
    models_dir  $STREAMKIT_MODEL_CACHE, else root/models
    native_dir  root/native
"""

from __future__ import annotations

import os
from pathlib import Path


def root() -> Path:
    base = os.environ.get("STREAMKIT_CACHE_DIR")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "streamkit"


def models_dir() -> Path:
    """Models joined from packages (the GGUFs, Kokoro, Whisper base)."""
    return Path(os.environ.get("STREAMKIT_MODEL_CACHE") or root() / "models")


def native_dir() -> Path:
    """The native kernel libraries, one per instruction-set path and source version."""
    return root() / "native"
