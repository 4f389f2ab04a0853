"""The recipe's own configuration, parsed and checked in one place.

The recipe YAML (``configs/length_aware_grpo.yaml``) adds two sections to verl's config: ``data.sampler`` (the
seed-compatible sampler keys) and ``recipe`` (cap, over-sample, traces, token records). This module turns them into
frozen dataclasses and rejects bad values with a message naming the key (and the environment variable that feeds it)
and the fix, before Ray or any GPU work starts. Pure Python: it takes plain mappings (``OmegaConf.to_container``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from .core.cap import CAP_MODES
from .core.estimates import parse_statistic
from .core.ordering import ORDER_KEYS, WITHIN_BUCKET

SAMPLER_CLASS_PATH = "pkg://recipe.adapter.sampler"
SAMPLER_CLASS_NAME = "LengthAwareEpochSampler"

# Hydra key -> environment variable that feeds it (for error messages; scripts/train_grpo.sh sets the keys).
ENV_OF_KEY = {
    "recipe.cap.enable": "VLLM_ROLLOUT_EARLY_STOP_ENABLE",
    "recipe.cap.factor": "VLLM_ROLLOUT_EARLY_STOP_FACTOR",
    "recipe.cap.min_tokens": "VLLM_ROLLOUT_EARLY_STOP_MIN_TOKENS",
    "recipe.cap.mode": "VLLM_ROLLOUT_EARLY_STOP_MODE",
    "recipe.cap.budget.budget": "VLLM_ROLLOUT_EARLY_STOP_BUDGET",
    "data.sampler.init_from": "SAMPLER_INIT_FROM",
    "data.sampler.prior_column": "SAMPLER_PRIOR_COLUMN",
    "recipe.over_sample.enable": "OVER_SAMPLE_ENABLE",
    "recipe.over_sample.ratio": "OVER_SAMPLE_RATIO",
    "recipe.over_sample.requeue": "OVER_SAMPLE_REQUEUE",
    "recipe.tail_cut.enable": "TAIL_CUT_ENABLE",
    "recipe.tail_cut.fraction": "TAIL_CUT_FRACTION",
    "recipe.tail_cut.level_exponent": "TAIL_CUT_LEVEL_EXPONENT",
    "recipe.tail_cut.max_extra_truncation": "TAIL_CUT_MAX_EXTRA_TRUNCATION",
    "data.sampler.bucket_size": "SAMPLER_BUCKET_SIZE",
    "data.sampler.ema_decay": "SAMPLER_EMA_DECAY",
    "data.sampler.shuffle_batch_blocks": "SAMPLER_SHUFFLE_BATCH_BLOCKS",
    "data.sampler.statistic": "SAMPLER_STATISTIC",
    "data.sampler.order_by": "SAMPLER_ORDER_BY",
    "data.sampler.time_tokens_per_s": "SAMPLER_TIME_TOKENS_PER_S",
    "data.train_batch_size": "TRAIN_BATCH_SIZE",
    "data.gen_batch_size": "GEN_BATCH_SIZE",
    "recipe.sampling_seed": "ROLLOUT_SAMPLING_SEED",
    "recipe.record_tokens.enable": "RECORD_TOKENS",
    "recipe.record_tokens.max_mb": "RECORD_TOKENS_MAX_MB",
    "recipe.draft_head.online": "ROLLOUT_DRAFT_ONLINE",
    "recipe.draft_head.train_steps": "ROLLOUT_DRAFT_TRAIN_STEPS",
    "recipe.draft_head.capture_tokens": "ROLLOUT_DRAFT_CAPTURE_TOKENS",
    "recipe.draft_head.lr": "ROLLOUT_DRAFT_LR",
}


class RecipeConfigError(ValueError):
    """A recipe setting is invalid; the message names the key, the env var behind it and the fix."""


def _where(key: str) -> str:
    env = ENV_OF_KEY.get(key)
    return f"{key} (env {env})" if env else key


def select(cfg: Mapping, dotted: str, default: Any = None) -> Any:
    """``cfg["a"]["b"]...`` for ``"a.b..."`` in a plain nested mapping, ``default`` where a key is missing."""
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def parse_bool(raw: str) -> bool:
    """The 0/1 switches users set through environment variables (or true/false; case and spaces ignored).

    The one parser of such strings: the preflight's variables and :func:`as_bool`'s config keys both use it."""
    s = raw.strip().lower()
    if s not in ("0", "1", "true", "false"):
        raise ValueError("must be 0 or 1 (or true/false)")
    return s in ("1", "true")


def as_bool(value: Any, key: str) -> bool:
    """A config switch: a bool, the int 0/1 or a :func:`parse_bool` string."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        try:
            return parse_bool(value)
        except ValueError:
            pass
    raise RecipeConfigError(f"{_where(key)} must be 0/1 or true/false, got {value!r}")


def as_int(value: Any, key: str, *, minimum: int | None = None) -> int:
    try:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError
        out = int(str(value).strip()) if isinstance(value, str) else int(value)
    except (TypeError, ValueError):
        raise RecipeConfigError(f"{_where(key)} must be an integer, got {value!r}") from None
    if minimum is not None and out < minimum:
        raise RecipeConfigError(f"{_where(key)} must be >= {minimum}, got {out}")
    return out


def as_float(value: Any, key: str, *, low: float | None = None, high: float | None = None,
             low_open: bool = False) -> float:
    try:
        if isinstance(value, bool):
            raise ValueError
        out = float(value)
    except (TypeError, ValueError):
        raise RecipeConfigError(f"{_where(key)} must be a number, got {value!r}") from None
    if out != out:  # NaN
        raise RecipeConfigError(f"{_where(key)} must be a number, got NaN")
    if low is not None and (out < low or (low_open and out == low)):
        raise RecipeConfigError(f"{_where(key)} must be {'>' if low_open else '>='} {low}, got {out}")
    if high is not None and out > high:
        raise RecipeConfigError(f"{_where(key)} must be <= {high}, got {out}")
    return out


@dataclass(frozen=True)
class SamplerSettings:
    enabled: bool
    bucket_size: float
    ema_decay: float
    shuffle_batch_blocks: bool
    statistic: str
    seed: int
    within_bucket: str
    init_from: str | None  # an earlier run's length_traces.jsonl (or its run directory): warm-started estimates
    prior_column: str | None  # a train-file column of expected lengths per row
    order_by: str  # tokens | time: epochs sorted by expected rollout time (multi-turn; recipe/core/time_key.py)
    # order_by=time: tool seconds in tokens (one sequence's decode speed); default 120, the simulator's tuned value
    # (bench/sim_multiturn.py, docs/results.md)
    time_tokens_per_s: float


@dataclass(frozen=True)
class CapSettings:
    enabled: bool
    mode: str  # seed | calibrated | budget
    factor: float
    min_tokens: int
    quantile: float
    history_epochs: int
    align: int
    calibrated_min_tokens: int
    budget: float
    budget_history_epochs: int
    budget_align: int
    budget_min_tokens: int

    def policy_kwargs(self) -> dict:
        if self.mode == "seed":
            return {"factor": self.factor, "min_tokens": self.min_tokens}
        if self.mode == "budget":
            return {"budget": self.budget, "history_epochs": self.budget_history_epochs, "align": self.budget_align,
                    "min_tokens": self.budget_min_tokens}
        return {"quantile": self.quantile, "history_epochs": self.history_epochs, "align": self.align,
                "min_tokens": self.calibrated_min_tokens}


@dataclass(frozen=True)
class OverSampleSettings:
    enabled: bool
    ratio: float
    requeue: str  # restart | continue
    max_resumes: int
    mask_stale_tokens: bool
    abort_events: bool


@dataclass(frozen=True)
class TailCutSettings:
    enabled: bool
    fraction: float  # end the step once this share of its responses is done
    level_exponent: float  # a batch of level L (mean estimate / all rows' mean) may leave (1-fraction)*L**x unfinished
    # > 0: recipe.core.tailcut_budget.TailCutBudget holds the cut's estimated extra truncation at this share, per step
    # (the fraction is then only where it starts); 0: the fixed fraction
    max_extra_truncation: float = 0.0


@dataclass(frozen=True)
class TraceSettings:
    enabled: bool
    path: str | None


@dataclass(frozen=True)
class TokenRecordSettings:
    """``recipe.record_tokens``: each trained response's token ids per step (``recipe/token_record.py``)."""

    enabled: bool
    max_mb: int  # the recording stops (never truncates) once its directory would pass this
    path: str | None  # None: <trainer.default_local_dir>/tokens

    @property
    def max_bytes(self) -> int:
        return self.max_mb * 2**20


@dataclass(frozen=True)
class DraftHeadSettings:
    """``recipe.draft_head``: online learning of the ``eagle3`` head (``recipe/adapter/draft_learning.py``)."""

    online: bool  # train the head each step on the step's captured hidden states
    train_steps: int  # optimizer steps per RL step
    capture_tokens: int  # tokens (and their aux hidden states) each engine keeps per step for training
    lr: float
    batch_tokens: int  # tokens per optimizer step


def parse_draft_head(cfg: Mapping) -> DraftHeadSettings:
    d = select(cfg, "recipe.draft_head", {}) or {}
    return DraftHeadSettings(
        online=as_bool(d.get("online", False), "recipe.draft_head.online"),
        train_steps=as_int(d.get("train_steps", 8), "recipe.draft_head.train_steps", minimum=1),
        capture_tokens=as_int(d.get("capture_tokens", 16384), "recipe.draft_head.capture_tokens", minimum=1),
        lr=as_float(d.get("lr", 1e-4), "recipe.draft_head.lr", low=0, low_open=True, high=1),
        batch_tokens=as_int(d.get("batch_tokens", 4096), "recipe.draft_head.batch_tokens", minimum=1),
    )


@dataclass(frozen=True)
class RecipeSettings:
    sampler: SamplerSettings
    cap: CapSettings
    over_sample: OverSampleSettings
    tail_cut: TailCutSettings
    traces: TraceSettings
    record_tokens: TokenRecordSettings
    draft_head: DraftHeadSettings
    response_length: int
    poll_interval_s: float  # verl's replay buffer: how often it polls TransferQueue for finished groups
    sampling_seed: int | None  # per-response vLLM seeds from (seed, epoch, row, sample); None: the engine's RNG
    batch_size: int  # prompts per dataloader fetch: data.gen_batch_size or data.train_batch_size
    train_batch_size: int


def parse_sampler(cfg: Mapping) -> SamplerSettings:
    s = select(cfg, "data.sampler", {}) or {}
    class_path = s.get("class_path")
    class_name = s.get("class_name")
    enabled = class_path not in (None, "", "null")
    if enabled and (class_path != SAMPLER_CLASS_PATH or class_name != SAMPLER_CLASS_NAME):
        raise RecipeConfigError(
            f"data.sampler.class_path/class_name = {class_path!r}/{class_name!r}: this recipe provides only "
            f"{SAMPLER_CLASS_PATH!r}/{SAMPLER_CLASS_NAME!r}; set data.sampler.class_path=null for verl's own sampler"
        )
    statistic = str(s.get("statistic", "mean"))
    try:
        parse_statistic(statistic)
    except ValueError as e:
        raise RecipeConfigError(f"{_where('data.sampler.statistic')}: {e}") from None
    out = SamplerSettings(
        enabled=enabled,
        bucket_size=as_float(s.get("bucket_size", 1024), "data.sampler.bucket_size", low=0, low_open=True),
        ema_decay=as_float(s.get("ema_decay", 0.7), "data.sampler.ema_decay", low=0.0, high=0.999),
        shuffle_batch_blocks=as_bool(s.get("shuffle_batch_blocks", True), "data.sampler.shuffle_batch_blocks"),
        statistic=statistic,
        seed=as_int(s.get("seed", 0) if s.get("seed") is not None else 0, "data.sampler.seed"),
        within_bucket=str(s.get("within_bucket", "sorted")),
        init_from=_optional_str(s.get("init_from")),
        prior_column=_optional_str(s.get("prior_column")),
        order_by=str(s.get("order_by", "tokens")),
        time_tokens_per_s=as_float(s.get("time_tokens_per_s", 120.0), "data.sampler.time_tokens_per_s", low=0,
                                   low_open=True),
    )
    if out.within_bucket not in WITHIN_BUCKET:
        raise RecipeConfigError(
            f"data.sampler.within_bucket must be one of {WITHIN_BUCKET}, got {out.within_bucket!r}")
    if out.order_by not in ORDER_KEYS:
        raise RecipeConfigError(
            f"{_where('data.sampler.order_by')} must be one of {ORDER_KEYS}, got {out.order_by!r}; e.g. "
            "SAMPLER_ORDER_BY=tokens (the default: the simulator found ordering by time no faster)")
    if enabled:
        if as_bool(select(cfg, "data.shuffle", False), "data.shuffle"):
            raise RecipeConfigError(
                "data.shuffle=True with the length-aware sampler: the sampler decides the order; set data.shuffle=False"
            )
        workers = as_int(select(cfg, "data.dataloader_num_workers", 0), "data.dataloader_num_workers", minimum=0)
        if workers != 0:
            raise RecipeConfigError(
                f"data.dataloader_num_workers={workers} with the length-aware sampler: worker processes hold stale "
                "copies of the sampler (its estimates change every step); set data.dataloader_num_workers=0"
            )
    return out


def _optional_str(value: Any) -> str | None:
    return None if value in (None, "", "null", "None") else str(value)


def parse_cap(cfg: Mapping, sampler_enabled: bool) -> CapSettings:
    c = select(cfg, "recipe.cap", {}) or {}
    cal = c.get("calibrated", {}) or {}
    bud = c.get("budget", {}) or {}
    mode = str(c.get("mode", "seed"))
    if mode not in CAP_MODES:
        raise RecipeConfigError(f"{_where('recipe.cap.mode')} must be one of {CAP_MODES}, got {mode!r}")
    out = CapSettings(
        enabled=as_bool(c.get("enable", False), "recipe.cap.enable"),
        mode=mode,
        factor=as_float(c.get("factor", 2.0), "recipe.cap.factor", low=0, low_open=True),
        min_tokens=as_int(c.get("min_tokens", 10000), "recipe.cap.min_tokens", minimum=1),
        quantile=as_float(cal.get("quantile", 0.95), "recipe.cap.calibrated.quantile", low=0, high=1, low_open=True),
        history_epochs=as_int(cal.get("history_epochs", 3), "recipe.cap.calibrated.history_epochs", minimum=1),
        align=as_int(cal.get("align", 512), "recipe.cap.calibrated.align", minimum=1),
        calibrated_min_tokens=as_int(cal.get("min_tokens", 4096), "recipe.cap.calibrated.min_tokens", minimum=1),
        budget=as_float(bud.get("budget", 0.007), "recipe.cap.budget.budget", low=0, high=0.999),
        budget_history_epochs=as_int(bud.get("history_epochs", 3), "recipe.cap.budget.history_epochs", minimum=1),
        budget_align=as_int(bud.get("align", 256), "recipe.cap.budget.align", minimum=1),
        budget_min_tokens=as_int(bud.get("min_tokens", 1024), "recipe.cap.budget.min_tokens", minimum=1),
    )
    if out.enabled and not sampler_enabled:
        raise RecipeConfigError(
            f"{_where('recipe.cap.enable')}=1 but the length-aware sampler is off (data.sampler.class_path=null): "
            "the cap needs its length estimates; enable the sampler or set recipe.cap.enable=0"
        )
    return out


def parse_over_sample(cfg: Mapping, sampler_enabled: bool) -> OverSampleSettings:
    o = select(cfg, "recipe.over_sample", {}) or {}
    out = OverSampleSettings(
        enabled=as_bool(o.get("enable", False), "recipe.over_sample.enable"),
        ratio=as_float(o.get("ratio", 0.25), "recipe.over_sample.ratio", low=0.0, high=4.0),
        requeue=str(o.get("requeue", "restart")),
        max_resumes=as_int(o.get("max_resumes", 1), "recipe.over_sample.max_resumes", minimum=0),
        mask_stale_tokens=as_bool(o.get("mask_stale_tokens", False), "recipe.over_sample.mask_stale_tokens"),
        abort_events=as_bool(o.get("abort_events", False), "recipe.over_sample.abort_events"),
    )
    if out.requeue not in ("restart", "continue"):
        raise RecipeConfigError(
            f"{_where('recipe.over_sample.requeue')} must be 'restart' or 'continue', got {out.requeue!r}")
    if out.enabled and out.ratio <= 0:
        raise RecipeConfigError(
            f"{_where('recipe.over_sample.enable')}=1 with {_where('recipe.over_sample.ratio')}={out.ratio}: "
            "set a ratio > 0 (e.g. 0.25) or disable over-sampling"
        )
    if out.enabled and not sampler_enabled:
        raise RecipeConfigError(
            f"{_where('recipe.over_sample.enable')}=1 needs the length-aware sampler (aborted prompts are re-queued "
            "into its epoch order); enable data.sampler or set recipe.over_sample.enable=0"
        )
    return out


def parse_tail_cut(cfg: Mapping, over_sample: OverSampleSettings, sampler_enabled: bool) -> TailCutSettings:
    t = select(cfg, "recipe.tail_cut", {}) or {}
    out = TailCutSettings(
        enabled=as_bool(t.get("enable", False), "recipe.tail_cut.enable"),
        fraction=as_float(t.get("fraction", 0.975), "recipe.tail_cut.fraction", low=0, low_open=True, high=1),
        level_exponent=as_float(t.get("level_exponent", 1.25), "recipe.tail_cut.level_exponent", low=0),
        max_extra_truncation=as_float(t.get("max_extra_truncation", 0.0) or 0.0,
                                      "recipe.tail_cut.max_extra_truncation", low=0, high=0.5),
    )
    if out.max_extra_truncation > 0 and not out.enabled:
        raise RecipeConfigError(
            f"{_where('recipe.tail_cut.max_extra_truncation')}={out.max_extra_truncation} budgets the tail cut, "
            f"which is off: set {_where('recipe.tail_cut.enable')}=1 or unset TAIL_CUT_MAX_EXTRA_TRUNCATION")
    if out.enabled and over_sample.enabled:
        raise RecipeConfigError(
            f"{_where('recipe.tail_cut.enable')}=1 with {_where('recipe.over_sample.enable')}=1: both abort a step's "
            "last requests, one to train them truncated now, the other to re-queue them; choose one")
    if out.enabled and out.level_exponent > 0 and not sampler_enabled:
        raise RecipeConfigError(
            f"{_where('recipe.tail_cut.level_exponent')}={out.level_exponent} needs the length-aware sampler's "
            "estimates (the batch's level); set TAIL_CUT_LEVEL_EXPONENT=0 or enable the sampler")
    return out


def parse_record_tokens(cfg: Mapping) -> TokenRecordSettings:
    r = select(cfg, "recipe.record_tokens", {}) or {}
    return TokenRecordSettings(
        enabled=as_bool(r.get("enable", False), "recipe.record_tokens.enable"),
        max_mb=as_int(r.get("max_mb", 1024), "recipe.record_tokens.max_mb", minimum=1),
        path=_optional_str(r.get("path")),
    )


def parse_settings(cfg: Mapping) -> RecipeSettings:
    """Parse and cross-check the recipe keys of a resolved config (a plain nested dict)."""
    sampler = parse_sampler(cfg)
    response_length = as_int(select(cfg, "actor_rollout_ref.rollout.response_length",
                                  select(cfg, "data.max_response_length")),
                             "actor_rollout_ref.rollout.response_length", minimum=1)
    train_bs = as_int(select(cfg, "data.train_batch_size"), "data.train_batch_size", minimum=1)
    gen_bs = select(cfg, "data.gen_batch_size")
    batch_size = train_bs if gen_bs in (None, 0) else as_int(gen_bs, "data.gen_batch_size", minimum=1)
    if train_bs % batch_size:
        raise RecipeConfigError(
            f"{_where('data.train_batch_size')}={train_bs} is not a multiple of {_where('data.gen_batch_size')}="
            f"{batch_size}: verl fetches whole gen batches per step; make gen_batch_size divide train_batch_size"
        )
    rollout = select(cfg, "actor_rollout_ref.rollout", {}) or {}
    if rollout.get("scheduling_policy") == "priority" and as_bool(rollout.get("full_determinism", False),
                                                                  "actor_rollout_ref.rollout.full_determinism"):
        raise RecipeConfigError(
            "actor_rollout_ref.rollout.scheduling_policy=priority (env ROLLOUT_SCHEDULING_POLICY) with "
            "rollout.full_determinism=True: verl then names each request det-<priority>, and the recipe's priorities "
            "repeat across a prompt's n responses; use recipe.sampling_seed (ROLLOUT_SAMPLING_SEED) for "
            "reproducible rollouts instead")
    t = select(cfg, "recipe.traces", {}) or {}
    return RecipeSettings(
        sampler=sampler,
        cap=parse_cap(cfg, sampler.enabled),
        over_sample=(over_sample := parse_over_sample(cfg, sampler.enabled)),
        tail_cut=parse_tail_cut(cfg, over_sample, sampler.enabled),
        traces=TraceSettings(enabled=as_bool(t.get("enable", True), "recipe.traces.enable"), path=t.get("path")),
        record_tokens=parse_record_tokens(cfg),
        draft_head=parse_draft_head(cfg),
        response_length=response_length,
        poll_interval_s=as_float(select(cfg, "recipe.replay_buffer.poll_interval_s", 0.2),
                                 "recipe.replay_buffer.poll_interval_s", low=0, low_open=True, high=10),
        sampling_seed=(None if select(cfg, "recipe.sampling_seed") is None
                       else as_int(select(cfg, "recipe.sampling_seed"), "recipe.sampling_seed", minimum=0)),
        batch_size=batch_size,
        train_batch_size=train_bs,
    )
