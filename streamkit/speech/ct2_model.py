"""Reading the variables of a CTranslate2 `model.bin` (binary version 6, as CTranslate2 4.x writes it).

The layout (ctranslate2/specs/model_spec.py, `_serialize`): uint32 version, the spec's name,
uint32 revision, uint32 variable count, then per variable its name, uint8 rank, uint32 dims,
uint8 dtype id, uint32 byte count and the bytes; strings are uint16 length (with a NUL) + UTF-8.
The file comes from a package, so it is untrusted: every length is checked against the file and
anything unexpected is a ValueError that names the file and the variable.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

VERSION = 6
# CTranslate2's DataType enum (include/ctranslate2/types.h); bfloat16 (5) has no numpy type
_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}


def read_variables(path: str | Path, prefix: str = "") -> dict[str, np.ndarray]:
    """The variables whose names start with `prefix`, as read-only arrays over a memory map."""
    path = Path(path)
    data = np.memmap(path, np.uint8, mode="r")
    pos = 0

    def take(fmt: str) -> int:
        nonlocal pos
        size = struct.calcsize(fmt)
        if pos + size > len(data):
            raise ValueError(f"{path}: truncated at byte {pos}")
        (value,) = struct.unpack_from(fmt, data, pos)
        pos += size
        return value

    def string() -> str:
        nonlocal pos
        n = take("<H")
        if n == 0 or pos + n > len(data):
            raise ValueError(f"{path}: bad string length {n} at byte {pos}")
        text = bytes(data[pos:pos + n - 1]).decode("utf-8", errors="replace")
        pos += n
        return text

    version = take("<I")
    if version != VERSION:
        raise ValueError(f"{path}: CTranslate2 binary version {version} is not supported (only {VERSION})")
    string()  # the spec's name
    take("<I")  # its revision
    out: dict[str, np.ndarray] = {}
    for _ in range(take("<I")):
        name = string()
        dims = [take("<I") for _ in range(take("<B"))]
        dtype_id, nbytes = take("<B"), take("<I")
        if pos + nbytes > len(data):
            raise ValueError(f"{path}: variable {name!r} runs past the end of the file")
        if name.startswith(prefix):
            dtype = _DTYPES.get(dtype_id)
            if dtype is None:
                raise ValueError(f"{path}: variable {name!r} has data type id {dtype_id}, not supported here")
            count = int(np.prod(dims)) if dims else 1
            if count * np.dtype(dtype).itemsize != nbytes:
                raise ValueError(f"{path}: variable {name!r} holds {nbytes} bytes, not {dims} x {np.dtype(dtype)}")
            out[name] = np.frombuffer(data, dtype, count, pos).reshape(dims)
        pos += nbytes
    return out


def dense(variables: dict[str, np.ndarray], name: str) -> np.ndarray:
    """A weight as float32: int8 rows are scaled back by their `<name>_scale` (127 / row max)."""
    try:
        w = variables[name]
    except KeyError:
        raise ValueError(f"the model has no variable {name!r}") from None
    if w.dtype == np.int8:
        scale = variables.get(name + "_scale")
        if scale is None or scale.shape != (w.shape[0],):
            raise ValueError(f"int8 variable {name!r} has no per-row {name}_scale")
        return w.astype(np.float32) / scale.astype(np.float32).reshape(-1, *([1] * (w.ndim - 1)))
    return w.astype(np.float32)
