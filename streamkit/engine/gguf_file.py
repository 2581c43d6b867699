"""A GGUF file's header read in bulk: its metadata as Python values and its tensors as views of the
memory-mapped file.

gguf-py's `GGUFReader` keeps every metadata value as numpy views of the file, a few for each string
of an array: the 1.5B's header (151,936 tokens and 151,387 merges) took it 6.9 s and SmolLM2's 2.8 s,
a quarter of the 1.5B's load (Intel Xeon with AMX, 2026-12-07). This reads the same header with
`struct` and `memoryview` slices, tenths of a second, into the values `GGUFReader`'s `contents()`
gives (strings decoded as strict UTF-8, numbers as Python numbers, arrays as lists); gguf-py stays
the source of the tensor types' block sizes and of the quantization code.

A model file is untrusted input: every count, length and offset is checked against the file before
it is used, and anything else than a little-endian GGUF of version 2 or 3 raises `GGUFFormatError`
naming what was wrong and at which byte.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS

# GGUF's metadata value types (gguf.GGUFValueType) -> struct format of one value, which is also the
# numpy dtype an array of them is read as
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
# tensor types stored as plain numbers, and their numpy types (as GGUFReader gives them); every
# other type is blocks, read as uint8 [..., bytes of a row]
_PLAIN = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8, "I16": np.int16,
          "I32": np.int32, "I64": np.int64}


class GGUFFormatError(ValueError):
    """The file is not a GGUF this reader takes: the message names the field and its byte offset."""


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    tensor_type: Any  # gguf.GGMLQuantizationType
    dims: tuple[int, ...]  # as GGUF lists them: the fastest-varying dimension first
    data: np.ndarray  # read-only view of the file: numpy's order, rows of blocks as uint8 bytes

    @property
    def shape(self) -> tuple[int, ...]:
        """The tensor's shape in numpy's order (GGUF's dims reversed)."""
        return tuple(reversed(self.dims))


class GGUFFile:
    """Metadata (`metadata`, keys in file order, GGUFReader's `GGUF.version`, `GGUF.tensor_count` and
    `GGUF.kv_count` first) and tensors (`tensors`, in file order) of the GGUF at `path`."""

    def __init__(self, path: str):
        self.path = path
        if os.path.getsize(path) == 0:  # which numpy cannot map
            raise self._error("an empty file", 0)
        self._map = np.memmap(path, dtype=np.uint8, mode="r")
        self._buf = memoryview(self._map)
        self._pos = 0
        if bytes(self._take(4, "the magic")) != MAGIC:
            raise self._error("no GGUF magic", 0)
        version = self._scalar(4, "the version")
        if version not in VERSIONS:
            raise self._error(f"version {version} (big-endian, or not one of {VERSIONS})", 4)
        n_tensors, n_kv = self._scalar(10, "the tensor count"), self._scalar(10, "the metadata count")
        self.metadata: dict[str, Any] = {"GGUF.version": version, "GGUF.tensor_count": n_tensors,
                                         "GGUF.kv_count": n_kv}
        for _ in range(self._count(n_kv, 12, "metadata entries")):
            at = self._pos
            key = self._string("a metadata key")
            if key in self.metadata:
                raise self._error(f"metadata key {key!r} appears twice", at)
            self.metadata[key] = self._value(self._scalar(4, f"{key}'s type"), key)
        infos = [self._tensor_info() for _ in range(self._count(n_tensors, 24, "tensor infos"))]
        names: set[str] = set()
        for at, name, *_ in infos:
            if name in names:
                raise self._error(f"tensor {name!r} appears twice", at)
            names.add(name)
        alignment = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if type(alignment) is not int or alignment <= 0 or alignment & (alignment - 1):
            raise self._error(f"general.alignment {alignment!r} is not a power of two", self._pos)
        start = (self._pos + alignment - 1) // alignment * alignment
        self.tensors = [self._tensor(start, *info) for info in infos]

    # ------------------------------------------------------------------ header fields
    def _error(self, what: str, at: int) -> GGUFFormatError:
        return GGUFFormatError(f"{self.path}: {what} at byte {at}")

    def _take(self, n: int, what: str) -> memoryview:
        if n < 0 or self._pos + n > len(self._buf):
            raise self._error(f"{what} ({n} bytes) runs past the end of the file ({len(self._buf)} bytes)", self._pos)
        out = self._buf[self._pos:self._pos + n]
        self._pos += n
        return out

    def _scalar(self, vtype: int, what: str) -> Any:
        fmt = _SCALARS[vtype]
        return struct.unpack(fmt, self._take(struct.calcsize(fmt), what))[0]

    def _count(self, n: int, min_bytes: int, what: str) -> int:
        """n items of at least min_bytes each must fit in what is left of the file"""
        if n * min_bytes > len(self._buf) - self._pos:
            raise self._error(f"{n} {what} cannot fit in the {len(self._buf) - self._pos} bytes left", self._pos)
        return n

    def _string(self, what: str) -> str:
        at = self._pos
        raw = self._take(self._scalar(10, f"{what}'s length"), what)
        try:
            return str(raw, "utf-8")
        except UnicodeDecodeError as e:
            raise self._error(f"{what} is not UTF-8 ({e.reason})", at) from None

    def _value(self, vtype: int, key: str) -> Any:
        if vtype in _SCALARS:
            return self._scalar(vtype, key)
        if vtype == _STRING:
            return self._string(key)
        if vtype != _ARRAY:
            raise self._error(f"{key} has unknown value type {vtype}", self._pos - 4)
        itype, at = self._scalar(4, f"{key}'s item type"), self._pos
        n = self._scalar(10, f"{key}'s length")
        if itype in _SCALARS:  # numbers in bulk
            dtype = np.dtype(_SCALARS[itype])
            return np.frombuffer(self._take(n * dtype.itemsize, key), dtype=dtype).tolist()
        if itype == _STRING:
            self._count(n, 8, f"strings of {key}")
            return [self._string(f"item {i} of {key}") for i in range(n)]
        if itype == _ARRAY:
            self._count(n, 12, f"arrays of {key}")
            return [self._value(_ARRAY, f"item {i} of {key}") for i in range(n)]
        raise self._error(f"{key} is an array of unknown type {itype}", at - 4)

    def _tensor_info(self) -> tuple[int, str, tuple[int, ...], int, int]:
        at = self._pos
        name = self._string("a tensor name")
        n_dims = self._scalar(4, f"{name}'s dimension count")
        if not 1 <= n_dims <= MAX_DIMS:
            raise self._error(f"tensor {name!r} has {n_dims} dimensions (1 to {MAX_DIMS} allowed)", at)
        dims = tuple(self._scalar(10, f"{name}'s dimensions") for _ in range(n_dims))
        return at, name, dims, self._scalar(4, f"{name}'s type"), self._scalar(10, f"{name}'s offset")

    # ------------------------------------------------------------------ tensors
    def _tensor(self, start: int, at: int, name: str, dims: tuple[int, ...], raw_type: int,
                offset: int) -> GGUFTensor:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        try:
            ttype = GGMLQuantizationType(raw_type)
        except ValueError:
            raise self._error(f"tensor {name!r} has unknown type {raw_type}", at) from None
        block, block_bytes = GGML_QUANT_SIZES[ttype]
        if min(dims) < 1 or dims[0] % block:
            raise self._error(f"tensor {name!r} ({ttype.name}) has dimensions {list(dims)} (rows of whole "
                              f"blocks of {block} expected)", at)
        n_bytes = int(np.prod(dims, dtype=object)) // block * block_bytes
        begin = start + offset
        if begin + n_bytes > len(self._buf):
            raise self._error(f"tensor {name!r}'s {n_bytes} bytes at {begin} run past the end of the file "
                              f"({len(self._buf)} bytes)", at)
        shape = tuple(reversed(dims))
        if ttype.name in _PLAIN:
            data = np.frombuffer(self._map, _PLAIN[ttype.name], n_bytes // np.dtype(_PLAIN[ttype.name]).itemsize,
                                 begin).reshape(shape)
        else:
            data = self._map[begin:begin + n_bytes].reshape(*shape[:-1], shape[-1] // block * block_bytes)
        return GGUFTensor(name, ttype, dims, data)


def read_metadata(path: str) -> dict[str, Any]:
    """The metadata of the GGUF at `path` (GGUFFile.metadata)."""
    return GGUFFile(path).metadata
