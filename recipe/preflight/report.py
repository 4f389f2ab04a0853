"""What the preflight found and resolved: :class:`PreflightReport`, its summary table and text, the bash launch
plan for ``scripts/train_grpo.sh`` and the ``PREFLIGHT_DUMP`` JSON."""
from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..settings import select
from .batches import is_on
from .knobs import ARR, MEG, config_name, is_cpu
from .model import expert_count
from .overrides import RunPaths, hydra_quote
from .router_replay import gpu_memory_bytes, routing_rows


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
    stack: list[str] = field(default_factory=list)  # the interpreter's versions (recipe/stack_versions.py)
    table: list[tuple[str, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def overrides(self) -> list[str]:
        return self.env_overrides + self.user_overrides



def _time_order(sampler: Mapping) -> str:
    """The sampler row's note when epochs are ordered by expected time (SAMPLER_ORDER_BY=time)."""
    if sampler.get("order_by") != "time":
        return ""
    return f", ordered by time at {sampler.get('time_tokens_per_s')} tokens/s"


def summary_table(c: Mapping, v: dict, layout: dict, hf: dict | None, report: PreflightReport
                  ) -> list[tuple[str, str]]:
    r = lambda k: select(c, f"{ARR}.rollout.{k}")  # noqa: E731
    world = layout.get("world") or 0
    cap, os_, sampler = select(c, "recipe.cap", {}), select(c, "recipe.over_sample", {}), select(c, "data.sampler", {})
    rws = r("tensor_model_parallel_size") * r("data_parallel_size")
    rows = [
        ("preset", v["PRESET"] or "(none)"),
        ("stack", "; ".join(report.stack) or "?"),
        ("model", f"{select(c, f'{ARR}.model.path')}"
                  + (f"  [{hf.get('num_hidden_layers')} layers, {expert_count(hf)} experts]" if hf else "")),
        *(_megatron_rows(c, layout, report) if not is_cpu(v) else
          [("actor", f"verl's FSDP engine on the CPU ({select(c, f'{ARR}.actor.strategy')}), vLLM CPU rollout")]),
        ("vLLM rollout", f"TP {r('tensor_model_parallel_size')} x DP {r('data_parallel_size')} -> "
                         f"{world // rws if rws else '?'} replica(s); EP {r('expert_parallel_size')}; enforce_eager "
                         f"{r('enforce_eager')}; gpu_memory_utilization {r('gpu_memory_utilization')}; max_num_seqs "
                         f"{r('max_num_seqs')}; max_num_batched_tokens {r('max_num_batched_tokens')}"),
        ("batch", f"{select(c, 'data.train_batch_size')} prompts x n {r('n')} (gen batch "
                  f"{select(c, 'data.gen_batch_size')}, mini-batch {select(c, f'{ARR}.actor.ppo_mini_batch_size')}); "
                  f"{select(c, 'trainer.total_epochs')} epochs"),
        ("lengths", f"prompt {select(c, 'data.max_prompt_length')}, response {select(c, 'data.max_response_length')}; "
                    f"tokens/GPU: train {select(c, f'{ARR}.actor.ppo_max_token_len_per_gpu')}, log-prob "
                    f"{r('log_prob_max_token_len_per_gpu')}"),
        ("sampler", "off: verl's own random order (baseline)" if not sampler.get("class_path") else
                    f"{sampler.get('class_name')} (bucket {sampler.get('bucket_size')}, ema {sampler.get('ema_decay')}"
                    f", shuffle blocks {sampler.get('shuffle_batch_blocks')}, {sampler.get('statistic')}"
                    f"{_time_order(sampler)})"),
        ("cap", "off" if not is_on(cap.get("enable")) else (
            f"seed: min({select(c, 'data.max_response_length')}, max({cap.get('min_tokens')}, {cap.get('factor')} x "
            "estimate))" if cap.get("mode") == "seed" else str(cap.get("mode")))),
        ("tail cut", _tail_cut(select(c, "recipe.tail_cut", {}))),
        ("scheduling", "priority: each step's longest-predicted responses first" if r("scheduling_policy") ==
                       "priority" else f"off: vLLM's {r('scheduling_policy')}"),
        ("drafter", _drafter(v["ROLLOUT_SPECULATIVE"], select(c, f"{ARR}.rollout.engine_kwargs.vllm."
                                                                 "speculative_config"),
                             select(c, f"{ARR}.rollout.router_config_path"))),
        ("over-sample", f"ratio {os_.get('ratio')}, requeue {os_.get('requeue')}" if is_on(os_.get("enable"))
                        else "off"),
        *routing_rows(c, hf, gpu_memory_bytes()),
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


def _tail_cut(cut: Mapping) -> str:
    if not is_on(cut.get("enable")):
        return "off"
    budget = cut.get("max_extra_truncation") or 0
    return (f"held at {budget} extra truncation (from fraction {cut.get('fraction')})" if budget else
            f"fraction {cut.get('fraction')}") + f", level exponent {cut.get('level_exponent')}"


def _drafter(method: str, spec: Mapping | None, router: str | None) -> str:
    if not spec:
        return "off (ROLLOUT_SPECULATIVE=off)"
    return (f"{method} ({spec.get('method')}), {spec.get('num_speculative_tokens')} tokens"
            + ("; group-affinity router" if router else ""))


# The levers a run may turn on (rows of the summary table): the report lists those on in a short table of their own.
LEVERS = ("sampler", "cap", "tail cut", "scheduling", "drafter", "router replay", "routes in vLLM", "over-sample",
          "checkpoints", "loggers")


def _megatron_rows(c: Mapping, layout: dict, report: PreflightReport) -> list[tuple[str, str]]:
    m = lambda k: select(c, f"{MEG}.{k}")  # noqa: E731
    tp, world = m("tensor_model_parallel_size"), layout.get("world") or 0
    distcp = (f"{m('dist_checkpointing_path')} (actor and ref)" + ("  [created at launch]" if report.smoke_convert
              else "")) if m("use_dist_checkpointing") else "none: Megatron-Bridge loads MODEL_PATH"
    return [
        ("dist checkpoint", distcp),
        ("GPUs", f"{world} = NNODES {select(c, 'trainer.nnodes')} x GPUS_PER_NODE {select(c, 'trainer.n_gpus_per_node')}"),
        ("actor parallel", f"TP {tp} x PP {m('pipeline_model_parallel_size')} x CP {m('context_parallel_size')} -> "
                           f"DP {layout.get('dp')}; EP {m('expert_model_parallel_size')} x ETP {layout.get('etp')} -> "
                           f"expert DP {layout.get('edp')}; SP {bool(m('sequence_parallel')) and tp > 1}"),
        ("pipeline layers", " | ".join(str(n) for n in layout.get("split") or []) or "?"),
    ]


def format_report(report: PreflightReport) -> str:
    """The preset first, then the resolved settings, the levers that are on (those off in one line), notes and
    errors."""
    preset = report.values.get("PRESET")
    lines = [f"preflight: preset {preset or '(none): the real run'}"]
    if report.table:
        width = max(len(k) for k, _ in report.table)
        lines.append("preflight: resolved settings")
        lines += [f"  {k.ljust(width)}  {val}" for k, val in report.table if k not in LEVERS]
        levers = [(k, val) for k, val in report.table if k in LEVERS]
        lines.append("preflight: levers on")
        lines += [f"  {k.ljust(width)}  {val}" for k, val in levers if not val.startswith("off")]
        off = [k for k, val in levers if val.startswith("off")]
        lines += [f"  {'(off)'.ljust(width)}  {', '.join(off)}"] if off else []
    lines += [f"preflight: note: {n}" for n in report.notes]
    lines += [f"preflight: ERROR: {e}" for e in report.errors]
    if report.errors:
        lines.append(f"preflight: {len(report.errors)} problem(s); nothing was launched")
    else:
        lines.append("preflight: OK")
    return "\n".join(lines)


def write_plan(report: PreflightReport, path: str) -> None:
    """A bash-sourceable plan for the launch (``PLAN_*`` variables and the ``PLAN_OVERRIDES`` array)."""
    from ..cpu.preset import PLATFORM_ENV

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
        f"PLAN_CONFIG_NAME={q(config_name(v))}",
        # the CPU preset's platform environment, for the launch's own process (its Ray actors get it from the config)
        "PLAN_ENV=(" + " ".join(q(f"{k}={val}") for k, val in (PLATFORM_ENV.items() if is_cpu(v) else ())) + ")",
        # the user's arguments are appended by the script, after these
        "PLAN_OVERRIDES=(" + " ".join(q(o) for o in report.env_overrides)
        + " " + q(f"hydra.run.dir={hydra_quote(p.hydra_dir, 'CKPT_ROOT')}") + ")",
    ]
    Path(path).write_text("\n".join(lines) + "\n")


def dump(report: PreflightReport, path: str) -> None:
    from omegaconf import OmegaConf

    config = OmegaConf.to_container(report.config, resolve=True) if report.config is not None else None
    Path(path).write_text(json.dumps({"overrides": report.overrides, "errors": report.errors, "notes": report.notes,
                                      "config": config}, indent=1, default=str))

