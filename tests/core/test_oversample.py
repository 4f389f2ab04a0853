"""Over-sample controller and the epoch plan's re-queue: which groups are kept, re-queued, and epoch accounting."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recipe.core.estimates import LengthEstimates
from recipe.core.ordering import EpochPlan
from recipe.core.oversample import OverSampleController, StepOutcome, run_oversampled_step


def test_launch_count_rounds_up_and_respects_epoch_end():
    c = OverSampleController(batch_size=32, ratio=0.25)
    assert c.launch_count(1024) == 40
    assert c.launch_count(35) == 35
    assert c.launch_count(32) == 32  # last step of the epoch: nothing to over-sample from
    assert OverSampleController(batch_size=3, ratio=0.1).launch_count(100) == 4  # ceil(3.3)
    with pytest.raises(RuntimeError, match="multiple of the batch size"):
        c.launch_count(31)


def test_select_keeps_first_completed_with_stable_ties():
    c = OverSampleController(batch_size=2, ratio=1.0)
    assert c.select([5.0, 1.0, 3.0, 1.0]).tolist() == [False, True, False, True]
    assert c.select([1.0, 1.0, 1.0]).tolist() == [True, True, False]


def test_requeue_back_batches_requeued_rows_by_estimate_at_the_end():
    est = LengthEstimates(10)
    est.update(np.arange(10), np.arange(10) * 100.0)
    plan = EpochPlan(est, batch_size=2, shuffle_batch_blocks=False)
    plan.start_next_epoch()  # 0..9
    taken = plan.take(3)
    plan.requeue([taken[2], taken[0]])  # rows 2 and 0 lost the race
    assert plan.remaining().tolist() == [3, 4, 5, 6, 7, 8, 9, 0, 2]
    plan.take(7)
    plan.requeue([9])  # into the pending tail, re-sorted by estimate
    assert plan.remaining().tolist() == [0, 2, 9]


def test_requeue_front_and_bad_mode():
    plan = EpochPlan(LengthEstimates(6), batch_size=2)
    plan.start_next_epoch()
    taken = plan.take(3)
    plan.requeue([taken[1]], where="front")
    assert plan.remaining()[0] == taken[1]
    with pytest.raises(ValueError, match="'back' or 'front'"):
        plan.requeue([1], where="middle")


def test_record_catches_double_training():
    c = OverSampleController(batch_size=2, ratio=0.5)
    c.record(0, StepOutcome(np.array([1, 2, 3]), np.array([True, True, False])))
    with pytest.raises(RuntimeError, match="trained twice"):
        c.record(0, StepOutcome(np.array([2, 4, 5]), np.array([True, True, False])))
    c.record(1, StepOutcome(np.array([2, 4, 5]), np.array([True, True, False])))  # a new epoch starts clean


def test_metrics_of_a_step():
    m = StepOutcome(np.array([1, 2, 3, 4, 5]), np.array([True, False, True, True, False]), aborted_tokens=900).metrics()
    assert m["rollout/over_sample/launched_groups"] == 5
    assert m["rollout/over_sample/completed_groups"] == 3
    assert m["rollout/over_sample/aborted_groups"] == 2 and m["rollout/over_sample/requeued_prompts"] == 2
    assert m["rollout/over_sample/aborted_fraction"] == pytest.approx(0.4)
    assert m["rollout/over_sample/aborted_tokens"] == 900


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 8), st.integers(1, 6), st.floats(0.0, 1.5), st.integers(0, 1000))
def test_every_prompt_trained_exactly_once_per_epoch(batch, n_batches, ratio, seed):
    """Random completion times (long prompts tend to lose): every epoch trains each row exactly once in exactly
    N/B steps, and the plan's state survives a round trip mid-epoch."""
    n_rows = batch * n_batches
    rng = np.random.default_rng(seed)
    est = LengthEstimates(n_rows)
    plan = EpochPlan(est, batch_size=batch, seed=seed)
    ctl = OverSampleController(batch_size=batch, ratio=ratio)
    difficulty = rng.lognormal(0, 1, n_rows)
    for epoch in range(3):
        trained = []
        for step in range(n_batches):
            if step == n_batches // 2:  # resume mid-epoch
                state = plan.state_dict()
                plan = EpochPlan(LengthEstimates(n_rows), batch_size=batch, seed=seed)
                plan.load_state_dict(state)
                est = plan.estimates
            out = run_oversampled_step(ctl, plan, lambda rows: difficulty[rows] * rng.uniform(0.5, 1.5, len(rows)))
            assert out.kept.sum() == batch
            trained.extend(out.launched[out.kept].tolist())
            est.update(out.launched, difficulty[out.launched] * 1000, censored=~out.kept)
        assert plan.epoch == epoch and plan.epoch_finished()
        assert sorted(trained) == list(range(n_rows))


def test_continue_resumes_next_and_restarts_at_the_back():
    """continue + max_resumes=1: a group aborted once is resumed in the next step; aborted again it restarts from
    scratch at the back of the epoch."""
    est = LengthEstimates(12)
    plan = EpochPlan(est, batch_size=2, shuffle_batch_blocks=False, seed=0)
    ctl = OverSampleController(batch_size=2, ratio=0.5, requeue="continue", max_resumes=1)
    resumes: dict[int, int] = {}
    slow = set()

    def times(rows):
        return np.array([10.0 if r in slow else 1.0 for r in rows])

    plan.start_next_epoch()
    slow.add(int(plan.remaining()[2]))
    out = run_oversampled_step(ctl, plan, times, resumes)  # launches 3, the slow one loses
    (lost,) = out.requeued.tolist()
    assert plan.remaining()[0] == lost and resumes == {lost: 1}  # resumed next
    out = run_oversampled_step(ctl, plan, times, resumes)  # it loses again: restart, to the back
    assert lost in out.requeued.tolist() and plan.remaining()[-1] == lost and lost not in resumes
