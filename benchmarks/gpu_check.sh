#!/usr/bin/env bash
# GPU check of the rollout engines and ES on a randomly initialised Qwen3.5 (under 8 minutes on one
# H100/H200). Needs on the machine: Python >= 3.11, torch with CUDA, Triton, numpy. No network and no
# model files: the models are built on the machine. The suite's own small dependencies (transformers
# 5.24 and its tokenizers, flash-linear-attention, bm25s, math-verify, ...) come as wheels made on a
# networked machine with `make gpu-wheels` (benchmarks/gpu_wheels/, ~50 MB); they are installed into
# a venv that sees the machine's torch (--system-site-packages).
#   benchmarks/gpu_check.sh                 # 0.8B model, batch 64, 128 new tokens
#   benchmarks/gpu_check.sh --size 2b
#   benchmarks/gpu_check.sh --size tiny --batch 4 --new-tokens 8   # CPU dry run (JSON marked cpu_dry_run)
# Results: results/bench/gpu/<UTC stamp>-<size>.json and <UTC stamp>-grpo.json (never overwritten).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WHEELS=${WHEELS:-benchmarks/gpu_wheels}
if compgen -G "$WHEELS/*.whl" > /dev/null; then
    VENV=${GPU_CHECK_VENV:-/tmp/copes_gpu_check_venv}
    [ -x "$VENV/bin/python" ] || "$PY" -m venv --system-site-packages "$VENV"
    "$VENV/bin/python" -m pip install --quiet --no-index --no-deps "$WHEELS"/*.whl
    PY="$VENV/bin/python"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# ES / engines first (most of the time), then GRPO at scale (chunked log-probs, bf16 rollout copy, memory
# against copes_lib/grpo_memory.py); each has its own time limit so one cannot starve the other.
stamp=$(date -u +%Y%m%dT%H%M%SZ)
status=0
timeout "${GPU_CHECK_TIMEOUT:-340}" "$PY" benchmarks/gpu_check.py "$@" || status=$?
timeout "${GPU_CHECK_GRPO_TIMEOUT:-120}" "$PY" benchmarks/gpu_check_grpo.py \
    --out "results/bench/gpu/${stamp}-grpo.json" || status=$?
exit "$status"
