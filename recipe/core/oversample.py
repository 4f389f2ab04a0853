"""Over-sample then abort, at GRPO-group granularity (pure logic).

A synchronous step lasts as long as its slowest group. With over-sampling a step launches
``ceil(B * (1 + ratio))`` prompts (never more than the epoch has left), trains on the first ``B`` groups to complete
with all their n responses, aborts every other request, and re-queues the aborted prompts into the current epoch
(``EpochPlan.requeue``), so every prompt is still trained exactly once per epoch. The epoch's last step has nothing
left to over-sample from and waits for its groups.

Re-queue modes:
* ``restart`` (default): an aborted prompt is generated afresh when it comes up again, at the back of the epoch
  with the other long prompts (tail batching). Strictly on-policy; the aborted tokens are thrown away.
* ``continue`` (partial rollout, as in slime/APRIL): the partial responses are kept and resumed in the very next
  step (front of the order), so no work is lost; a resumed response mixes tokens of two or more policy versions.
  ``max_resumes`` bounds that: a group aborted again after that many resumes restarts from scratch, at the back of
  the epoch like in ``restart`` mode, so no trained response spans more than ``max_resumes + 1`` policy versions.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

REQUEUE_MODES = ("restart", "continue")


@dataclass
class StepOutcome:
    """What one over-sampled step did (the numbers behind the ``rollout/over_sample/*`` metrics)."""

    launched: np.ndarray  # rows launched
    kept: np.ndarray  # bool per launched row: trained this step
    aborted_tokens: int = 0

    @property
    def requeued(self) -> np.ndarray:
        return self.launched[~self.kept]

    def metrics(self) -> dict[str, float]:
        n = len(self.launched)
        return {
            "rollout/over_sample/launched_groups": float(n),
            "rollout/over_sample/completed_groups": float(self.kept.sum()),
            "rollout/over_sample/aborted_groups": float(n - self.kept.sum()),
            "rollout/over_sample/aborted_fraction": float((n - self.kept.sum()) / n) if n else 0.0,
            "rollout/over_sample/aborted_tokens": float(self.aborted_tokens),
            "rollout/over_sample/requeued_prompts": float(len(self.requeued)),
        }


@dataclass
class OverSampleController:
    batch_size: int
    ratio: float
    requeue: str = "restart"
    max_resumes: int = 1
    trained_this_epoch: dict[int, set] = field(default_factory=dict)

    def __post_init__(self):
        if self.batch_size < 1:
            raise ValueError(f"over-sample batch_size must be >= 1, got {self.batch_size}")
        if not self.ratio >= 0:
            raise ValueError(f"over-sample ratio must be >= 0, got {self.ratio}")
        if self.requeue not in REQUEUE_MODES:
            raise ValueError(f"over-sample requeue {self.requeue!r} is not one of {REQUEUE_MODES}")
        if self.max_resumes < 0:
            raise ValueError(f"over-sample max_resumes must be >= 0, got {self.max_resumes}")

    @staticmethod
    def requeue_where(keeps_partial: bool) -> str:
        """Where an aborted prompt goes back into the epoch (``EpochPlan.requeue``): a group resumed from its partial
        responses goes next (front), which bounds how stale its tokens get; a group that restarts from scratch goes
        to the back with the other long prompts that lost their races (tail batching)."""
        return "front" if keeps_partial else "back"

    def keeps_partial(self, resumes_so_far: int) -> bool:
        """Whether an aborted group's partial responses are kept for resumption (else it restarts)."""
        return self.requeue == "continue" and resumes_so_far < self.max_resumes

    def launch_count(self, remaining_in_epoch: int) -> int:
        """Prompts to launch this step: ``ceil(B * (1 + ratio))``, capped by what the epoch has left."""
        if remaining_in_epoch < self.batch_size:
            raise RuntimeError(
                f"only {remaining_in_epoch} prompts left in the epoch for a batch of {self.batch_size}: the train "
                "set must be a multiple of the batch size (LengthAwareRLHFDataset cuts it)"
            )
        return min(math.ceil(self.batch_size * (1.0 + self.ratio) - 1e-9), remaining_in_epoch)

    def select(self, completion_time) -> np.ndarray:
        """Kept mask over launched groups: the first ``batch_size`` to complete (ties: earlier launched first)."""
        t = np.asarray(completion_time, dtype=np.float64)
        if len(t) < self.batch_size:
            raise ValueError(f"{len(t)} groups launched for a batch of {self.batch_size}")
        kept = np.zeros(len(t), bool)
        kept[np.argsort(t, kind="stable")[: self.batch_size]] = True
        return kept

    def record(self, epoch: int, outcome: StepOutcome) -> None:
        """Epoch accounting: a row is trained at most once per epoch (a violation is a bug, raised loudly)."""
        trained = outcome.launched[outcome.kept]
        seen = self.trained_this_epoch.setdefault(int(epoch), set())
        dup = seen.intersection(trained.tolist())
        if dup:
            raise RuntimeError(f"rows {sorted(dup)[:8]} trained twice in epoch {epoch}")
        seen.update(trained.tolist())
        for old in [e for e in self.trained_this_epoch if e < epoch]:
            del self.trained_this_epoch[old]

    def state_dict(self) -> dict:
        return {"trained_this_epoch": {e: sorted(s) for e, s in self.trained_this_epoch.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.trained_this_epoch = {int(e): set(int(r) for r in s) for e, s in state["trained_this_epoch"].items()}


def requeue_aborted(controller: OverSampleController, plan, rows, keeps_partial) -> None:
    """Put aborted rows back into the plan: restarting ones at the back, resumed ones (``keeps_partial``) next."""
    rows = np.asarray(rows, dtype=np.int64)
    keep = np.asarray(keeps_partial, dtype=bool)
    plan.requeue(rows[~keep], where=controller.requeue_where(False))
    plan.requeue(rows[keep], where=controller.requeue_where(True))


def run_oversampled_step(controller: OverSampleController, plan, completion_time_of,
                         resumes: dict[int, int] | None = None) -> StepOutcome:
    """One step of the protocol on an ``EpochPlan`` (the trainer does the same through verl's dataloader, replay
    buffer and abort API): launch, keep the first B, re-queue the rest. ``resumes`` (row -> resumes so far) is
    updated in ``continue`` mode."""
    if plan.epoch_finished():
        plan.start_next_epoch()
    launched = plan.take(controller.launch_count(plan.num_remaining()))
    kept = controller.select(completion_time_of(launched))
    outcome = StepOutcome(launched=launched, kept=kept)
    resumes = {} if resumes is None else resumes
    keep = np.array([controller.keeps_partial(resumes.get(int(r), 0)) for r in outcome.requeued], dtype=bool)
    for r, k in zip(outcome.requeued.tolist(), keep.tolist()):
        if k:
            resumes[r] = resumes.get(r, 0) + 1
        else:
            resumes.pop(r, None)
    for r in launched[kept].tolist():
        resumes.pop(r, None)
    requeue_aborted(controller, plan, outcome.requeued, keep)
    controller.record(plan.epoch, outcome)
    return outcome
