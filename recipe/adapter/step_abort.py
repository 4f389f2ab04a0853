"""The driver's one way to end a training step's rollout early, shared by the tail cut and over-sampling.

Both stop a step's requests the same way, and the order matters, so it is written once here:

1. close the rollout gate for the step (multi-turn runs, ``recipe.adapter.rollout_gate``): tool calls of the step's
   trajectories in flight are cancelled, and none of them starts another turn the abort would then miss;
2. abort every request on every replica with ``reject_request=True``: vLLM returns the partial tokens, and a turn
   that still arrives gets an empty aborted reply at once instead of parking until a resume that comes only after the
   step (a multi-turn deadlock);
3. settle: wait until what was cut is terminal (over-sampling polls TransferQueue with a deadline, ``settle``; the
   tail cut's settle is verl's own wait for the step's groups in ``ReplayBuffer.sample``);
4. after the weight update, ``resume``: generation re-opens on the replicas, then the gate opens (a turn started
   before generation is back would park).

The gate closes for one step only: every training row carries the step it was launched for, so a worker whose view of
the gate lags behind ``open`` never cuts the next step's trajectories or validation's.
"""
from __future__ import annotations

import time
from typing import Callable


class StepAbort:
    def __init__(self, gate=None):
        self.gate = gate  # a rollout_gate.DriverGate (multi-turn runs) or None
        self.aborted = False  # aborted and not resumed yet
        self.gate_closed = False  # the gate's close returned (an abort that fails later has still cut turns)

    def abort(self, checkpoint_manager, step: int | None) -> None:
        """Close the gate for ``step`` (the training step the aborted rows were launched for), then abort."""
        if self.gate is not None and step is None:
            raise ValueError("StepAbort.abort: the rollout gate closes for one training step; pass step= (the step "
                             "the aborted rows carry in rollout_step)")
        self.aborted = True  # from here on ``resume`` re-opens whatever this got to close, even if a call fails
        if self.gate is not None:
            self.gate.close(step)
            self.gate_closed = True
        checkpoint_manager.abort_replicas(reject_request=True)

    @staticmethod
    def settle(stuck: Callable[[], list], timeout_s: float, poll_s: float, what: str) -> None:
        """Wait until ``stuck()`` (the aborted groups not yet terminal) is empty; a TimeoutError after
        ``timeout_s``."""
        deadline = time.time() + timeout_s
        while left := stuck():
            if time.time() > deadline:
                raise TimeoutError(
                    f"{what}: {len(left)} aborted groups did not settle within {timeout_s}s (e.g. {left[:3]}); "
                    "check the rollout servers' abort handling")
            time.sleep(poll_s)

    def resume(self, checkpoint_manager) -> None:
        """After the weight update: re-open generation, then the gate (nothing to do if nothing was aborted)."""
        if not self.aborted:
            return
        checkpoint_manager.resume_generation_replicas()
        if self.gate is not None:
            self.gate.open()
        self.aborted = self.gate_closed = False
