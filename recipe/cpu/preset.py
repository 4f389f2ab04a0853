"""``PRESET=cpu``: the whole recipe through verl's real loop on a machine without a GPU, in a few minutes.

The default of ``bash scripts/train_grpo.sh`` when neither ``MODEL_PATH`` nor a GPU is there: verl's FSDP engine and
one vLLM CPU replica that verl starts itself (``configs/length_aware_grpo_cpu.yaml``), with the length-aware sampler,
the cap and (with ``OVER_SAMPLE_ENABLE=1``) over-sampling, exactly the recipe code of the GPU cluster. 48 prompts,
batch 8 x 4 responses, 3 epochs of 6 steps (18 steps). Three flavours, each a dict of values over
:data:`CPU_VALUES`:

- **countdown** (the default, ``CPU_MODEL=trained``): the tiny Qwen3-MoE trained on two tasks
  (``recipe.tiny.sft``, built in ~8 CPU-minutes and cached) answers "Count down from N.": its answers end
  with EOS at lengths the prompt sets (~5 to ~130 tokens) with spread within a prompt, so the estimates rank
  prompts and the cap (2 x the batch's estimate, floor 16) cuts the batches' longer-than-expected responses only.
  Reward ``reward/math_reward.py`` on its ``#### N``; learning rate 1e-4 (a trained model: the random flavour's
  5e-3 would undo its training).
- **random** (``CPU_MODEL=random``): the random tiny model of ``recipe.tiny.artifacts`` on generated math prompts,
  scored by a smoke task (``reward/smoke_reward.py``: digit density) that it learns within the run. It rarely emits
  its stop token, so every response runs to the limit (32) and the cap (factor 0.5) visibly halves them from epoch 1
  on. The test suite's single-turn e2e runs use it: their assertions are written for it (tests/e2e/conftest.py).
- **multi-turn** (``MULTI_TURN=1``): the trained model on calculator word problems through ``CappedToolAgentLoop``
  and the recipe's calculator tool (``recipe/tools/configs/calculator.yaml``), scored by
  ``reward/tool_use_reward.py`` (the right answer; half for the tool's result; a guess without the tool earns
  nothing); prompts of ~230 tokens (the tools block), trajectories of ~50 (call, tool reply, answer), budget 96, cap
  factor 2 with a floor of 32 (a cap below the answer zeroes the reward), learning rate 4e-4. The model calls the
  tool on ~70% of the prompts at first; GRPO raises that to ~95% within the 18 steps. docs/multi-turn.md.

What a CPU run proves and what it cannot is listed in ``docs/cpu-run.md``. :func:`cpu_env` returns the preset's
environment values; the preflight lays the user's explicit variables over them, as for the smoke preset.
:data:`PLATFORM_ENV` is the environment every process of the run needs.
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
    # Ray starts its workers at niceness 15 (RayConfig worker_niceness): on a CPU every process of the run is a Ray
    # worker, so any other CPU load at niceness 0 starved it (a launch beside the test suite and one busy process
    # stalled 9 min with vLLM's worker process at 2 s of CPU in 76 s). The GPU path keeps Ray's default.
    "RAY_worker_niceness": "0",
}

# The random flavour, and the base of the other two
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
    "ACTOR_LR": "5e-3",  # a random tiny model and a dense reward: visible progress within a few dozen steps
    "TRAINER_TEST_FREQ": "6",
    "TRAINER_VAL_BEFORE_TRAIN": "1",
    "TRAINER_LOGGER": "file,wandb",  # the recipe prints a compact line per step; verl's console line has ~150 keys
    "VLLM_ROLLOUT_EARLY_STOP_FACTOR": "0.5",
    "VLLM_ROLLOUT_EARLY_STOP_MIN_TOKENS": "8",
    "ROLLOUT_SAMPLING_SEED": "0",  # reproducible runs: a resumed run draws what an uninterrupted one would
    # 1024-token buckets would hold every tiny response in one bucket (no ordering at all).
    "SAMPLER_BUCKET_SIZE": "4",
}


# What differs from CPU_VALUES (the random flavour) in the two flavours on the trained model
COUNTDOWN_VALUES = {
    "MAX_RESPONSE_LENGTH": "160",  # the longest countdown (99 ... 1. plus a closing sentence) is ~130 tokens
    "ACTOR_LR": "1e-4",
    # the seed's factor: 1.25 cut 25-55% of the responses (a countdown's closing sentence adds up to 13 tokens)
    "VLLM_ROLLOUT_EARLY_STOP_FACTOR": "2.0",
    "VLLM_ROLLOUT_EARLY_STOP_MIN_TOKENS": "16",
    "SAMPLER_BUCKET_SIZE": "16",
}
MULTI_TURN_VALUES = {
    "MAX_PROMPT_LENGTH": "256",
    "MAX_RESPONSE_LENGTH": "96",
    "ACTOR_LR": "4e-4",  # 1e-3 collapsed the policy to empty answers within 6 steps; 2e-4 barely moved it
    "VLLM_ROLLOUT_EARLY_STOP_FACTOR": "2.0",
    "VLLM_ROLLOUT_EARLY_STOP_MIN_TOKENS": "32",
    "SAMPLER_BUCKET_SIZE": "8",
}


def cpu_flavour(env: Mapping[str, str]) -> str:
    """``multi-turn``, ``countdown`` or ``random`` (see the module docstring); a bad value of either variable counts
    as unset here: the preflight reports it by name."""
    from ..settings import parse_bool

    try:
        if parse_bool(env.get("MULTI_TURN") or "0"):
            return "multi-turn"
    except ValueError:
        pass
    return "random" if (env.get("CPU_MODEL") or "").strip() == "random" else "countdown"


def cpu_env(env: Mapping[str, str]) -> dict[str, str]:
    """The preset's values, with the tiny model and data built (or reused) under ``RECIPE_FIXTURE_CACHE``; with
    ``ROLLOUT_SPECULATIVE=eagle3`` and no ``DRAFT_MODEL_PATH``, the tiny EAGLE-3 head trained for that model too."""
    out = _model_and_data(env)
    if (env.get("ROLLOUT_SPECULATIVE") or "").strip() == "eagle3" and not (env.get("DRAFT_MODEL_PATH") or "").strip():
        from ..tiny.eagle3_head import build_tiny_eagle3_head

        out["DRAFT_MODEL_PATH"] = str(build_tiny_eagle3_head(out["MODEL_PATH"], env.get("RECIPE_FIXTURE_CACHE") or None))
    return out


def _model_and_data(env: Mapping[str, str]) -> dict[str, str]:
    reward = Path(__file__).resolve().parents[2] / "reward"
    cache = env.get("RECIPE_FIXTURE_CACHE") or None
    flavour = cpu_flavour(env)
    if flavour == "random":
        from ..tiny.artifacts import tiny_artifacts

        art = tiny_artifacts(cache, n_train=N_TRAIN, n_test=N_TEST)
        return {**CPU_VALUES, "MODEL_PATH": str(art.model_dir), "TRAIN_FILE": str(art.train_parquet),
                "TEST_FILE": str(art.test_parquet), "REWARD_FUNCTION_PATH": str(reward / "smoke_reward.py")}
    from ..tiny.sft import sft_artifacts

    sft = sft_artifacts(cache, n_train=N_TRAIN, n_test=N_TEST)
    if flavour == "multi-turn":
        return {**CPU_VALUES, **MULTI_TURN_VALUES, "MODEL_PATH": str(sft.model_dir),
                "TRAIN_FILE": str(sft.tool_train_parquet), "TEST_FILE": str(sft.tool_test_parquet),
                "REWARD_FUNCTION_PATH": str(reward / "tool_use_reward.py")}
    return {**CPU_VALUES, **COUNTDOWN_VALUES, "MODEL_PATH": str(sft.model_dir), "TRAIN_FILE": str(sft.train_parquet),
            "TEST_FILE": str(sft.test_parquet), "REWARD_FUNCTION_PATH": str(reward / "math_reward.py")}
