"""Batch-formation policies, built from the same ``recipe.core`` objects the trainer uses.

A policy is a ``PolicySpec`` (data) turned into a ``Policy`` (state) by ``make_policy``. Per step it answers
``plan_step()`` with the rows to launch, the cap (vLLM ``max_tokens``) and how many complete groups to keep; after
the step ``observe`` feeds the kept groups back exactly as the trainer does: ``StepResponses.censored()`` into
``LengthEstimates.update`` and ``group_tails`` into the cap's ``observe``. Caps see only estimates of rows already
observed (``fill_prior=False``): with nothing known about a batch there is no cap, in epoch 0 as in the trainer.

Row order comes from ``EpochPlan`` in all three modes: ``plan`` sorts by the policy's own estimates, ``random``
gives it an estimator that never observes anything (so every epoch is a fresh seeded permutation, verl's
RandomSampler), and ``oracle`` gives it an estimator overwritten with the epoch's true group maxima before the epoch
starts. Over-sampling uses ``recipe.core.oversample.OverSampleController`` and ``EpochPlan.requeue`` in the order
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

from recipe.core.cap import CalibratedCap, SeedCap, make_cap_policy
from recipe.core.estimates import LengthEstimates
from recipe.core.ordering import WITHIN_BUCKET, EpochPlan
from recipe.core.oversample import REQUEUE_MODES, OverSampleController, StepOutcome, requeue_aborted
from recipe.core.step_stats import StepResponses, group_tails

from .tailcut import TailCut

ORDERS = ("random", "plan", "oracle")
CAPS = ("none", "seed", "calibrated")
CAP_SCOPES = ("batch", "row")
_TOKEN_KWARGS = ("min_tokens", "align")  # cap arguments counted in tokens (PolicySpec.scaled)


@dataclass(frozen=True)
class PolicySpec:
    name: str
    description: str = ""
    order: str = "plan"  # random | plan | oracle
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

    def __post_init__(self):
        if (self.order not in ORDERS or self.cap not in CAPS or self.cap_scope not in CAP_SCOPES
                or self.oversample_requeue not in REQUEUE_MODES or self.max_resumes < 0
                or self.within_bucket not in WITHIN_BUCKET):
            raise ValueError(f"policy {self.name!r}: order must be one of {ORDERS}, cap one of {CAPS}, cap_scope"
                             f" one of {CAP_SCOPES}, oversample_requeue one of {REQUEUE_MODES}, within_bucket one of"
                             f" {WITHIN_BUCKET} and max_resumes >= 0")

    def scaled(self, factor: float) -> PolicySpec:
        """The same policy for a trace whose lengths were multiplied by ``factor`` (``Trace.scaled``): every
        parameter counted in tokens (bucket size; the caps' ``min_tokens`` and ``align``, defaults included) is
        multiplied too, rounded, at least 1. Ratios (cap factor, quantile, over-sample ratio) stay."""
        cls = {"seed": SeedCap, "calibrated": CalibratedCap}.get(self.cap)
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
        if self.within_bucket == "sorted":
            d.pop("within_bucket")
        return d


@dataclass
class StepPlan:
    rows: np.ndarray  # rows launched, in submission order
    caps: np.ndarray  # max_tokens of each launched row (0: none, i.e. response_length)
    keep: int | None  # keep the first ``keep`` complete groups and abort the rest (None: wait for all)
    predicted: np.ndarray  # estimate of each launched row at planning time (NaN: never observed)
    resumes: np.ndarray  # per launched row: resumes of its partial group, this launch included (0: a fresh group)
    keep_partial: np.ndarray | None = None  # set by ``Policy.observe``: aborted rows whose partial responses stay


class Policy:
    """The state of one policy over a run: estimates, epoch plan, cap and step-end controllers.

    ``truth`` (the trace's ``lengths``) is read by the oracle order only.
    """

    def __init__(self, spec: PolicySpec, *, num_rows: int, batch_size: int, response_length: int, seed: int = 0,
                 truth: np.ndarray | None = None):
        if spec.order == "oracle" and truth is None:
            raise ValueError("the oracle order needs the trace's true lengths")
        self.spec = spec
        self.batch_size = int(batch_size)
        self.response_length = int(response_length)
        self.estimates = LengthEstimates(num_rows, ema_decay=spec.ema_decay, statistic=spec.statistic)
        self._truth = truth
        self._order_est = (self.estimates if spec.order == "plan"
                           else LengthEstimates(num_rows, ema_decay=0.0, statistic="max"))
        self.plan = EpochPlan(self._order_est, batch_size=batch_size, bucket_size=spec.bucket_size,
                              shuffle_batch_blocks=spec.shuffle_batch_blocks, seed=seed,
                              within_bucket=spec.within_bucket)
        self.cap = None if spec.cap == "none" else make_cap_policy(spec.cap, response_length, **spec.cap_kwargs)
        self.oversample = (OverSampleController(batch_size, spec.oversample_ratio, spec.oversample_requeue,
                                                spec.max_resumes) if spec.oversample_ratio > 0 else None)
        self.partial_resumes: dict[int, int] = {}  # rows whose partial group waits to be resumed -> resumes so far
        self.tail_cut = TailCut(spec.tail_cut) if spec.tail_cut < 1.0 else None
        self.epoch = -1

    def start_epoch(self, epoch: int) -> None:
        if self.spec.order == "oracle":
            lengths = self._truth[epoch]
            self._order_est.update(np.repeat(np.arange(lengths.shape[0]), lengths.shape[1]), lengths.ravel())
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
        return StepPlan(rows=rows, caps=self._caps(predicted), keep=keep, predicted=predicted, resumes=resumes)

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
            tails = group_tails(resp)
            self.cap.observe(self.epoch, pred[np.argsort(rows)], tails.value, tails.censored)
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
# best-onpolicy (bench/sim_sweep.py --groups onpolicy, reference trace, seeds 0-2): the fastest strictly on-policy
# recipe.core composition the trainer can run (batch-scope cap) that truncates no more than the seed on every seed:
# EMA 0.5 mean estimates, calibrated cap q=0.75. Its edge over the seed is nil within noise (1.236 vs 1.235 mean
# speedup, 0.5 points less truncation; a change of the ordering's random tie-break alone moved such candidates by
# +-0.03): every order + cap candidate sits on one speedup-vs-truncation curve. Statistic, EMA and bucket barely
# matter; the cap is the lever.
_ONPOLICY = dict(order="plan", statistic="mean", ema_decay=0.5, bucket_size=1024)
ONPOLICY_CAP = {"quantile": 0.75}
# best (bench/sim_sweep.py --groups continue --tradeoff, reference trace, seeds 0-2; bench/RESULTS.md): length-aware
# order + over-sample ``continue`` (partial rollout), launch 2x, max_resumes=1 (at most 2 policy versions per trained
# response), no cap. It clears the goal on the reference trace on every seed (+0.12..+0.13 speedup over seed,
# truncation at or below baseline's) at the price of ~66% of trained tokens coming from the previous policy
# version and ~19% of decoded tokens thrown away (groups lost again after their one resume restart). Ratio 1.0 is a
# sharp optimum for max_resumes=1 (0.75: +0.11, 1.125: +0.04, 1.5: -0.15). A cap does not help (the calibrated one
# changes nothing, the seed's exceeds the seed's truncation). max_resumes=2 (``best-max-resumes-2``, 3 versions) is
# far stronger (+0.38, ~1% waste, clears the 1.5x moonshot) and also clears the goal on heavy_tail and bimodal,
# where max_resumes=1 gets +0.12 and only +0.05..+0.08.
BEST_RATIO = 1.0
BEST_MAX_RESUMES = 1
RESTART_RATIO = 0.125
UNBOUNDED_RESUMES = 10_000

register(PolicySpec("baseline", "verl RandomSampler: a new random order every epoch, no cap", order="random"))
register(PolicySpec("baseline+seedcap", "random order with the seed's cap", order="random", cap="seed",
                    cap_kwargs=SEED_CAP))
register(PolicySpec("seed", "the seed: EMA 0.7 mean estimates, bucket 1024, block shuffle, cap 2x mean >= 10000",
                    **_SEED, cap="seed", cap_kwargs=SEED_CAP))
register(PolicySpec("seed-nocap", "the seed's order without its cap", **_SEED))
register(PolicySpec("best", f"length-aware order (EMA 0.5 mean), no cap, launch {1 + BEST_RATIO:g}x the prompts, "
                    f"keep the first B groups, resume the others next step (continue, front), at most "
                    f"{BEST_MAX_RESUMES} resume(s) per group: off-policy tokens, see stale_token_fraction",
                    **_ONPOLICY, oversample_ratio=BEST_RATIO, oversample_requeue="continue",
                    max_resumes=BEST_MAX_RESUMES))
register(PolicySpec("best-max-resumes-2", "best with max_resumes=2: at most 3 policy versions per response",
                    **_ONPOLICY, oversample_ratio=BEST_RATIO, oversample_requeue="continue", max_resumes=2))
register(PolicySpec("best-onpolicy", "the best strictly on-policy policy: EMA 0.5 mean estimates, calibrated cap "
                    "(batch max estimate x q0.75 of observed/predicted)", **_ONPOLICY, cap="calibrated",
                    cap_kwargs=ONPOLICY_CAP))
register(PolicySpec("best-onpolicy-nocap", "best-onpolicy's order without a cap", **_ONPOLICY))
register(PolicySpec("oversample-restart", f"best-onpolicy's order, no cap, launch {100 * RESTART_RATIO:g}% more "
                    "prompts, keep the first B groups, restart the others at the back of the epoch (on-policy, "
                    "aborted tokens wasted)", **_ONPOLICY, oversample_ratio=RESTART_RATIO))
register(PolicySpec("partial-rollout-unbounded", f"best without the resume bound (max_resumes={UNBOUNDED_RESUMES})",
                    **_ONPOLICY, oversample_ratio=BEST_RATIO, oversample_requeue="continue",
                    max_resumes=UNBOUNDED_RESUMES))
register(PolicySpec("oracle", "order by this epoch's true group maxima, no cap (not realisable)", order="oracle"))
register(PolicySpec("tailcut", "best-onpolicy's order and cap; end each step when 98% of its responses are done"
                    " (needs a recipe/core piece)", **_ONPOLICY, cap="calibrated", cap_kwargs=ONPOLICY_CAP,
                    tail_cut=0.98))
