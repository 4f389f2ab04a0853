"""Batch-formation policies, built from the same ``recipe.core`` objects the trainer uses.

A policy is a ``PolicySpec`` (data) turned into a ``Policy`` (state) by ``make_policy``. Per step it answers
``plan_step()`` with the rows to launch, the cap (vLLM ``max_tokens``) and how many complete groups to keep; after
the step ``observe`` feeds the kept groups back exactly as the trainer does: ``StepResponses.censored()`` into
``LengthEstimates.update`` and the ``StepResponses`` into the cap's ``observe_step``. Caps see only estimates of rows
known (``fill_prior=False``): with nothing known about a batch there is no cap, in a cold epoch 0 as in the trainer.

Warm start (``warm_start="previous_run"``): before epoch 0 the estimates are seeded with ``LengthEstimates.
warm_start`` from an earlier run of the same prompts (``Trace.previous_run``, or a recording; never the trace being
replayed), all its epochs or only its first (``warm_epochs``), and a learning cap is calibrated on it with
``recipe.core.cap.warm_start_cap``, so epoch 0 is ordered and capped like any later one. ``priority=
"longest_first"`` passes vLLM priorities (lower first: minus the row's estimate; resumed partial groups before
everything), which the engine model serves in priority order and preempts lowest-priority first;
``placement="predicted_tokens"`` routes by predicted outstanding tokens (``engine.assign_by_predicted``).
``tail_cut < 1`` ends each step with ``recipe.core.tailcut.TailCut`` (the plan carries the batch's ``cut_level``
for ``tail_cut_exponent``): the executor stops the step at its ``cut_time`` and the stopped responses are observed
as aborted, i.e. censored and counted truncated, like a cap hit. ``tail_cut_budget > 0`` replaces the fixed
fraction by ``recipe.core.tailcut_budget.TailCutBudget``: each plan takes the controller's current rule, and each
step's trained responses go to its ``observe`` as the trainer feeds them (``TAIL_CUT_MAX_EXTRA_TRUNCATION``).
``speculate`` (``always``, or ``tail`` up to ``speculate_max_batch`` running sequences per replica) makes the executor
run the step with speculative decoding (``recipe.sim.speculation``; the acceptance length is the executor's).

Row order comes from ``EpochPlan`` in all four modes: ``plan`` sorts by the policy's own estimates, ``random``
gives it an estimator that never observes anything (so every epoch is a fresh seeded permutation, verl's
RandomSampler), ``oracle`` gives it an estimator overwritten with the epoch's true group maxima before the epoch
starts, and ``level`` one holding each prompt's true level in the epoch (``Trace.level`` as a per-row prior): what a
perfect estimate of the prompt could order by, without the luck of the epoch's own draws (both not realisable).
Over-sampling uses ``recipe.core.oversample.OverSampleController`` and ``EpochPlan.requeue`` in the order
``recipe/adapter/oversample.py`` does; the controller alone decides whether an aborted group keeps its partial
responses (``keeps_partial(resumes_so_far)``, bounded by ``max_resumes``) and so where it goes back
(``requeue_aborted``: resumed groups next, restarting ones to the back), as the trainer's driver and
``PartialRef.resumes`` do. A new kind of policy registers a spec (``register``) or subclasses ``Policy``.
"""
from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field

import numpy as np

from recipe.core.cap import CAP_MODES, BudgetCap, CalibratedCap, SeedCap, make_cap_policy, warm_start_cap
from recipe.core.estimates import LengthEstimates
from recipe.core.ordering import WITHIN_BUCKET, EpochPlan
from recipe.core.oversample import REQUEUE_MODES, OverSampleController, StepOutcome, requeue_aborted
from recipe.core.step_stats import StepResponses
from recipe.core.tailcut import TailCut, batch_level
from recipe.core.tailcut_budget import TailCutBudget

from .engine import PLACEMENTS
from .speculation import MODES as SPECULATE_MODES
from .trace import Trace

ORDERS = ("random", "plan", "oracle", "level")
CAPS = ("none", *CAP_MODES)
CAP_SCOPES = ("batch", "row")
WARM_STARTS = ("none", "previous_run")
WARM_EPOCHS = ("all", "first")
PRIORITIES = ("fcfs", "longest_first")
RESUMED_PRIORITY = -1e18  # before any fresh row: vLLM serves lower priority values first
_TOKEN_KWARGS = ("min_tokens", "align")  # cap arguments counted in tokens (PolicySpec.scaled)


@dataclass(frozen=True)
class PolicySpec:
    name: str
    description: str = ""
    order: str = "plan"  # random | plan | oracle | level
    statistic: str = "mean"  # LengthEstimates statistic (drives the order and the caps)
    ema_decay: float = 0.7
    bucket_size: float = 1024
    shuffle_batch_blocks: bool = True
    within_bucket: str = "sorted"  # EpochPlan: sorted by estimate | shuffled inside each bucket_size bucket
    cap: str = "none"  # none | seed | calibrated (recipe.core.cap)
    cap_kwargs: dict = field(default_factory=dict)
    cap_scope: str = "batch"  # batch: one cap from all rows' estimates; row: each row's cap from its own estimate
    oversample_ratio: float = 0.0  # 0: wait for every group (recipe.core.oversample)
    oversample_requeue: str = "restart"  # restart (back, fresh) | continue (front, partial rollout)
    max_resumes: int = 1  # continue: resumes a partial group gets before it restarts (OverSampleController)
    tail_cut: float = 1.0  # end the step when this fraction of its responses is done (1: wait for all)
    tail_cut_exponent: float = 0.0  # recipe.core.tailcut.TailCut level_exponent: the allowance per batch level
    warm_start: str = "none"  # none | previous_run: estimates (and a learning cap) seeded from an earlier run
    warm_epochs: str = "all"  # which epochs of the earlier run seed the estimates: all | first
    priority: str = "fcfs"  # fcfs | longest_first (vLLM scheduling_policy=priority, per-request priority)
    placement: str = "least_inflight"  # least_inflight (verl's router) | predicted_tokens
    # > 0: recipe.core.tailcut_budget.TailCutBudget holds the cut's estimated extra truncation at this share, the
    # allowance starting at 1 - tail_cut (which must then be < 1), a deficit paid back over tail_cut_horizon steps
    tail_cut_budget: float = 0.0
    tail_cut_horizon: float = 8.0
    speculate: str = "off"  # off | tail | always: speculative decoding (recipe.sim.speculation), the executor's cost
    speculate_max_batch: int = 0  # tail: draft while a replica runs at most this many sequences

    def __post_init__(self):
        if (self.order not in ORDERS or self.cap not in CAPS or self.cap_scope not in CAP_SCOPES
                or self.oversample_requeue not in REQUEUE_MODES or self.max_resumes < 0
                or self.within_bucket not in WITHIN_BUCKET or self.warm_start not in WARM_STARTS
                or self.warm_epochs not in WARM_EPOCHS or self.priority not in PRIORITIES
                or self.placement not in PLACEMENTS):
            raise ValueError(f"policy {self.name!r}: order must be one of {ORDERS}, cap one of {CAPS}, cap_scope"
                             f" one of {CAP_SCOPES}, oversample_requeue one of {REQUEUE_MODES}, within_bucket one of"
                             f" {WITHIN_BUCKET}, warm_start one of {WARM_STARTS}, warm_epochs one of {WARM_EPOCHS},"
                             f" priority one of {PRIORITIES}, placement one of {PLACEMENTS} and max_resumes >= 0")
        TailCut(self.tail_cut, self.tail_cut_exponent)  # validates both
        if self.tail_cut_budget:
            if self.tail_cut >= 1.0:
                raise ValueError(f"policy {self.name!r}: tail_cut_budget needs tail_cut < 1 (its starting point)")
            TailCutBudget(self.tail_cut_budget, self.tail_cut_exponent, horizon=self.tail_cut_horizon)  # validates
        if self.speculate not in SPECULATE_MODES or (self.speculate == "tail") != (self.speculate_max_batch > 0):
            raise ValueError(f"policy {self.name!r}: speculate must be one of {SPECULATE_MODES}, with "
                             "speculate_max_batch > 0 exactly when it is 'tail'")
        if self.tail_cut < 1.0 and self.oversample_ratio > 0:
            # The executor picks the kept groups by when they complete, which a cut before that cannot know yet.
            raise ValueError(f"policy {self.name!r}: tail_cut < 1 with oversample_ratio > 0 is not modelled; set "
                             "one of them off (tail_cut=1.0 or oversample_ratio=0)")

    def scaled(self, factor: float) -> PolicySpec:
        """The same policy for a trace whose lengths were multiplied by ``factor`` (``Trace.scaled``): every
        parameter counted in tokens (bucket size; the caps' ``min_tokens`` and ``align``, defaults included) is
        multiplied too, rounded, at least 1. Ratios (cap factor, quantile, over-sample ratio) stay."""
        cls = {"seed": SeedCap, "calibrated": CalibratedCap, "budget": BudgetCap}.get(self.cap)
        tokens = {} if cls is None else {k: v.default for k, v in inspect.signature(cls).parameters.items()
                                         if k in _TOKEN_KWARGS}
        kw = {**tokens, **self.cap_kwargs}
        kw.update({k: max(1, int(round(kw[k] * factor))) for k in tokens})
        return dataclasses.replace(self, bucket_size=max(1.0, self.bucket_size * factor), cap_kwargs=kw)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        if self.cap == "none":
            d.pop("cap_kwargs")
            d.pop("cap_scope")
        if self.oversample_ratio == 0:
            d.pop("oversample_requeue")
        if self.oversample_ratio == 0 or self.oversample_requeue != "continue":
            d.pop("max_resumes")
        if self.tail_cut == 1.0:
            d.pop("tail_cut")
        if self.tail_cut == 1.0 or self.tail_cut_exponent == 0:
            d.pop("tail_cut_exponent")
        if not self.tail_cut_budget:
            d.pop("tail_cut_budget")
            d.pop("tail_cut_horizon")
        if self.speculate == "off":
            d.pop("speculate")
        if self.speculate != "tail":
            d.pop("speculate_max_batch")
        if self.within_bucket == "sorted":
            d.pop("within_bucket")
        if self.warm_start == "none":
            d.pop("warm_start")
            d.pop("warm_epochs")
        for key in ("priority", "placement"):
            if d[key] == PolicySpec.__dataclass_fields__[key].default:
                d.pop(key)
        return d


@dataclass
class StepPlan:
    rows: np.ndarray  # rows launched, in submission order
    caps: np.ndarray  # max_tokens of each launched row (0: none, i.e. response_length)
    keep: int | None  # keep the first ``keep`` complete groups and abort the rest (None: wait for all)
    predicted: np.ndarray  # estimate of each launched row at planning time (NaN: never observed)
    resumes: np.ndarray  # per launched row: resumes of its partial group, this launch included (0: a fresh group)
    expected: np.ndarray  # estimate of each launched row with the prior filled in (0 where nothing is known)
    priority: np.ndarray | None = None  # vLLM priority of each launched row (lower first); None: FCFS
    keep_partial: np.ndarray | None = None  # set by ``Policy.observe``: aborted rows whose partial responses stay
    cut_level: float = 1.0  # the batch's level for the tail cut (recipe.core.tailcut.batch_level; 1: none)


class Policy:
    """The state of one policy over a run: estimates, epoch plan, cap and step-end controllers.

    ``truth`` (the trace's ``lengths``) is read by the oracle order only, ``level`` (the trace's log-levels) by the
    level order only; ``previous`` (an earlier run of the same prompts, rows matched by ``row_ids``) by
    warm-started policies only.
    """

    def __init__(self, spec: PolicySpec, *, num_rows: int, batch_size: int, response_length: int, seed: int = 0,
                 truth: np.ndarray | None = None, level: np.ndarray | None = None, previous: Trace | None = None,
                 row_ids: np.ndarray | None = None):
        if spec.order == "oracle" and truth is None:
            raise ValueError("the oracle order needs the trace's true lengths")
        if spec.order == "level" and level is None:
            raise ValueError("the level order needs a generated trace's levels (Trace.level)")
        if spec.warm_start != "none" and previous is None:
            raise ValueError(f"policy {spec.name!r} warm-starts from an earlier run: pass previous= (a generated "
                             "trace's previous_run(), or a recording of an earlier run)")
        self.spec = spec
        self.batch_size = int(batch_size)
        self.response_length = int(response_length)
        self.estimates = LengthEstimates(num_rows, ema_decay=spec.ema_decay, statistic=spec.statistic)
        self._truth, self._level = truth, level
        self._order_est = (self.estimates if spec.order == "plan"
                           else LengthEstimates(num_rows, ema_decay=0.0, statistic="max"))
        self.plan = EpochPlan(self._order_est, batch_size=batch_size, bucket_size=spec.bucket_size,
                              shuffle_batch_blocks=spec.shuffle_batch_blocks, seed=seed,
                              within_bucket=spec.within_bucket)
        self.cap = None if spec.cap == "none" else make_cap_policy(spec.cap, response_length, **spec.cap_kwargs)
        self.oversample = (OverSampleController(batch_size, spec.oversample_ratio, spec.oversample_requeue,
                                                spec.max_resumes) if spec.oversample_ratio > 0 else None)
        self.partial_resumes: dict[int, int] = {}  # rows whose partial group waits to be resumed -> resumes so far
        self.tail_cut = TailCut(spec.tail_cut, spec.tail_cut_exponent) if spec.tail_cut < 1.0 else None
        self.cut_budget = (TailCutBudget(spec.tail_cut_budget, spec.tail_cut_exponent, horizon=spec.tail_cut_horizon,
                                         initial_allowance=1.0 - spec.tail_cut) if spec.tail_cut_budget else None)
        self.epoch = -1
        self.warm_rows = 0
        if spec.warm_start != "none":
            self.warm_rows = self._warm_start(previous, np.arange(num_rows) if row_ids is None else row_ids)

    def _warm_start(self, previous: Trace, row_ids: np.ndarray) -> int:
        """Seed the estimates (and a learning cap) from ``previous``; rows matched by row id, others stay unknown
        and get the prior. Returns the rows seeded."""
        where = {int(r): i for i, r in enumerate(np.asarray(row_ids).tolist())}
        mine = np.array([where.get(int(r), -1) for r in previous.row_ids], np.int64)
        shape = previous.lengths.shape
        ok = np.broadcast_to((mine >= 0)[None, :, None], shape).ravel()
        rows = np.broadcast_to(mine[None, :, None], shape).ravel()[ok]
        epochs = np.broadcast_to(np.arange(previous.epochs)[:, None, None], shape).ravel()[ok]
        lengths = previous.lengths.ravel()[ok]
        censored = (previous.censored | previous.truncated).ravel()[ok]
        first = epochs == 0 if self.spec.warm_epochs == "first" else np.ones(len(rows), bool)
        seeded = self.estimates.warm_start(rows[first], lengths[first], censored[first], epochs[first])
        if isinstance(self.cap, (CalibratedCap, BudgetCap)):  # calibrated on every epoch: it needs two or more
            warm_start_cap(self.cap, rows, lengths, censored, epochs, response_length=self.response_length,
                           ema_decay=self.spec.ema_decay, statistic=self.spec.statistic)
        return seeded

    def start_epoch(self, epoch: int) -> None:
        if self.spec.order == "oracle":
            lengths = self._truth[epoch]
            self._order_est.update(np.repeat(np.arange(lengths.shape[0]), lengths.shape[1]), lengths.ravel())
        elif self.spec.order == "level":
            self._order_est.set_row_prior(np.exp(self._level[epoch]))
        self.plan.start_next_epoch()
        self.epoch = epoch

    def epoch_finished(self) -> bool:
        return self.plan.epoch_finished()  # over-sampling re-queues into the plan, so it knows what is left

    def plan_step(self) -> StepPlan:
        k = self.oversample.launch_count(self.plan.num_remaining()) if self.oversample else self.batch_size
        rows = self.plan.take(k)
        keep = self.batch_size if len(rows) > self.batch_size else None
        predicted = self.estimates.get(rows, fill_prior=False)
        resumes = np.array([self.partial_resumes.pop(int(r)) + 1 if int(r) in self.partial_resumes else 0
                            for r in rows], np.int64)
        expected = np.nan_to_num(self.estimates.get(rows), nan=0.0)
        priority = None
        if self.spec.priority == "longest_first":
            priority = np.where(resumes > 0, RESUMED_PRIORITY, -expected)
        cut_level = 1.0
        if self.cut_budget is not None:
            self.tail_cut = self.cut_budget.cut()  # this step's allowance, from what the run has observed
        if self.tail_cut and self.tail_cut.level_exponent > 0:
            cut_level = batch_level(predicted, self.estimates.get(np.arange(self.estimates.num_rows),
                                                                  fill_prior=False))
        return StepPlan(rows=rows, caps=self._caps(predicted), keep=keep, predicted=predicted, resumes=resumes,
                        expected=expected, priority=priority, cut_level=cut_level)

    def _caps(self, predicted: np.ndarray) -> np.ndarray:
        """Per-row max_tokens; ``row`` scope asks the same cap formula about a batch of one row."""
        if self.cap is None:
            return np.zeros(len(predicted), np.int64)
        if self.spec.cap_scope == "batch":
            return np.full(len(predicted), self.cap.cap_for_batch(predicted) or 0, np.int64)
        return np.array([self.cap.cap_for_batch(predicted[i : i + 1]) or 0 for i in range(len(predicted))], np.int64)

    def observe(self, plan: StepPlan, lengths: np.ndarray, kept: np.ndarray, stopped: np.ndarray) -> StepResponses:
        """Feed a finished step back in the trainer's order; returns the trained responses it fed.

        ``lengths[row_in_plan, sample]``: tokens each response has; ``kept``: groups trained this step;
        ``stopped``: responses ended before their natural end by an abort (a tail cut, or a group that lost the
        over-sampling race). Aborted groups first (``recipe/adapter/oversample.py`` settle: partial lengths as
        censored observations, re-queue where the controller says, epoch accounting), then the trained groups.
        Sets ``plan.keep_partial``: the aborted rows the controller resumes next time (the others restart).
        """
        n = lengths.shape[1]
        plan.keep_partial = np.zeros(len(plan.rows), bool)
        if self.oversample:
            lost = ~kept
            if lost.any():
                self.estimates.update(np.repeat(plan.rows[lost], n), lengths[lost].ravel(),
                                      np.ones(int(lost.sum()) * n, bool))
            outcome = StepOutcome(launched=plan.rows, kept=kept, aborted_tokens=int(lengths[lost].sum()))
            for i in np.flatnonzero(lost):
                if self.oversample.keeps_partial(int(plan.resumes[i])):
                    plan.keep_partial[i] = True
                    self.partial_resumes[int(plan.rows[i])] = int(plan.resumes[i])
            requeue_aborted(self.oversample, self.plan, plan.rows[lost], plan.keep_partial[lost])
            self.oversample.record(self.epoch, outcome)
        rows, pred = plan.rows[kept], plan.predicted[kept]
        resp = StepResponses(rows=np.repeat(rows, n), lengths=lengths[kept].ravel(),
                             caps=np.repeat(plan.caps[kept], n), predicted=np.repeat(pred, n),
                             response_length=self.response_length, aborted=stopped[kept].ravel())
        self.estimates.update(resp.rows, resp.lengths, resp.censored())
        if self.cap:
            self.cap.observe_step(self.epoch, resp)
        if self.cut_budget is not None:
            self.cut_budget.observe(resp)
        return resp


# -- registry ----------------------------------------------------------------------------------------------------
POLICIES: dict[str, PolicySpec] = {}


def register(spec: PolicySpec) -> PolicySpec:
    POLICIES[spec.name] = spec
    return spec


def make_policy(name: str, **kw) -> Policy:
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")
    return Policy(POLICIES[name], **kw)


SEED_CAP = {"factor": 2.0, "min_tokens": 10000}
_SEED = dict(order="plan", statistic="mean", ema_decay=0.7, bucket_size=1024)
_WARM = dict(warm_start="previous_run", warm_epochs="first")
# best-onpolicy (bench/sim_sweep.py --groups onpolicy on the tuning trace seeds 10-14; reported on seeds 0-2, which
# took no part in choosing it): the fastest strictly on-policy recipe.core composition with a cap chosen before the
# step whose extra truncation over baseline stays <= 1 point on every tuning seed (1.199 mean speedup, +0.91 / +0.93
# points; the seed: 1.221, +1.76). Warm start from the earlier run's first epoch (its later epochs have drifted away:
# seeding from all of them orders epoch 0 worse), EMA 0.3 (the estimator whose predictions rank each epoch's groups
# best, bench/sim_sweep.py --groups estimators), the budget cap, and vLLM priority longest-first (it changes
# nothing without a queue, and nothing measurable at a binding KV cache either: bench/sim_sweep.py --groups engine).
ONPOLICY_EMA = 0.3
ONPOLICY_BUDGET = 0.007
ONPOLICY_CAP = {"budget": ONPOLICY_BUDGET}
_ONPOLICY = dict(order="plan", statistic="mean", ema_decay=ONPOLICY_EMA, bucket_size=1024, priority="longest_first")
# tailcut-level (bench/sim_sweep.py --groups tailcut,tailcut-level,tailcut-order on the tuning seeds), by a rule
# fixed before any of its candidates ran on the report seeds: the fastest strictly on-policy, warm-started candidate
# whose extra truncation over baseline is <= 0.9 point in the mean over the tuning seeds and <= 1 point on each
# (1.223 mean speedup, +0.89 / +0.98 points; the seed: 1.221, +1.76). best-onpolicy's order, no cap, and the tail
# cut (recipe.core.tailcut.TailCut): a step ends once all but (1 - 0.975) x level**1.25 of its responses are done,
# level being the batch's mean estimate over the mean estimate of all rows; the rest are aborted and trained as
# truncated. A cap chosen before the step has to guess which responses will run away; the cut sees them, and the
# level spends more of it on long batches, whose stragglers hold a step up longest. tailcut: the top pick of
# --groups tailcut alone (no level exponent), for comparison.
TAILCUT_LEVEL = dict(tail_cut=0.975, tail_cut_exponent=1.25)
TAILCUT_PLAIN = 0.9825
# best (bench/sim_sweep.py --groups continue on the tuning seeds): length-aware order + over-sample ``continue``
# (partial rollout), launch (1 + BEST_RATIO) x the prompts, max_resumes=1 (at most 2 policy versions per trained
# response), no cap; the price is stale tokens (see stale_token_fraction) and work thrown away by restarts. Ratio
# 1.0 is the top at max_resumes=1 on the tuning seeds (mean speedup 1.395; 0.75: 1.345, 1.25: 1.299).
BEST_RATIO = 1.0
BEST_MAX_RESUMES = 1
RESTART_RATIO = 0.125
UNBOUNDED_RESUMES = 10_000
_BEST = dict(order="plan", statistic="mean", ema_decay=0.5, bucket_size=1024)

register(PolicySpec("baseline", "verl RandomSampler: a new random order every epoch, no cap", order="random"))
register(PolicySpec("baseline+seedcap", "random order with the seed's cap", order="random", cap="seed",
                    cap_kwargs=SEED_CAP))
register(PolicySpec("seed", "the seed: EMA 0.7 mean estimates, bucket 1024, block shuffle, cap 2x mean >= 10000",
                    **_SEED, cap="seed", cap_kwargs=SEED_CAP))
register(PolicySpec("seed-nocap", "the seed's order without its cap", **_SEED))
register(PolicySpec("seed-warm", "the seed warm-started from an earlier run's first epoch", **_SEED, **_WARM,
                    cap="seed", cap_kwargs=SEED_CAP))
register(PolicySpec("best", f"length-aware order (EMA 0.5 mean), no cap, launch {1 + BEST_RATIO:g}x the prompts, "
                    f"keep the first B groups, resume the others next step (continue, front), at most "
                    f"{BEST_MAX_RESUMES} resume(s) per group: off-policy tokens, see stale_token_fraction",
                    **_BEST, oversample_ratio=BEST_RATIO, oversample_requeue="continue",
                    max_resumes=BEST_MAX_RESUMES))
register(PolicySpec("best-max-resumes-2", "best with max_resumes=2: at most 3 policy versions per response",
                    **_BEST, oversample_ratio=BEST_RATIO, oversample_requeue="continue", max_resumes=2))
register(PolicySpec("best-onpolicy", f"strictly on-policy: warm start from an earlier run's first epoch, EMA "
                    f"{ONPOLICY_EMA} mean estimates, budget cap (expected extra truncation <= "
                    f"{100 * ONPOLICY_BUDGET:g}% of the batch), vLLM priority longest-first", **_ONPOLICY, **_WARM,
                    cap="budget", cap_kwargs=ONPOLICY_CAP))
register(dataclasses.replace(POLICIES["best-onpolicy"], name="best-onpolicy-fcfs", priority="fcfs",
                             description="best-onpolicy with vLLM's default FCFS scheduling (no priorities)"))
register(PolicySpec("best-onpolicy-cold", "best-onpolicy without the warm start (no earlier run)", **_ONPOLICY,
                    cap="budget", cap_kwargs=ONPOLICY_CAP))
register(PolicySpec("onpolicy-order", "best-onpolicy's warm-started order and priorities without a cap",
                    **_ONPOLICY, **_WARM))
register(PolicySpec("tailcut-level", f"strictly on-policy: best-onpolicy's warm-started order, no cap; each step "
                    f"ends once all but (1 - {TAILCUT_LEVEL['tail_cut']:g}) x level^"
                    f"{TAILCUT_LEVEL['tail_cut_exponent']:g} of its responses are done (level: the batch's mean "
                    "estimate over all rows'), the rest aborted and trained as truncated (tail cut)", **_ONPOLICY,
                    **_WARM, **TAILCUT_LEVEL))
register(PolicySpec("tailcut", f"best-onpolicy's warm-started order, no cap; each step ends once "
                    f"{100 * TAILCUT_PLAIN:g}% of its responses are done, the rest aborted and trained as truncated",
                    **_ONPOLICY, **_WARM, tail_cut=TAILCUT_PLAIN))
register(PolicySpec("calibrated", "EMA 0.5 mean estimates, calibrated cap (batch max estimate x q0.75 of observed/"
                    "predicted group maxima): the previous best-onpolicy", order="plan", ema_decay=0.5,
                    cap="calibrated", cap_kwargs={"quantile": 0.75}))
register(PolicySpec("oversample-restart", f"length-aware order (EMA 0.5), no cap, launch {100 * RESTART_RATIO:g}% "
                    "more prompts, keep the first B groups, restart the others at the back of the epoch (on-policy, "
                    "aborted tokens wasted)", **_BEST, oversample_ratio=RESTART_RATIO))
register(PolicySpec("partial-rollout-unbounded", f"best without the resume bound (max_resumes={UNBOUNDED_RESUMES})",
                    **_BEST, oversample_ratio=BEST_RATIO, oversample_requeue="continue",
                    max_resumes=UNBOUNDED_RESUMES))
register(PolicySpec("oracle", "order by this epoch's true group maxima, no cap (not realisable)", order="oracle"))
register(PolicySpec("level-oracle", "order by each prompt's true level in this epoch, no cap (not realisable: a "
                    "perfect estimate of the prompt, without the epoch's draws)", order="level"))
# tailcut-budget (item 5 of issue 19): tailcut-level's order and level exponent, the allowance held per step by
# recipe.core.tailcut_budget.TailCutBudget at an extra-truncation budget (TAIL_CUT_MAX_EXTRA_TRUNCATION in the
# trainer) instead of a fixed fraction: it starts from tailcut-level's 0.975 and moves by what the run observes.
TAILCUT_BUDGET = 0.01
TAILCUT_BUDGET_HORIZON = 8.0
_TAILCUT_BUDGET = dict(**TAILCUT_LEVEL, tail_cut_budget=TAILCUT_BUDGET, tail_cut_horizon=TAILCUT_BUDGET_HORIZON)
register(PolicySpec("tailcut-budget", f"strictly on-policy: tailcut-level with the allowance held per step by a "
                    f"controller at {100 * TAILCUT_BUDGET:g} point of estimated extra truncation (Kaplan-Meier "
                    "estimate of the cut responses bound for EOS, from the run's own observations)", **_ONPOLICY,
                    **_WARM, **_TAILCUT_BUDGET))
# Speculative decoding (item 4; recipe.sim.speculation): the acceptance length and the cost model are the
# executor's (python -m recipe.sim --acceptance-length), the policy says when to draft.
# best-onpolicy-spec (bench/sim_spec.py's tuning table, trace seeds 10-14, chosen before it ran on seeds 0-2):
# speculation on every step (by the roofline, verification at full batch is nearly free, so always-on beats every
# tail-only schedule) + tailcut-budget's order and cut at the largest budget, in steps of 0.001, whose measured
# extra truncation stays <= 1 point on every tuning seed of the reference trace (the controller's Kaplan-Meier
# estimate runs ~0.1 point below the truth there).
SPEC_BUDGET = 0.008
SPEC_TAIL_MAX_BATCH = 32  # ROLLOUT_SPECULATIVE_MAX_BATCH=32: the tail-only schedule the recipe shipped before
_SPEC_CUT = {**_TAILCUT_BUDGET, "tail_cut_budget": SPEC_BUDGET}
register(PolicySpec("best-onpolicy-spec", f"strictly on-policy: speculative decoding on every step (acceptance "
                    f"length: the run's --acceptance-length) + tailcut-budget's warm-started order and cut at a "
                    f"{100 * SPEC_BUDGET:g}-point budget", **_ONPOLICY, **_WARM, **_SPEC_CUT, speculate="always"))
register(PolicySpec("onpolicy-spec-tail", f"best-onpolicy-spec drafting only while a replica runs at most "
                    f"{SPEC_TAIL_MAX_BATCH} sequences (vLLM's per-batch-size draft schedule)", **_ONPOLICY, **_WARM,
                    **_SPEC_CUT, speculate="tail", speculate_max_batch=SPEC_TAIL_MAX_BATCH))
register(PolicySpec("tailcut-budget-spec-off", "best-onpolicy-spec without speculation: its order and cut alone",
                    **_ONPOLICY, **_WARM, **_SPEC_CUT))
