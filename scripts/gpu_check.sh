#!/usr/bin/env bash
# The GPU-only parts of the launch path, checked in one command on one GPU (verl 0.9.1 installed; under 15 minutes),
# ending in a pass/fail table:
#   convert     scripts/convert_hf_to_distcp.sh: the smoke preset's tiny Qwen3-MoE -> a fresh dist checkpoint
#   logits      python -m recipe.gpu_check logits: verl's Megatron engine loads that checkpoint as actor and ref do;
#               its exported weights and its logits are compared with the Hugging Face model (recipe/gpu_check.py)
#   smoke       PRESET=smoke ... bash scripts/train_grpo.sh trainer.total_training_steps=2, on that checkpoint
#   smoke-logs  python -m recipe.gpu_check smoke-result: both steps logged with the recipe's metrics and traces
#   smoke-spec  the smoke step again with ROLLOUT_SPECULATIVE=group: the recipe's group drafter as vLLM's custom
#               proposer on the GPU (its context, its GRPO siblings, the prompt's earlier responses), experiment
#               smoke-grpo-spec
#   spec-logs   python -m recipe.gpu_check smoke-result --spec: both steps logged, with the recipe's speculative
#               acceptance metrics (rollout/spec_*, read from vLLM's counters) and drafts on each
#   smoke-eagle3, eagle3-logs  with --eagle3, in place of smoke-spec and spec-logs (both in one run: 1170 s of
#               limits, past a 15-minute GPU): the same with ROLLOUT_SPECULATIVE=eagle3, vLLM's EAGLE-3 proposer with
#               the head at DRAFT_MODEL_PATH if set (it must be a head for the smoke step's tiny model: the preflight
#               checks it, recipe/preflight/draft_head.py), else the tiny head trained for that model on the CPU
#               (cached; recipe/tiny/eagle3_head.py), learning online (ROLLOUT_DRAFT_ONLINE=1: capture, training and
#               the checked push after each sleep), experiment smoke-grpo-eagle3; with the tiny head its log check
#               also needs accepted drafts and draft_head/* on each step, and reports the acceptance rates: the rollout's (temperature 1, where
#               the tiny model is near uniform: any head's drafts are accepted about as rarely) and the greedy
#               validation's, which is the head's measure
#
#   bash scripts/gpu_check.sh [--dry-run] [--eagle3] [--work DIR]
#
# On a lent GPU without network or Transformer Engine (scripts/lib/device_check.sh): `--fetch-wheels` (on a machine
# with PyPI) downloads requirements/device-megatron.txt into .whl/ (~50 MiB) and records, on vLLM CPU, the routes the
# R3 step replays (.whl/r3: the tiny model, rollouts and the recipe's paths, recipe/route_record/record.py);
# `--device` (on the GPU, .whl carried) installs them offline into WORK/venv over the machine's own torch and runs
# python -m recipe.megatron_check: the tiny model through Megatron-Bridge vs HF logits, verl's converter mapping, the
# dist checkpoint save/load, DDP with the distributed optimizer, verl's checkpoint manager save -> load -> identical
# next-step loss (bf16, one GPU); then `replay`, R3: the recorded routes through verl's router replay in Megatron on
# the GPU (fp32, after an optimizer step, each recipe path, bf16), every replayed route equal to vLLM's. Its CPU
# rehearsal is tests/megatron.
#
# --dry-run prints each step's command and runs none of them (no GPU needed; it builds the tiny model, and with
# --eagle3 the tiny head, on the CPU, cached, to name them: a dry run first keeps those builds off the GPU's time).
# --work DIR holds the checkpoint, the smoke run and one log per step (default checkpoints/gpu-check-<UTC stamp>; it
# must be new or empty). Each GPU step runs under recipe.run_guard with a time limit, which ends its whole process
# tree (Ray, vLLM) when reached: GPU_CHECK_CONVERT_TIMEOUT_S (90), GPU_CHECK_LOGITS_TIMEOUT_S (120),
# GPU_CHECK_SMOKE_TIMEOUT_S (360), GPU_CHECK_SPEC_TIMEOUT_S (300; the same two steps as smoke, on a warm page cache)
# or with --eagle3 GPU_CHECK_EAGLE3_TIMEOUT_S (300: the same steps again; a one-layer head adds seconds), 870 s in
# all. A failed conversion skips the steps that need its checkpoint; a failed smoke step skips the speculative one
# (it would fail the same way). Exit status: 0 when every step passed, 1 when one did not, 2 on bad usage or
# without a GPU.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/lib/python_env.sh
source "$ROOT/scripts/lib/python_env.sh"

die() {
    echo "gpu_check.sh: ERROR: $*" >&2
    exit 2
}

dry=0
eagle3=0
work=""
mode=full
while (( $# > 0 )); do
    case "$1" in
        --dry-run) dry=1 ;;
        --eagle3) eagle3=1 ;;
        --device) mode=device ;;
        --fetch-wheels) mode=fetch ;;
        --work)
            (( $# > 1 )) || die "--work needs a directory"
            work="$2"
            shift
            ;;
        --work=*) work="${1#--work=}" ;;
        -h | --help)
            sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"
            exit 0
            ;;
        *) die "unknown argument '$1' (usage: bash scripts/gpu_check.sh [--dry-run] [--eagle3] [--work DIR]" \
               "[--device | --fetch-wheels])" ;;
    esac
    shift
done

# shellcheck source=scripts/lib/device_check.sh
source "$ROOT/scripts/lib/device_check.sh"
if [[ "$mode" == fetch ]]; then
    fetch_device_wheels "$(recipe_python "$ROOT")"
    exit 0
fi

convert_limit="${GPU_CHECK_CONVERT_TIMEOUT_S:-90}"
logits_limit="${GPU_CHECK_LOGITS_TIMEOUT_S:-120}"
smoke_limit="${GPU_CHECK_SMOKE_TIMEOUT_S:-360}"
spec_limit="${GPU_CHECK_SPEC_TIMEOUT_S:-300}"
eagle3_limit="${GPU_CHECK_EAGLE3_TIMEOUT_S:-300}"
for v in convert_limit logits_limit smoke_limit spec_limit eagle3_limit; do
    name="${v%_limit}"
    [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "GPU_CHECK_${name^^}_TIMEOUT_S=${!v} must be a positive number of seconds"
done

if (( dry == 0 )) && (( $(recipe_gpu_count) == 0 )); then
    die "no GPU is visible on this machine (nvidia-smi is missing or lists no GPU): these checks need one GPU." \
        "Run it on a GPU node, or --dry-run to print the commands"
fi

work="$(realpath -m "${work:-$ROOT/checkpoints/gpu-check-$(date -u +%Y%m%dT%H%M%SZ)}")"
if (( dry == 0 )); then
    if [[ -e "$work" ]] && [[ ! -d "$work" || -n "$(ls -A "$work")" ]]; then
        die "--work $work exists and is not an empty directory: give a new one"
    fi
    mkdir -p "$work"
fi
if [[ "$mode" == device ]]; then
    # the lent GPU's own python3 (torch with CUDA); the recipe's venvs are not there
    run_device_check "${RECIPE_PYTHON:-python3}" "$work" "$dry"
    exit 0
fi
PY="$(recipe_python "$ROOT")" || die "no usable Python (see the message above)"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
model="$("$PY" -m recipe.gpu_check tiny-model)" || die "could not build the smoke preset's tiny model (above)"
distcp="$work/distcp"
runs="$work/runs"
steps="$work/steps.tsv"
# the speculative smoke step: the group drafter, or with --eagle3 an EAGLE-3 head (the tiny one must get drafts
# accepted; a user's head may be untrained)
spec_step=smoke-spec spec_logs=spec-logs spec_run=smoke-grpo-spec spec_check=--spec spec_note=""
spec_env=(ROLLOUT_SPECULATIVE=group)
if (( eagle3 )); then
    spec_step=smoke-eagle3 spec_logs=eagle3-logs spec_run=smoke-grpo-eagle3 spec_limit="$eagle3_limit"
    if [[ -n "${DRAFT_MODEL_PATH:-}" ]]; then
        head="$(realpath -m "$DRAFT_MODEL_PATH")" spec_note="head: DRAFT_MODEL_PATH=$head"
    else
        head="$("$PY" -m recipe.gpu_check tiny-head)" || die "could not build the tiny model's EAGLE-3 head (above)"
        spec_check=--accepted spec_note="head: the tiny one, trained for the tiny model, learning online"
    fi
    # online: the capture on CUDA, the head trained and pushed (and checked) after each level-2 sleep
    spec_env=(ROLLOUT_SPECULATIVE=eagle3 DRAFT_MODEL_PATH="$head" ROLLOUT_DRAFT_ONLINE=1)
fi

# run_step NAME LIMIT CMD...: run CMD (under recipe.run_guard when LIMIT > 0) with its output in WORK/NAME.log and
# record PASS/FAIL, seconds and the log's last line (after STEP_NOTE, if set); with --dry-run only print the
# command. Returns CMD's status.
run_step() {
    local name="$1" limit="$2" status=0 start="$SECONDS" detail
    shift 2
    if (( dry )); then
        printf '%s:' "$name"
        printf ' %q' "$@"
        echo
        return 0
    fi
    echo "gpu_check.sh: $name (log: $work/$name.log)" >&2
    if (( limit > 0 )); then
        "$PY" -m recipe.run_guard --timeout "$limit" -- "$@" >"$work/$name.log" 2>&1 || status=$?
    else
        "$@" >"$work/$name.log" 2>&1 || status=$?
    fi
    detail="$(grep -v '^[[:space:]]*$' "$work/$name.log" | tail -n 1 | tr '\t' ' ' | cut -c 1-400)" || true
    (( status != 124 )) || detail="time limit ${limit}s reached; $detail"
    detail="${STEP_NOTE:+$STEP_NOTE; }$detail"
    printf '%s\t%s\t%s\t%s\n' "$name" "$( (( status == 0 )) && echo PASS || echo FAIL)" "$(( SECONDS - start ))" \
        "${detail:-exit status $status}" >>"$steps"
    return "$status"
}

(( dry == 0 )) || echo "gpu_check.sh: --dry-run: the steps (not run), tiny model $model:"
if run_step convert "$convert_limit" env MODEL_PATH="$model" DISTCP_PATH="$distcp" CONVERT_PP=1 CONVERT_EP=1 \
        CONVERT_NNODES=1 GPUS_PER_NODE=1 RECIPE_PYTHON="$PY" bash "$ROOT/scripts/convert_hf_to_distcp.sh"; then
    run_step logits "$logits_limit" "$PY" -m recipe.gpu_check logits --model "$model" --distcp "$distcp" || true
    smoke_ok=1
    run_step smoke "$smoke_limit" env PRESET=smoke CKPT_ROOT="$runs" DISTCP_PATH="$distcp" RECIPE_PYTHON="$PY" \
        RECIPE_CONSOLE=full \
        bash "$ROOT/scripts/train_grpo.sh" trainer.total_training_steps=2 || smoke_ok=0
    # also after a failed smoke run: what its logs lack says how far it got
    run_step smoke-logs 0 "$PY" -m recipe.gpu_check smoke-result "$runs/smoke-grpo-resampler" --steps 2 || true
    if (( smoke_ok )); then
        STEP_NOTE="$spec_note" run_step "$spec_step" "$spec_limit" env PRESET=smoke CKPT_ROOT="$runs" \
            DISTCP_PATH="$distcp" RECIPE_CONSOLE=full RECIPE_PYTHON="$PY" EXPERIMENT_NAME="$spec_run" \
            "${spec_env[@]}" bash "$ROOT/scripts/train_grpo.sh" trainer.total_training_steps=2 || true
        run_step "$spec_logs" 0 "$PY" -m recipe.gpu_check smoke-result "$runs/$spec_run" --steps 2 "$spec_check" || true
    else
        for name in "$spec_step" "$spec_logs"; do
            printf '%s\tSKIP\t\tthe smoke step failed\n' "$name" >>"$steps"
        done
    fi
else
    for name in logits smoke smoke-logs "$spec_step" "$spec_logs"; do
        printf '%s\tSKIP\t\tneeds the converted checkpoint\n' "$name" >>"$steps"
    done
fi
(( dry == 0 )) || exit 0

status=0
"$PY" -m recipe.gpu_check table "$steps" || status=$?
echo "gpu_check.sh: logs in $work" >&2
exit "$status"
