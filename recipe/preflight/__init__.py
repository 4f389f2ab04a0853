"""CPU preflight for ``scripts/train_grpo.sh``: environment -> Hydra overrides -> composed config -> checks.

A 16-GPU job that dies in a Ray actor after minutes of start-up, on a typo or a parallel layout Megatron rejects,
wastes the cluster and hides the cause in a stack trace. The preflight runs the same composition the launch runs
(verl 0.9.1 + ``configs/length_aware_grpo.yaml``), on a CPU, in seconds, and reports every problem at once, each
naming the environment variable (and Hydra key) to change and how. ``scripts/train_grpo.sh`` runs it before every
launch and in ``DRY_RUN=1`` mode; tests call :func:`run_preflight` in-process.

Two phases: (1) the environment variables in :data:`KNOBS` are parsed (types, ranges, required inputs) before any
Hydra composition, so a bad value is reported under its variable name rather than as a Hydra grammar error (and is
then replaced by its default, so that phase 2 still reports the other problems; two variables that contradict each
other stop here); a set variable with a recipe-like name the recipe does not read (``SAVE_CKPT_ENABLED``) is refused
with the nearest declared one;
(2) the overrides built from them, followed by the user's extra overrides (last one wins), are composed, passed
through ``recipe.main.prepare_config`` (recipe settings + verl's ``validate_config``), and checked against what
verl does not check: Megatron's parallel layout rules, the model's ``config.json``, the dist checkpoint, the
parquet schemas, the rollout layout and batch divisibility.

``KNOBS`` is the single source of the variables, their defaults and the keys they set; docs/training.md's table is
generated from it (``python -m recipe.preflight --env-table``).

Modules: :mod:`.knobs` (the variables), :mod:`.env` (phase 1), :mod:`.overrides`, :mod:`.compose` (phase 2), one
module per check on the composed config (:mod:`.model`, :mod:`.layout`, :mod:`.rollout`, :mod:`.draft_head`, :mod:`.router_replay`,
:mod:`.batches`, :mod:`.data`, :mod:`.reward`, :mod:`.tools`, :mod:`.distcp`, :mod:`.megatron`), :mod:`.report`
(summary, text, launch plan); a new check is a function ``check_x(cfg, errors)`` in its module, called from
:func:`_check_config`.
"""
from __future__ import annotations

import os
import re
from collections.abc import Mapping

from ..loggers import logger_problems
from ..settings import RecipeConfigError, select
from .batches import cap_note, check_batches
from .compose import check_verl_dataclasses, compose_config
from .data import check_data
from .distcp import check_distcp, distcp_problem
from .draft_head import check_draft_head
from .env import cross_env_errors, inert_notes, parse_env, parse_env_all, replaced_notes, unknown_variables
from .knobs import ARR, KNOB, KNOBS, Knob, env_table_markdown, is_cpu
from .layout import check_parallel, fsdp_layout
from .megatron import check_attention_backend, check_resume_layout, check_routing
from .model import model_config
from .overrides import RunPaths, build_overrides, run_paths
from .report import PreflightReport, dump, format_report, summary_table, write_plan
from .reward import check_reward
from .rollout import check_rollout, group_drafter_memory
from .router_replay import check_router_replay, routing_memory_note
from .stack import check_stack
from .tools import check_tools, node_memory_bytes
from .warm_start import check_warm_start

__all__ = ["KNOB", "KNOBS", "Knob", "PreflightReport", "RunPaths", "build_overrides", "distcp_problem", "dump",
           "effective_env", "env_table_markdown", "format_report", "parse_env", "parse_env_all", "run_paths",
           "run_preflight", "write_plan"]


def effective_env(env: Mapping[str, str]) -> tuple[dict[str, str], list[tuple[str, dict[str, str]]]]:
    """The environment with the presets' values under the user's explicit (non-empty) ones, and the presets that
    applied as ``(label, values)`` pairs (``POLICY_PRESET``'s above ``PRESET``'s)."""
    from ..policy_presets import policy_env, preset_values

    merged = policy_env(env)  # POLICY_PRESET: the simulator's configuration, under the user's own variables
    policy = (env.get("POLICY_PRESET") or "").strip()
    values = preset_values(policy, env)
    presets = [(f"POLICY_PRESET={policy}", values)] if values is not None else []
    preset = (merged.get("PRESET") or "").strip()
    if preset == "smoke":
        from ..smoke import smoke_env as preset_env
    elif preset == "cpu":
        from ..cpu.preset import cpu_env as preset_env
    else:
        return dict(merged), presets
    values = preset_env(merged)
    return {**values, **{k: val for k, val in merged.items() if val.strip() != ""}}, presets + [(f"PRESET={preset}",
                                                                                                  values)]


def run_preflight(overrides: list[str] | tuple[str, ...] = (), env: Mapping[str, str] | None = None
                  ) -> PreflightReport:
    """Parse ``env`` (default ``os.environ``), compose with ``overrides`` last, and check; never raises on user
    errors: they land in ``report.errors``, all of them (a bad value is checked further with its default)."""
    report = PreflightReport(user_overrides=list(overrides))
    user_env = os.environ if env is None else env
    report.errors = unknown_variables(user_env)  # before the presets build anything
    env, presets = effective_env(user_env)
    under = {k: val for _, layer in reversed(presets) for k, val in layer.items()}
    values, errors, bad = parse_env_all(env, under)
    report.errors += errors + logger_problems(user_env, values)
    report.stack = check_stack(env, report.errors, report.notes)
    report.values = values
    user_ok = {k: val for k, val in user_env.items() if k not in bad}
    report.notes += replaced_notes(user_ok, presets) + inert_notes(user_ok, values)
    check_attention_backend(env, values, report.errors)
    if any(k.env not in values for k in KNOBS if k.kind != "script") or any(
            e in report.errors for e in cross_env_errors(values)):
        return report  # a required input is missing, or two variables contradict each other: no config to check
    report.paths = run_paths(values, env)
    try:
        report.env_overrides = build_overrides(values, report.paths)
    except RecipeConfigError as e:
        report.errors.append(str(e))
        return report
    phase1 = list(report.errors)
    cfg = compose_config(report)
    if cfg is not None:
        try:
            _check_config(cfg, values, report)
        except (TypeError, ValueError, KeyError, AttributeError) as e:
            report.errors.append(f"cannot check the composed config, a value has an unexpected type (check the extra "
                                 f"overrides): {type(e).__name__}: {e}")
    report.errors = phase1 + _not_repeated(report.errors[len(phase1):], phase1, bad)
    return report


def _not_repeated(later: list[str], phase1: list[str], bad: set[str]) -> list[str]:
    """The composed config's errors less the problems phase 1 already reported: a recipe setting of a variable
    phase 1 named, or any about a variable with a bad value (its default stood in for it)."""
    named = {m for e in phase1 for m in re.findall(r"\b([A-Z][A-Z0-9_]*)=", e) if m in KNOB}
    return [e for e in later if e not in phase1 and not any(f"(env {n})" in e for n in named)
            and not any(re.search(rf"\b{n}\b", e) for n in bad)]


def _check_config(cfg, values: dict, report: PreflightReport) -> None:
    from omegaconf import OmegaConf

    c = OmegaConf.to_container(cfg)
    errors, notes = report.errors, report.notes
    hf = model_config(select(c, f"{ARR}.model.path"), errors)
    megatron = not is_cpu(values)
    layout = check_parallel(c, hf, errors) if megatron else fsdp_layout(c)
    if megatron:
        check_routing(hf, values, errors)
        check_resume_layout(c, values, errors)
    check_rollout(c, hf, layout["world"], errors)
    check_draft_head(c, hf, errors, notes)
    check_router_replay(c, hf, errors, notes)
    routing_memory_note(c, hf, notes, node_memory_bytes())
    group_drafter_memory(c, errors, notes, node_memory_bytes())
    check_batches(c, layout["dp"], errors)
    cap_note(c, notes)
    check_data(c, select(c, "data.train_batch_size"), errors, notes)
    check_reward(c, errors)
    check_tools(c, errors, notes)
    check_warm_start(c, errors, notes)
    if megatron:
        report.smoke_convert = check_distcp(c, values["PRESET"] == "smoke", errors, notes)
    if not errors:
        check_verl_dataclasses(cfg, megatron, errors)
    report.table = summary_table(c, values, layout, hf, report)
