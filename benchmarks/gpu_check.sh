#!/usr/bin/env bash
# GPU check of the rollout engines, ES and GRPO on randomly initialised models (its section limits add
# up to under 6 minutes on one GPU, so a rerun fits a 15-minute lease). Runs on the machine's own Python (>= 3.11; it may
# itself be a venv) with its torch + CUDA and Triton; no network and no model files. What that Python
# lacks of benchmarks/gpu_wheels.txt (transformers 5.24, huggingface_hub < 2, flash-linear-attention,
# ...) comes from benchmarks/gpu_wheels/ (made with `make gpu-wheels` on a networked machine, ~27 MB):
# installed with pip --no-deps --target into $GPU_CHECK_SITE, put first on PYTHONPATH. No venv is made.
# Without the folder, a Python that lacks a pinned package stops here with the make gpu-wheels command
# (GPU_CHECK_NO_WHEELS=1: run anyway; docs/gpu_install.md).
#   benchmarks/gpu_check.sh                      # 0.8B-shaped Qwen3.5, batch 64 (the issue's goals)
#   benchmarks/gpu_check.sh --size 2b            # figures at another shape: the goals judge them not measured
#   benchmarks/gpu_check.sh --dry-run            # CPU dry run: tiny sizes, --allow-cpu (make test runs it)
# Results: results/bench/gpu/<UTC stamp>[-cpu-dry-run]/<section>.json, each written when measured
# (never overwritten) and mirrored to $OUT/gpu_check/ when OUT is set; summary.json has the goals.
# Exit 0 when every section ran (and on CUDA every goal passed), 3 when a goal failed, 1 on errors.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WHEELS=${WHEELS:-benchmarks/gpu_wheels}
SITE=${GPU_CHECK_SITE:-/tmp/copes_gpu_check_site}
RESULTS=${GPU_CHECK_RESULTS:-results/bench/gpu}
dry=0
args=()
for a in "$@"; do
    if [ "$a" = "--dry-run" ]; then dry=1; else args+=("$a"); fi
done
# Per-section limits (seconds): kernels, equality, all engines together, GRPO, summary. The GPU defaults
# are what must hold there (they fit a 15-minute lease); the CPU dry run's are generous. Both follow
# T_KERNELS, T_EQUALITY, T_ENGINES, T_GRPO and T_SUMMARY when set, and every limit (and the 40 s kept for
# each engine still to come) is multiplied by GPU_CHECK_TIME_SCALE: 1 by default on a GPU; in the dry run
# "auto" by default, 1 + the 1-minute load average per CPU (at most 8), so a busy shared CI box gets more
# time. The limits used are printed and saved in the run's limits.txt.
if [ "$dry" = 1 ]; then
    args=(--allow-cpu --size tiny --batch 4 --new-tokens 32 "${args[@]}")
    defaults=(120 240 300 120 60)
    scale=${GPU_CHECK_TIME_SCALE:-auto}
else
    defaults=(25 40 215 40 15)
    scale=${GPU_CHECK_TIME_SCALE:-1}
fi
if [ "$scale" = auto ]; then
    scale=$(awk -v cpus="$(nproc 2>/dev/null || echo 1)" '{s = 1 + $1 / cpus; printf "%.2f", (s > 8 ? 8 : s)}' /proc/loadavg 2>/dev/null) \
        || scale=1
fi
number='^[0-9]+([.][0-9]+)?$'
if ! [[ $scale =~ $number ]] || [ "$(awk -v s="$scale" 'BEGIN {print (s > 0)}')" != 1 ]; then
    echo "gpu_check: GPU_CHECK_TIME_SCALE=$scale is not valid; valid values: a number > 0 (e.g. 1.5) or auto" >&2
    exit 2
fi
scaled() { awk -v t="$1" -v s="$scale" 'BEGIN {v = int(t * s + 0.5); print (v < 1 ? 1 : v)}'; }
limits=()
i=0
for var in T_KERNELS T_EQUALITY T_ENGINES T_GRPO T_SUMMARY; do
    value=${!var:-${defaults[$i]}}
    if ! [[ $value =~ $number ]]; then
        echo "gpu_check: $var=$value is not valid; valid values: seconds, a number > 0" >&2
        exit 2
    fi
    printf -v "$var" '%s' "$(scaled "$value")"
    limits+=("$var=${!var}")
    i=$((i + 1))
done
RESERVE=$(scaled 40)
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if compgen -G "$WHEELS/*.whl" > /dev/null; then
    "$PY" benchmarks/install_wheels.py "$WHEELS" "$SITE" || echo "gpu_check: installing wheels failed" >&2
elif ! lacking=$("$PY" benchmarks/install_wheels.py --check --list "${GPU_WHEEL_LIST:-benchmarks/gpu_wheels.txt}"); then
    # no wheel folder and this Python lacks pinned packages: say so and how to fix it, instead of letting
    # every section fail on import (or run with an older transformers)
    tag=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")' 2>/dev/null || echo 312)
    cat >&2 <<EOF
gpu_check: no wheels in $WHEELS/ and $PY lacks what benchmarks/gpu_wheels.txt pins:
  $lacking
Build the folder on a machine with network, from this checkout, for this Python's version:
  make gpu-wheels PY_TAG=$tag
then copy benchmarks/gpu_wheels/ beside this checkout (or set WHEELS=/path/to/folder) and rerun;
GPU_CHECK_NO_WHEELS=1 runs with what this Python has.
EOF
    if [ "$dry" = 0 ] && [ "${GPU_CHECK_NO_WHEELS:-0}" = 0 ]; then exit 1; fi
    echo "gpu_check: going on without the wheels$([ "$dry" = 1 ] && echo ' (CPU dry run)')" >&2
fi
stamp=$(date -u +%Y%m%dT%H%M%SZ)
DIR="$RESULTS/$stamp$([ "$dry" = 1 ] && echo -cpu-dry-run)"
mkdir -p "$DIR"
echo "gpu_check: results in $DIR"
echo "gpu_check: time limits (s) ${limits[*]} RESERVE=$RESERVE (scale $scale)" | tee "$DIR/limits.txt"
status=0
section() {  # section NAME LIMIT COMMAND...: a timed-out or failed section is recorded, the rest still run
    local name=$1 limit=$2 rc=0
    shift 2
    timeout -k 10 "$limit" "$@" || rc=$?
    if [ "$rc" != 0 ]; then
        echo "gpu_check: section $name exit $rc$([ "$rc" = 124 ] && echo " (ran past ${limit} s)")" >&2
        echo "{\"section\": \"$name\", \"exit\": $rc, \"limit_s\": $limit}" > "$DIR/exit-$name.txt"
        if [ "$rc" = 3 ]; then [ "$status" = 0 ] && status=3; else status=1; fi
    fi
}
check=("$PY" benchmarks/gpu_check.py --dir "$DIR" "${args[@]}")
section kernels "$T_KERNELS" "${check[@]}" --section kernels
section equality "$T_EQUALITY" "${check[@]}" --section equality
engines=$("$PY" -c "from copes_lib.engines import ENGINES; print(' '.join(ENGINES))" 2>/dev/null || echo "loop slots")
# In ENGINES' order, each engine gets what is left of T_ENGINES less RESERVE (40 s, scaled) for each one
# still to come, so a fast engine leaves its time to the next (a compiled one spends it compiling).
n=$(wc -w <<< "$engines")
left=$T_ENGINES
i=0
for engine in $engines; do
    i=$((i + 1))
    limit=$((left - RESERVE * (n - i)))
    [ "$limit" -lt "$RESERVE" ] && limit=$RESERVE
    t0=$SECONDS
    section "engine-$engine" "$limit" "${check[@]}" --section engine --engine "$engine"
    left=$((left - (SECONDS - t0)))
done
grpo_args=()
[ "$dry" = 1 ] && grpo_args=(--allow-cpu)
section grpo "$T_GRPO" "$PY" benchmarks/gpu_check_grpo.py --out "$DIR/grpo.json" "${grpo_args[@]}"
section summary "$T_SUMMARY" "${check[@]}" --section summary
if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT/gpu_check" && cp -r "$DIR" "$OUT/gpu_check/"
fi
exit "$status"
