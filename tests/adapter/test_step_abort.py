"""StepAbort, the one abort sequence of the tail cut and over-sampling: its order, once per abort, and the settle's
deadline. (Both users drive it on a real TransferQueue in test_tail_cut.py and test_oversample_wiring.py.)"""
import pytest

from recipe.adapter.step_abort import StepAbort


class Calls:
    """The replicas (CheckpointEngineManager) and the gate (DriverGate) recording into one log."""

    def __init__(self):
        self.log = []

    def abort_replicas(self, reject_request=False):
        self.log.append(("abort", reject_request))

    def resume_generation_replicas(self):
        self.log.append(("resume",))

    def close(self, step):
        self.log.append(("close", step))

    def open(self):
        self.log.append(("open",))


def test_close_for_the_step_then_abort_rejecting_late_requests_then_resume_then_open():
    calls = Calls()
    abort = StepAbort(gate=calls)
    abort.resume(calls)  # nothing aborted: nothing to re-open
    assert calls.log == []
    abort.abort(calls, step=12)
    assert calls.log == [("close", 12), ("abort", True)]
    abort.resume(calls)
    abort.resume(calls)  # once per abort
    assert calls.log[2:] == [("resume",), ("open",)]


def test_without_a_gate_only_the_replicas_are_aborted_and_resumed():
    calls = Calls()
    abort = StepAbort()
    abort.abort(calls, step=None)
    abort.resume(calls)
    assert calls.log == [("abort", True), ("resume",)]


def test_the_gate_closes_for_a_named_step_only():
    calls = Calls()
    with pytest.raises(ValueError, match="rollout_step"):
        StepAbort(gate=calls).abort(calls, step=None)
    assert calls.log == []  # nothing closed or aborted


def test_a_failed_abort_call_still_reopens_what_was_closed():
    """The gate closed but the replicas' abort raised: the resume must still open the gate (else the step's
    trajectories would be cut after it)."""
    calls = Calls()

    def broken(reject_request=False):
        raise RuntimeError("replica unreachable")

    calls.abort_replicas = broken
    abort = StepAbort(gate=calls)
    with pytest.raises(RuntimeError):
        abort.abort(calls, step=2)
    abort.resume(calls)
    assert calls.log == [("close", 2), ("resume",), ("open",)]


def test_settle_returns_once_nothing_is_stuck_and_names_the_stuck_groups_at_the_deadline():
    left = [["a", "b"], ["b"], []]
    StepAbort.settle(lambda: left.pop(0), timeout_s=60, poll_s=0, what="over-sample")
    assert left == []
    stuck = r"over-sample: 2 aborted groups did not settle within 0s \(e.g. \['x', 'y'\]\)"
    with pytest.raises(TimeoutError, match=stuck):
        StepAbort.settle(lambda: ["x", "y"], timeout_s=0, poll_s=0.001, what="over-sample")
