# shellcheck shell=bash
# Environment for running verl, Ray and vLLM on small CPU machines (sourced by scripts/test.sh).
# No hub access: everything is built locally. Ray must not try to reach anything or start a dashboard.
export HF_HUB_OFFLINE=1
export TRANSFORMERS_OFFLINE=1
export HF_DATASETS_OFFLINE=1
export WANDB_MODE="${WANDB_MODE:-offline}"
export TOKENIZERS_PARALLELISM=false
export RAY_USAGE_STATS_ENABLED=0
export VLLM_NO_USAGE_STATS=1
export DO_NOT_TRACK=1
export VLLM_TARGET_DEVICE=cpu
export PYTHONDONTWRITEBYTECODE=1
# Fixtures (tiny tokenizer/model/parquet) are built once per machine and reused.
export RECIPE_FIXTURE_CACHE="${RECIPE_FIXTURE_CACHE:-$PWD/.cache/fixtures}"
