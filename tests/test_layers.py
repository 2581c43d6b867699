"""The layer rules of docs/architecture.md, checked by import-linter on every import in
streamkit/ (lazy ones inside functions too): the next arrow upwards fails here. Also ruff (the
rules in pyproject.toml) over the whole tree, and mypy on the public seams."""
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _contract() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"][0]


def test_every_module_of_streamkit_has_a_layer():
    layered = {name.strip() for layer in _contract()["layers"] for name in layer.split("|")}
    modules = {f"streamkit.{p.stem}" for p in (ROOT / "streamkit").iterdir()
               if (p.suffix == ".py" and p.stem != "__init__") or (p.is_dir() and (p / "__init__.py").exists())}
    assert modules - layered == set(), "give every new top-level module a layer in pyproject.toml"
    assert layered - modules == set(), "a layer names a module that is gone"


def test_no_layer_imports_upwards():
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("import-linter is not installed (the test extra has it)")
    out = subprocess.run([exe, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "1 kept, 0 broken" in out.stdout


# the public seams a stage, a transport or an engine client is written against
TYPED = ["streamkit/stage.py", "streamkit/stages/catalog.py", "streamkit/transport/base.py",
         "streamkit/transport/memory.py", "streamkit/runtime.py", "streamkit/metrics.py", "streamkit/liveness.py",
         "streamkit/redis_io.py", "streamkit/engine/options.py", "streamkit/events.py"]


def test_public_seams_type_check():
    exe = shutil.which("mypy", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("mypy is not installed (the test extra has it)")
    out = subprocess.run([exe, "--ignore-missing-imports", "--follow-imports=silent", "--no-error-summary", *TYPED],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-4000:]


def test_ruff_is_clean():
    exe = shutil.which("ruff", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("ruff is not installed (the test extra has it)")
    out = subprocess.run([exe, "check", "--no-cache", "--output-format", "concise", "."], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
