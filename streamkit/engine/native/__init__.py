"""The native CPU kernels (sk_kernels.c): built on first use with the system C compiler, cached.

The library is compiled with -march=native for the machine it runs on, so it is built at run time
(like Triton or torch's cpp extensions), not at install time: a wheel or Docker image built on
one CPU is still correct on another. The build takes a few seconds once; the result is cached
under $STREAMKIT_CACHE_DIR (default ~/.cache/streamkit/native), keyed by the source, the compiler,
the flags and the CPU's feature flags. Where there is no compiler or no AVX-512, `load()` returns
None and the engine uses its torch path.

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
from pathlib import Path

log = logging.getLogger("streamkit.engine")

SOURCE = Path(__file__).with_name("sk_kernels.c")
CFLAGS = ["-O3", "-march=native", "-pthread", "-fPIC", "-shared", "-ffp-contract=off", "-fno-math-errno",
          "-fvisibility=hidden"]
# weight formats understood by the kernels (block layouts exactly as in GGUF files)
FORMATS = {"F32": 0, "Q4_1": 1, "Q8_0": 2, "Q4_0": 3, "Q4_K": 4, "Q6_K": 5}

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_caps = 0
_error: str | None = None
_tried = False


def _cpu_flags() -> set[str]:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cache_dir() -> Path:
    base = os.environ.get("STREAMKIT_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "streamkit")
    return Path(base) / "native"


def _compiler() -> str | None:
    cc = os.environ.get("CC")
    return cc if cc and shutil.which(cc) else (shutil.which("gcc") or shutil.which("cc"))


def _build(cc: str, flags: set[str]) -> Path:
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    key = hashlib.sha256()
    sources = [p.read_bytes() for p in sorted(SOURCE.parent.glob("sk_*.[ch]"))]
    for part in (*sources, version.encode(), " ".join(CFLAGS).encode(), " ".join(sorted(flags)).encode()):
        key.update(part)
    out = cache_dir() / f"sk_kernels-{key.hexdigest()[:16]}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    log.info("engine: compiling native kernels with %s (once per machine) ...", cc)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        p = subprocess.run([cc, *CFLAGS, str(SOURCE), "-o", tmp, "-lm"], capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            raise RuntimeError(f"{cc} failed: {p.stderr.strip()[-800:]}")
        os.replace(tmp, out)  # atomic: concurrent builders (server + workers) never see half a file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def _declare(lib: ctypes.CDLL) -> None:
    P, I, F, L = ctypes.c_void_p, ctypes.c_int, ctypes.c_float, ctypes.c_long
    sig = {
        "sk_init": ([], I),
        "sk_model_new": ([I, I, I, I, I, I, I, F, F], P),
        "sk_model_free": ([P], None),
        "sk_model_set_globals": ([P, I, P, P, I, P, P, P, P, P, I], None),
        "sk_model_set_layer": ([P, I, P, P, I, P, P, I, P, P, I, P, P, I, P, P], None),
        "sk_model_set_qkv_bias": ([P, I, P], None),
        "sk_model_set_kv": ([P, P, P, L, I, I], I),
        "sk_forward": ([P, I, P, P, P, P, P, I, I, P, P, I, I], I),
        "sk_matmul": ([I, P, P, I, I, I, P, P, I, I, I], I),
        "sk_dequant": ([I, P, P, I, I, P], None),
    }
    for name, (args, res) in sig.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, res


def load() -> ctypes.CDLL | None:
    """The kernel library, built if needed; None (with the reason in `error()`) where it cannot be."""
    global _lib, _caps, _error, _tried
    if _tried:
        return _lib
    with _lock:
        if _tried:
            return _lib
        _tried = True
        if os.environ.get("STREAMKIT_NATIVE", "1") == "0":
            _error = "disabled by STREAMKIT_NATIVE=0"
            return None
        flags = _cpu_flags()
        if not {"avx512f", "f16c"} <= flags:
            _error = "this CPU has no AVX-512F"
            return None
        cc = _compiler()
        if cc is None:
            _error = "no C compiler (gcc) found"
            return None
        try:
            path = _build(cc, flags)
            lib = ctypes.CDLL(str(path))
            _declare(lib)
            _caps = lib.sk_init()
        except Exception as e:  # compile error, missing OpenMP, ...
            _error = f"native kernels unavailable: {e}"
            log.warning("engine: %s; using the torch CPU path", _error)
            return None
        _lib = lib
        log.info("engine: native kernels loaded from %s (AMX %s)", path, "on" if _caps & 2 else "off")
        return _lib


def available() -> bool:
    return load() is not None


def amx() -> bool:
    """AMX tiles compiled in, present on this CPU and granted by the kernel."""
    return load() is not None and bool(_caps & 2)


def error() -> str | None:
    load()
    return _error


def ptr(a) -> int:
    """Address of a numpy array's or a torch tensor's first element."""
    return a.data_ptr() if hasattr(a, "data_ptr") else a.ctypes.data
