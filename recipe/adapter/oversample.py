"""Over-sample then abort on verl 0.9.1's v1 sync trainer (driver side).

Per step (``LengthAwareTrainer`` calls these from verl's hooks):
* ``launch`` (from ``prepare_step``): fetch ``ceil(B * (1 + ratio))`` prompts through the dataloader (one row per
  fetch, so any count works) and submit them; verl's ``ReplayBuffer.sample`` then returns as soon as ``B`` groups
  are complete with all n responses.
* ``settle`` (from ``on_sample_end``, before the replicas sleep, as verl's colocate-async trainer does): abort every
  request on every replica (``abort_replicas(reject_request=True)`` so late submissions fail fast instead of parking
  until the next resume), wait until the leftover groups are terminal in TransferQueue, read their partial lengths
  (censored observations for the estimates), drop them from TransferQueue and re-queue their prompts into the
  epoch. ``resume`` (from ``on_step_end``, after the weight update) re-opens generation.
Validation never passes through these hooks (it uses the "val" partition and its own dispatch).
"""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field

import numpy as np
import transfer_queue as tq

from ..core.oversample import OverSampleController, StepOutcome
from .columns import column_to_numpy, row_sums
from .fields import ROW_ID

logger = logging.getLogger(__name__)

TERMINAL = ("finished", "failure")


@dataclass
class Launch:
    uids: list[str]
    rows: np.ndarray
    time: float
    epoch: int
    partition_id: str = "train"
    extra: dict = field(default_factory=dict)


class OverSampleDriver:
    def __init__(self, controller: OverSampleController, *, settle_timeout_s: float = 600.0,
                 events_path: str | None = None, poll_s: float = 0.05):
        self.controller = controller
        self.settle_timeout_s = settle_timeout_s
        self.events_path = events_path
        self.poll_s = poll_s
        self.pending: Launch | None = None
        self.last_metrics: dict[str, float] = {}

    def launch(self, trainer) -> int:
        sampler = trainer.length_sampler
        count = self.controller.launch_count(sampler.plan.num_remaining())
        batch = trainer._next_train_batch(count)
        uids = [str(u) for u in batch["uid"]]
        rows = column_to_numpy(batch[ROW_ID], dtype=np.int64)
        self.pending = Launch(uids=uids, rows=rows, time=time.time(), epoch=sampler.plan.epoch)
        return trainer._submit_batch_to_rollout(batch)

    def _leftover(self, launch: Launch) -> dict[str, str]:
        """Launched prompt uids still registered in TransferQueue (the replay buffer removes the ones it trains)."""
        items = (tq.kv_list(launch.partition_id) or {}).get(launch.partition_id, {})
        wanted = set(launch.uids)
        return {k: t.get("status") for k, t in items.items() if t.get("is_prompt", False) and k in wanted}

    def settle(self, trainer) -> dict[str, float]:
        """Abort the groups that lost the race, record them, clear them and re-queue their prompts."""
        launch, self.pending = self.pending, None
        if launch is None:
            return {}
        t_target = time.time()
        leftover = self._leftover(launch)
        aborted_tokens = 0
        if leftover:
            trainer.checkpoint_manager.abort_replicas(reject_request=True)
            deadline = t_target + self.settle_timeout_s
            while any(s not in TERMINAL for s in leftover.values()):
                if time.time() > deadline:
                    stuck = [u for u, s in leftover.items() if s not in TERMINAL]
                    raise TimeoutError(
                        f"over-sample: {len(stuck)} aborted groups did not settle within {self.settle_timeout_s}s "
                        f"(e.g. {stuck[:3]}); check the rollout servers' abort handling"
                    )
                time.sleep(self.poll_s)
                leftover.update(self._leftover(launch))
            aborted_tokens = self._observe_and_clear(trainer, launch, set(leftover))
        idle_s = time.time() - t_target
        kept = np.array([u not in leftover for u in launch.uids])
        outcome = StepOutcome(launched=launch.rows, kept=kept, aborted_tokens=aborted_tokens)
        trainer.length_sampler.plan.requeue(outcome.requeued, where="back")
        self.controller.record(launch.epoch, outcome)
        if self.events_path and leftover:
            self._write_events(launch, leftover, t_target)
        self.last_metrics = {**outcome.metrics(), "rollout/over_sample/target_to_idle_s": idle_s}
        return self.last_metrics

    def _observe_and_clear(self, trainer, launch: Launch, leftover: set[str]) -> int:
        items = (tq.kv_list(launch.partition_id) or {}).get(launch.partition_id, {})
        traj = [k for k, t in items.items() if not t.get("is_prompt", False) and k.split("_", 1)[0] in leftover]
        tokens = 0
        if traj:
            data = tq.kv_batch_get(keys=traj, partition_id=launch.partition_id, select_fields=[ROW_ID, "response_mask"])
            rows = column_to_numpy(data[ROW_ID], dtype=np.int64)
            lengths = row_sums(data["response_mask"])
            tokens = int(lengths.sum())
            # partial lengths are lower bounds: they may raise an estimate, never lower it
            trainer.length_sampler.update(rows, lengths, censored=np.ones(len(rows), bool))
        tq.kv_clear(keys=sorted(leftover) + traj, partition_id=launch.partition_id)
        return tokens

    def _write_events(self, launch: Launch, leftover: dict[str, str], t_abort: float) -> None:
        os.makedirs(os.path.dirname(self.events_path) or ".", exist_ok=True)
        row_of = dict(zip(launch.uids, launch.rows.tolist()))
        with open(self.events_path, "a") as f:
            for uid in sorted(leftover):
                f.write(json.dumps({"uid": uid, "dataset_item_idx": row_of[uid], "epoch": launch.epoch,
                                    "launched_at": launch.time, "aborted_at": t_abort,
                                    "duration_s": t_abort - launch.time}) + "\n")

    def resume(self, trainer) -> None:
        if self.last_metrics.get("rollout/over_sample/aborted_groups", 0) > 0:
            trainer.checkpoint_manager.resume_generation_replicas()

    def state_dict(self) -> dict:
        return self.controller.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.controller.load_state_dict(state)
