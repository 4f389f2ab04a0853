"""TailCutMonitor with a truncation budget (TAIL_CUT_MAX_EXTRA_TRUNCATION): each step's rule is the controller's
current allowance, the step's trained responses move it, and its state survives a checkpoint round trip.
TransferQueue is stood in for by ``_finished`` (the watch on a real TransferQueue: tests/adapter/test_tail_cut.py)."""
import time

import numpy as np

from recipe.adapter.tail_cut import TailCutMonitor
from recipe.core.step_stats import StepResponses
from recipe.core.tailcut import TailCut
from recipe.core.tailcut_budget import TailCutBudget


class Replicas:
    def __init__(self):
        self.calls = []

    def abort_replicas(self, reject_request=False):
        self.calls.append("abort")

    def resume_generation_replicas(self):
        self.calls.append("resume")


class Fixed(TailCutMonitor):
    done = {f"a_{i}_0" for i in range(4)} | {"b_0_0", "b_1_0"}  # 6 of the 8 responses of uids a, b (n=4)

    def _finished(self, uids, partition_id):
        return set(self.done)


def run_step(mon: TailCutMonitor) -> Replicas:
    rep = Replicas()
    mon.start(rep, ["a", "b"], 1.0)
    deadline = time.monotonic() + 10
    while mon._thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.005)
    mon.stop(8)
    return rep


def test_budget_sets_each_steps_rule_and_learns():
    fixed = Fixed(TailCut(0.975), rollout_n=4, poll_s=0.001)
    assert run_step(fixed).calls == [] and fixed.last_metrics["rollout/tail_cut/cut"] == 0.0  # needs all 8
    mon = Fixed(TailCut(0.975), rollout_n=4, poll_s=0.001, budget=TailCutBudget(0.05, initial_allowance=0.25))
    rep = run_step(mon)
    assert rep.calls == ["abort"] and mon.cut.fraction == 0.75  # 25% may stay unfinished: 6 of 8 is enough
    assert mon.last_metrics["rollout/tail_cut/cut_responses"] == 2.0
    resp = StepResponses(rows=np.repeat([0, 1], 4), lengths=[900, 1000, 1100, 1200, 800, 950, 3000, 3100],
                         caps=np.zeros(8, np.int64), predicted=np.full(8, 1000.0), response_length=8192,
                         aborted=[False] * 6 + [True] * 2)
    m = mon.observe(resp)  # nothing known before: both stopped responses count as extra, 25% > 5%: tighten
    assert m["rollout/tail_cut/est_extra_truncation"] == 0.25 and mon.budget.allowance < 0.25
    assert {"rollout/tail_cut/allowance", "rollout/tail_cut/budget"} <= set(mon.last_metrics)
    again = Fixed(TailCut(0.975), rollout_n=4, budget=TailCutBudget(0.05, initial_allowance=0.25))
    again.load_state_dict(mon.state_dict())
    assert again.budget.allowance == mon.budget.allowance and again.budget.responses == 8
    assert TailCutMonitor(TailCut(0.975), 4).observe(resp) == {}  # no budget: nothing to learn
