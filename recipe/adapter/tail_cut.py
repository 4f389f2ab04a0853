"""Tail cut on verl 0.9.1's v1 sync trainer (driver side): end a step's rollout once enough of it is done.

``recipe.core.tailcut.TailCut`` decides when; this module watches and acts. While verl's replay buffer waits for the
step's groups (between ``on_sample_begin`` and ``on_sample_end``), a thread polls TransferQueue, where verl's
agent-loop worker writes each response's record as soon as it is done, and once ``TailCut.should_cut`` says so it
aborts the requests still running on every replica (``abort_replicas``). vLLM returns their partial tokens, verl's
agent loops finish them as shorter responses, every group completes, and the step trains on all of them: the cut
responses count as truncated (censored in the estimates, ``cut`` in the traces, like a cap hit). No group is dropped
and nothing is resumed, so it stays on-policy and every prompt is trained once per epoch. Generation re-opens after
the weight update (``resume``). Not combinable with over-sampling, which aborts for another reason.

The abort is ``recipe.adapter.step_abort.StepAbort``'s, shared with over-sampling: it rejects late requests
(``reject_request=True``), so a multi-turn trajectory that wants another turn after the cut gets an empty aborted
reply and ends as truncated instead of parking until a resume that comes only after the step (a deadlock); with a
rollout gate (multi-turn runs, ``recipe.adapter.rollout_gate``) the gate first closes for the watched step, so that
step's tool calls in flight are cancelled and none of its trajectories starts a new turn. The settle is verl's own
wait for the step's groups.

What had finished when the cut landed (``done_at_cut``, the responses not labelled cut) is read at the instant
the cut takes effect: with a rollout gate, just before it closes; without one, once the replicas' abort has
returned, so a response that ends on its own while the abort is in flight counts as done (a response the abort
stopped counts as done only if verl recorded it before the driver's abort call returned, which takes its worker
hearing back from the server first: the engine test sees none). When the abort fails the
step goes on and the log says what it got: a gate that closed still ends the step's multi-turn trajectories at
their next turn boundary (trained as cut); replicas the abort missed run their responses to the end (labelled cut,
lower bounds); a gate that never closed cut nothing. ``rollout/tail_cut/abort_failed`` counts such steps.

With a truncation budget (``recipe.tail_cut.max_extra_truncation``, env ``TAIL_CUT_MAX_EXTRA_TRUNCATION``) the
monitor holds a ``recipe.core.tailcut_budget.TailCutBudget``: each step's rule is its ``cut()``, and the trainer
feeds every step's trained responses to ``observe`` (lengths, limit hits, which the cut stopped, the rows'
estimates), so the next allowance follows the extra truncation the run has observed; its state travels with the
sampler's checkpoint state (``state_dict``).
"""
from __future__ import annotations

import logging
import threading
import time

import transfer_queue as tq

from ..core.tailcut import TailCut
from ..core.tailcut_budget import TailCutBudget
from .step_abort import StepAbort

logger = logging.getLogger(__name__)


class TailCutMonitor:
    def __init__(self, cut: TailCut, rollout_n: int, poll_s: float = 0.05, budget: TailCutBudget | None = None,
                 abort: StepAbort | None = None):
        self.cut, self.rollout_n, self.poll_s = cut, int(rollout_n), poll_s
        self.budget = budget  # None: the fixed ``cut`` every step
        self.abort = abort if abort is not None else StepAbort()  # the trainer's (it holds the rollout gate)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.done_at_cut: set[str] | None = None  # response keys finished when the cut landed (None: no cut)
        self.abort_failed = False  # this step's abort raised (the log says what the step got)
        self.last_metrics: dict[str, float] = {}

    def start(self, checkpoint_manager, uids: list[str], level: float, partition_id: str = "train",
              step: int | None = None) -> None:
        """Watch the step launched as ``uids`` (one GRPO group each) until ``stop``. ``step``: the training step
        its rows carry (``rollout_step``), which a cut closes the rollout gate for (required with a gate)."""
        if step is None and self.abort.gate is not None:
            raise ValueError("TailCutMonitor.start: with a rollout gate the watched step is required (step=, the "
                             "rows' rollout_step)")
        self.done_at_cut, self.abort_failed, self._stop = None, False, threading.Event()
        if self.budget is not None:
            self.cut = self.budget.cut()  # this step's allowance, from what the run has observed so far
        launched = len(uids) * self.rollout_n
        self._thread = threading.Thread(target=self._watch, name="recipe-tail-cut", daemon=True,
                                        args=(checkpoint_manager, set(uids), launched, level, partition_id, step))
        self._thread.start()

    def _finished(self, uids: set[str], partition_id: str) -> set[str]:
        items = (tq.kv_list(partition_id) or {}).get(partition_id, {})
        return {k for k, tag in items.items()
                if not tag.get("is_prompt", False) and k.rsplit("_", 2)[0] in uids and tag.get("status") == "success"}

    def _watch(self, checkpoint_manager, uids: set[str], launched: int, level: float, partition_id: str,
               step: int | None) -> None:
        try:
            while not self._stop.is_set():
                done = self._finished(uids, partition_id)
                if len(done) >= launched:
                    return
                if self.cut.should_cut(len(done), launched, level):
                    break
                time.sleep(self.poll_s)
            else:
                return
        except Exception:  # noqa: BLE001 - a failed watch must not take the step down: it only loses the cut
            logger.exception("tail cut: the watch failed before it cut anything; this step runs to the end")
            return
        self._cut(checkpoint_manager, uids, launched, partition_id, step, done)

    def _cut(self, checkpoint_manager, uids: set[str], launched: int, partition_id: str, step: int | None,
             done: set[str]) -> None:
        """Cut the step. ``done_at_cut`` is what had finished when the cut landed: with a rollout gate, the instant
        before it closes (from then on a trajectory between turns ends as cut, and is recorded as soon as it does);
        without one, once the replicas' abort has returned (until then a response may still finish on its own)."""
        gate = self.abort.gate
        self.done_at_cut = done
        try:
            self.abort.abort(checkpoint_manager, step)
        except Exception:  # noqa: BLE001 - the step goes on; say what it got
            self.abort_failed = True
            if gate is not None and self.abort.gate_closed:
                logger.exception(
                    "tail cut: the abort failed after the rollout gate closed for step %s: its multi-turn "
                    "trajectories still end at their next turn boundary and are trained as cut; turns generating "
                    "on replicas the abort missed run to their end (labelled cut as well: lower bounds)", step)
            elif gate is not None:
                logger.exception("tail cut: closing the rollout gate for step %s failed: nothing was cut, this step "
                                 "runs to the end", step)
                self.done_at_cut = None
            else:
                logger.exception(
                    "tail cut: aborting the replicas for step %s failed: responses on replicas it reached come back "
                    "cut, the others run to their end; all %d unfinished are labelled cut (lower bounds)",
                    step, launched - len(done))
            return
        if gate is None:
            try:
                self.done_at_cut = self._finished(uids, partition_id)  # the abort has landed
            except Exception:  # noqa: BLE001 - keep the snapshot from the cut's decision
                logger.exception("tail cut: reading the step's records after the abort failed; the responses "
                                 "finished at the cut's decision count as done")

    def stop(self, launched_responses: int) -> dict[str, float]:
        """End the watch (the step's groups are all done); returns the step's tail-cut metrics."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        cut = self.done_at_cut is not None
        self.last_metrics = {
            "rollout/tail_cut/cut": float(cut),
            "rollout/tail_cut/cut_responses": float(launched_responses - len(self.done_at_cut)) if cut else 0.0,
            "rollout/tail_cut/abort_failed": float(self.abort_failed),
        }
        return self.last_metrics

    def observe(self, resp) -> dict[str, float]:
        """After the step: its trained responses (``StepResponses``, ``aborted`` = stopped by this cut) move the
        budget's allowance; the budget's metrics join ``last_metrics``. A no-op without a budget."""
        if self.budget is None:
            return {}
        m = self.budget.observe(resp)
        self.last_metrics.update(m)
        return m

    def state_dict(self) -> dict | None:
        return None if self.budget is None else self.budget.state_dict()

    def load_state_dict(self, state: dict | None) -> None:
        if self.budget is not None and state:
            self.budget.load_state_dict(state)

    def resume(self, checkpoint_manager) -> None:
        """After the weight update: re-open generation on the replicas the cut paused (and the gate)."""
        self.abort.resume(checkpoint_manager)
