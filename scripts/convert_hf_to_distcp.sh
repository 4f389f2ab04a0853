#!/usr/bin/env bash
# Convert a Hugging Face model (MODEL_PATH) into the Megatron dist checkpoint (DISTCP_PATH) that train_grpo.sh
# loads for actor and ref, with the converter shipped in the verl 0.9.1 wheel (scripts/converter_hf_to_mcore.py).
#
#   MODEL_PATH=/models/Qwen3-30B-A3B DISTCP_PATH=/ckpt/qwen3-30b-a3b-mcore bash scripts/convert_hf_to_distcp.sh
#
# torchrun starts CONVERT_PP x CONVERT_EP ranks, default 1 x 1: a dist checkpoint is resharded at load (the tests
# load checkpoints saved at TP 2 and EP 2 at TP = EP = 1: tests/megatron), so the layout of the conversion need not be
# the training's, and every rank loads the whole HF model into host memory (~61 GB in bf16 for Qwen3-30B-A3B): one
# rank needs ~61 GB of RAM and the model on one GPU (80 GB: fits; smaller GPUs: CONVERT_CPU_INIT=1 builds it in host
# memory, ~122 GB of RAM, or CONVERT_EP=2). More ranks convert no faster than the HF load they each repeat. Over
# several nodes (CONVERT_NNODES > 1) run this on every node with NODE_RANK=0..N-1 and MASTER_ADDR=<node 0>, writing
# to a shared DISTCP_PATH.
# The converter needs NCCL (a GPU). It silently skips a non-empty output dir, so this script refuses one instead.
# DRY_RUN=1 prints the command without running it.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/lib/python_env.sh
source "$ROOT/scripts/lib/python_env.sh"

die() {
    echo "convert_hf_to_distcp.sh: ERROR: $*" >&2
    exit 2
}

[[ -n "${MODEL_PATH:-}" ]] || die "MODEL_PATH is not set: export MODEL_PATH=/path/to/Qwen3-30B-A3B (a Hugging Face model dir)"
[[ -n "${DISTCP_PATH:-}" ]] || die "DISTCP_PATH is not set: export DISTCP_PATH=/path/to/output (a new or empty dir)"
[[ -f "$MODEL_PATH/config.json" ]] || die "MODEL_PATH=$MODEL_PATH has no config.json (not a Hugging Face model dir)"
# Absolute paths: every rank (and every node) must see the same ones.
MODEL_PATH="$(realpath -m "$MODEL_PATH")"
DISTCP_PATH="$(realpath -m "$DISTCP_PATH")"
if [[ -e "$DISTCP_PATH" && ! -d "$DISTCP_PATH" ]]; then
    die "DISTCP_PATH=$DISTCP_PATH exists and is not a directory"
fi
if [[ -d "$DISTCP_PATH" ]] && [[ -n "$(ls -A "$DISTCP_PATH")" ]]; then
    die "DISTCP_PATH=$DISTCP_PATH is not empty: verl's converter would skip it silently. If it is a finished" \
        "conversion (it has metadata.json), use it as is; otherwise delete it (rm -rf '$DISTCP_PATH') and run again"
fi
gpus="$(recipe_gpu_count)"
dry="${DRY_RUN:-0}"
if [[ "$dry" != "1" ]] && (( gpus == 0 )); then
    die "no GPU is visible on this machine (nvidia-smi is missing or lists no GPU): verl's converter needs NCCL." \
        "Run it on a GPU node, or DRY_RUN=1 to print the command"
fi

PY="$(recipe_python "$ROOT")" || die "no usable Python (see the message above)"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
# GPUS_PER_NODE's default and parsing live in recipe/preflight/.
defaults="$("$PY" -m recipe.preflight --print-env GPUS_PER_NODE)" || die "bad variable (above)"
eval "$defaults"
pp="${CONVERT_PP:-1}"
ep="${CONVERT_EP:-1}"
for v in pp ep; do
    [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "CONVERT_${v^^}=${!v} must be a positive integer"
done
ranks=$(( pp * ep ))
nnodes="${CONVERT_NNODES:-$(( (ranks + GPUS_PER_NODE - 1) / GPUS_PER_NODE ))}"
[[ "$nnodes" =~ ^[1-9][0-9]*$ ]] || die "CONVERT_NNODES=$nnodes must be a positive integer"
(( ranks % nnodes == 0 )) || die "CONVERT_PP=$pp x CONVERT_EP=$ep = $ranks ranks do not split over CONVERT_NNODES=$nnodes"
per_node=$(( ranks / nnodes ))
if (( ranks > 1 )) && ! grep -qE '"(Qwen3MoeForCausalLM|Qwen2MoeForCausalLM|DeepseekV3ForCausalLM)"' \
        "$MODEL_PATH/config.json"; then
    die "verl's converter converts only MoE models (Qwen3/Qwen2 MoE, DeepSeek-V3) with several ranks: export" \
        "CONVERT_PP=1 CONVERT_EP=1 for this model"
fi
(( per_node <= GPUS_PER_NODE )) || die "$per_node ranks per node > GPUS_PER_NODE=$GPUS_PER_NODE: raise CONVERT_NNODES" \
    "or lower CONVERT_PP / CONVERT_EP"

# The converter is the top-level `scripts` package of the verl wheel; look it up from outside this repo, whose own
# scripts/ directory would otherwise be a candidate on sys.path.
converter="$(cd / && "$PY" -c 'import importlib.util as u; s = u.find_spec("scripts.converter_hf_to_mcore"); print(s.origin if s else "")')"
[[ -f "$converter" ]] || die "verl's scripts/converter_hf_to_mcore.py is not installed for $PY (verl 0.9.1 ships it)"

if (( nnodes > 1 )); then
    [[ -n "${NODE_RANK:-}" && -n "${MASTER_ADDR:-}" ]] || die "CONVERT_NNODES=$nnodes: run this script on each node" \
        "with NODE_RANK=0..$(( nnodes - 1 )) and MASTER_ADDR=<node 0 address> (shared DISTCP_PATH), or convert on" \
        "one node with fewer ranks (e.g. CONVERT_EP=$(( GPUS_PER_NODE / pp > 0 ? GPUS_PER_NODE / pp : 1 )))"
    dist=(--nnodes="$nnodes" --node_rank="$NODE_RANK" --master_addr="$MASTER_ADDR" --master_port="${MASTER_PORT:-29500}")
else
    dist=(--standalone --nnodes=1)
fi
cmd=("$PY" -m torch.distributed.run "${dist[@]}" --nproc_per_node="$per_node" "$converter"
     --hf_model_path "$MODEL_PATH" --output_path "$DISTCP_PATH" --pp_size "$pp" --ep_size "$ep")
case "${CONVERT_CPU_INIT:-0}" in
    1) cmd+=(--use_cpu_initialization) ;;
    0) ;;
    *) die "CONVERT_CPU_INIT=${CONVERT_CPU_INIT} must be 0 or 1" ;;
esac

if [[ "$dry" == "1" ]]; then
    echo "convert_hf_to_distcp.sh: DRY_RUN=1: the command (not run):"
    printf '%q ' "${cmd[@]}"
    echo
    exit 0
fi
echo "convert_hf_to_distcp.sh: $ranks rank(s) (PP $pp x EP $ep) on $nnodes node(s): $MODEL_PATH -> $DISTCP_PATH" >&2
"${cmd[@]}"
if [[ "${NODE_RANK:-0}" == "0" && ! -f "$DISTCP_PATH/metadata.json" ]]; then
    die "the converter finished but $DISTCP_PATH has no metadata.json: the conversion did not complete"
fi
echo "convert_hf_to_distcp.sh: done: DISTCP_PATH=$DISTCP_PATH" >&2
