"""The native CPU kernels (sk_kernels.c and its sk_*.h): built on first use with the system C compiler, cached.

One library per instruction-set path, each compiled with explicit -m flags (-mtune=native only
tunes), at run time (like Triton or torch's cpp extensions), not at install time:
  amx     AVX-512 + AVX512_BF16 + AMX tiles: batched steps multiply bf16 strips on AMX, each
          operand as two bf16 terms (~16 bits: closer to fp32 than the int8 path), 4-bit weights as
          their exact integers scaled per block (sk_amx4.h) (Intel Sapphire Rapids and later);
  avx512  AVX-512 without AMX: batched steps in int8 (vpdpbusd, two-term activations) where the CPU
          has AVX512_VNNI, else vdpbf16ps where it has AVX512_BF16 (AMD Zen 4/5, Cooper Lake), else
          fp32 FMAs over strips dequantized once per step;
  avx2    AVX2 + FMA + F16C, no AVX-512 instruction anywhere (most laptops, many CI runners):
          batched steps on int16 activations, with vpdpwssd where the CPU has AVX-VNNI (Intel
          client cores since Alder Lake, AMD Zen 5), else vpmaddwd.
The best path the CPU has is the default; STREAMKIT_NATIVE_ISA=avx512|avx2 (or the engine option
`native_isa`) forces a lower one, and asking for a path the CPU lacks is a ValueError. A path as a CPU
without some of its optional flags builds it is named "avx2 without avx_vnni" (flags joined by "+"):
what a laptop without AVX-VNNI runs, built and measured on a CPU that has it. Each build
takes a few seconds once; the result is cached under streamkit.cache.native_dir() (default
~/.cache/streamkit/native), keyed by the path, the sources, the compiler and the flags. Where there
is no compiler, no AVX2/FMA/F16C or STREAMKIT_NATIVE=0, `load()` returns None and the engine uses
its torch path.

The kernels run on their own small thread pool (sk_pool.h), not OpenMP; the engine passes the
thread count for each step.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterable
from pathlib import Path

from streamkit import cache, cores

log = logging.getLogger("streamkit.engine")

SOURCE = Path(__file__).with_name("sk_kernels.c")
# an undeclared function is an error, not a warning to find at load time (as GCC 14 has it)
CFLAGS = ["-O3", "-pthread", "-fPIC", "-shared", "-ffp-contract=off", "-fno-math-errno", "-fvisibility=hidden",
          "-mtune=native", "-Werror=implicit-function-declaration"]
ISAS = ("amx", "avx512", "avx2")  # best first
_AVX2 = ["-mavx2", "-mfma", "-mf16c", "-mbmi2"]
_AVX512 = [*_AVX2, "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512cd"]
# flags a path uses where the CPU has them but runs without (the batched int8 kernels)
OPTIONAL_FLAGS = ("-mavxvnni", "-mavx512vnni")
# /proc/cpuinfo flags each path needs
REQUIRES = {"avx2": {"avx2", "fma", "f16c", "bmi2"}}
REQUIRES["avx512"] = REQUIRES["avx2"] | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"}
REQUIRES["amx"] = REQUIRES["avx512"] | {"avx512_bf16", "amx_tile", "amx_bf16"}
# weight formats understood by the kernels (block layouts exactly as in GGUF files)
FORMATS = {"F32": 0, "Q4_1": 1, "Q8_0": 2, "Q4_0": 3, "Q4_K": 4, "Q6_K": 5, "Q5_K": 6, "F16": 7, "BF16": 8}
# sk_init's capability bits
CAP_AMX, CAP_BF16, CAP_AVX512, CAP_INT8, CAP_INT16, CAP_AVXVNNI, CAP_GREEDY = 2, 4, 8, 16, 32, 64, 128

_lock = threading.RLock()
_libs: dict[str, ctypes.CDLL | None] = {}
_caps: dict[str, int] = {}
_errors: dict[str, str] = {}
_default: list[str | None] = []  # [the default path] once chosen


# Builds of a path as a CPU without some of the features this one has would get them (variant()):
# name -> (path, CPU flags left out)
_variants: dict[str, tuple[str, frozenset[str]]] = {}


def variant(isa: str, without: Iterable[str]) -> str:
    """A name under which load(), caps(), describe() and NativeLlamaModel(isa=...) take path `isa` as a
    CPU without the flags `without` builds it: the tests run the kernels of a laptop without AVX-VNNI,
    or of an AVX-512 CPU without VNNI or BF16, on a CPU that has them."""
    if isa not in ISAS:
        raise ValueError(f"unknown native instruction-set path {isa!r}; expected one of {ISAS}")
    drop = frozenset(without)
    name = f"{isa} without {'+'.join(sorted(drop))}"
    _variants[name] = (isa, drop)
    return name


def _base(name: str) -> tuple[str, frozenset[str]]:
    """The path a name builds and the CPU flags its build leaves out (none for a plain path)."""
    return _variants.get(name, (name, frozenset()))


def missing(isa: str) -> list[str]:
    """The CPU flags this machine lacks for `isa` (empty: it can run it)."""
    isa = _base(isa)[0]
    if isa not in ISAS:
        raise ValueError(f"unknown native instruction-set path {isa!r}; expected one of {ISAS}")
    return sorted(REQUIRES[isa] - cores.cpu_flags())


def isa_flags(isa: str, cpu: set[str] | None = None) -> list[str]:
    """The -m flags `isa` is compiled with on a CPU with flags `cpu` (avx512 uses bf16 dot
    products where the CPU has them)."""
    cpu = set(cores.cpu_flags()) if cpu is None else cpu
    if isa == "avx2":  # the batched int8 kernel on ymm where the CPU has AVX-VNNI
        return [*_AVX2, "-mavxvnni"] if "avx_vnni" in cpu else list(_AVX2)
    flags = list(_AVX512)
    if isa == "amx" or "avx512_bf16" in cpu:
        flags.append("-mavx512bf16")
    if "avx512_vnni" in cpu:  # the batched int8 path (avx512) and the few-rows one (both)
        flags.append("-mavx512vnni")
    if isa == "amx":
        flags += ["-mamx-tile", "-mamx-bf16"]
    return flags


def _compiler() -> str | None:
    cc = os.environ.get("CC")
    return cc if cc and shutil.which(cc) else (shutil.which("gcc") or shutil.which("cc"))


def _build(cc: str, isa: str, flags: list[str]) -> Path:
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    key = hashlib.sha256()
    sources = [p.read_bytes() for p in sorted(SOURCE.parent.glob("sk_*.[ch]"))]
    for part in (*sources, version.encode(), isa.encode(), " ".join(CFLAGS + flags).encode()):
        key.update(part)
    out = cache.native_dir() / f"sk_kernels-{isa}-{key.hexdigest()[:16]}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    log.info("engine: compiling the %s native kernels with %s (once per machine) ...", isa, cc)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        p = subprocess.run([cc, *CFLAGS, *flags, str(SOURCE), "-o", tmp, "-lm"], capture_output=True, text=True,
                           timeout=300)
        if p.returncode != 0:
            raise RuntimeError(f"{cc} failed: {p.stderr.strip()[-800:]}")
        os.replace(tmp, out)  # atomic: concurrent builders (server + workers) never see half a file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


# sk_deliver_fn: a decode loop's hand-over between two of its steps (the steps run so far; nonzero ends it)
DELIVER = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)


def _declare(lib: ctypes.CDLL) -> None:
    P, I, F, L, D = ctypes.c_void_p, ctypes.c_int, ctypes.c_float, ctypes.c_long, DELIVER
    sig = {
        "sk_init": ([], I),
        "sk_gemv_chunks": ([I], I),
        "sk_gemv_own_x": ([I], I),
        "sk_flag_barrier_max": ([I], I),
        "sk_model_new": ([I, I, I, I, I, I, I, F, F], P),
        "sk_model_free": ([P], None),
        "sk_model_set_globals": ([P, I, P, P, I, P, P, P, P, P, I], None),
        "sk_model_set_layer": ([P, I, P, P, I, P, P, I, P, P], None),
        "sk_model_add_part": ([P, I, I, I, I, P, P], I),
        "sk_model_set_qkv_bias": ([P, I, P], None),
        "sk_model_set_kv": ([P, P, P, L, I, I, P, P], I),
        "sk_forward": ([P, I, P, P, P, P, P, I, I, P, P, I, I, I, I], I),
        "sk_forward_argmax": ([P, I, P, P, P, P, P, I, I, P, P, P, I, I, I, I], I),
        "sk_decode_greedy": ([P, I, I, P, P, P, I, P, I, P, P, P, I, I, I, I, P, I, D], I),
        "sk_decode_sample": ([P, I, I, P, P, P, I, P, I, P, P, P, P, P, P, P, P, P, I, I, I, I, P, I, D], I),
        "sk_sample_rows": ([P, I, I, P, P, P, P, P, P, P, P, I], I),
        "sk_matmul": ([I, P, P, I, I, I, P, P, I, I, I, I, I], I),
        "sk_greedy_head": ([I, P, P, I, I, I, P, P, I], I),
        "sk_head4_argmax": ([I, P, P, I, I, I, P, P, I, I, I], I),
        "sk_dequant": ([I, P, P, I, I, P], None),
        "sk_repack": ([I, P, L, P, P], I),
        "sk_requantize_q4_0": ([I, P, P, I, I, P], I),
        "sk_repack_q5_0": ([P, L, P, P], None),
        "sk_read_sum": ([P, L, I], L),
    }
    for name, (args, res) in sig.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, res


def _load_isa(isa: str) -> ctypes.CDLL | None:
    """The library of one path, built if needed; None with the reason in _errors[isa]."""
    if isa in _libs:
        return _libs[isa]
    _libs[isa] = None
    lack = missing(isa)
    if lack:
        _errors[isa] = f"this CPU lacks {', '.join(lack)} (needed by the {isa} path)"
        return None
    cc = _compiler()
    if cc is None:
        _errors[isa] = "no C compiler (gcc) found"
        return None
    base, drop = _base(isa)
    try:
        flags = isa_flags(base, set(cores.cpu_flags()) - drop)
        try:
            path = _build(cc, base, flags)
        except RuntimeError:
            optional = [f for f in flags if f in OPTIONAL_FLAGS]
            if not optional:
                raise
            # an older compiler without them (AVX-VNNI needs GCC 11): the path still runs, slower
            log.warning("engine: %s could not build the %s kernels with %s; building without", cc, isa,
                        " ".join(optional))
            path = _build(cc, base, [f for f in flags if f not in OPTIONAL_FLAGS])
        lib = ctypes.CDLL(str(path))
        _declare(lib)
        caps = lib.sk_init()
    except Exception as e:  # compile error, ...
        _errors[isa] = f"native kernels ({isa}) unavailable: {e}"
        log.warning("engine: %s", _errors[isa])
        return None
    if isa == "amx" and not caps & CAP_AMX:
        _errors[isa] = "the kernel did not grant the AMX tile state (arch_prctl)"
        return None
    _libs[isa], _caps[isa] = lib, caps
    log.info("engine: native kernels loaded from %s: %s", path, describe(isa))
    return lib


def requested_isa(isa: str | None = None) -> str | None:
    """`isa`, else $STREAMKIT_NATIVE_ISA; None (or "auto"/"") means the best this CPU has."""
    isa = isa if isa is not None else os.environ.get("STREAMKIT_NATIVE_ISA", "")
    isa = isa.strip().lower()
    if isa in ("", "auto"):
        return None
    if isa in ISAS or isa in _variants:
        return isa
    base, without, drop = isa.partition(" without ")
    if base in ISAS and without and drop:
        return variant(base, drop.split("+"))
    raise ValueError(f"STREAMKIT_NATIVE_ISA / native_isa must be auto, one of {', '.join(ISAS)}, or a path as a "
                     f"CPU without some flags builds it ('avx2 without avx_vnni'), not {isa!r}")


def resolve_isa(isa: str | None = None) -> str | None:
    """The path to run: a requested one (ValueError where this CPU or compiler cannot run it), else
    the best one that loads; None where none does (or STREAMKIT_NATIVE=0)."""
    want = requested_isa(isa)
    if os.environ.get("STREAMKIT_NATIVE", "1") == "0":
        return None
    with _lock:
        if want is not None:
            if _load_isa(want) is None:
                raise ValueError(f"native path {want!r} was asked for (STREAMKIT_NATIVE_ISA or native_isa) but "
                                 f"cannot run here: {_errors[want]}")
            return want
        if not _default:
            _default.append(next((i for i in ISAS if _load_isa(i) is not None), None))
            if _default[0] is None:
                log.warning("engine: no native kernels (%s); using the torch CPU path", error())
        return _default[0]


def load(isa: str | None = None) -> ctypes.CDLL | None:
    """The kernel library of `isa` (default: resolve_isa()), built if needed; None (with the reason in
    `error(isa)`) where it cannot be. An explicit `isa` the CPU lacks gives None; a lacking one
    forced by STREAMKIT_NATIVE_ISA raises ValueError."""
    if os.environ.get("STREAMKIT_NATIVE", "1") == "0":
        return None
    if isa is None:
        isa = resolve_isa()
        if isa is None:
            return None
    with _lock:
        return _load_isa(requested_isa(isa))


def available(isa: str | None = None) -> bool:
    return load(isa) is not None


def isa() -> str | None:
    """The default path's name (None: no native kernels)."""
    return resolve_isa()


def caps(isa: str | None = None) -> int:
    """sk_init's capability bits of a loaded path (CAP_AMX, CAP_BF16, CAP_AVX512); 0 if not loaded."""
    return _caps.get(isa or resolve_isa() or "", 0) if load(isa) is not None else 0


def amx() -> bool:
    """The default path multiplies batched steps on AMX tiles (compiled in, present, granted)."""
    return bool(caps() & CAP_AMX)


def fast_dpbf16() -> bool:
    """Whether one vdpbf16ps (32 multiply-adds) costs about one FMA, as on AMD Zen 4/5: there it
    beats the fp32 strips from 8 rows (Zen 5, 1 thread, 8 rows, gate+up: 152 vs 412 us) and the
    two-term int8 kernel too (16 rows: 158 vs 219 us). On Intel it costs 3.3 FMAs."""
    return cores.cpu_vendor() == "AuthenticAMD" and "avx512_bf16" in cores.cpu_flags()


def int8_terms() -> int:
    """Activation terms of the batched int8 kernel (avx512 with VNNI), 0 where it is not used:
    STREAMKIT_NATIVE_INT8 (2, 1 or 0), default 2; 0 turns off avx2's int16 kernel too. One term
    applies to the few-row kernel (sk_gemv.h) as well, and makes amx's tiles take one bf16 product
    instead of two terms an operand; 2 and 0 leave both two terms. Two terms keep greedy output
    equal to fp32's (20 of 20 bench prompts on Zen 5 and on Intel, amx included); one term,
    llama.cpp's scheme, does not, and neither quite does vdpbf16ps, 15-20 % faster on Zen 5 at 16
    streams but 17 of 20, or one bf16 product on amx, 16 of 20, whose prefill of the 1.5B is
    faster (first token 130 against 211-222 ms; docs/engine.md)."""
    env = os.environ.get("STREAMKIT_NATIVE_INT8", "")
    if env and env not in ("0", "1", "2"):
        raise ValueError(f"STREAMKIT_NATIVE_INT8={env!r}: expected 2 (two-term activations), 1 (one term) "
                         "or 0 (no int8 kernel: vdpbf16ps or fp32)")
    return int(env or 2)


def describe(isa: str | None = None) -> str:
    """One line naming a path and what its batched steps run on, for logs and the bench."""
    name = isa or resolve_isa()
    if name is not None:
        load(name)
    if name is None or name not in _caps:
        return f"none ({error(isa)})"
    c = _caps[name]
    terms = int8_terms()
    amx_terms = "one bf16 product" if terms == 1 else "two terms an operand"
    batched = (f"AMX bf16 tiles, {amx_terms}" if c & CAP_AMX else "vdpbf16ps bf16 dot products" if c & CAP_BF16
               else "fp32 FMAs over strips dequantized once per step")
    if c & CAP_INT8 and terms:
        batched = f"int8 VNNI, {'one' if terms == 1 else 'two'}-term activations (else {batched})"
    elif c & CAP_INT16 and terms:
        batched = f"int16 activations, {'vpdpwssd (AVX-VNNI)' if c & CAP_AVXVNNI else 'vpmaddwd'} (else {batched})"
    return f"{name} ({'AVX-512' if c & CAP_AVX512 else 'AVX2+FMA, no AVX-512'}; batched steps: {batched})"


def error(isa: str | None = None) -> str | None:
    """Why `isa` (default: the default path) is unavailable; None where it loads."""
    if os.environ.get("STREAMKIT_NATIVE", "1") == "0":
        return "disabled by STREAMKIT_NATIVE=0"
    if isa is None:
        name = resolve_isa()
        if name is None:
            return "; ".join(f"{i}: {_errors.get(i, '?')}" for i in ISAS)
        return None
    load(isa)
    return _errors.get(isa) if _libs.get(isa) is None else None


def ptr(a) -> int:
    """Address of a numpy array's or a torch tensor's first element."""
    return a.data_ptr() if hasattr(a, "data_ptr") else a.ctypes.data
