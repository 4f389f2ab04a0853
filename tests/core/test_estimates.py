"""Length estimates: EMA convention, statistics, censoring."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recipe.core.estimates import LengthEstimates, reduce_groups


def test_first_observation_initialises_then_ema_weights_old_value():
    est = LengthEstimates(3, ema_decay=0.7)
    est.update([0, 0, 1], [100, 300, 50])
    assert est.value[0] == pytest.approx(200.0)
    assert est.value[1] == pytest.approx(50.0)
    assert np.isnan(est.value[2])
    est.update([0, 0], [400, 400])
    assert est.value[0] == pytest.approx(0.7 * 200 + 0.3 * 400)
    assert est.count.tolist() == [2, 1, 0]


@pytest.mark.parametrize("stat,expected", [("mean", 25.0), ("max", 40.0), ("median", 25.0), ("p90", 37.0)])
def test_group_statistics(stat, expected):
    obs = reduce_groups([5, 5, 5, 5], [10, 20, 30, 40], None, stat)
    assert obs.rows.tolist() == [5]
    assert obs.value[0] == pytest.approx(expected)


def test_unknown_statistic_is_rejected():
    with pytest.raises(ValueError, match="length statistic"):
        LengthEstimates(2, statistic="p0")


def test_censored_observation_never_lowers_estimate():
    est = LengthEstimates(1, ema_decay=0.7)
    est.update([0, 0], [8000, 9000])
    before = est.value[0]
    est.update([0, 0], [2000, 2000], censored=[True, True])  # cut short: a lower bound only
    assert est.value[0] == pytest.approx(before)
    est.update([0, 0], [12000, 12000], censored=[True, False])  # a lower bound above: may raise it
    assert est.value[0] == pytest.approx(0.7 * before + 0.3 * 12000)


def test_cap_on_for_many_epochs_does_not_drag_long_prompts_toward_the_cap():
    """Long prompts (true length 14000) under a 10000-token cap for 8 epochs keep their estimate; without the
    censoring rule the EMA would converge to the cap."""
    rng = np.random.default_rng(0)
    n_rows, n = 64, 16
    true = np.where(np.arange(n_rows) < 16, 14000.0, 3000.0)
    censored_est = LengthEstimates(n_rows, ema_decay=0.7)
    naive_est = LengthEstimates(n_rows, ema_decay=0.7)
    rows = np.repeat(np.arange(n_rows), n)
    first = rng.normal(true[rows], 300)  # epoch 0 uncapped
    censored_est.update(rows, first)
    naive_est.update(rows, first)
    cap = 10000
    for _ in range(8):
        want = rng.normal(true[rows], 300)
        got = np.minimum(want, cap)
        censored_est.update(rows, got, censored=got >= cap)
        naive_est.update(rows, got)
    long_rows = np.arange(16)
    assert censored_est.value[long_rows].min() > 13000
    assert naive_est.value[long_rows].max() < 10500  # what the censoring rule prevents
    short = np.arange(16, n_rows)
    assert np.allclose(censored_est.value[short], 3000, rtol=0.05)


def test_prior_is_median_of_seen_and_nan_before_any():
    est = LengthEstimates(4)
    assert np.isnan(est.prior())
    est.update([0, 1, 2], [100, 200, 900])
    assert est.prior() == 200
    assert est.get([3]).tolist() == [200]
    assert np.isnan(est.get([3], fill_prior=False)[0])


def test_state_roundtrip_and_size_mismatch_message():
    est = LengthEstimates(3, statistic="max")
    est.update([0, 1], [5, 7], censored=[False, True])
    other = LengthEstimates(3, statistic="max")
    other.load_state_dict(est.state_dict())
    assert np.array_equal(other.value, est.value, equal_nan=True)
    assert other.censored.tolist() == est.censored.tolist()
    with pytest.raises(ValueError, match="train file or its truncation changed"):
        LengthEstimates(4).load_state_dict(est.state_dict())


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 9), st.floats(1, 20000), st.booleans()), min_size=1, max_size=80),
    st.sampled_from(["mean", "max", "p90"]),
)
def test_estimates_stay_within_observed_range(obs, stat):
    """Any update sequence keeps each estimate within [min, max] of what was observed for the row (an EMA of
    statistics of observations), and rows never observed stay unseen."""
    est = LengthEstimates(10, statistic=stat)
    for r, length, cens in obs:
        est.update([r], [length], censored=[cens])
    for r in range(10):
        seen = [length for rr, length, _ in obs if rr == r]
        if seen:
            assert min(seen) - 1e-6 <= est.value[r] <= max(seen) + 1e-6
        else:
            assert np.isnan(est.value[r])


def test_exact_observation_replaces_a_lower_bound_estimate():
    """A prompt first seen as an aborted partial (a lower bound) must not bias the next exact observation low."""
    est = LengthEstimates(2, ema_decay=0.7)
    est.update([0, 1], [300, 300], censored=[True, True])
    assert est.censored.tolist() == [True, True]
    est.update([0, 1], [9000, 100])  # row 0: exact and above the bound -> replaces; row 1: below -> EMA
    assert est.value[0] == 9000 and not est.censored[0]
    assert est.value[1] == pytest.approx(0.7 * 300 + 0.3 * 100) and not est.censored[1]
    est.update([0], [200], censored=[True])  # a lower bound under an exact estimate changes nothing
    assert est.value[0] == 9000 and not est.censored[0]


def test_warm_start_folds_an_earlier_run_in_epoch_order_with_censoring():
    est = LengthEstimates(4, ema_decay=0.5)
    rows = [0, 0, 1, 1, 0, 0, 1, 1, 2]
    lengths = [100, 300, 1000, 1000, 400, 400, 500, 500, 50]
    censored = [False, False, False, False, False, False, True, True, False]
    epochs = [0, 0, 0, 0, 1, 1, 1, 1, 1]
    assert est.warm_start(rows, lengths, censored, epochs) == 3
    assert est.value[0] == pytest.approx(0.5 * 200 + 0.5 * 400)  # epoch 0 initialises, epoch 1 goes through the EMA
    assert est.value[1] == 1000 and not est.censored[1]  # a lower bound (500, cut) below the estimate changes nothing
    assert est.value[2] == 50 and np.isnan(est.value[3])
    assert est.seen.tolist() == [True, True, True, False] and est.prior() == 300
    assert est.get([3]).tolist() == [300]  # a row without a match gets the population prior
    est.update([0, 0], [1000, 1000])  # this run's first observation continues the EMA from the warm value
    assert est.value[0] == pytest.approx(0.5 * 300 + 0.5 * 1000)
    with pytest.raises(RuntimeError, match="before the run's first update"):
        est.warm_start([3], [10])


def test_warm_start_without_epochs_pools_a_rows_responses_and_checks_shapes():
    est = LengthEstimates(2, ema_decay=0.9)
    est.warm_start([0, 0, 0, 1], [100, 200, 600, 80])
    assert est.value.tolist() == [300, 80] and est.count.tolist() == [1, 1]
    with pytest.raises(ValueError, match="one entry per response"):
        LengthEstimates(2).warm_start([0, 1], [5.0])


def test_row_prior_stands_in_until_observed_and_counts_as_known():
    est = LengthEstimates(4)
    assert not est.known.any() and np.isnan(est.prior())
    assert est.set_row_prior([100.0, np.nan, 900.0, np.nan]) == 2
    assert est.known.tolist() == [True, False, True, False] and not est.seen.any()
    assert est.prior() == 500 and est.known_ratio() == 0.5
    assert est.get([0, 1, 2]).tolist() == [100, 500, 900]
    assert np.isnan(est.get([1], fill_prior=False)[0]) and est.get([2], fill_prior=False)[0] == 900
    est.update([0, 0], [4000, 6000])  # an observation replaces the row's prior (no EMA with it)
    assert est.get([0])[0] == 5000
    other = LengthEstimates(4)
    other.load_state_dict(est.state_dict())
    assert np.array_equal(other.row_prior, est.row_prior, equal_nan=True)
    for bad in ([1.0, 2.0], [1.0, -5.0, np.nan, 1.0], [1.0, np.inf, 1.0, 1.0]):
        with pytest.raises(ValueError, match="row prior"):
            LengthEstimates(4).set_row_prior(bad)


def test_checkpoint_from_before_row_priors_still_loads():
    est = LengthEstimates(2)
    est.update([0], [10])
    state = est.state_dict()
    del state["row_prior"]
    other = LengthEstimates(2)
    other.load_state_dict(state)
    assert other.value[0] == 10 and np.isnan(other.row_prior).all()


def test_warm_start_folds_epochs_in_epoch_order_whatever_the_order_of_the_entries():
    """With ema_decay 0.9 the first epoch dominates, so the folding order shows: epochs 0, 1, 2 observe 100, 1000,
    400 and the entries come as epoch 2, 0, 1 (a trace read back in another order)."""
    est = LengthEstimates(1, ema_decay=0.9)
    est.warm_start([0, 0, 0, 0, 0, 0], [400, 400, 100, 100, 1000, 1000], epochs=[2, 2, 0, 0, 1, 1])
    assert est.value[0] == pytest.approx(0.9 * (0.9 * 100 + 0.1 * 1000) + 0.1 * 400)  # 211; reversed: 424
    assert est.count[0] == 3
