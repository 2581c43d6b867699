"""The GGUF header reader (streamkit/engine/gguf_file.py): the same metadata and tensors as gguf-py's
GGUFReader on real and written files, and a clear GGUFFormatError for every malformed header."""
import struct

import gguf
import numpy as np
import pytest
from gguf_files import write_model

from streamkit.engine import default_model_path
from streamkit.engine.architectures import TENSOR_TYPES, UnsupportedModelError
from streamkit.engine.gguf_file import GGUFFile, GGUFFormatError
from streamkit.engine.gguf_loader import load_gguf


def _reader_view(path: str) -> tuple[dict, list]:
    r = gguf.GGUFReader(path)
    return {k: f.contents() for k, f in r.fields.items()}, r.tensors


def _assert_same_as_gguf(path: str) -> None:
    ref_meta, ref_tensors = _reader_view(path)
    f = GGUFFile(path)
    assert list(f.metadata) == list(ref_meta)
    for key, want in ref_meta.items():
        got = f.metadata[key]
        assert got == want and type(got) is type(want), key
    assert [t.name for t in f.tensors] == [t.name for t in ref_tensors]
    for mine, ref in zip(f.tensors, ref_tensors):
        assert mine.tensor_type == ref.tensor_type and mine.dims == tuple(ref.shape.tolist()), ref.name
        assert mine.data.dtype == ref.data.dtype and mine.data.shape == ref.data.shape, ref.name
        assert np.array_equal(mine.data, ref.data), ref.name


def test_the_shipped_model_reads_as_gguf_reads_it():
    """SmolLM2's 49,152-token vocabulary, merges, chat template and 272 Q4_1 / Q8_0 / F32 tensors."""
    _assert_same_as_gguf(default_model_path())


def test_every_tensor_type_and_value_type_reads_as_gguf_reads_them(tmp_path):
    p = tmp_path / "m.gguf"
    write_model(p, extra_types=tuple(TENSOR_TYPES))
    w = gguf.GGUFWriter(str(tmp_path / "v.gguf"), "llama")
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_int32("t.i32", -(2**31))
    w.add_uint64("t.u64", 2**64 - 1)
    w.add_int64("t.i64", -(2**63))
    w.add_float64("t.f64", 1e-300)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo ✓")
    w.add_array("t.floats", [0.5, -1.25, 3.0])
    w.add_array("t.strs", ["a", "", "ñ"])
    w.add_array("t.empty", [])
    w.add_tensor("x", np.arange(12, dtype=np.float32).reshape(3, 4))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    _assert_same_as_gguf(str(p))
    _assert_same_as_gguf(str(tmp_path / "v.gguf"))
    assert GGUFFile(str(tmp_path / "v.gguf")).metadata["t.u64"] == 2**64 - 1


# ---------------------------------------------------------------------- malformed headers
def _s(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def _header(kvs: bytes = b"", n_kv: int = 0, infos: bytes = b"", n_tensors: int = 0, version: int = 3) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv) + kvs + infos


def _info(name: str, dims: tuple[int, ...], ttype: int = 0, offset: int = 0) -> bytes:
    return _s(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", ttype, offset)


def _u32(key: str, v: int) -> bytes:
    return _s(key) + struct.pack("<II", 4, v)


GOOD = _header(_u32("general.alignment", 32), 1, _info("w", (4, 2)), 1)
GOOD_FILE = GOOD + b"\0" * (-len(GOOD) % 32) + np.arange(8, dtype=np.float32).tobytes()

MALFORMED = {
    "bad magic": (b"GGUG" + GOOD_FILE[4:], "no GGUF magic"),
    "big-endian": (b"GGUF" + struct.pack(">I", 3) + GOOD_FILE[8:], "version 50331648"),
    "version 1": (_header(version=1), "version 1"),
    "empty": (b"", "empty file"),
    "string past the end": (_header(struct.pack("<Q", 100) + b"k" * 20, 1), "runs past the end"),
    "huge string length": (_header(struct.pack("<Q", 2**62) + b"k" * 20, 1), "runs past the end"),
    "key not UTF-8": (_header(_s(b"\xff\xfe") + struct.pack("<II", 4, 1), 1), "not UTF-8"),
    "duplicate key": (_header(_u32("a", 1) + _u32("a", 2), 2), "'a' appears twice"),
    "unknown value type": (_header(_s("k") + struct.pack("<II", 13, 0), 1), "unknown value type 13"),
    "huge array": (_header(_s("k") + struct.pack("<IIQ", 9, 8, 2**40), 1), "cannot fit"),
    "huge numeric array": (_header(_s("k") + struct.pack("<IIQ", 9, 4, 2**40), 1), "runs past the end"),
    "unknown array type": (_header(_s("k") + struct.pack("<IIQ", 9, 42, 1), 1), "array of unknown type 42"),
    "too many entries": (_header(n_kv=2**50), "cannot fit"),
    "too many tensors": (_header(n_tensors=2**40), "cannot fit"),
    "five dimensions": (_header(infos=_info("w", (1, 1, 1, 1, 1)), n_tensors=1), "5 dimensions"),
    "zero dimensions": (_header(infos=_info("w", ()), n_tensors=1), "0 dimensions"),
    "empty dimension": (_header(infos=_info("w", (4, 0)), n_tensors=1), r"dimensions \[4, 0\]"),
    "partial block": (_header(infos=_info("w", (16, 2), ttype=8), n_tensors=1), "whole blocks of 32"),
    "unknown tensor type": (_header(infos=_info("w", (4, 2), ttype=1000), n_tensors=1), "unknown type 1000"),
    "bad alignment": (_header(_u32("general.alignment", 24), 1), "not a power of two"),
    "duplicate tensor": (_header(infos=_info("w", (4, 2)) * 2, n_tensors=2) + b"\0" * 64, "'w' appears twice"),
    "data past the end": (GOOD_FILE[:-4], "run past the end"),
    "offset past the end": (_header(_u32("general.alignment", 32), 1, _info("w", (4, 2), offset=2**40), 1) + b"\0" * 64,
                            "run past the end"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_headers_name_what_is_wrong_and_where(tmp_path, case):
    data, message = MALFORMED[case]
    p = tmp_path / "m.gguf"
    p.write_bytes(data)
    with pytest.raises(GGUFFormatError, match=message) as e:
        GGUFFile(str(p))
    assert str(p) in str(e.value) and " at byte " in str(e.value)
    with pytest.raises(UnsupportedModelError, match="not a readable GGUF"):
        load_gguf(str(p), progress=False)


def test_a_good_handmade_file_reads():
    """The file the malformed cases break, whole: their errors come from the break, not the base."""
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".gguf") as f:
        f.write(GOOD_FILE)
        f.flush()
        g = GGUFFile(f.name)
        assert g.metadata["general.alignment"] == 32
        assert g.tensors[0].shape == (2, 4) and g.tensors[0].data.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_every_truncation_of_a_real_header_is_a_format_error(tmp_path):
    """Cut anywhere in a written model's header (and into its tensors), the reader raises
    GGUFFormatError, never an IndexError or struct.error from deep inside."""
    src = tmp_path / "m.gguf"
    write_model(src)
    data = src.read_bytes()
    data_end = max(t.data_offset + t.n_bytes for t in gguf.GGUFReader(str(src)).tensors)
    p = tmp_path / "cut.gguf"
    cuts = sorted(set(range(0, 400)) | set(range(400, data_end, 997)) | {data_end - 1})
    for cut in cuts:
        p.write_bytes(data[:cut])
        with pytest.raises(GGUFFormatError):
            GGUFFile(str(p))
