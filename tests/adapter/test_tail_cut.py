"""The tail cut's watch on a real TransferQueue: it aborts the replicas once enough of the step's responses are
recorded (as verl's agent-loop worker records them), and not before. ``Replicas`` stands in for verl's
CheckpointEngineManager (its abort needs Ray-managed vLLM servers); the cut through verl's real server runs where
verl's vLLM does (tests/e2e cover the abort path with over-sampling).

"Not yet" is checked without sleeping: ``Watch`` counts the monitor's polls, and ``settled`` waits until a poll that
began after the records were written has been acted on (the next poll began, or the watch ended)."""
import threading

import pytest
import torch
from verl.utils.tensordict_utils import list_of_dict_to_tensordict

from recipe.adapter.step_abort import StepAbort
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


class Watch(TailCutMonitor):
    """The monitor with its polls counted and the end of its watch recorded."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.polls, self.ended, self.cutting, self._cv = 0, False, False, threading.Condition()

    def start(self, *args, **kwargs):
        self.ended = self.cutting = False
        super().start(*args, **kwargs)

    def _finished(self, uids, partition_id):
        with self._cv:
            if not self.cutting:  # the read when the abort lands is not a poll of the watch
                self.polls += 1
                self._cv.notify_all()
        return super()._finished(uids, partition_id)

    def _cut(self, *args):
        self.cutting = True
        super()._cut(*args)

    def _watch(self, *args):
        try:
            super()._watch(*args)
        finally:
            with self._cv:
                self.ended = True
                self._cv.notify_all()

    def settled(self, timeout=30.0):
        """Wait until the watch has acted on a poll that began after this call; False on timeout."""
        with self._cv:
            target = self.polls + 2
            return self._cv.wait_for(lambda: self.polls >= target or self.ended, timeout)


@pytest.fixture
def watches(tq_cluster):
    """Makes the test's monitors and stops them at teardown, pass or fail: a failed test must not leave a watch
    thread polling TransferQueue (and aborting replicas) under the next test."""
    made = []

    def make(cut):
        made.append(Watch(cut, rollout_n=N, poll_s=0.01))
        return made[-1]

    yield make
    for monitor in made:
        monitor.stop(launched_responses=0)


def finish(tq, uid, sessions):
    keys = [f"{uid}_{s}_0" for s in sessions]
    tq.kv_batch_put(keys=keys, partition_id="train", tags=[{"status": "success"} for _ in keys],
                    fields=list_of_dict_to_tensordict([{"responses": torch.ones(3)} for _ in keys]))


def test_cuts_once_enough_responses_are_done_and_reports_which(tq_cluster, watches):
    uids = [f"u{i}" for i in range(5)]  # 20 responses: at 0.85, cut once 17 are done
    replicas, monitor = Replicas(), watches(TailCut(0.85))
    monitor.start(replicas, uids, level=1.0)
    for uid in uids[:4]:
        finish(tq_cluster, uid, range(N))  # 16 done
    assert monitor.settled() and replicas.calls == []  # the watch has seen the 16: not yet
    finish(tq_cluster, "other", range(N))  # another step's records do not count
    assert monitor.settled() and replicas.calls == []
    finish(tq_cluster, uids[4], [0])  # 17: cut
    assert monitor.settled() and monitor.ended and replicas.calls == [("abort", True)]
    finish(tq_cluster, uids[4], [1, 2, 3])  # the aborted ones come back as shorter responses
    metrics = monitor.stop(launched_responses=len(uids) * N)
    assert metrics == {"rollout/tail_cut/cut": 1.0, "rollout/tail_cut/cut_responses": 3.0,
                       "rollout/tail_cut/abort_failed": 0.0}
    assert monitor.done_at_cut == {f"{u}_{s}_0" for u in uids[:4] for s in range(N)} | {"u4_0_0"}
    monitor.resume(replicas)
    assert replicas.calls[-1] == ("resume",)


@pytest.mark.parametrize("prompt_status", ["finished", "success"])
def test_prompt_records_are_not_finished_responses(tq_cluster, watches, prompt_status):
    """verl registers each group's prompt under its bare uid in the same partition (tag ``is_prompt``, status
    pending -> running -> finished): 16 responses and 4 finished groups are 16 done, not 20 (>= the 17 that cut).
    "success" is a trajectory's status, never a prompt's in verl 0.9.1: ``is_prompt`` alone must keep it out."""
    uids = [f"p{i}" for i in range(5)]
    tq_cluster.kv_batch_put(keys=uids, partition_id="train",
                            tags=[{"is_prompt": True, "status": "running", "global_steps": 1} for _ in uids])
    replicas, monitor = Replicas(), watches(TailCut(0.85))
    monitor.start(replicas, uids, level=1.0)
    for uid in uids[:4]:
        finish(tq_cluster, uid, range(N))
        tq_cluster.kv_put(key=uid, partition_id="train", tag={"status": prompt_status})  # the group is done
    assert tq_cluster.kv_list("train")["train"]["p0"] == {"is_prompt": True, "status": prompt_status,
                                                          "global_steps": 1}
    assert monitor.settled() and replicas.calls == []
    finish(tq_cluster, uids[4], [0])  # 17 responses: cut
    assert monitor.settled() and replicas.calls == [("abort", True)]
    assert monitor.done_at_cut == {f"{u}_{s}_0" for u in uids[:4] for s in range(N)} | {"p4_0_0"}


def test_a_step_that_finishes_on_its_own_is_not_cut(tq_cluster, watches):
    """A cut at 0.75 fires once 6 of these 8 responses are done and 2 still run; here all 8 are recorded at once
    (one put), so the watch sees the step complete and ends by itself without aborting anything."""
    replicas, monitor = Replicas(), watches(TailCut(0.75))
    monitor.start(replicas, ["a", "b"], level=1.0)
    assert monitor.settled() and not monitor.ended  # watching, nothing done yet
    tq_cluster.kv_batch_put(keys=[f"{u}_{s}_0" for u in "ab" for s in range(N)], partition_id="train",
                            tags=[{"status": "success"}] * (2 * N),
                            fields=list_of_dict_to_tensordict([{"responses": torch.ones(3)}] * (2 * N)))
    assert monitor.settled() and monitor.ended and replicas.calls == []
    metrics = monitor.stop(launched_responses=2 * N)
    assert metrics == {"rollout/tail_cut/cut": 0.0, "rollout/tail_cut/cut_responses": 0.0,
                       "rollout/tail_cut/abort_failed": 0.0}
    monitor.resume(replicas)
    assert replicas.calls == []


class Gate:
    """A DriverGate stand-in that records into the replicas' call log, so the order of gate and abort shows."""

    def __init__(self, calls):
        self.calls = calls

    def close(self, step):
        self.calls.append(("gate", "close", step))

    def open(self):
        self.calls.append(("gate", "open"))


def test_with_a_rollout_gate_the_cut_closes_it_for_the_step_before_aborting_and_opens_it_after_resuming(
        tq_cluster, watches):
    """Multi-turn runs: tool calls in flight are cancelled by the gate, so it must close (for the watched step, the
    one its rows carry) before vLLM's abort (a trajectory between turns must not start a turn the abort would then
    miss) and open only once generation is back (a turn started in between would park)."""
    replicas = Replicas()
    monitor = watches(TailCut(0.5))
    monitor.abort = StepAbort(Gate(replicas.calls))
    monitor.start(replicas, ["g"], level=1.0, step=3)
    finish(tq_cluster, "g", [0, 1])  # 2 of 4: cut
    assert monitor.settled() and replicas.calls == [("gate", "close", 3), ("abort", True)]
    finish(tq_cluster, "g", [2, 3])
    monitor.stop(launched_responses=N)
    monitor.resume(replicas)
    assert replicas.calls[2:] == [("resume",), ("gate", "open")]
    monitor.resume(replicas)  # resumed once per abort
    assert len(replicas.calls) == 4


def test_with_a_rollout_gate_the_watched_step_is_required():
    monitor = TailCutMonitor(TailCut(0.5), rollout_n=N, abort=StepAbort(Gate([])))
    with pytest.raises(ValueError, match="step="):
        monitor.start(Replicas(), ["g"], level=1.0)


class LandingReplicas(Replicas):
    """Replicas whose abort takes a while to land: ``during`` runs inside it (records written meanwhile), then it
    returns or raises ``fail``."""

    def __init__(self, during=None, fail=None):
        super().__init__()
        self.during, self.fail = during, fail

    def abort_replicas(self, reject_request=False):
        super().abort_replicas(reject_request)
        if self.during:
            self.during()
        if self.fail:
            raise self.fail


def test_done_at_cut_is_read_when_the_abort_lands(tq_cluster, watches):
    """A response that ends on its own while the replicas' abort is in flight finished uncut: it is done, not
    labelled cut (the snapshot from the cut's decision labelled it cut)."""
    replicas = LandingReplicas(during=lambda: finish(tq_cluster, "g", [2]))
    monitor = watches(TailCut(0.5))
    monitor.start(replicas, ["g"], level=1.0)
    finish(tq_cluster, "g", [0, 1])  # 2 of 4: cut
    assert monitor.settled() and monitor.ended and replicas.calls == [("abort", True)]
    assert monitor.done_at_cut == {"g_0_0", "g_1_0", "g_2_0"}
    finish(tq_cluster, "g", [3])
    assert monitor.stop(launched_responses=N)["rollout/tail_cut/cut_responses"] == 1.0


def test_with_a_gate_done_at_cut_is_read_before_it_closes(tq_cluster, watches):
    """With a rollout gate the cut lands when the gate closes: a trajectory recorded after that (one the gate ended
    between turns) is cut, even though it is recorded before the replicas' abort returns."""
    replicas = Replicas()

    class EndingGate(Gate):
        def close(self, step):
            super().close(step)
            finish(tq_cluster, "g", [2])  # ended by the gate at its next turn boundary

    monitor = watches(TailCut(0.5))
    monitor.abort = StepAbort(EndingGate(replicas.calls))
    monitor.start(replicas, ["g"], level=1.0, step=7)
    finish(tq_cluster, "g", [0, 1])
    assert monitor.settled() and monitor.ended
    assert monitor.done_at_cut == {"g_0_0", "g_1_0"}


def test_an_abort_that_fails_after_the_gate_closed_says_the_step_is_cut(tq_cluster, watches, caplog):
    """The gate closed, then vLLM's abort raised: the step's multi-turn trajectories still end at their next
    boundary, so the step is cut (and says so), not "runs to the end"; resume re-opens what was closed."""
    replicas = LandingReplicas(fail=RuntimeError("replica 1 unreachable"))
    monitor = watches(TailCut(0.5))
    monitor.abort = StepAbort(Gate(replicas.calls))
    monitor.start(replicas, ["g"], level=1.0, step=3)
    with caplog.at_level("ERROR", logger="recipe.adapter.tail_cut"):
        finish(tq_cluster, "g", [0, 1])
        assert monitor.settled() and monitor.ended
    assert "after the rollout gate closed for step 3" in caplog.text and "trained as cut" in caplog.text
    assert "runs to the end" not in caplog.text.split("turns generating")[0]
    finish(tq_cluster, "g", [2, 3])
    metrics = monitor.stop(launched_responses=N)
    assert metrics == {"rollout/tail_cut/cut": 1.0, "rollout/tail_cut/cut_responses": 2.0,
                       "rollout/tail_cut/abort_failed": 1.0}
    monitor.resume(replicas)
    assert replicas.calls[-2:] == [("resume",), ("gate", "open")]


def test_a_gate_that_never_closed_cut_nothing(tq_cluster, watches, caplog):
    replicas = Replicas()

    class BrokenGate(Gate):
        def close(self, step):
            raise RuntimeError("gate actor gone")

    monitor = watches(TailCut(0.5))
    monitor.abort = StepAbort(BrokenGate(replicas.calls))
    monitor.start(replicas, ["g"], level=1.0, step=3)
    with caplog.at_level("ERROR", logger="recipe.adapter.tail_cut"):
        finish(tq_cluster, "g", [0, 1])
        assert monitor.settled() and monitor.ended
    assert "nothing was cut, this step runs to the end" in caplog.text and replicas.calls == []
    finish(tq_cluster, "g", [2, 3])
    assert monitor.stop(launched_responses=N) == {"rollout/tail_cut/cut": 0.0, "rollout/tail_cut/cut_responses": 0.0,
                                                  "rollout/tail_cut/abort_failed": 1.0}


def test_a_failed_replica_abort_labels_the_unfinished_cut(tq_cluster, watches, caplog):
    replicas = LandingReplicas(fail=RuntimeError("replica 1 unreachable"))
    monitor = watches(TailCut(0.5))
    monitor.start(replicas, ["g"], level=1.0)
    with caplog.at_level("ERROR", logger="recipe.adapter.tail_cut"):
        finish(tq_cluster, "g", [0, 1])
        assert monitor.settled() and monitor.ended
    assert "the others run to their end; all 2 unfinished are labelled cut" in caplog.text
    finish(tq_cluster, "g", [2, 3])
    assert monitor.stop(launched_responses=N)["rollout/tail_cut/cut_responses"] == 2.0
