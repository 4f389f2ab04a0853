"""Cap policies: the seed formula and the calibrated one."""
import numpy as np
import pytest

from recipe.core.cap import CalibratedCap, SeedCap, make_cap_policy


def test_seed_formula():
    cap = SeedCap(16384, factor=2.0, min_tokens=1000)
    assert cap.cap_for_batch([1000, 2000, 3000]) == 4000  # 2 * mean


def test_seed_min_token_floor():
    assert SeedCap(16384, factor=2.0, min_tokens=10000).cap_for_batch([500, 700]) == 10000


def test_seed_cap_at_or_above_response_length_changes_nothing():
    assert SeedCap(16384, factor=2.0, min_tokens=10000).cap_for_batch([9000, 9000]) is None
    assert SeedCap(8192, factor=2.0, min_tokens=10000).cap_for_batch([10.0]) is None


def test_no_estimates_no_cap():
    assert SeedCap(16384).cap_for_batch([np.nan, np.nan]) is None
    assert SeedCap(16384).cap_for_batch([]) is None


def test_partial_estimates_use_the_seen_rows():
    assert SeedCap(16384, 2.0, 100).cap_for_batch([np.nan, 3000]) == 6000


def test_calibrated_needs_history_then_rounds_and_floors():
    cal = CalibratedCap(16384, quantile=0.95, history_epochs=3, align=512, min_tokens=4096)
    assert cal.cap_for_batch([3000.0]) is None  # nothing observed yet
    cal.observe(0, predicted=[1000] * 20, observed_tail=[1500] * 19 + [3000], censored=[False] * 20)
    r = cal.ratio()
    assert r == pytest.approx(1.575)  # numpy's linear q0.95 of 19 x 1.5 and one 3.0: 1.5 + 0.05 * 1.5
    assert cal.cap_for_batch([2000.0, 3000.0]) == 5120  # max estimate 3000 * 1.575 = 4725, up to a multiple of 512
    assert cal.cap_for_batch([100.0]) == 4096  # floor


def test_calibrated_forgets_old_epochs():
    cal = CalibratedCap(100000, quantile=1.0, history_epochs=2, align=1, min_tokens=1)
    cal.observe(0, [100], [900], [False])
    cal.observe(1, [100], [200], [False])
    assert cal.ratio() == pytest.approx(9.0)
    cal.observe(2, [100], [150], [False])
    assert cal.ratio() == pytest.approx(2.0)


def test_calibrated_state_roundtrip():
    cal = CalibratedCap(20000)
    cal.observe(0, [1000, 2000], [1800, 2500], [False, True])
    other = CalibratedCap(20000)
    other.load_state_dict(cal.state_dict())
    assert other.ratio() == cal.ratio()


def test_make_cap_policy_rejects_unknown_mode():
    with pytest.raises(ValueError, match="cap mode"):
        make_cap_policy("tail", 1000)


def _responses(rows, lengths, predicted, response_length=16384, caps=None):
    from recipe.core.step_stats import StepResponses

    rows = np.asarray(rows)
    return StepResponses(rows=rows, lengths=lengths, caps=np.zeros(len(rows)) if caps is None else caps,
                         predicted=predicted, response_length=response_length)


def test_budget_cap_spends_the_budget_where_responses_would_not_hit_the_limit_anyway():
    from recipe.core.cap import BudgetCap

    cap = BudgetCap(16000, budget=0.05, align=1000, min_tokens=1000)
    assert cap.cap_for_batch([2000.0]) is None  # nothing observed: no cap
    ratios = np.concatenate([np.full(90, 1.0), np.full(10, 3.0)])  # 10% of responses run 3x their estimate
    cap.observe_step(0, _responses(np.arange(100), 1000 * ratios, np.full(100, 1000.0)))
    assert cap.extra_truncation([2000.0], [1000.0, 2000.0, 6000.0]).tolist() == pytest.approx([1.0, 0.1, 0.0])
    assert cap.cap_for_batch([2000.0]) == 6000  # a cut below 6000 would truncate the 10% that end there
    # estimate 6000: the long 10% reach 18000 > the limit, truncated anyway; the cap may cut down to the rest
    assert cap.cap_for_batch([6000.0]) == 6000
    assert cap.cap_for_batch([np.nan, 2000.0]) == 6000  # rows without an estimate are left out
    loose = BudgetCap(16000, budget=0.2, align=1000, min_tokens=1000)
    loose.load_state_dict(cap.state_dict())
    assert loose.cap_for_batch([2000.0]) == 2000  # a larger budget buys the 10% truncation
    with pytest.raises(ValueError, match="budget"):
        BudgetCap(16000, budget=1.5)


def test_calibrated_observe_step_uses_group_tails():
    cal, ref = CalibratedCap(20000, quantile=1.0), CalibratedCap(20000, quantile=1.0)
    cal.observe_step(0, _responses([3, 3, 1, 1], [100, 500, 200, 200], [250, 250, 100, 100]))
    ref.observe(0, [100, 250], [200, 500], [False, False])  # rows sorted, tails = group maxima
    assert cal.ratio() == ref.ratio() == 2.0


def test_warm_start_cap_calibrates_on_the_earlier_runs_own_predictions():
    from recipe.core.cap import WARM_EPOCH, BudgetCap, warm_start_cap

    cal = CalibratedCap(20000, quantile=1.0, history_epochs=2)
    rows, epochs = np.array([0, 0, 1, 1] * 2), np.repeat([0, 1], 4)
    lengths = np.array([100, 100, 400, 400, 300, 300, 400, 400])
    assert warm_start_cap(cal, rows, lengths, np.zeros(8, bool), epochs, response_length=20000, ema_decay=0.5,
                          statistic="mean") == 4  # epoch 1 predicted from epoch 0
    assert cal.ratio() == 3.0 and cal.cap_for_batch([1000.0]) == 4096  # 3000, floored
    cal.observe(WARM_EPOCH + 2, [100], [100], [False])  # two epochs on, the warm calibration has aged out
    assert cal.ratio() == 1.0
    budget = BudgetCap(20000)
    assert warm_start_cap(budget, rows[:4], lengths[:4], np.zeros(4, bool), epochs[:4], response_length=20000,
                          ema_decay=0.5, statistic="mean") == 0  # one epoch: nothing to calibrate on
    assert budget.cap_for_batch([1000.0]) is None


def test_budget_cap_leaves_out_responses_without_a_prediction():
    """Epoch 0 without a warm start has no predictions (NaN): such responses say nothing about the ratio
    observed / predicted and must not enter the history (NaN ratios would make every cap look free)."""
    from recipe.core.cap import BudgetCap

    cold = BudgetCap(16000, budget=0.05, align=1000, min_tokens=1000)
    cold.observe_step(0, _responses(np.arange(4), np.full(4, 9000.0), np.full(4, np.nan)))
    assert cold.state_dict()["ratios"] == [] and cold.cap_for_batch([2000.0]) is None
    mixed, ref = (BudgetCap(16000, budget=0.05, align=1000, min_tokens=1000) for _ in range(2))
    ratios = np.concatenate([np.full(90, 1.0), np.full(10, 3.0)])
    ref.observe_step(0, _responses(np.arange(100), 1000 * ratios, np.full(100, 1000.0)))
    mixed.observe_step(0, _responses(np.arange(150), np.concatenate([1000 * ratios, np.full(50, 500.0)]),
                                     np.concatenate([np.full(100, 1000.0), np.full(50, np.nan)])))
    assert np.array_equal(mixed.state_dict()["ratios"][0][1], ref.state_dict()["ratios"][0][1])
    assert mixed.cap_for_batch([2000.0]) == ref.cap_for_batch([2000.0]) == 6000


def test_budget_cap_floor_is_min_tokens_rounded_up_to_align():
    """However short the batch, the cap is never below ``min_tokens`` (rounded up to a multiple of ``align``)."""
    from recipe.core.cap import BudgetCap

    cap = BudgetCap(16000, budget=0.5, align=1000, min_tokens=1500)
    cap.observe_step(0, _responses(np.arange(10), np.full(10, 100.0), np.full(10, 100.0)))
    assert cap.extra_truncation([100.0], [1000.0]).tolist() == [0.0]  # 1000 would cut nothing, yet is below the floor
    assert cap.cap_for_batch([100.0]) == 2000


def test_budget_zero_buys_no_extra_truncation_but_still_caps():
    """``budget=0`` is valid: the lowest cap that cuts nothing ``response_length`` would not cut anyway."""
    from recipe.core.cap import BudgetCap

    cap = BudgetCap(16000, budget=0.0, align=1000, min_tokens=1000)
    ratios = np.concatenate([np.full(90, 1.0), np.full(10, 3.0)])
    cap.observe_step(0, _responses(np.arange(100), 1000 * ratios, np.full(100, 1000.0)))
    assert cap.cap_for_batch([2000.0]) == 6000  # the longest 10% end at 3 x 2000: not one of them cut
    assert cap.cap_for_batch([500.0]) == 2000  # 3 x 500 = 1500, up to a multiple of align
    assert cap.cap_for_batch([6000.0]) == 6000  # the long 10% reach 18000 > the limit: cut there anyway


def test_warm_start_cap_replays_with_the_runs_own_decay_and_statistic():
    """The earlier run's predictions are replayed with this run's EMA decay and statistic: three epochs, so that
    the decay shapes the epoch-2 predictions, and unequal responses, so that the statistic does."""
    from recipe.core.cap import WARM_EPOCH, BudgetCap, warm_start_cap

    rows, epochs = np.tile([0, 0, 1, 1], 3), np.repeat([0, 1, 2], 4)
    lengths = np.array([100, 300, 1000, 1000, 500, 500, 200, 600, 400, 400, 800, 800], np.float64)
    cap = BudgetCap(20000)
    assert warm_start_cap(cap, rows, lengths, np.zeros(12, bool), epochs, response_length=20000, ema_decay=0.9,
                          statistic="max") == 8
    # max: epoch 0 predicts (300, 1000); epoch 1 observes maxima (500, 600) -> 0.9 * old + 0.1 * new = (320, 960)
    want = np.array([500 / 300, 500 / 300, 200 / 1000, 600 / 1000, 400 / 320, 400 / 320, 800 / 960, 800 / 960])
    (epoch, got), = cap.state_dict()["ratios"]
    assert epoch == WARM_EPOCH and np.allclose(got, want)


def test_a_cap_exactly_at_response_length_is_no_cap():
    """Where the ratio lands the cap exactly on ``response_length`` (ratio = response_length / estimate) the cap
    changes nothing: None; one token below it, it is a cap."""
    assert SeedCap(8000, factor=2.0, min_tokens=1).cap_for_batch([4000.0]) is None  # 2 x 4000 = 8000
    assert SeedCap(8001, factor=2.0, min_tokens=1).cap_for_batch([4000.0]) == 8000
    for response_length, want in ((6144, None), (6145, 6144)):
        cal = CalibratedCap(response_length, quantile=1.0, align=512, min_tokens=1)
        cal.observe(0, predicted=[1000.0], observed_tail=[1500.0], censored=[False])
        assert cal.cap_for_batch([4096.0]) == want  # 4096 x 1.5 = 6144, a multiple of align


def test_budget_cap_counts_a_ratio_exactly_at_the_limit_as_truncated_anyway():
    """A response whose modelled length is exactly ``response_length`` (ratio = response_length / estimate) hits the
    limit, as a censored length does (``StepResponses.censored``: length >= response_length): truncated in the
    baseline too, so no cap below it adds truncation; a token shorter, it ends with EOS and only a cap above it
    spares it."""
    from recipe.core.cap import BudgetCap

    cap = BudgetCap(16000, budget=0.0, align=1000, min_tokens=1000)
    cap.observe_step(0, _responses(np.arange(10), np.full(10, 2000.0), np.full(10, 1000.0)))  # every ratio is 2
    assert cap.extra_truncation([8000.0], [1000.0, 15000.0]).tolist() == [0.0, 0.0]
    assert cap.cap_for_batch([8000.0]) == 1000
    assert cap.extra_truncation([7999.5], [1000.0, 15000.0]).tolist() == [1.0, 1.0]  # 15999 tokens: natural
    assert cap.cap_for_batch([7999.5]) is None
