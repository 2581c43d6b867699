"""Where the files shipped beside the code are: the browser page and the pipelines.

An installed wheel has them inside the package (streamkit/web, streamkit/pipelines: see setup.py);
a checkout, editable install included, has them at the top of the repository."""
from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def shipped_dir(name: str) -> Path:
    """`web` or `pipelines`: the installed copy when there is one, else the checkout's."""
    for candidate in (_PACKAGE / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"streamkit's {name}/ is neither in {_PACKAGE} nor in {_PACKAGE.parent}: "
                            "a broken install?")
