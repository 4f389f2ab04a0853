"""CPU preflight for ``scripts/train_grpo.sh``: environment -> Hydra overrides -> composed config -> checks.

A 16-GPU job that dies in a Ray actor after minutes of start-up, on a typo or a parallel layout Megatron rejects,
wastes the cluster and hides the cause in a stack trace. The preflight runs the same composition the launch runs
(verl 0.9.1 + ``configs/length_aware_grpo.yaml``), on a CPU, in seconds, and reports every problem at once, each
naming the environment variable (and Hydra key) to change and how. ``scripts/train_grpo.sh`` runs it before every
launch and in ``DRY_RUN=1`` mode; tests call :func:`run_preflight` in-process.

Two phases: (1) the environment variables in :data:`KNOBS` are parsed (types, ranges, required inputs) before any
Hydra composition, so a bad value is reported under its variable name rather than as a Hydra grammar error;
(2) the overrides built from them, followed by the user's extra overrides (last one wins), are composed, passed
through ``recipe.main.prepare_config`` (recipe settings + verl's ``validate_config``), and checked against what
verl does not check: Megatron's parallel layout rules, the model's ``config.json``, the dist checkpoint, the
parquet schemas, the rollout layout and batch divisibility.

``KNOBS`` is the single source of the variables, their defaults and the keys they set; the README table is
generated from it (``python -m recipe.preflight --env-table``).
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import io
import json
import math
import os
import re
import shlex
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .settings import RecipeConfigError, select

REPO_ROOT = Path(__file__).resolve().parents[1]
CONVERT_SCRIPT = REPO_ROOT / "scripts" / "convert_hf_to_distcp.sh"

# --------------------------------------------------------------------------------------------------------------
# The environment variables
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Knob:
    """One environment variable: how to parse it, its default, and what it sets (for messages and the README)."""

    env: str
    kind: str  # bool | int | float | str | choice | path | paths | script (read by the bash scripts only)
    default: str | Callable[[dict], Any] | None  # None: required (or unset for script knobs)
    sets: str  # Hydra key(s) or effect, for the README table
    doc: str
    default_doc: str = ""  # how a computed default is shown in the table
    minimum: float | None = None
    choices: tuple[str, ...] = ()
    group: str = ""


def _prompt_plus_response(v: dict) -> int:
    return v["MAX_PROMPT_LENGTH"] + v["MAX_RESPONSE_LENGTH"]


def _experiment_name(v: dict) -> str:
    """``<model>-grpo-<variant>``: a run directory per model and comparison arm."""
    if v["VLLM_EAGER_BASELINE_NO_RESAMPLE"]:
        variant = "baseline"
    else:
        variant = "resampler"
        if not v["VLLM_ROLLOUT_EARLY_STOP_ENABLE"]:
            variant += "-nocap"
        elif v["VLLM_ROLLOUT_EARLY_STOP_MODE"] == "calibrated":
            variant += "-calcap"
        if v["OVER_SAMPLE_ENABLE"]:
            variant += "-os"
    model = "smoke" if v["PRESET"] == "smoke" else re.sub(r"[^a-z0-9._-]+", "-", Path(v["MODEL_PATH"]).name.lower())
    return f"{model}-grpo-{variant}"


_P_PLUS_R = "MAX_PROMPT_LENGTH + MAX_RESPONSE_LENGTH"
_G_IN, _G_CLUSTER, _G_BATCH, _G_MEGATRON, _G_ROLLOUT, _G_RECIPE, _G_RUN, _G_SCRIPT, _G_CONVERT = (
    "Inputs", "Cluster", "Batch, lengths, algorithm (GRPO)", "Megatron actor and ref (Qwen3-30B-A3B: 48 layers, "
    "128 experts)", "vLLM rollout", "Comparison switches, sampler, cap, over-sample", "Run directory, checkpoints, "
    "logging", "Script control", "Conversion (scripts/convert_hf_to_distcp.sh)",
)
_ARR = "actor_rollout_ref"
_MEG = f"{_ARR}.actor.megatron"

KNOBS: tuple[Knob, ...] = (
    Knob("PRESET", "choice", "", "(the defaults of the other variables)", "`smoke`: tiny random Qwen3-MoE, "
         "generated math data, 1 GPU; the default when MODEL_PATH is unset on a GPU machine", default_doc="unset",
         choices=("", "smoke"), group=_G_IN),
    Knob("MODEL_PATH", "path", None, f"{_ARR}.model.path", "Hugging Face model dir (config.json, tokenizer, "
         "safetensors: vLLM loads it)", group=_G_IN),
    Knob("DISTCP_PATH", "path", None, f"{_ARR}.{{actor,ref}}.megatron.use_dist_checkpointing=True, "
         ".dist_checkpointing_path", "Megatron dist checkpoint of MODEL_PATH for actor and ref (convert script)",
         group=_G_IN),
    Knob("TRAIN_FILE", "paths", None, "data.train_files", "train parquet in verl RL format (comma-separated for "
         "several; `scripts/prepare_data.py` writes it)", group=_G_IN),
    Knob("TEST_FILE", "paths", None, "data.val_files", "validation parquet(s), same format", group=_G_IN),
    Knob("REWARD_FUNCTION_PATH", "path", str(REPO_ROOT / "reward" / "math_reward.py"),
         "reward.custom_reward_function.path", "file defining the reward function",
         default_doc="`<repo>/reward/math_reward.py`", group=_G_IN),
    Knob("REWARD_FUNCTION_NAME", "str", "compute_score", "reward.custom_reward_function.name",
         "function name in that file", group=_G_IN),
    Knob("NNODES", "int", "2", "trainer.nnodes", "nodes", minimum=1, group=_G_CLUSTER),
    Knob("GPUS_PER_NODE", "int", "8", "trainer.n_gpus_per_node", "GPUs per node", minimum=1, group=_G_CLUSTER),
    Knob("TRAIN_BATCH_SIZE", "int", "32", "data.train_batch_size", "prompts per step", minimum=1, group=_G_BATCH),
    Knob("GEN_BATCH_SIZE", "int", lambda v: v["TRAIN_BATCH_SIZE"], "data.gen_batch_size",
         "prompts per rollout fetch (divides TRAIN_BATCH_SIZE)", default_doc="TRAIN_BATCH_SIZE", minimum=1,
         group=_G_BATCH),
    Knob("ROLLOUT_N", "int", "16", f"{_ARR}.rollout.n", "responses per prompt (GRPO group)", minimum=1,
         group=_G_BATCH),
    Knob("MAX_PROMPT_LENGTH", "int", "1024", "data.max_prompt_length", "prompt tokens", minimum=1, group=_G_BATCH),
    Knob("MAX_RESPONSE_LENGTH", "int", "16384", "data.max_response_length", "response tokens (the cap never "
         "exceeds it)", minimum=1, group=_G_BATCH),
    Knob("TOTAL_EPOCHS", "int", "3", "trainer.total_epochs", "epochs", minimum=1, group=_G_BATCH),
    Knob("ACTOR_PPO_MINI_BATCH_SIZE", "int", "8", f"{_ARR}.actor.ppo_mini_batch_size",
         "prompts per optimizer update (x ROLLOUT_N responses)", minimum=1, group=_G_BATCH),
    Knob("ACTOR_LR", "float", "1e-6", f"{_ARR}.actor.optim.lr", "learning rate", minimum=0, group=_G_BATCH),
    Knob("USE_KL_LOSS", "bool", "1", f"{_ARR}.actor.use_kl_loss", "GRPO KL loss against the ref model "
         "(low_var_kl; the ref loads DISTCP_PATH)", group=_G_BATCH),
    Knob("KL_LOSS_COEF", "float", "0.001", f"{_ARR}.actor.kl_loss_coef", "KL loss weight", minimum=0,
         group=_G_BATCH),
    Knob("ACTOR_PPO_MAX_TOKEN_LEN_PER_GPU", "int", _prompt_plus_response, f"{_ARR}.actor.ppo_max_token_len_per_gpu",
         "dynamic-batch token budget per micro-batch (training); x ACTOR_CP must hold one full sequence",
         default_doc=_P_PLUS_R, minimum=1, group=_G_BATCH),
    Knob("LOG_PROB_MAX_TOKEN_LEN_PER_GPU", "int", lambda v: 2 * _prompt_plus_response(v),
         f"{_ARR}.{{rollout,ref}}.log_prob_max_token_len_per_gpu", "same for the forward-only log-prob passes",
         default_doc=f"2 x ({_P_PLUS_R})", minimum=1, group=_G_BATCH),
    Knob("ACTOR_TP", "int", "2", f"{_MEG}.tensor_model_parallel_size", "tensor parallel (divides the 4 KV heads)",
         minimum=1, group=_G_MEGATRON),
    Knob("ACTOR_PP", "int", "4", f"{_MEG}.pipeline_model_parallel_size", "pipeline stages", minimum=1,
         group=_G_MEGATRON),
    Knob("ACTOR_CP", "int", "1", f"{_MEG}.context_parallel_size", "context parallel", minimum=1,
         group=_G_MEGATRON),
    Knob("ACTOR_EP", "int", "4", f"{_MEG}.expert_model_parallel_size", "expert parallel (divides num_experts)",
         minimum=1, group=_G_MEGATRON),
    Knob("ACTOR_ETP", "int", "1", f"{_MEG}.expert_tensor_parallel_size", "expert tensor parallel", minimum=1,
         group=_G_MEGATRON),
    Knob("ACTOR_PP_FIRST_LAYERS", "int", "11", f"+{_MEG}.override_transformer_config."
         "num_layers_in_first_pipeline_stage", "layers on the first stage (it also holds the embedding); 0 = even "
         "split", minimum=0, group=_G_MEGATRON),
    Knob("ACTOR_PP_LAST_LAYERS", "int", "11", f"+{_MEG}.override_transformer_config."
         "num_layers_in_last_pipeline_stage", "layers on the last stage (output layer + logits); 0 = even split",
         minimum=0, group=_G_MEGATRON),
    Knob("ACTOR_SEQUENCE_PARALLEL", "bool", "1", f"{_MEG}.sequence_parallel", "Megatron sequence parallel "
         "(required with TP>1 and EP>1)", group=_G_MEGATRON),
    Knob("ACTOR_RECOMPUTE", "bool", "1", f"{_MEG}.override_transformer_config.recompute_*", "full activation "
         "recompute (uniform, 1 layer): 16k-token sequences", group=_G_MEGATRON),
    Knob("ACTOR_PARAM_OFFLOAD", "bool", "1", f"{_MEG}.param_offload (ref too)", "park weights on the CPU while "
         "vLLM generates", group=_G_MEGATRON),
    Knob("ACTOR_OPTIMIZER_OFFLOAD", "bool", "1", f"{_MEG}.optimizer_offload", "park optimizer states on the CPU "
         "outside the update", group=_G_MEGATRON),
    Knob("ROLLOUT_TP", "int", "4", f"{_ARR}.rollout.tensor_model_parallel_size", "vLLM tensor parallel per replica",
         minimum=1, group=_G_ROLLOUT),
    Knob("ROLLOUT_DP", "int", "1", f"{_ARR}.rollout.data_parallel_size", "vLLM data parallel per replica",
         minimum=1, group=_G_ROLLOUT),
    Knob("ROLLOUT_EP", "int", "1", f"{_ARR}.rollout.expert_parallel_size", "vLLM expert parallel (if > 1: = "
         "ROLLOUT_TP x ROLLOUT_DP)", minimum=1, group=_G_ROLLOUT),
    Knob("ROLLOUT_GPU_MEMORY_UTILIZATION", "float", "0.6", f"{_ARR}.rollout.gpu_memory_utilization",
         "GPU memory share for vLLM (weights + KV cache)", minimum=0, group=_G_ROLLOUT),
    Knob("ROLLOUT_MAX_NUM_SEQS", "int", "256", f"{_ARR}.rollout.max_num_seqs", "concurrent sequences per replica",
         minimum=1, group=_G_ROLLOUT),
    Knob("ROLLOUT_MAX_NUM_BATCHED_TOKENS", "int", _prompt_plus_response, f"{_ARR}.rollout.max_num_batched_tokens",
         "tokens per vLLM scheduler step (chunked prefill)", default_doc=_P_PLUS_R, minimum=1, group=_G_ROLLOUT),
    Knob("VLLM_EAGER_BASELINE_NO_RESAMPLE", "bool", "0", f"{_ARR}.rollout.enforce_eager=True, "
         "data.sampler.class_path=null, recipe.cap.enable=0", "the baseline arm: eager vLLM, verl's sampler, no "
         "cap (ignores the cap and sampler variables)", group=_G_RECIPE),
    Knob("VLLM_ROLLOUT_EARLY_STOP_ENABLE", "bool", "1", "recipe.cap.enable", "per-batch response cap (vLLM "
         "max_tokens)", group=_G_RECIPE),
    Knob("VLLM_ROLLOUT_EARLY_STOP_MODE", "choice", "seed", "recipe.cap.mode", "`seed`: min(response, max(MIN_TOKENS, "
         "FACTOR x estimate)); `calibrated`: from recent under-prediction", choices=("seed", "calibrated"),
         group=_G_RECIPE),
    Knob("VLLM_ROLLOUT_EARLY_STOP_FACTOR", "float", "2.0", "recipe.cap.factor", "seed cap factor", minimum=0,
         group=_G_RECIPE),
    Knob("VLLM_ROLLOUT_EARLY_STOP_MIN_TOKENS", "int", "10000", "recipe.cap.min_tokens", "seed cap floor",
         minimum=1, group=_G_RECIPE),
    Knob("SAMPLER_BUCKET_SIZE", "float", "1024", "data.sampler.bucket_size", "tokens per length bucket",
         minimum=0, group=_G_RECIPE),
    Knob("SAMPLER_EMA_DECAY", "float", "0.7", "data.sampler.ema_decay", "weight of the old estimate (0..0.999)",
         minimum=0, group=_G_RECIPE),
    Knob("SAMPLER_SHUFFLE_BATCH_BLOCKS", "bool", "1", "data.sampler.shuffle_batch_blocks", "shuffle whole "
         "batches after sorting", group=_G_RECIPE),
    Knob("SAMPLER_STATISTIC", "str", "mean", "data.sampler.statistic", "group statistic: mean, max, median or pNN",
         group=_G_RECIPE),
    Knob("OVER_SAMPLE_ENABLE", "bool", "0", "recipe.over_sample.enable", "over-sample and abort the slowest groups",
         group=_G_RECIPE),
    Knob("OVER_SAMPLE_RATIO", "float", "0.25", "recipe.over_sample.ratio", "extra prompts per batch (share)",
         minimum=0, group=_G_RECIPE),
    Knob("OVER_SAMPLE_REQUEUE", "choice", "restart", "recipe.over_sample.requeue", "`restart`: aborted prompts "
         "regenerate from scratch at the back of the epoch (on-policy); `continue`: partial rollout, resumed next "
         "step", choices=("restart", "continue"), group=_G_RECIPE),
    Knob("OVER_SAMPLE_MAX_RESUMES", "int", "1", "recipe.over_sample.max_resumes", "continue: resumes per "
         "response before it restarts (bounds policy versions per response to this + 1)", minimum=0,
         group=_G_RECIPE),
    Knob("PROJECT_NAME", "str", "length-aware-grpo", "trainer.project_name", "wandb project", group=_G_RUN),
    Knob("EXPERIMENT_NAME", "str", _experiment_name, "trainer.experiment_name", "run name and run directory name",
         default_doc="`<model>-grpo-<variant>`: `resampler`, `resampler-nocap`, `resampler-calcap`, `-os`, "
         "`baseline`", group=_G_RUN),
    Knob("CKPT_ROOT", "path", str(REPO_ROOT / "checkpoints"), "trainer.default_local_dir=CKPT_ROOT/EXPERIMENT_NAME",
         "parent of the run directories (shared filesystem on multi-node)", default_doc="`<repo>/checkpoints`",
         group=_G_RUN),
    Knob("SAVE_CKPT_ENABLE", "bool", "0", "trainer.save_freq, trainer.resume_mode", "1: save every "
         "TRAINER_SAVE_FREQ steps, resume from the latest (`auto`); 0: save nothing, never resume (`disable`)",
         group=_G_RUN),
    Knob("TRAINER_SAVE_FREQ", "int", "20", "trainer.save_freq", "steps between checkpoints (SAVE_CKPT_ENABLE=1)",
         minimum=1, group=_G_RUN),
    Knob("MAX_CKPT_TO_KEEP", "int", "2", "trainer.max_actor_ckpt_to_keep", "checkpoints kept (~0.4 TB each with "
         "optimizer)", minimum=1, group=_G_RUN),
    Knob("TRAINER_TEST_FREQ", "int", "10", "trainer.test_freq", "steps between validations (-1: never)",
         minimum=-1, group=_G_RUN),
    Knob("TRAINER_VAL_BEFORE_TRAIN", "bool", "0", "trainer.val_before_train", "validate before the first step",
         group=_G_RUN),
    Knob("TRAINER_LOGGER", "str", "console,file,wandb", "trainer.logger", "verl loggers", group=_G_RUN),
    Knob("WANDB_MODE", "choice", lambda v: "online" if v["WANDB_API_KEY"] else "offline",
         "+ray_kwargs.ray_init.runtime_env.env_vars.WANDB_MODE", "wandb mode, also sent to the Ray actors",
         default_doc="`online` if WANDB_API_KEY is set, else `offline`", choices=("online", "offline", "disabled"),
         group=_G_RUN),
    Knob("WANDB_API_KEY", "script", None, "(environment only)", "wandb key; on a multi-node cluster export it on "
         "every node before `ray start` (it is never written into the config)", default_doc="unset", group=_G_RUN),
    Knob("DRY_RUN", "script", "0", "(script)", "1: preflight, print the command and the resolved settings, exit",
         group=_G_SCRIPT),
    Knob("PREFLIGHT_DUMP", "script", None, "(script)", "write the resolved config and overrides as JSON to this "
         "path", default_doc="unset", group=_G_SCRIPT),
    Knob("RECIPE_PYTHON", "script", None, "(script)", "Python to use (else `.venv-gpu`, a `python3` with verl, a new "
         "`.venv-gpu` on a GPU machine, or the CPU `.venv`)", default_doc="unset", group=_G_SCRIPT),
    Knob("RAY_ADDRESS", "script", None, "(ray.init)", "join a running Ray cluster (multi-node); no local GPU "
         "needed on the launching machine", default_doc="unset", group=_G_SCRIPT),
    Knob("CONVERT_PP", "script", "ACTOR_PP", "--pp_size", "pipeline ranks of the conversion", group=_G_CONVERT),
    Knob("CONVERT_EP", "script", "ACTOR_EP", "--ep_size", "expert ranks of the conversion", group=_G_CONVERT),
    Knob("CONVERT_NNODES", "script", "ceil(PP x EP / GPUS_PER_NODE)", "torchrun --nnodes", "nodes; > 1 needs "
         "NODE_RANK and MASTER_ADDR on each node", group=_G_CONVERT),
    Knob("CONVERT_CPU_INIT", "script", "0", "--use_cpu_initialization", "build the Megatron model in host "
         "memory (one rank on a small GPU)", group=_G_CONVERT),
    Knob("NODE_RANK", "script", None, "torchrun --node_rank", "this node's rank (CONVERT_NNODES > 1)",
         default_doc="unset", group=_G_CONVERT),
    Knob("MASTER_ADDR", "script", None, "torchrun --master_addr", "node 0's address (CONVERT_NNODES > 1)",
         default_doc="unset", group=_G_CONVERT),
    Knob("MASTER_PORT", "script", "29500", "torchrun --master_port", "rendezvous port (CONVERT_NNODES > 1)",
         group=_G_CONVERT),
)
KNOB = {k.env: k for k in KNOBS}
_PARSED = tuple(k for k in KNOBS if k.kind != "script")

def _bool(raw: str) -> bool:
    s = raw.strip().lower()
    if s not in ("0", "1", "true", "false"):
        raise ValueError("must be 0 or 1 (or true/false)")
    return s in ("1", "true")


def _parse_value(knob: Knob, raw: str) -> Any:
    """Parse one raw string; ``ValueError`` carries the reason."""
    if knob.kind == "bool":
        return _bool(raw)
    if knob.kind in ("int", "float"):
        try:
            value = int(raw.strip()) if knob.kind == "int" else float(raw.strip())
        except ValueError:
            raise ValueError(f"must be {'an integer' if knob.kind == 'int' else 'a number'}") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError("must be a finite number")
        if knob.minimum is not None and value < knob.minimum:
            raise ValueError(f"must be >= {knob.minimum:g}")
        return value
    if knob.kind == "choice":
        if raw.strip() not in knob.choices:
            raise ValueError("must be one of " + ", ".join(repr(c) for c in knob.choices if c))
        return raw.strip()
    if knob.kind == "path":
        return os.path.abspath(os.path.expanduser(raw.strip()))
    if knob.kind == "paths":
        parts = [p.strip() for p in raw.split(",") if p.strip()]
        if not parts:
            raise ValueError("must name at least one file")
        return [os.path.abspath(os.path.expanduser(p)) for p in parts]
    return raw.strip()


def _default_text(knob: Knob) -> str:
    return knob.default_doc or (f"`{knob.default}`" if isinstance(knob.default, str) else "")


_REQUIRED_HINT = {
    "MODEL_PATH": "export MODEL_PATH=/path/to/Qwen3-30B-A3B (a Hugging Face model dir), or PRESET=smoke for the "
                  "tiny 1-GPU run",
    "DISTCP_PATH": "export DISTCP_PATH=/path/to/qwen3-30b-a3b-mcore (create it with `MODEL_PATH=... DISTCP_PATH=... "
                   "bash scripts/convert_hf_to_distcp.sh` on a GPU node)",
    "TRAIN_FILE": "export TRAIN_FILE=/path/to/train.parquet (`python scripts/prepare_data.py --help` converts "
                  "GSM8K / DAPO-Math-17k / DeepScaleR)",
    "TEST_FILE": "export TEST_FILE=/path/to/test.parquet",
}


def parse_env(env: Mapping[str, str], names: tuple[str, ...] | None = None) -> tuple[dict, list[str]]:
    """Parse the variables (all, or ``names`` with static defaults); return ``(values, errors)``.

    Unset or empty means the default. Computed defaults see the values parsed before them (``KNOBS`` order); a
    knob whose dependencies failed to parse is skipped (its dependency's error is reported).
    """
    values: dict[str, Any] = {"WANDB_API_KEY": env.get("WANDB_API_KEY") or ""}
    errors: list[str] = []
    for knob in _PARSED:
        if names is not None and knob.env not in names:
            continue
        raw = env.get(knob.env)
        if raw is None or raw.strip() == "":
            if knob.default is None:
                errors.append(f"{knob.env} is not set: {_REQUIRED_HINT[knob.env]}")
                continue
            if callable(knob.default):
                with contextlib.suppress(KeyError):  # a dependency failed and is reported
                    values[knob.env] = knob.default(values)
                continue
            raw = knob.default
        try:
            values[knob.env] = _parse_value(knob, raw)
        except ValueError as e:
            hint = f"; e.g. export {knob.env}={knob.default}" if isinstance(knob.default, str) and knob.default else ""
            errors.append(f"{knob.env}={raw!r} {e}{hint} (sets {knob.sets})")
    values.pop("WANDB_API_KEY")  # a secret: only WANDB_MODE's default needs it
    if names is None and not errors:
        errors += _cross_env_errors(values)
    return values, errors


def _cross_env_errors(v: dict) -> list[str]:
    """Env-level consistency that needs no composition."""
    from .core.estimates import parse_statistic

    errors = []
    try:
        parse_statistic(v["SAMPLER_STATISTIC"])
    except ValueError as e:
        errors.append(f"SAMPLER_STATISTIC={v['SAMPLER_STATISTIC']!r}: {e}; e.g. export SAMPLER_STATISTIC=mean")
    if v["TRAIN_BATCH_SIZE"] % v["GEN_BATCH_SIZE"]:
        errors.append(f"TRAIN_BATCH_SIZE={v['TRAIN_BATCH_SIZE']} is not a multiple of GEN_BATCH_SIZE="
                      f"{v['GEN_BATCH_SIZE']}: verl fetches whole gen batches per step; unset GEN_BATCH_SIZE (= the "
                      "train batch) or make it divide TRAIN_BATCH_SIZE")
    if v["VLLM_EAGER_BASELINE_NO_RESAMPLE"] and v["OVER_SAMPLE_ENABLE"]:
        errors.append("VLLM_EAGER_BASELINE_NO_RESAMPLE=1 turns the length-aware sampler off, but OVER_SAMPLE_ENABLE=1 "
                      "needs it: unset OVER_SAMPLE_ENABLE for the baseline arm")
    if "/" in v["EXPERIMENT_NAME"] or v["EXPERIMENT_NAME"] in (".", ".."):
        errors.append(f"EXPERIMENT_NAME={v['EXPERIMENT_NAME']!r} must be a plain directory name (no '/')")
    loggers = [s.strip() for s in v["TRAINER_LOGGER"].split(",") if s.strip()]
    if not loggers or any(not re.fullmatch(r"[A-Za-z0-9_]+", s) for s in loggers):
        errors.append(f"TRAINER_LOGGER={v['TRAINER_LOGGER']!r} must be a comma-separated list of verl loggers, "
                      "e.g. export TRAINER_LOGGER=console,file,wandb")
    return errors


# --------------------------------------------------------------------------------------------------------------
# Overrides
# --------------------------------------------------------------------------------------------------------------


def _q(value: str, var: str) -> str:
    """A Hydra quoted string (paths may hold spaces, commas, '=' ...)."""
    if "${" in value:
        raise RecipeConfigError(f"{var}={value!r}: '${{' would be read as an OmegaConf interpolation; rename the path")
    if "'" not in value:
        return f"'{value}'"
    if '"' not in value:
        return f'"{value}"'
    raise RecipeConfigError(f"{var}={value!r} holds both quote characters; rename the path")


def _files(paths: list[str], var: str) -> str:
    return _q(paths[0], var) if len(paths) == 1 else "[" + ",".join(_q(p, var) for p in paths) + "]"


def _b(x: bool) -> str:
    return "True" if x else "False"


@dataclass(frozen=True)
class RunPaths:
    """Where one launch writes: a run directory per experiment, new log files per launch (verl truncates its
    file log on open, so a resume must never reuse a name)."""

    run_dir: str
    console_log: str
    metrics_log: str
    hydra_dir: str


def run_paths(v: dict, env: Mapping[str, str]) -> RunPaths:
    run_dir = os.path.join(v["CKPT_ROOT"], v["EXPERIMENT_NAME"])
    stamp = env.get("RECIPE_LAUNCH_STAMP") or datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    logs = os.path.join(run_dir, "logs")
    base, n = stamp, 1
    while os.path.exists(os.path.join(logs, f"metrics.{stamp}.jsonl")):
        n += 1
        stamp = f"{base}-{n}"
    return RunPaths(run_dir, os.path.join(logs, f"console.{stamp}.log"),
                    os.path.join(logs, f"metrics.{stamp}.jsonl"), os.path.join(run_dir, "hydra", stamp))


def build_overrides(v: dict, paths: RunPaths) -> list[str]:
    """The Hydra overrides for parsed values ``v``; every key is set explicitly, even where the YAML agrees."""
    baseline = v["VLLM_EAGER_BASELINE_NO_RESAMPLE"]
    meg, ref = _MEG, f"{_ARR}.ref.megatron"
    otc = f"{meg}.override_transformer_config"
    o = [
        # inputs
        f"{_ARR}.model.path={_q(v['MODEL_PATH'], 'MODEL_PATH')}",
        f"{meg}.use_dist_checkpointing=True",
        f"{meg}.dist_checkpointing_path={_q(v['DISTCP_PATH'], 'DISTCP_PATH')}",
        f"{ref}.use_dist_checkpointing=True",  # verl's ref does not inherit these two
        f"{ref}.dist_checkpointing_path={_q(v['DISTCP_PATH'], 'DISTCP_PATH')}",
        f"data.train_files={_files(v['TRAIN_FILE'], 'TRAIN_FILE')}",
        f"data.val_files={_files(v['TEST_FILE'], 'TEST_FILE')}",
        f"reward.custom_reward_function.path={_q(v['REWARD_FUNCTION_PATH'], 'REWARD_FUNCTION_PATH')}",
        f"reward.custom_reward_function.name={_q(v['REWARD_FUNCTION_NAME'], 'REWARD_FUNCTION_NAME')}",
        # cluster
        f"trainer.nnodes={v['NNODES']}",
        f"trainer.n_gpus_per_node={v['GPUS_PER_NODE']}",
        # GRPO: group-normalised advantages, no critic, KL as a loss term (not in the reward)
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=False",
        f"{_ARR}.actor.use_kl_loss={_b(v['USE_KL_LOSS'])}",
        f"{_ARR}.actor.kl_loss_coef={v['KL_LOSS_COEF']}",
        f"{_ARR}.actor.kl_loss_type=low_var_kl",
        f"{_ARR}.actor.entropy_coeff=0",
        f"{_ARR}.actor.optim.lr={v['ACTOR_LR']}",
        f"{_ARR}.actor.ppo_mini_batch_size={v['ACTOR_PPO_MINI_BATCH_SIZE']}",
        # data: the sampler decides the order; worker processes would hold stale sampler copies
        f"data.train_batch_size={v['TRAIN_BATCH_SIZE']}",
        f"data.gen_batch_size={v['GEN_BATCH_SIZE']}",
        f"data.max_prompt_length={v['MAX_PROMPT_LENGTH']}",
        f"data.max_response_length={v['MAX_RESPONSE_LENGTH']}",
        "data.shuffle=False",
        "data.dataloader_num_workers=0",
        f"{_ARR}.rollout.n={v['ROLLOUT_N']}",
        # dynamic batch sizes: micro-batches packed up to a token budget
        f"{_ARR}.actor.use_dynamic_bsz=True",
        f"{_ARR}.actor.ppo_max_token_len_per_gpu={v['ACTOR_PPO_MAX_TOKEN_LEN_PER_GPU']}",
        f"{_ARR}.rollout.log_prob_use_dynamic_bsz=True",
        f"{_ARR}.rollout.log_prob_max_token_len_per_gpu={v['LOG_PROB_MAX_TOKEN_LEN_PER_GPU']}",
        f"{_ARR}.ref.log_prob_use_dynamic_bsz=True",
        f"{_ARR}.ref.log_prob_max_token_len_per_gpu={v['LOG_PROB_MAX_TOKEN_LEN_PER_GPU']}",
        # Megatron (the ref inherits the parallel sizes and override_transformer_config through oc.select)
        f"{meg}.tensor_model_parallel_size={v['ACTOR_TP']}",
        f"{meg}.pipeline_model_parallel_size={v['ACTOR_PP']}",
        f"{meg}.context_parallel_size={v['ACTOR_CP']}",
        f"{meg}.expert_model_parallel_size={v['ACTOR_EP']}",
        f"{meg}.expert_tensor_parallel_size={v['ACTOR_ETP']}",
        f"{meg}.sequence_parallel={_b(v['ACTOR_SEQUENCE_PARALLEL'])}",
        f"{ref}.sequence_parallel={_b(v['ACTOR_SEQUENCE_PARALLEL'])}",
        f"{meg}.use_distributed_optimizer=True",
        f"{meg}.param_offload={_b(v['ACTOR_PARAM_OFFLOAD'])}",
        f"{meg}.optimizer_offload={_b(v['ACTOR_OPTIMIZER_OFFLOAD'])}",
        f"{ref}.param_offload={_b(v['ACTOR_PARAM_OFFLOAD'])}",
    ]
    if v["ACTOR_PP_FIRST_LAYERS"]:
        o.append(f"+{otc}.num_layers_in_first_pipeline_stage={v['ACTOR_PP_FIRST_LAYERS']}")
    if v["ACTOR_PP_LAST_LAYERS"]:
        o.append(f"+{otc}.num_layers_in_last_pipeline_stage={v['ACTOR_PP_LAST_LAYERS']}")
    if v["ACTOR_RECOMPUTE"]:
        o += [f"{otc}.recompute_granularity=full", f"{otc}.recompute_method=uniform", f"{otc}.recompute_num_layers=1"]
    o += [
        # vLLM rollout
        f"{_ARR}.rollout.name=vllm",
        f"{_ARR}.rollout.tensor_model_parallel_size={v['ROLLOUT_TP']}",
        f"{_ARR}.rollout.data_parallel_size={v['ROLLOUT_DP']}",
        f"{_ARR}.rollout.expert_parallel_size={v['ROLLOUT_EP']}",
        f"{_ARR}.rollout.gpu_memory_utilization={v['ROLLOUT_GPU_MEMORY_UTILIZATION']}",
        f"{_ARR}.rollout.max_num_seqs={v['ROLLOUT_MAX_NUM_SEQS']}",
        f"{_ARR}.rollout.max_num_batched_tokens={v['ROLLOUT_MAX_NUM_BATCHED_TOKENS']}",
        f"{_ARR}.rollout.enforce_eager={_b(baseline)}",
        # the comparison switch, the sampler and the cap (the YAML reads the same variables as its defaults)
        "data.sampler.class_path=" + ("null" if baseline else "pkg://recipe.adapter.sampler"),
        "data.sampler.class_name=LengthAwareEpochSampler",
        f"data.sampler.bucket_size={v['SAMPLER_BUCKET_SIZE']}",
        f"data.sampler.ema_decay={v['SAMPLER_EMA_DECAY']}",
        f"data.sampler.shuffle_batch_blocks={_b(v['SAMPLER_SHUFFLE_BATCH_BLOCKS'])}",
        f"data.sampler.statistic={_q(v['SAMPLER_STATISTIC'], 'SAMPLER_STATISTIC')}",
        f"recipe.cap.enable={0 if baseline else int(v['VLLM_ROLLOUT_EARLY_STOP_ENABLE'])}",
        f"recipe.cap.mode={v['VLLM_ROLLOUT_EARLY_STOP_MODE']}",
        f"recipe.cap.factor={v['VLLM_ROLLOUT_EARLY_STOP_FACTOR']}",
        f"recipe.cap.min_tokens={v['VLLM_ROLLOUT_EARLY_STOP_MIN_TOKENS']}",
        f"recipe.over_sample.enable={int(v['OVER_SAMPLE_ENABLE'])}",
        f"recipe.over_sample.ratio={v['OVER_SAMPLE_RATIO']}",
        f"recipe.over_sample.requeue={v['OVER_SAMPLE_REQUEUE']}",
        f"recipe.over_sample.max_resumes={v['OVER_SAMPLE_MAX_RESUMES']}",
        # run directory, checkpoints, logging
        f"trainer.project_name={_q(v['PROJECT_NAME'], 'PROJECT_NAME')}",
        f"trainer.experiment_name={_q(v['EXPERIMENT_NAME'], 'EXPERIMENT_NAME')}",
        f"trainer.default_local_dir={_q(paths.run_dir, 'CKPT_ROOT')}",
        f"trainer.total_epochs={v['TOTAL_EPOCHS']}",
        f"trainer.save_freq={v['TRAINER_SAVE_FREQ'] if v['SAVE_CKPT_ENABLE'] else -1}",
        f"trainer.resume_mode={'auto' if v['SAVE_CKPT_ENABLE'] else 'disable'}",
        f"trainer.max_actor_ckpt_to_keep={v['MAX_CKPT_TO_KEEP']}",
        f"trainer.test_freq={v['TRAINER_TEST_FREQ']}",
        f"trainer.val_before_train={_b(v['TRAINER_VAL_BEFORE_TRAIN'])}",
        "trainer.logger=[" + ",".join(s.strip() for s in v["TRAINER_LOGGER"].split(",") if s.strip()) + "]",
        # the Ray actors (TaskRunner, workers) may run on other nodes: send them the logging environment
        f"+ray_kwargs.ray_init.runtime_env.env_vars.WANDB_MODE={v['WANDB_MODE']}",
        f"+ray_kwargs.ray_init.runtime_env.env_vars.WANDB_DIR={_q(paths.run_dir, 'CKPT_ROOT')}",
        f"+ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH={_q(paths.metrics_log, 'CKPT_ROOT')}",
    ]
    return o


# --------------------------------------------------------------------------------------------------------------
# Checks on the composed config
# --------------------------------------------------------------------------------------------------------------


def _convert_command(model_path: str, distcp_path: str) -> str:
    return (f"MODEL_PATH={shlex.quote(model_path)} DISTCP_PATH={shlex.quote(distcp_path)} "
            f"bash {shlex.quote(str(CONVERT_SCRIPT))}")


def distcp_problem(path: str) -> str | None:
    """Why ``path`` is not a complete Megatron dist checkpoint, or None.

    megatron-core's ``dist_checkpointing.save`` writes ``common.pt`` and the shards first and ``metadata.json``
    (``{"sharded_backend": ...}``) last, so a missing ``metadata.json`` also means an interrupted conversion;
    the ``torch_dist`` backend keeps its shard index in ``.metadata``.
    """
    p = Path(path)
    if not p.is_dir():
        return "does not exist" if not p.exists() else "is not a directory"
    if not any(p.iterdir()):
        return "is empty"
    meta = p / "metadata.json"
    if not meta.is_file():
        return "has no metadata.json (not a Megatron dist checkpoint, or an interrupted conversion: delete it)"
    try:
        backend = json.loads(meta.read_text()).get("sharded_backend")
    except (OSError, ValueError, AttributeError):
        backend = None
    if not backend:
        return "has a metadata.json without 'sharded_backend' (not a Megatron dist checkpoint)"
    if not (p / "common.pt").is_file():
        return "has no common.pt (incomplete dist checkpoint: delete it and convert again)"
    if backend == "torch_dist" and not (p / ".metadata").is_file():
        return "has no .metadata (incomplete torch_dist checkpoint: delete it and convert again)"
    return None


def _model_config(model_path: str, errors: list[str]) -> dict | None:
    cfg_file = Path(model_path) / "config.json"
    if not cfg_file.is_file():
        errors.append(f"MODEL_PATH={model_path} has no config.json: point MODEL_PATH at a Hugging Face model "
                      "directory (config.json, tokenizer files, *.safetensors)")
        return None
    try:
        hf = json.loads(cfg_file.read_text())
    except ValueError as e:
        errors.append(f"MODEL_PATH={model_path}: config.json is not valid JSON ({e})")
        return None
    if not any((Path(model_path) / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        errors.append(f"MODEL_PATH={model_path} has no tokenizer (tokenizer.json / tokenizer_config.json): verl "
                      "and vLLM load the tokenizer from MODEL_PATH")
    hf = hf.get("text_config", hf) if isinstance(hf.get("text_config"), dict) else hf
    for key in ("num_hidden_layers", "num_attention_heads"):
        if not isinstance(hf.get(key), int):
            errors.append(f"MODEL_PATH={model_path}: config.json has no integer {key}")
            return None
    return hf


def _num_experts(hf: dict) -> int | None:
    for key in ("num_experts", "num_local_experts", "n_routed_experts"):
        if isinstance(hf.get(key), int) and hf[key] > 0:
            return hf[key]
    return None


def _check_parallel(cfg: Mapping, hf: dict | None, errors: list[str]) -> dict:
    """Megatron-core 0.16 layout rules (``parallel_state.initialize_model_parallel``, ``TransformerConfig``).

    Two grids over the same GPUs: dense layers TP x CP x DP x PP = world, experts ETP x EP x EDP x PP = world
    (MoE parallel folding; ETP defaults to TP). So world % (TP x PP x CP) == 0 and EP x ETP divides world / PP;
    EP need not divide the dense DP, and CP does not constrain EP. Returns the layout for the summary.
    """
    g = lambda k: select(cfg, f"{_MEG}.{k}")  # noqa: E731
    nnodes, per_node = select(cfg, "trainer.nnodes"), select(cfg, "trainer.n_gpus_per_node")
    world = nnodes * per_node
    tp, pp, cp, ep = (g("tensor_model_parallel_size"), g("pipeline_model_parallel_size"),
                      g("context_parallel_size"), g("expert_model_parallel_size"))
    etp = g("expert_tensor_parallel_size") or tp
    layout = {"world": world, "etp": etp, "split": [], "experts": None,
              "dp": None if world % (tp * pp * cp) else world // (tp * pp * cp),
              "edp": None if world % (etp * ep * pp) else world // (etp * ep * pp)}
    gpus = f"the {world} GPUs (NNODES={nnodes} x GPUS_PER_NODE={per_node})"
    if layout["dp"] is None:
        errors.append(f"ACTOR_TP={tp} x ACTOR_PP={pp} x ACTOR_CP={cp} = {tp * pp * cp} does not divide {gpus}: "
                      "Megatron needs world % (TP x PP x CP) == 0; change ACTOR_TP/ACTOR_PP/ACTOR_CP or the GPU count")
    if layout["edp"] is None:
        fits = [e for e in range(ep, 0, -1) if world % (etp * e * pp) == 0]
        fix = f"e.g. ACTOR_EP={fits[0]}, or a smaller ACTOR_PP" if fits else "lower ACTOR_ETP or ACTOR_PP"
        errors.append(f"ACTOR_EP={ep} x ACTOR_ETP={etp} x ACTOR_PP={pp} = {etp * ep * pp} does not divide {gpus}: "
                      f"Megatron's expert grid needs EP x ETP to divide world / PP = {world / pp:g}; {fix}")
    if ep > 1 and tp > 1 and not g("sequence_parallel"):
        errors.append(f"ACTOR_SEQUENCE_PARALLEL=0 with ACTOR_TP={tp} and ACTOR_EP={ep}: Megatron MoE needs "
                      "sequence parallelism with TP and EP; export ACTOR_SEQUENCE_PARALLEL=1")
    if hf is None:
        return layout
    experts = layout["experts"] = _num_experts(hf)
    if experts is None and ep > 1:
        errors.append(f"ACTOR_EP={ep} but MODEL_PATH's config.json has no experts (dense model): export ACTOR_EP=1")
    elif experts is not None and experts % ep:
        divisors = [d for d in range(1, experts + 1) if experts % d == 0 and d <= world]
        errors.append(f"ACTOR_EP={ep} does not divide num_experts={experts} (MODEL_PATH config.json): each EP rank "
                      f"holds num_experts / EP experts; choose one of {divisors}")
    heads, kv = hf["num_attention_heads"], hf.get("num_key_value_heads") or hf["num_attention_heads"]
    if heads % tp or kv % tp:
        errors.append(f"ACTOR_TP={tp} must divide num_attention_heads={heads} and num_key_value_heads={kv} "
                      f"(MODEL_PATH config.json); choose a divisor of {math.gcd(heads, kv)}")
    otc = g("override_transformer_config") or {}
    layout["split"] = _pipeline_split(hf["num_hidden_layers"], pp, otc.get("num_layers_in_first_pipeline_stage"),
                                      otc.get("num_layers_in_last_pipeline_stage"), errors)
    vpp = g("virtual_pipeline_model_parallel_size")
    if vpp and any(n % vpp for n in layout["split"]):
        errors.append(f"{_MEG}.virtual_pipeline_model_parallel_size={vpp} must divide every stage's layer count "
                      f"{layout['split']}")
    return layout


def _pipeline_split(layers: int, pp: int, first: int | None, last: int | None, errors: list[str]) -> list[int]:
    """Layers per stage as Megatron assigns them (first/last fixed, the rest even over the middle), or []."""
    even = "ACTOR_PP_FIRST_LAYERS=0 ACTOR_PP_LAST_LAYERS=0"
    if pp == 1:
        if first or last:
            errors.append(f"ACTOR_PP_FIRST_LAYERS={first or 0} / ACTOR_PP_LAST_LAYERS={last or 0} with ACTOR_PP=1: "
                          f"uneven stages need pipeline parallelism; export {even}")
            return []
        return [layers]
    if first is None and last is None:
        if layers % pp:
            errors.append(f"ACTOR_PP={pp} does not divide num_hidden_layers={layers} for an even split: set "
                          "ACTOR_PP_FIRST_LAYERS / ACTOR_PP_LAST_LAYERS so that the middle stages share the rest "
                          "evenly")
            return []
        return [layers // pp] * pp
    middle_stages = pp - (first is not None) - (last is not None)
    middle_layers = layers - (first or 0) - (last or 0)
    if middle_layers < 0 or bool(middle_layers) != bool(middle_stages) or (
            middle_stages and middle_layers % middle_stages):
        hint = _uneven_hint(layers, pp)
        fix = (f"e.g. ACTOR_PP_FIRST_LAYERS={hint} ACTOR_PP_LAST_LAYERS={hint}" if hint else
               f"e.g. {even} for an even split" if layers % pp == 0 else
               "first + last + the middle stages' equal shares must make num_hidden_layers")
        given = f"ACTOR_PP_FIRST_LAYERS={first or 0} + ACTOR_PP_LAST_LAYERS={last or 0}"
        if middle_stages == 0:
            errors.append(f"{given} = {(first or 0) + (last or 0)} != num_hidden_layers={layers} with ACTOR_PP={pp} "
                          f"(no middle stages); {fix}")
        else:
            errors.append(f"{given} leave {middle_layers} of num_hidden_layers={layers} for {middle_stages} middle "
                          f"stage(s) (ACTOR_PP={pp}), which must split them evenly; {fix}")
        return []
    per = middle_layers // middle_stages if middle_stages else 0
    return ([first] if first is not None else []) + [per] * middle_stages + ([last] if last is not None else [])


def _uneven_hint(layers: int, pp: int) -> int | None:
    """A first/last stage size two layers lighter than the middle ones (embedding / logits), if that fits."""
    if pp < 3 or (layers + 4) % pp or (layers + 4) // pp <= 2:
        return None
    return (layers + 4) // pp - 2


def _check_rollout(cfg: Mapping, hf: dict | None, world: int, errors: list[str]) -> None:
    """vLLM replica layout and scheduler limits, which verl and vLLM only meet when the servers start."""
    r = lambda k: select(cfg, f"{_ARR}.rollout.{k}")  # noqa: E731
    tp, dp, ep, rpp = r("tensor_model_parallel_size"), r("data_parallel_size"), r("expert_parallel_size"), \
        r("pipeline_model_parallel_size") or 1
    if ep > 1 and ep != tp * dp:
        errors.append(f"ROLLOUT_EP={ep} must equal ROLLOUT_TP={tp} x ROLLOUT_DP={dp} = {tp * dp} when > 1 (verl's "
                      f"vLLM rollout); export ROLLOUT_EP={tp * dp} or ROLLOUT_EP=1")
    if world % (tp * dp * rpp):
        errors.append(f"ROLLOUT_TP={tp} x ROLLOUT_DP={dp} = {tp * dp * rpp} GPUs per vLLM replica does not divide the "
                      f"{world} GPUs: verl would leave GPUs without a replica; choose sizes that divide {world}")
    longest = select(cfg, "data.max_prompt_length") + select(cfg, "data.max_response_length")
    if hf is not None:
        if hf["num_attention_heads"] % tp:
            errors.append(f"ROLLOUT_TP={tp} must divide num_attention_heads={hf['num_attention_heads']} (vLLM)")
        limit = hf.get("max_position_embeddings")
        if isinstance(limit, int) and longest > limit:
            errors.append(f"MAX_PROMPT_LENGTH + MAX_RESPONSE_LENGTH = {longest} exceeds the model's "
                          f"max_position_embeddings={limit} (MODEL_PATH config.json): vLLM would refuse the context")
    util = r("gpu_memory_utilization")
    if not 0 < util <= 1:
        errors.append(f"ROLLOUT_GPU_MEMORY_UTILIZATION={util} must be in (0, 1]")
    tokens, seqs = r("max_num_batched_tokens"), r("max_num_seqs")
    if tokens < seqs:
        errors.append(f"ROLLOUT_MAX_NUM_BATCHED_TOKENS={tokens} < ROLLOUT_MAX_NUM_SEQS={seqs}: vLLM's scheduler needs "
                      "at least one token per running sequence per step")
    if not r("enable_chunked_prefill") and tokens < longest:
        errors.append(f"ROLLOUT_MAX_NUM_BATCHED_TOKENS={tokens} < MAX_PROMPT_LENGTH + MAX_RESPONSE_LENGTH = {longest} "
                      "with chunked prefill off: vLLM must fit a whole context in one step")


def _check_batches(cfg: Mapping, dp: int | None, errors: list[str]) -> None:
    """Batch divisibility and token budgets that verl skips with dynamic batch sizes (or pads around silently)."""
    train_bs, n = select(cfg, "data.train_batch_size"), select(cfg, f"{_ARR}.rollout.n")
    mini = select(cfg, f"{_ARR}.actor.ppo_mini_batch_size")
    if mini > train_bs or train_bs % mini:
        errors.append(f"TRAIN_BATCH_SIZE={train_bs} is not a multiple of ACTOR_PPO_MINI_BATCH_SIZE={mini}: verl "
                      "would pad the step with dummy rows to fill the last mini-batch; make the mini-batch divide it")
    if dp and (mini * n) % dp:
        errors.append(f"ACTOR_PPO_MINI_BATCH_SIZE={mini} x ROLLOUT_N={n} = {mini * n} responses per update do not "
                      f"split over the {dp} data-parallel ranks (GPUs / (ACTOR_TP x ACTOR_PP x ACTOR_CP)); verl would "
                      "pad with dummy rows: choose a mini-batch whose x ROLLOUT_N is a multiple of the DP size")
    longest = select(cfg, "data.max_prompt_length") + select(cfg, "data.max_response_length")
    cp = select(cfg, f"{_MEG}.context_parallel_size")
    budgets = (("ACTOR_PPO_MAX_TOKEN_LEN_PER_GPU", "actor.ppo_max_token_len_per_gpu", "actor.use_dynamic_bsz"),
               ("LOG_PROB_MAX_TOKEN_LEN_PER_GPU", "rollout.log_prob_max_token_len_per_gpu",
                "rollout.log_prob_use_dynamic_bsz"),
               ("LOG_PROB_MAX_TOKEN_LEN_PER_GPU", "ref.log_prob_max_token_len_per_gpu", "ref.log_prob_use_dynamic_bsz"))
    for var, key, dynamic in budgets:
        budget = select(cfg, f"{_ARR}.{key}")
        if select(cfg, f"{_ARR}.{dynamic}") and budget is not None and budget * cp < longest:
            errors.append(f"{var}={budget} ({_ARR}.{key}) x ACTOR_CP={cp} < MAX_PROMPT_LENGTH + MAX_RESPONSE_LENGTH = "
                          f"{longest}: verl's dynamic batching needs one full sequence per micro-batch; set it to >= "
                          f"{math.ceil(longest / cp)}")



def _cap_note(cfg: Mapping, notes: list[str]) -> None:
    """Not an error, but a comparison arm that measures nothing."""
    cap, response = select(cfg, "recipe.cap", {}) or {}, select(cfg, "data.max_response_length")
    if _on(cap.get("enable")) and cap.get("mode") == "seed" and cap.get("min_tokens", 0) >= response:
        notes.append(f"VLLM_ROLLOUT_EARLY_STOP_MIN_TOKENS={cap.get('min_tokens')} >= MAX_RESPONSE_LENGTH={response}: "
                     "the seed cap can never shorten a response")


def _on(value: Any) -> bool:
    return str(value).lower() in ("1", "true")


def _check_data(cfg: Mapping, train_batch_size: int, errors: list[str]) -> None:
    """Columns verl's dataset, reward loop and the recipe read; schema and row count only (never the rows)."""
    import pyarrow.parquet as pq

    prompt_key, source_key = select(cfg, "data.prompt_key", "prompt"), select(cfg, "data.reward_fn_key", "data_source")
    for key, var in (("data.train_files", "TRAIN_FILE"), ("data.val_files", "TEST_FILE")):
        files = select(cfg, key)
        files = [files] if isinstance(files, str) else list(files or [])
        rows = 0
        for f in files:
            if not os.path.isfile(f):
                errors.append(f"{var}: {f} does not exist (`python scripts/prepare_data.py --help` writes verl's RL "
                              "parquet)")
                continue
            try:
                pf = pq.ParquetFile(f)
                schema = pf.schema_arrow
            except Exception as e:  # noqa: BLE001 - any unreadable file is a user error here
                errors.append(f"{var}: {f} is not a readable parquet file ({type(e).__name__}: {e})")
                continue
            rows += pf.metadata.num_rows
            missing = [c for c in (prompt_key, source_key, "reward_model") if c not in schema.names]
            if missing:
                errors.append(f"{var}: {f} lacks column(s) {missing} (has {schema.names}); verl needs "
                              f"'{prompt_key}' (list of {{role, content}} messages), '{source_key}' and "
                              "'reward_model' {ground_truth}: convert it with scripts/prepare_data.py")
                continue
            if not _is_message_list(schema.field(prompt_key).type):
                errors.append(f"{var}: {f} column '{prompt_key}' is {schema.field(prompt_key).type}, not a list of "
                              "{role, content} messages: convert it with scripts/prepare_data.py")
            rm = schema.field("reward_model").type
            if not (hasattr(rm, "get_field_index") and rm.get_field_index("ground_truth") >= 0):
                errors.append(f"{var}: {f} column 'reward_model' has no 'ground_truth' field ({rm})")
        if var == "TRAIN_FILE" and rows and rows < train_batch_size:
            errors.append(f"TRAIN_FILE holds {rows} rows, fewer than one batch (TRAIN_BATCH_SIZE={train_batch_size}): "
                          "the recipe cuts the train set to whole batches, so nothing would train; add data or lower "
                          "the batch")


def _is_message_list(t) -> bool:
    import pyarrow as pa

    if not (pa.types.is_list(t) or pa.types.is_large_list(t)):
        return False
    item = t.value_type
    return pa.types.is_struct(item) and item.get_field_index("role") >= 0 and item.get_field_index("content") >= 0


def _check_reward(cfg: Mapping, errors: list[str]) -> None:
    """The reward file exists and defines the function at top level (parsed, not imported)."""
    legacy = select(cfg, "custom_reward_function") or {}
    rf = legacy if any(v is not None for v in legacy.values()) else (select(cfg, "reward.custom_reward_function") or {})
    path, name = rf.get("path"), rf.get("name")
    if not path:
        return
    if not os.path.isfile(path):
        errors.append(f"REWARD_FUNCTION_PATH={path} does not exist; unset it for the repo's reward/math_reward.py")
        return
    try:
        tree = ast.parse(Path(path).read_text(), filename=path)
    except SyntaxError as e:
        errors.append(f"REWARD_FUNCTION_PATH={path} does not parse: {e}")
        return
    defined = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):
            defined |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined |= {(a.asname or a.name).split(".")[0] for a in node.names}
    if name not in defined:
        errors.append(f"REWARD_FUNCTION_NAME={name} is not defined at the top level of REWARD_FUNCTION_PATH={path}")


def _check_distcp(cfg: Mapping, smoke: bool, errors: list[str], notes: list[str]) -> bool:
    """The dist checkpoint(s) of actor and ref; True when the smoke preset must create the checkpoint at launch
    (the conversion needs a GPU, so a missing one is expected on a CPU)."""
    model = select(cfg, f"{_ARR}.model.path")
    roles: dict[str, list[str]] = {}
    for role in ("actor", "ref"):
        m = select(cfg, f"{_ARR}.{role}.megatron")
        if m.get("use_dist_checkpointing"):
            roles.setdefault(m.get("dist_checkpointing_path") or "", []).append(f"{_ARR}.{role}.megatron")
    create = False
    for path, keys in roles.items():
        problem = distcp_problem(path) if path else "is not set"
        where = f"DISTCP_PATH={path} ({' and '.join(k + '.dist_checkpointing_path' for k in keys)})"
        if problem is None:
            continue
        if smoke and problem in ("does not exist", "is empty"):
            notes.append(f"{where} {problem}: the smoke preset converts the tiny model into it at launch (GPU); "
                         "missing on a CPU machine is expected")
            create = True
        else:
            errors.append(f"{where} {problem}; create it on a GPU node with: {_convert_command(model, path)}")
    return create


# --------------------------------------------------------------------------------------------------------------
# The preflight
# --------------------------------------------------------------------------------------------------------------


@dataclass
class PreflightReport:
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    values: dict = field(default_factory=dict)
    env_overrides: list[str] = field(default_factory=list)  # built from the environment
    user_overrides: list[str] = field(default_factory=list)  # the script's arguments, applied last
    config: Any = None  # the resolved DictConfig (None if composition failed)
    paths: RunPaths | None = None
    smoke_convert: bool = False
    table: list[tuple[str, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def overrides(self) -> list[str]:
        return self.env_overrides + self.user_overrides


def _effective_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment with the preset's values under the user's explicit (non-empty) ones."""
    if (env.get("PRESET") or "").strip() != "smoke":
        return dict(env)
    from .smoke import smoke_env

    return {**smoke_env(env), **{k: val for k, val in env.items() if val.strip() != ""}}


def run_preflight(overrides: list[str] | tuple[str, ...] = (), env: Mapping[str, str] | None = None
                  ) -> PreflightReport:
    """Parse ``env`` (default ``os.environ``), compose with ``overrides`` last, and check; never raises on user
    errors: they land in ``report.errors``."""
    report = PreflightReport(user_overrides=list(overrides))
    env = _effective_env(os.environ if env is None else env)
    values, report.errors = parse_env(env)
    report.values = values
    if report.errors:
        return report
    report.paths = run_paths(values, env)
    try:
        report.env_overrides = build_overrides(values, report.paths)
    except RecipeConfigError as e:
        report.errors.append(str(e))
        return report
    cfg = _compose(report)
    if cfg is None:
        return report
    try:
        _check_config(cfg, values, report)
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        report.errors.append(f"cannot check the composed config, a value has an unexpected type (check the extra "
                             f"overrides): {type(e).__name__}: {e}")
    return report


def _compose(report: PreflightReport):
    """Compose exactly what ``python -m recipe.main <overrides>`` composes, then ``prepare_config``."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from .main import CONFIGS_DIR, prepare_config

    try:
        with initialize_config_dir(config_dir=CONFIGS_DIR, version_base=None):
            cfg = compose(config_name="length_aware_grpo", overrides=report.overrides)
    except (HydraException, OmegaConfBaseException) as e:
        detail = "; ".join(line.strip() for line in str(e).splitlines() if line.strip())
        report.errors.append(f"the overrides do not compose: {detail} (check the extra arguments passed after the "
                             "script name; a key that already exists is set without '+')")
        return None
    try:
        with contextlib.redirect_stdout(io.StringIO()), _quiet():
            prepare_config(cfg)  # resolves first, so the checks below see plain values even if it fails later
    except RecipeConfigError as e:
        report.errors.append(str(e))
    except OmegaConfBaseException as e:
        report.errors.append(f"the config does not resolve: {e}")
        return None
    except (AssertionError, ValueError, TypeError, KeyError, HydraException) as e:
        report.errors.append(f"verl rejected the config (validate_config): {type(e).__name__}: {e}")
    report.config = cfg
    return cfg


@contextlib.contextmanager
def _quiet():
    """verl warns about the missing accelerator and TP=1; those are expected on the CPU and not user errors."""
    import logging
    import warnings

    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(logging.NOTSET)


def _check_config(cfg, values: dict, report: PreflightReport) -> None:
    from omegaconf import OmegaConf

    c = OmegaConf.to_container(cfg)
    errors, notes = report.errors, report.notes
    hf = _model_config(select(c, f"{_ARR}.model.path"), errors)
    layout = _check_parallel(c, hf, errors)
    _check_rollout(c, hf, layout["world"], errors)
    _check_batches(c, layout["dp"], errors)
    _cap_note(c, notes)
    _check_data(c, select(c, "data.train_batch_size"), errors)
    _check_reward(c, errors)
    report.smoke_convert = _check_distcp(c, values["PRESET"] == "smoke", errors, notes)
    if not errors:
        _check_verl_dataclasses(cfg, errors)
    report.table = _summary(c, values, layout, hf, report)


def _check_verl_dataclasses(cfg, errors: list[str]) -> None:
    """What verl checks only when the workers build their configs (e.g. the rollout EP rule)."""
    from omegaconf import OmegaConf
    from verl.utils.config import omega_conf_to_dataclass

    for key in (f"{_ARR}.rollout", _MEG):
        try:
            with _quiet():
                omega_conf_to_dataclass(OmegaConf.select(cfg, key))
        except Exception as e:  # noqa: BLE001 - report whatever verl raises, without a traceback
            errors.append(f"verl rejects {key}: {type(e).__name__}: {e}")


def _summary(c: Mapping, v: dict, layout: dict, hf: dict | None, report: PreflightReport) -> list[tuple[str, str]]:
    m = lambda k: select(c, f"{_MEG}.{k}")  # noqa: E731
    r = lambda k: select(c, f"{_ARR}.rollout.{k}")  # noqa: E731
    world = layout.get("world") or 0
    cap, os_, sampler = select(c, "recipe.cap", {}), select(c, "recipe.over_sample", {}), select(c, "data.sampler", {})
    rws, tp = r("tensor_model_parallel_size") * r("data_parallel_size"), m("tensor_model_parallel_size")
    rows = [
        ("preset", v["PRESET"] or "(none)"),
        ("model", f"{select(c, f'{_ARR}.model.path')}"
                  + (f"  [{hf.get('num_hidden_layers')} layers, {_num_experts(hf)} experts]" if hf else "")),
        ("dist checkpoint", f"{m('dist_checkpointing_path')} (actor and ref)"
                            + ("  [created at launch]" if report.smoke_convert else "")),
        ("GPUs", f"{world} = NNODES {select(c, 'trainer.nnodes')} x GPUS_PER_NODE {select(c, 'trainer.n_gpus_per_node')}"),
        ("actor parallel", f"TP {tp} x PP {m('pipeline_model_parallel_size')} x CP {m('context_parallel_size')} -> "
                           f"DP {layout.get('dp')}; EP {m('expert_model_parallel_size')} x ETP {layout.get('etp')} -> "
                           f"expert DP {layout.get('edp')}; SP {bool(m('sequence_parallel')) and tp > 1}"),
        ("pipeline layers", " | ".join(str(n) for n in layout.get("split") or []) or "?"),
        ("vLLM rollout", f"TP {r('tensor_model_parallel_size')} x DP {r('data_parallel_size')} -> "
                         f"{world // rws if rws else '?'} replica(s); EP {r('expert_parallel_size')}; enforce_eager "
                         f"{r('enforce_eager')}; gpu_memory_utilization {r('gpu_memory_utilization')}; max_num_seqs "
                         f"{r('max_num_seqs')}; max_num_batched_tokens {r('max_num_batched_tokens')}"),
        ("batch", f"{select(c, 'data.train_batch_size')} prompts x n {r('n')} (gen batch "
                  f"{select(c, 'data.gen_batch_size')}, mini-batch {select(c, f'{_ARR}.actor.ppo_mini_batch_size')}); "
                  f"{select(c, 'trainer.total_epochs')} epochs"),
        ("lengths", f"prompt {select(c, 'data.max_prompt_length')}, response {select(c, 'data.max_response_length')}; "
                    f"tokens/GPU: train {select(c, f'{_ARR}.actor.ppo_max_token_len_per_gpu')}, log-prob "
                    f"{r('log_prob_max_token_len_per_gpu')}"),
        ("sampler", "verl's own (baseline)" if not sampler.get("class_path") else
                    f"{sampler.get('class_name')} (bucket {sampler.get('bucket_size')}, ema {sampler.get('ema_decay')}"
                    f", shuffle blocks {sampler.get('shuffle_batch_blocks')}, {sampler.get('statistic')})"),
        ("cap", "off" if not _on(cap.get("enable")) else (
            f"seed: min({select(c, 'data.max_response_length')}, max({cap.get('min_tokens')}, {cap.get('factor')} x "
            "estimate))" if cap.get("mode") == "seed" else "calibrated")),
        ("over-sample", f"ratio {os_.get('ratio')}" if _on(os_.get("enable")) else "off"),
        ("checkpoints", f"every {select(c, 'trainer.save_freq')} steps, keep {select(c, 'trainer.max_actor_ckpt_to_keep')}"
                        f", resume {select(c, 'trainer.resume_mode')}" if select(c, "trainer.save_freq", -1) > 0 else
                        f"off (save_freq -1, resume {select(c, 'trainer.resume_mode')})"),
    ]
    if report.paths:
        env_vars = select(c, "ray_kwargs.ray_init.runtime_env.env_vars", {}) or {}
        rows += [("run dir", report.paths.run_dir),
                 ("logs", f"{report.paths.console_log}, {env_vars.get('VERL_FILE_LOGGER_PATH')}"),
                 ("loggers", f"{select(c, 'trainer.logger')}; wandb {env_vars.get('WANDB_MODE')}")]
    return rows


def format_report(report: PreflightReport) -> str:
    lines = []
    if report.table:
        width = max(len(k) for k, _ in report.table)
        lines.append("preflight: resolved settings")
        lines += [f"  {k.ljust(width)}  {val}" for k, val in report.table]
    lines += [f"preflight: note: {n}" for n in report.notes]
    lines += [f"preflight: ERROR: {e}" for e in report.errors]
    if report.errors:
        lines.append(f"preflight: {len(report.errors)} problem(s); nothing was launched")
    else:
        lines.append("preflight: OK")
    return "\n".join(lines)


def write_plan(report: PreflightReport, path: str) -> None:
    """A bash-sourceable plan for the launch (``PLAN_*`` variables and the ``PLAN_OVERRIDES`` array)."""
    v, p = report.values, report.paths
    q = shlex.quote
    env_vars = select(report.config, "ray_kwargs.ray_init.runtime_env.env_vars", {}) if report.config else {}
    lines = [
        f"PLAN_RUN_DIR={q(p.run_dir)}",
        f"PLAN_CONSOLE_LOG={q(p.console_log)}",
        f"PLAN_METRICS_LOG={q(env_vars.get('VERL_FILE_LOGGER_PATH', p.metrics_log))}",
        f"PLAN_WANDB_MODE={q(str(env_vars.get('WANDB_MODE', v['WANDB_MODE'])))}",
        f"PLAN_WANDB_DIR={q(str(env_vars.get('WANDB_DIR', p.run_dir)))}",
        f"PLAN_MODEL_PATH={q(v['MODEL_PATH'])}",
        f"PLAN_DISTCP_PATH={q(v['DISTCP_PATH'])}",
        f"PLAN_SMOKE_CONVERT={int(report.smoke_convert)}",
        # the user's arguments are appended by the script, after these
        "PLAN_OVERRIDES=(" + " ".join(q(o) for o in report.env_overrides)
        + " " + q(f"hydra.run.dir={_q(p.hydra_dir, 'CKPT_ROOT')}") + ")",
    ]
    Path(path).write_text("\n".join(lines) + "\n")


def dump(report: PreflightReport, path: str) -> None:
    from omegaconf import OmegaConf

    config = OmegaConf.to_container(report.config, resolve=True) if report.config is not None else None
    Path(path).write_text(json.dumps({"overrides": report.overrides, "errors": report.errors, "notes": report.notes,
                                      "config": config}, indent=1, default=str))


def env_table_markdown() -> str:
    """The README's one table of variables, generated from ``KNOBS``."""
    out = ["| Variable | Default | Sets | Meaning |", "|---|---|---|---|"]
    group = None
    for k in KNOBS:
        if k.group != group:
            group = k.group
            out.append(f"| **{group}** | | | |")
        default = "**required**" if k.default is None and k.kind != "script" else (_default_text(k) or "unset")
        sets = k.sets[1:-1] if k.sets.startswith("(") else f"`{k.sets}`"
        out.append(f"| `{k.env}` | {default} | {sets} | {k.doc} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m recipe.preflight", description=__doc__.split("\n\n")[0])
    ap.add_argument("--plan-out", help="write the bash launch plan here (scripts/train_grpo.sh)")
    ap.add_argument("--env-table", action="store_true", help="print the README table of variables and exit")
    ap.add_argument("--print-env", nargs="+", metavar="VAR", help="print VAR=value (parsed or default) and exit")
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides, applied last")
    args = ap.parse_args(argv)
    if args.env_table:
        print(env_table_markdown())
        return 0
    if args.print_env:
        unknown = [n for n in args.print_env if n not in KNOB or KNOB[n].kind == "script"]
        values, errors = parse_env(os.environ, tuple(args.print_env))
        errors += [f"{n} is not a preflight variable" for n in unknown]
        if errors:
            print("\n".join(f"preflight: ERROR: {e}" for e in errors), file=sys.stderr)
            return 2
        print("\n".join(f"{n}={shlex.quote(str(values[n]))}" for n in args.print_env))
        return 0
    report = run_preflight(args.overrides)
    print(format_report(report), flush=True)
    dump_path = os.environ.get("PREFLIGHT_DUMP")
    if dump_path:
        dump(report, dump_path)
    if not report.ok:
        return 2
    if args.plan_out:
        write_plan(report, args.plan_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
