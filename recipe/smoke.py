"""``PRESET=smoke``: the whole launch path of ``scripts/train_grpo.sh`` on one GPU, with nothing to download.

The 16-GPU job is expensive to get wrong; the smoke preset runs the same script, the same recipe code (sampler,
cap, dist-checkpoint loading for actor and ref, vLLM rollout, Megatron update, logging) on a tiny random
Qwen3-MoE built by ``recipe.tiny.artifacts`` (4 layers, 8 experts) and a generated arithmetic dataset, for 3 short
epochs. The cap floor is low enough to bite on 256-token responses, and the length buckets small enough to order
them, so the recipe's own paths really run.

:func:`smoke_env` returns the preset's environment values; the preflight lays the user's explicit variables over
them (so ``PRESET=smoke TOTAL_EPOCHS=1`` works). The tiny model and data are built here (CPU, cached); the dist
checkpoint is converted by ``scripts/train_grpo.sh`` at launch through ``scripts/convert_hf_to_distcp.sh``, because
verl's converter needs a GPU. On a CPU machine the preflight therefore accepts a missing ``DISTCP_PATH`` in this
preset (and only in it).
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

# Rows: 32 train prompts / batch 8 = 4 steps per epoch, 12 steps in all; 8 validation prompts.
N_TRAIN, N_TEST = 32, 8

SMOKE_VALUES = {
    "NNODES": "1",
    "GPUS_PER_NODE": "1",
    "ACTOR_TP": "1",
    "ACTOR_PP": "1",
    "ACTOR_CP": "1",
    "ACTOR_EP": "1",
    "ACTOR_ETP": "1",
    "ACTOR_PP_FIRST_LAYERS": "0",
    "ACTOR_PP_LAST_LAYERS": "0",
    "ACTOR_RECOMPUTE": "0",
    "ACTOR_PARAM_OFFLOAD": "0",
    "ACTOR_OPTIMIZER_OFFLOAD": "0",
    "ROLLOUT_TP": "1",
    "ROLLOUT_GPU_MEMORY_UTILIZATION": "0.4",
    "ROLLOUT_MAX_NUM_SEQS": "64",
    "TRAIN_BATCH_SIZE": "8",
    "ROLLOUT_N": "4",
    "ACTOR_PPO_MINI_BATCH_SIZE": "4",
    "MAX_PROMPT_LENGTH": "256",
    "MAX_RESPONSE_LENGTH": "256",
    "TOTAL_EPOCHS": "3",
    "TRAINER_TEST_FREQ": "4",
    "TRAINER_VAL_BEFORE_TRAIN": "1",
    # with ROLLOUT_SPECULATIVE=group (scripts/gpu_check.sh): a GiB holds the tiny run's whole history
    "ROLLOUT_SPECULATIVE_CORPUS_GIB": "1",
    # Random weights produce responses up to the limit: a low floor makes the cap shorten them from epoch 2 on.
    "VLLM_ROLLOUT_EARLY_STOP_MIN_TOKENS": "64",
    # 1024-token buckets would hold every tiny response in one bucket (no ordering at all).
    "SAMPLER_BUCKET_SIZE": "16",
}


def distcp_dir(model_dir: Path) -> Path:
    """The tiny model's dist checkpoint, next to it in the fixture cache (its name follows the model version)."""
    return model_dir.with_name(model_dir.name + "-distcp")


def smoke_env(env: Mapping[str, str]) -> dict[str, str]:
    """The preset's values, with the tiny model and data built (or reused) under ``RECIPE_FIXTURE_CACHE``.

    The tiny model's checkpoint path is offered only with the tiny model: a user's own ``MODEL_PATH`` needs its
    own ``DISTCP_PATH`` (else the launch would convert it into the tiny model's slot of the cache).
    """
    from .tiny.artifacts import tiny_artifacts

    art = tiny_artifacts(env.get("RECIPE_FIXTURE_CACHE") or None, n_train=N_TRAIN, n_test=N_TEST)
    values = {**SMOKE_VALUES, "TRAIN_FILE": str(art.train_parquet), "TEST_FILE": str(art.test_parquet)}
    if not (env.get("MODEL_PATH") or "").strip():
        values.update(MODEL_PATH=str(art.model_dir), DISTCP_PATH=str(distcp_dir(art.model_dir)))
    return values
