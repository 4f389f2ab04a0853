"""Phase 1: the variables in :data:`~.knobs.KNOBS` parsed (types, ranges, required inputs, env-level consistency)
before any Hydra composition, so a bad value is reported under its variable name, not as a Hydra grammar error."""
from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Mapping
from typing import Any

from ..settings import parse_bool
from .knobs import (ALLOW_VARIABLES, FOREIGN_PREFIXES, KNOB, KNOBS, OTHER_VARIABLES, RECIPE_PREFIXES, Knob, baseline_arm,
                    is_cpu)

_PARSED = tuple(k for k in KNOBS if k.kind != "script")


def _parse_value(knob: Knob, raw: str) -> Any:
    """Parse one raw string; ``ValueError`` carries the reason."""
    if knob.kind == "bool":
        return parse_bool(raw)
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
    if knob.kind == "opt_int":
        if raw.strip().lower() in ("", "none", "null"):
            return None
        try:
            value = int(raw.strip())
        except ValueError:
            raise ValueError("must be an integer (or unset)") from None
        if knob.minimum is not None and value < knob.minimum:
            raise ValueError(f"must be >= {knob.minimum:g}")
        return value
    if knob.kind == "choice":
        if raw.strip() not in knob.choices:
            raise ValueError("must be one of " + ", ".join(repr(c) for c in knob.choices if c))
        return raw.strip()
    if knob.kind == "path_or_none" and raw.strip().lower() == "none":
        return "none"
    if knob.kind in ("path", "path_or_none"):
        return os.path.abspath(os.path.expanduser(raw.strip()))
    if knob.kind == "paths":
        parts = [p.strip() for p in raw.split(",") if p.strip()]
        if not parts:
            raise ValueError("must name at least one file")
        return [os.path.abspath(os.path.expanduser(p)) for p in parts]
    return raw.strip()



_REQUIRED_HINT = {
    "MODEL_PATH": "export MODEL_PATH=/path/to/Qwen3-30B-A3B (a Hugging Face model dir), or PRESET=smoke for the "
                  "tiny 1-GPU run, or PRESET=cpu for the tiny run on a CPU",
    "DISTCP_PATH": "export DISTCP_PATH=/path/to/qwen3-30b-a3b-mcore (create it with `MODEL_PATH=... DISTCP_PATH=... "
                   "bash scripts/convert_hf_to_distcp.sh` on a GPU node), or DISTCP_PATH=none to let Megatron-Bridge load "
                   "MODEL_PATH directly",
    "TRAIN_FILE": "export TRAIN_FILE=/path/to/train.parquet (`python scripts/prepare_data.py --help` converts "
                  "GSM8K / DAPO-Math-17k / DeepScaleR / AIME 2024)",
    "TEST_FILE": "export TEST_FILE=/path/to/test.parquet (e.g. AIME 2024: `python scripts/prepare_data.py --dataset "
                 "aime24 --input aime_2024.parquet --output test.parquet`)",
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
            if knob.kind == "opt_int" and knob.default == "":
                values[knob.env] = None
                continue
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
    if names is None:
        with contextlib.suppress(KeyError):  # a variable it reads failed and is reported
            errors += cross_env_errors(values)
    return values, errors


def parse_env_all(env: Mapping[str, str], fallback: Mapping[str, str] | None = None
                  ) -> tuple[dict, list[str], set[str]]:
    """:func:`parse_env`, then every variable with a bad value replaced by ``fallback``'s (the presets') or its
    default, so that the checks after this phase still run and the user sees every problem at once; returns
    ``(values, errors, the names with bad values)``."""
    values, errors = parse_env(env)
    bad = {k.env for k in _PARSED if k.env not in values and (env.get(k.env) or "").strip()}
    if bad:
        values, more = parse_env({**{k: val for k, val in env.items() if k not in bad},
                                  **{k: val for k, val in (fallback or {}).items() if k in bad}})
        named = tuple(f"{n}{c}" for n in bad for c in " =")
        errors += [e for e in more if e not in errors and not e.startswith(named)]
    return values, errors, bad


def cross_env_errors(v: dict) -> list[str]:
    """Env-level consistency that needs no composition."""
    from ..core.estimates import parse_statistic

    errors = []
    try:
        parse_statistic(v["SAMPLER_STATISTIC"])
    except ValueError as e:
        errors.append(f"SAMPLER_STATISTIC={v['SAMPLER_STATISTIC']!r}: {e}; e.g. export SAMPLER_STATISTIC=mean")
    if v["TRAIN_BATCH_SIZE"] % v["GEN_BATCH_SIZE"]:
        errors.append(f"TRAIN_BATCH_SIZE={v['TRAIN_BATCH_SIZE']} is not a multiple of GEN_BATCH_SIZE="
                      f"{v['GEN_BATCH_SIZE']}: verl fetches whole gen batches per step; unset GEN_BATCH_SIZE (= the "
                      "train batch) or make it divide TRAIN_BATCH_SIZE")
    if v["VLLM_EAGER_BASELINE_NO_RESAMPLE"] and v["BASELINE_NO_RESAMPLE"]:
        errors.append("VLLM_EAGER_BASELINE_NO_RESAMPLE=1 and BASELINE_NO_RESAMPLE=1 name two baseline arms: set one "
                      "(BASELINE_NO_RESAMPLE=1: the fair one, same vLLM mode as the resampler arm)")
    arm = "VLLM_EAGER_BASELINE_NO_RESAMPLE" if v["VLLM_EAGER_BASELINE_NO_RESAMPLE"] else "BASELINE_NO_RESAMPLE"
    if v[arm] and v["OVER_SAMPLE_ENABLE"]:
        errors.append(f"{arm}=1 turns the length-aware sampler off, but OVER_SAMPLE_ENABLE=1 "
                      "needs it: unset OVER_SAMPLE_ENABLE for the baseline arm")
    if v["ROUTER_REPLAY"] != "off" and v["PRESET"] == "cpu":
        errors.append(f"ROUTER_REPLAY={v['ROUTER_REPLAY']} with PRESET=cpu: router replay needs the Megatron engine; "
                      "the CPU preset trains with verl's FSDP engine, which never replays routes (verl/workers/"
                      "engine_workers.py reads router_replay only for the megatron and veomni strategies), so the "
                      "routes vLLM CPU returns would be replayed by nothing. Unset ROUTER_REPLAY (or "
                      "ROUTER_REPLAY=off) for the CPU preset")
    if "/" in v["EXPERIMENT_NAME"] or v["EXPERIMENT_NAME"] in (".", ".."):
        errors.append(f"EXPERIMENT_NAME={v['EXPERIMENT_NAME']!r} must be a plain directory name (no '/')")
    loggers = [s.strip() for s in v["TRAINER_LOGGER"].split(",") if s.strip()]
    if not loggers or any(not re.fullmatch(r"[A-Za-z0-9_]+", s) for s in loggers):
        errors.append(f"TRAINER_LOGGER={v['TRAINER_LOGGER']!r} must be a comma-separated list of verl loggers, "
                      "e.g. export TRAINER_LOGGER=console,file,wandb")
    return errors



def declared_names() -> set[str]:
    """Every variable the recipe reads: :data:`KNOBS`, :data:`OTHER_VARIABLES` and the sandbox's limits."""
    from dataclasses import fields

    from ..tools.limits import SandboxLimits

    return set(KNOB) | set(OTHER_VARIABLES) | {f"SANDBOX_{f.name.upper()}" for f in fields(SandboxLimits)}


def _distance(a: str, b: str) -> int:
    """Edit distance with transpositions (``TRAIN_FLIE`` is one step from ``TRAIN_FILE``)."""
    prev2, prev = None, list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            d = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb))
            if prev2 is not None and i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                d = min(d, prev2[j - 2] + 1)
            cur.append(d)
        prev2, prev = prev, cur
    return prev[-1]


def unknown_variables(env: Mapping[str, str]) -> list[str]:
    """The set variables with a recipe-like name that the recipe does not read, each named with its nearest
    declared one: a misspelled variable is otherwise ignored and the run silently uses the default. Recipe-like:
    one of the recipe's own prefixes (:data:`~.knobs.RECIPE_PREFIXES`), or within an edit or two of a declared name
    and outside other projects' namespaces (vLLM, Ray, verl, CUDA, wandb ...: :data:`~.knobs.FOREIGN_PREFIXES`)."""
    declared = declared_names()
    allowed = {n.strip() for n in (env.get(ALLOW_VARIABLES) or "").split(",")}  # the user's own, not the recipe's
    errors = []
    for name in sorted(env):
        if name in declared or name in allowed or not re.fullmatch(r"[A-Z][A-Z0-9_]*", name):
            continue
        nearest = min(sorted(declared), key=lambda d: _distance(name, d))
        close = _distance(name, nearest) <= (1 if len(name) <= 8 else 2)
        if name.startswith(RECIPE_PREFIXES) or (close and not name.startswith(FOREIGN_PREFIXES)):
            errors.append(f"{name} is set but the recipe reads no such variable (did you mean {nearest}?): the run "
                          f"would ignore it; rename it to {nearest} or unset it (the variables: docs/training.md), or, if it is "
                          f"not meant for the recipe, export {ALLOW_VARIABLES}={name}")
    return errors


def replaced_notes(user_env: Mapping[str, str], presets: list[tuple[str, Mapping[str, str]]]) -> list[str]:
    """The user's variables that replace a preset's value (``presets``: ``(label, values)`` pairs): the run is then
    not quite the preset, and the user should know which of their own settings made the difference."""
    return [f"{name}={user_env[name]!r} (yours) replaces {label}'s {name}={value!r}"
            for label, values in presets for name, value in values.items()
            if (user_env.get(name) or "").strip() not in ("", value.strip())]


def inert_notes(user_env: Mapping[str, str], v: dict) -> list[str]:
    """The user's variables that have no effect in this run's mode, each with why (``v``: the parsed values)."""
    arm = baseline_arm(v)
    rules = [  # (applies, which variables, why)
        (is_cpu(v), lambda n: ("megatron" in KNOB[n].sets and n != "ROUTER_REPLAY")
         or n == "CUDA_DEVICE_MAX_CONNECTIONS", "PRESET=cpu trains with verl's FSDP engine, not Megatron"),
        (not is_cpu(v), lambda n: n == "CPU_MODEL", "only PRESET=cpu reads it"),
        (not v["MULTI_TURN"], lambda n: n in ("TOOL_CONFIG", "TOOL_MAX_RESPONSE_CHARS"), "MULTI_TURN is off"),
        (arm is not None, lambda n: n.startswith(("SAMPLER_", "VLLM_ROLLOUT_EARLY_STOP_")),
         "a baseline arm turns the sampler and the cap off"),
        (arm is None and not v["VLLM_ROLLOUT_EARLY_STOP_ENABLE"],
         lambda n: n.startswith("VLLM_ROLLOUT_EARLY_STOP_") and n != "VLLM_ROLLOUT_EARLY_STOP_ENABLE",
         "the cap is off (VLLM_ROLLOUT_EARLY_STOP_ENABLE=0)"),
        (not v["OVER_SAMPLE_ENABLE"], lambda n: n.startswith("OVER_SAMPLE_") and n != "OVER_SAMPLE_ENABLE",
         "OVER_SAMPLE_ENABLE is off"),
        (not v["TAIL_CUT_ENABLE"], lambda n: n.startswith("TAIL_CUT_") and n != "TAIL_CUT_ENABLE",
         "TAIL_CUT_ENABLE is off"),
        (not v["SAVE_CKPT_ENABLE"], lambda n: n in ("TRAINER_SAVE_FREQ", "MAX_CKPT_TO_KEEP"),
         "SAVE_CKPT_ENABLE is off: nothing is saved"),
        (v["ROLLOUT_SPECULATIVE"] == "off", lambda n: n.startswith("ROLLOUT_SPECULATIVE_"),
         "ROLLOUT_SPECULATIVE is off"),
        (v["ROLLOUT_SPECULATIVE"] != "group", lambda n: n == "ROLLOUT_SPECULATIVE_CORPUS_GIB",
         "only ROLLOUT_SPECULATIVE=group keeps a corpus"),
        (v["ROLLOUT_SPECULATIVE"] != "eagle3", lambda n: n == "DRAFT_MODEL_PATH" or n.startswith("ROLLOUT_DRAFT_"),
         "only ROLLOUT_SPECULATIVE=eagle3 reads it"),
        (not v["ROLLOUT_DRAFT_ONLINE"], lambda n: n.startswith("ROLLOUT_DRAFT_") and n != "ROLLOUT_DRAFT_ONLINE",
         "ROLLOUT_DRAFT_ONLINE is off"),
        (not v["RECORD_TOKENS"], lambda n: n == "RECORD_TOKENS_MAX_MB", "RECORD_TOKENS is off"),
        (v["SAMPLER_ORDER_BY"] != "time", lambda n: n == "SAMPLER_TIME_TOKENS_PER_S", "SAMPLER_ORDER_BY is not time"),
        (True, lambda n: n.startswith("CONVERT_"), "only scripts/convert_hf_to_distcp.sh reads it"),
    ]
    notes = []
    for name in (k.env for k in KNOBS if (user_env.get(k.env) or "").strip()):
        why = next((why for applies, match, why in rules if applies and match(name)), None)
        if why:
            notes.append(f"{name} is set but has no effect in this run: {why}")
    return notes
