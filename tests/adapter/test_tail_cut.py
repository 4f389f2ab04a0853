"""The tail cut's watch on a real TransferQueue: it aborts the replicas once enough of the step's responses are
recorded (as verl's agent-loop worker records them), and not before. ``Replicas`` stands in for verl's
CheckpointEngineManager (its abort needs Ray-managed vLLM servers); the cut through verl's real server runs where
verl's vLLM does (tests/e2e cover the abort path with over-sampling)."""
import time

import torch
from verl.utils.tensordict_utils import list_of_dict_to_tensordict

from recipe.adapter.tail_cut import TailCutMonitor
from recipe.core.tailcut import TailCut

N = 4


class Replicas:
    def __init__(self):
        self.calls = []

    def abort_replicas(self, reject_request=False):
        self.calls.append(("abort", reject_request))

    def resume_generation_replicas(self):
        self.calls.append(("resume",))


def finish(tq, uid, sessions):
    keys = [f"{uid}_{s}_0" for s in sessions]
    tq.kv_batch_put(keys=keys, partition_id="train", tags=[{"status": "success"} for _ in keys],
                    fields=list_of_dict_to_tensordict([{"responses": torch.ones(3)} for _ in keys]))


def wait_until(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.02)
    return predicate()


def test_cuts_once_enough_responses_are_done_and_reports_which(tq_cluster):
    uids = [f"u{i}" for i in range(5)]  # 20 responses: at 0.85, cut once 17 are done
    replicas, monitor = Replicas(), TailCutMonitor(TailCut(0.85), rollout_n=N, poll_s=0.01)
    monitor.start(replicas, uids, level=1.0)
    for uid in uids[:4]:
        finish(tq_cluster, uid, range(N))  # 16 done
    time.sleep(0.2)
    assert replicas.calls == []  # not yet
    finish(tq_cluster, "other", range(N))  # another step's records do not count
    time.sleep(0.1)
    assert replicas.calls == []
    finish(tq_cluster, uids[4], [0])  # 17: cut
    assert wait_until(lambda: replicas.calls == [("abort", False)])
    finish(tq_cluster, uids[4], [1, 2, 3])  # the aborted ones come back as shorter responses
    metrics = monitor.stop(launched_responses=len(uids) * N)
    assert metrics == {"rollout/tail_cut/cut": 1.0, "rollout/tail_cut/cut_responses": 3.0}
    assert monitor.done_at_cut == {f"{u}_{s}_0" for u in uids[:4] for s in range(N)} | {"u4_0_0"}
    monitor.resume(replicas)
    assert replicas.calls[-1] == ("resume",)


def test_a_step_that_finishes_on_its_own_is_not_cut(tq_cluster):
    replicas, monitor = Replicas(), TailCutMonitor(TailCut(1.0), rollout_n=N, poll_s=0.01)
    monitor.start(replicas, ["a", "b"], level=1.0)
    finish(tq_cluster, "a", range(N))
    finish(tq_cluster, "b", range(N))
    time.sleep(0.1)
    assert monitor.stop(launched_responses=2 * N) == {"rollout/tail_cut/cut": 0.0, "rollout/tail_cut/cut_responses": 0.0}
    monitor.resume(replicas)
    assert replicas.calls == []
