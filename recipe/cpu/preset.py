"""``PRESET=cpu``: the whole recipe through verl's real loop on a machine without a GPU, in a few minutes.

The default of ``bash scripts/train_grpo.sh`` when neither ``MODEL_PATH`` nor a GPU is there. It trains the tiny
random Qwen3-MoE of ``recipe.testing.tiny`` on the generated math prompts with verl's FSDP engine and one vLLM CPU
replica that verl starts itself (``configs/length_aware_grpo_cpu.yaml``), with the length-aware sampler, the cap
and (with ``OVER_SAMPLE_ENABLE=1``) over-sampling, exactly the recipe code of the GPU cluster. Its reward is a smoke
task (``reward/smoke_reward.py``: digit density), not math: a random model cannot learn arithmetic in minutes.

Sizing: 48 prompts, batch 8 x 4 responses of at most 32 tokens, 3 epochs of 6 steps (18 steps). A random model
rarely emits its stop token, so nearly every response runs to the length limit; the cap's factor is 0.5 so that
from epoch 1 on it visibly halves the responses (``rollout/response_max_tokens_cap`` 16). What a CPU run proves and
what it cannot is listed in ``docs/cpu-run.md``.

:func:`cpu_env` returns the preset's environment values; the preflight lays the user's explicit variables over
them, as for the smoke preset. :data:`PLATFORM_ENV` is the environment every process of the run needs.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

N_TRAIN, N_TEST = 48, 8
CONFIG_NAME = "length_aware_grpo_cpu"

# verl's CPU platform (recipe/cpu/verl_platform.py) in every process; the FSDP engine is registered for device
# "cuda"/"npu" only (verl/workers/engine/fsdp/transformer_impl.py), VERL_ENGINE_DEVICE is verl's own override of
# that lookup (verl/workers/engine/base.py); the engine itself places tensors on get_device_name() = "cpu".
PLATFORM_ENV = {
    "VERL_PLATFORM": "cpu",
    "VERL_USE_EXTERNAL_MODULES": "recipe.cpu.verl_platform",
    "VERL_ENGINE_DEVICE": "cuda",
    "VLLM_TARGET_DEVICE": "cpu",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "VLLM_NO_USAGE_STATS": "1",
}

CPU_VALUES = {
    "NNODES": "1",
    "GPUS_PER_NODE": "1",
    "DISTCP_PATH": "none",  # FSDP loads MODEL_PATH itself
    "ROLLOUT_TP": "1",
    "ROLLOUT_GPU_MEMORY_UTILIZATION": "0.25",
    "ROLLOUT_MAX_NUM_SEQS": "64",
    "ROLLOUT_MAX_NUM_BATCHED_TOKENS": "2048",
    "TRAIN_BATCH_SIZE": "8",
    "ROLLOUT_N": "4",
    "ACTOR_PPO_MINI_BATCH_SIZE": "8",
    "MAX_PROMPT_LENGTH": "96",
    "MAX_RESPONSE_LENGTH": "32",
    "TOTAL_EPOCHS": "3",
    # one micro-batch per pass: the default token budget (one longest sequence) splits a CPU step into dozens
    "ACTOR_PPO_MAX_TOKEN_LEN_PER_GPU": "8192",
    "LOG_PROB_MAX_TOKEN_LEN_PER_GPU": "8192",
    "ACTOR_LR": "5e-3",  # a tiny model and a dense reward: visible progress within a few dozen steps
    "TRAINER_TEST_FREQ": "6",
    "TRAINER_VAL_BEFORE_TRAIN": "1",
    "TRAINER_LOGGER": "file,wandb",  # the recipe prints a compact line per step; verl's console line has ~150 keys
    "VLLM_ROLLOUT_EARLY_STOP_FACTOR": "0.5",
    "VLLM_ROLLOUT_EARLY_STOP_MIN_TOKENS": "8",
    "ROLLOUT_SAMPLING_SEED": "0",  # reproducible runs: a resumed run draws what an uninterrupted one would
    # 1024-token buckets would hold every tiny response in one bucket (no ordering at all).
    "SAMPLER_BUCKET_SIZE": "4",
}


def cpu_env(env: Mapping[str, str]) -> dict[str, str]:
    """The preset's values, with the tiny model and data built (or reused) under ``RECIPE_FIXTURE_CACHE``."""
    from ..testing.tiny import tiny_artifacts

    art = tiny_artifacts(env.get("RECIPE_FIXTURE_CACHE") or None, n_train=N_TRAIN, n_test=N_TEST)
    reward = Path(__file__).resolve().parents[2] / "reward" / "smoke_reward.py"
    return {**CPU_VALUES, "MODEL_PATH": str(art.model_dir), "TRAIN_FILE": str(art.train_parquet),
            "TEST_FILE": str(art.test_parquet), "REWARD_FUNCTION_PATH": str(reward)}
