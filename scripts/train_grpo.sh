#!/usr/bin/env bash
# GRPO on Qwen3-30B-A3B with the length-aware resampler and the per-batch response cap (verl 0.9.1, Megatron
# TP/PP/EP actor and ref from a dist checkpoint, vLLM rollout). The seed's example script, for verl 0.9.1.
#
#   MODEL_PATH=... DISTCP_PATH=... TRAIN_FILE=... TEST_FILE=... bash scripts/train_grpo.sh [hydra overrides]
#   DRY_RUN=1 ... bash scripts/train_grpo.sh     # preflight only: the resolved settings; the command into a file
#   PRESET=smoke bash scripts/train_grpo.sh      # tiny model, 1 GPU, no downloads
#   bash scripts/train_grpo.sh                   # no MODEL_PATH, no GPU: PRESET=cpu, the recipe through verl on a CPU
#
# Every knob is an environment variable; the table (defaults, Hydra keys) is in docs/training.md and comes from
# recipe/preflight/knobs.py (KNOBS); the preflight builds the Hydra overrides from them. Arguments are extra
# Hydra overrides, applied after the ones built from the environment (last one wins).
#
# Steps: pick the Python (scripts/lib/python_env.sh) -> preflight on the CPU (parse the variables, compose the real
# config, verl's and the recipe's checks; all problems at once) -> DRY_RUN: write the command and stop -> no GPU and no
# RAY_ADDRESS: stop -> smoke preset: convert the tiny model -> python -m recipe.main, console teed into
# <run dir>/logs/console.<UTC stamp>.log and verl's JSONL metrics in <run dir>/logs/metrics.<UTC stamp>.jsonl.
# shellcheck disable=SC2154  # PLAN_* are set by the plan file the preflight writes
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/lib/python_env.sh
source "$ROOT/scripts/lib/python_env.sh"

# die STATUS MESSAGE...
die() {
    local status="$1"
    shift
    echo "train_grpo.sh: ERROR: $*" >&2
    exit "$status"
}

# quiet LOG COMMAND...: run COMMAND with stdout and stderr appended to LOG; the terminal gets the recipe's own lines
# (``[recipe] ...``: a line per step, the sampler's warm start) and this script's, not Ray's, verl's and vLLM's
# hundreds of start-up lines, unless RECIPE_CONSOLE=full. On a failure the log's last lines follow. Returns
# COMMAND's status.
quiet() {
    local log="$1" status
    shift
    if [[ "${RECIPE_CONSOLE:-quiet}" == "full" ]]; then
        logged "$log" "$@"
        return
    fi
    echo "train_grpo.sh: the run's full output goes to $log (RECIPE_CONSOLE=full shows it here)"
    set +e
    "$@" 2>&1 | tee -a "$log" | grep --line-buffered -E '\[recipe\] |^train_grpo\.sh: ' | sed -u -E 's/\x1b\[[0-9;]*m//g; s/^\([^)]*\) //'
    status="${PIPESTATUS[0]}"
    set -e
    if (( status != 0 )); then
        echo "train_grpo.sh: the run failed (status $status); the last lines of $log:"
        tail -n 40 "$log" | sed 's/^/    /'
    fi
    return "$status"
}

# logged LOG COMMAND...: run COMMAND with stdout and stderr also appended to LOG; return COMMAND's status.
logged() {
    local log="$1" status
    shift
    set +e
    "$@" 2>&1 | tee -a "$log"
    status="${PIPESTATUS[0]}"
    set -e
    return "$status"
}

gpus="$(recipe_gpu_count)"
# The real run's inputs (recipe/preflight/knobs.py REAL_RUN_INPUTS): set, they mean the real run, never a preset.
real_inputs=()
for name in DISTCP_PATH TRAIN_FILE TEST_FILE; do
    [[ -z "${!name:-}" ]] || real_inputs+=("$name")
done
if [[ -z "${PRESET:-}" && -z "${MODEL_PATH:-}" && ${#real_inputs[@]} -gt 0 ]]; then
    die 2 "${real_inputs[*]} set but MODEL_PATH is not: the real run needs MODEL_PATH (export" \
        "MODEL_PATH=/path/to/Qwen3-30B-A3B, a Hugging Face model dir). For a preset on these inputs, name it:" \
        "PRESET=cpu or PRESET=smoke (nothing was run)"
fi
if [[ -n "${PRESET:-}" ]]; then
    echo "train_grpo.sh: running PRESET=$PRESET (set in the environment)" >&2
elif [[ -z "${MODEL_PATH:-}" ]]; then
    if (( gpus > 0 )); then
        echo "train_grpo.sh: running the 1-GPU smoke preset (PRESET=smoke): MODEL_PATH is not set and this" \
            "machine has a GPU" >&2
        export PRESET=smoke
    elif [[ -z "${RAY_ADDRESS:-}" ]]; then
        cat >&2 <<'BANNER'
train_grpo.sh: running the CPU preset (PRESET=cpu): MODEL_PATH is not set, no GPU is visible, no RAY_ADDRESS.
  The whole recipe through verl 0.9.1's own training loop on this CPU in a few minutes: a tiny Qwen3-MoE trained
  here on synthetic tasks (countdowns whose length the prompt sets; MULTI_TURN=1: calculator problems with real tool
  calls; CPU_MODEL=random: the random model on a smoke reward), verl's FSDP engine and one vLLM CPU replica, with the
  length-aware sampler and the response cap on. It proves the wiring, not the speed-up (docs/cpu-run.md). For the
  real job on a GPU cluster:
  MODEL_PATH=... DISTCP_PATH=... TRAIN_FILE=... TEST_FILE=... bash scripts/train_grpo.sh   (README: Quick start)
BANNER
        export PRESET=cpu
    fi
fi

if [[ "${PRESET:-}" == "cpu" && -z "${RECIPE_PYTHON:-}" ]]; then
    # vLLM's CPU build lives in the test venv (requirements/cpu-test.txt), not in a GPU stack.
    bash "$ROOT/scripts/bootstrap_venv.sh" >&2 || die 1 "could not create the CPU venv (scripts/bootstrap_venv.sh)"
    PY="${RECIPE_VENV:-$ROOT/.venv}/bin/python"
else
    PY="$(recipe_python "$ROOT")" || die 1 "no usable Python (see the message above)"
fi
# This checkout's `recipe` and `reward` packages, for the driver and (through inheritance) a local Ray cluster.
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export RECIPE_LAUNCH_STAMP="${RECIPE_LAUNCH_STAMP:-$(date -u +%Y%m%dT%H%M%SZ)}"  # names this launch's log files

plan="$(mktemp)"
report="$(mktemp)"
trap 'rm -f "$plan" "$report"' EXIT
status=0
# What the chosen Python must hold: the whole GPU stack for a real launch, verl 0.9.1 alone for a check or a CPU run.
# A DRY_RUN on a GPU node checks the GPU stack as the launch would; without a GPU the report says it did not.
stack_target=cpu
if [[ "${PRESET:-}" != "cpu" ]] && { (( gpus > 0 )) || [[ -n "${RAY_ADDRESS:-}" ]]; }; then
    stack_target=gpu
fi
logged "$report" env RECIPE_STACK_TARGET="$stack_target" "$PY" -m recipe.preflight --plan-out "$plan" -- "$@" \
    || status=$?
if (( status != 0 )); then
    (( gpus > 0 )) || [[ -n "${RAY_ADDRESS:-}" ]] || echo "train_grpo.sh: (and no GPU is visible here)" >&2
    die "$status" "preflight failed; fix the problems above (nothing was launched)"
fi
# shellcheck source=/dev/null
source "$plan"
launch=(env WANDB_MODE="$PLAN_WANDB_MODE" WANDB_DIR="$PLAN_WANDB_DIR" VERL_FILE_LOGGER_PATH="$PLAN_METRICS_LOG"
        PYTHONPATH="$PYTHONPATH" "${PLAN_ENV[@]}" "$PY" -m recipe.main --config-name "$PLAN_CONFIG_NAME"
        "${PLAN_OVERRIDES[@]}" "$@")

if [[ "${DRY_RUN:-0}" == "1" ]]; then
    # the full command, one word per line, in a file the user can read or run (bash FILE): ~100 escaped lines that
    # would bury the summary above
    command_file="$(mktemp -t --suffix=.sh train_grpo.command.XXXXXX)"  # in $TMPDIR, else /tmp
    { printf '%s' "${launch[0]}"; printf ' \\\n    %q' "${launch[@]:1}"; echo; } > "$command_file"
    echo "train_grpo.sh: DRY_RUN=1: nothing was run; the full command is in $command_file (bash $command_file runs it)"
    exit 0
fi

if (( gpus == 0 )) && [[ -z "${RAY_ADDRESS:-}" && "${PRESET:-}" != "cpu" ]]; then
    die 3 "no GPU is visible on this machine (nvidia-smi is missing or lists no GPU) and RAY_ADDRESS is" \
        "not set. The preflight passed; nothing was launched. Run on a GPU node, set RAY_ADDRESS to join a running" \
        "Ray cluster, or use DRY_RUN=1 to check only."
fi

mkdir -p "$(dirname "$PLAN_CONSOLE_LOG")"
cp "$report" "$PLAN_CONSOLE_LOG"
if [[ "$PLAN_SMOKE_CONVERT" == "1" ]]; then
    echo "train_grpo.sh: smoke preset: converting the tiny model into $PLAN_DISTCP_PATH" | tee -a "$PLAN_CONSOLE_LOG"
    logged "$PLAN_CONSOLE_LOG" env RECIPE_PYTHON="$PY" MODEL_PATH="$PLAN_MODEL_PATH" DISTCP_PATH="$PLAN_DISTCP_PATH" \
        CONVERT_PP=1 CONVERT_EP=1 CONVERT_NNODES=1 GPUS_PER_NODE=1 bash "$ROOT/scripts/convert_hf_to_distcp.sh" \
        || die $? "the smoke preset's conversion failed (log: $PLAN_CONSOLE_LOG)"
fi

echo "train_grpo.sh: run dir $PLAN_RUN_DIR; console log $PLAN_CONSOLE_LOG" | tee -a "$PLAN_CONSOLE_LOG"
if [[ "${PRESET:-}" == "cpu" ]]; then
    # The CPU run starts its own Ray cluster, a vLLM replica and FSDP workers: a hard limit, and the whole process
    # tree ends with it (recipe/run_guard.py), so a hung step never outlives the command.
    launch=("$PY" -m recipe.run_guard --timeout "${CPU_RUN_TIMEOUT_S:-1800}" -- "${launch[@]}")
fi
quiet "$PLAN_CONSOLE_LOG" "${launch[@]}" || status=$?
{
    echo "train_grpo.sh: where the run is:"
    echo "  log      $PLAN_CONSOLE_LOG"
    echo "  metrics  $PLAN_METRICS_LOG"
    echo "  traces   $PLAN_RUN_DIR/length_traces.jsonl"
    echo "  report   bash scripts/compare_runs.sh <baseline run dir> $PLAN_RUN_DIR   (plots and a table, docs/training.md)"
    echo "train_grpo.sh: finished with status $status; run dir $PLAN_RUN_DIR"
} | tee -a "$PLAN_CONSOLE_LOG"
exit "$status"
