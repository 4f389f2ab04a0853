"""The expected-time key as an ``EpochPlan``'s estimates (recipe/core/time_key.py): the token order without tool
latency, rows with many calls later with it, NaN (unreported) calls skipped, and its state."""
import numpy as np
import pytest

from recipe.core.estimates import LengthEstimates
from recipe.core.ordering import EpochPlan, expected_time_key
from recipe.core.time_key import TimeKeyEstimates


def plan_of(estimates, **kw):
    return EpochPlan(estimates, batch_size=kw.pop("batch_size", 4), bucket_size=kw.pop("bucket_size", 1.0),
                     shuffle_batch_blocks=kw.pop("shuffle_batch_blocks", False), seed=kw.pop("seed", 5), **kw)


def observed(num_rows, rng, n=4):
    """Token estimates of ``num_rows`` rows, each observed once with ``n`` responses."""
    tokens = LengthEstimates(num_rows)
    rows = np.repeat(np.arange(num_rows), n)
    tokens.update(rows, rng.integers(100, 16000, rows.size).astype(float))
    return tokens, rows


def test_without_tool_latency_the_order_is_the_token_order():
    rng = np.random.default_rng(0)
    tokens, rows = observed(200, rng)
    key = TimeKeyEstimates(tokens, 120.0)
    key.observe(rows, rng.integers(0, 9, rows.size), np.zeros(rows.size))  # calls, but every tool took 0 s
    assert key.mean_latency_s() == 0.0 and key.calls.seen.all()
    assert np.array_equal(key.filled(), tokens.filled())
    by_time, by_tokens = plan_of(key, batch_size=8, shuffle_batch_blocks=True), plan_of(tokens, batch_size=8,
                                                                                        shuffle_batch_blocks=True)
    for _ in range(2):
        assert np.array_equal(by_time.start_next_epoch(), by_tokens.start_next_epoch())


def test_a_row_with_many_calls_moves_later():
    tokens = LengthEstimates(4)
    tokens.update(np.arange(4), [100.0, 200.0, 300.0, 400.0])
    key = TimeKeyEstimates(tokens, 120.0)
    # row 0: 10 calls, the others none; 20 s over the 10 calls: 2 s a call = 240 tokens
    key.observe(np.arange(4), [10, 0, 0, 0], [20.0, 0.0, 0.0, 0.0])
    assert key.mean_latency_s() == 2.0
    assert key.filled().tolist() == [100.0 + 10 * 240.0, 200.0, 300.0, 400.0]
    assert plan_of(key, batch_size=1).start_next_epoch().tolist() == [1, 2, 3, 0]
    assert plan_of(tokens, batch_size=1).start_next_epoch().tolist() == [0, 1, 2, 3]
    assert tokens.filled().tolist() == [100.0, 200.0, 300.0, 400.0]  # the token estimates are not touched
    assert np.allclose(key.get([0, 3]), expected_time_key([100.0, 400.0], [10, 0], 2.0, 120.0))


def test_unreported_calls_are_skipped_and_unknown_rows_take_the_prior():
    tokens = LengthEstimates(5)
    tokens.update(np.arange(4), [1000.0] * 4)  # row 4: no token estimate either
    key = TimeKeyEstimates(tokens, 100.0)
    assert np.array_equal(key.filled(), tokens.filled())  # no calls known anywhere: they count 0
    # row 2 reports none (NaN), and its 50 s must not enter the latency either
    key.observe([0, 0, 1, 2], [2, 4, 1, np.nan], [6.0, 12.0, 3.0, 50.0])
    assert (key.latency_sum_s, key.latency_calls) == (21.0, 7)
    assert key.calls.seen.tolist() == [True, True, False, False, False]
    assert key.calls.value[:2].tolist() == [3.0, 1.0]
    # rows 2-4 take the calls' population prior (the median of 3 and 1: 2 calls of 3 s = 600 tokens), row 4 the
    # tokens' one too
    assert key.filled().tolist() == [1000.0 + 900.0, 1000.0 + 300.0, 1600.0, 1600.0, 1600.0]
    assert key.known.tolist() == [True] * 4 + [False]
    # without priors: unknown calls count 0, unknown tokens stay unknown
    assert np.array_equal(key.get([2, 4], fill_prior=False), [1000.0, np.nan], equal_nan=True)
    assert key.update_calls([3], [np.nan]) is None


def test_censored_calls_never_lower_the_estimate():
    tokens = LengthEstimates(1, ema_decay=0.5)
    key = TimeKeyEstimates(tokens, 1.0)
    key.update_calls([0], [4])
    key.update_calls([0], [1], censored=[True])  # cut after one call: at least one, not evidence of fewer
    assert key.calls.value[0] == 4.0
    key.update_calls([0], [8], censored=[True])
    assert key.calls.value[0] == 6.0


def test_requeued_rows_are_sorted_by_the_time_key():
    tokens = LengthEstimates(6)
    tokens.update(np.arange(6), [100.0, 200.0, 300.0, 400.0, 500.0, 600.0])
    key = TimeKeyEstimates(tokens, 100.0)
    key.observe(np.arange(6), [0, 0, 0, 0, 0, 9], [0, 0, 0, 0, 0, 9.0])  # row 5: 9 calls of 1 s = +900 tokens
    key.observe([0], [6], [6.0])  # row 0: 6 calls (EMA 0.7: 1.8 calls) -> 100 + 180
    assert key.filled().tolist() == [280.0, 200.0, 300.0, 400.0, 500.0, 1500.0]
    plan = plan_of(key, batch_size=2)
    assert plan.start_next_epoch().tolist() == [1, 0, 2, 3, 4, 5]
    plan.take(6)
    plan.requeue([5, 0, 1], where="back")  # over-sample losers go to the back, sorted by the plan's key
    assert plan.remaining().tolist() == [1, 0, 5]
    by_tokens = plan_of(tokens, batch_size=2)
    by_tokens.start_next_epoch()
    by_tokens.take(6)
    by_tokens.requeue([5, 0, 1], where="back")
    assert by_tokens.remaining().tolist() == [0, 1, 5]


def test_state_round_trip_and_token_only_states():
    rng = np.random.default_rng(1)
    tokens, rows = observed(30, rng)
    key = TimeKeyEstimates(tokens, 60.0)
    key.observe(rows, rng.integers(0, 5, rows.size), rng.uniform(0, 10, rows.size), censored=rows % 7 == 0)
    state = key.state_dict()
    other = TimeKeyEstimates(LengthEstimates(30), 60.0)
    other.load_state_dict(state)
    assert np.array_equal(other.filled(), key.filled())
    assert (other.latency_sum_s, other.latency_calls) == (key.latency_sum_s, key.latency_calls)
    assert np.array_equal(other.calls.censored, key.calls.censored)
    assert np.array_equal(other.tokens.value, tokens.value)
    # a plain LengthEstimates (order_by=tokens) loads it, ignoring the tool state
    plain = LengthEstimates(30)
    plain.load_state_dict(state)
    assert np.array_equal(plain.filled(), tokens.filled())
    # a token-only state (order_by=tokens, or written before the time key) loads with empty tool state
    other.load_state_dict(tokens.state_dict())
    assert not other.calls.seen.any() and other.mean_latency_s() == 0.0
    assert np.array_equal(other.filled(), tokens.filled())


def test_bad_inputs_are_refused():
    tokens = LengthEstimates(2)
    with pytest.raises(ValueError, match="tokens_per_s"):
        TimeKeyEstimates(tokens, 0.0)
    key = TimeKeyEstimates(tokens, 1.0)
    with pytest.raises(ValueError, match="tool latency"):
        key.add_latency(-1.0, 1)
    with pytest.raises(ValueError, match="differ in shape"):
        key.observe([0, 1], [1, 1], [1.0])
    with pytest.raises(ValueError, match="differ in shape"):
        key.update_calls([0, 1], [1])


def test_warm_start_seeds_calls_and_latency_and_skips_unreported():
    key = TimeKeyEstimates(LengthEstimates(3), 1.0)
    assert key.warm_start([0, 1, 2], [np.nan] * 3, [np.nan] * 3) == 0  # single-turn traces: nothing to seed
    assert not key.calls.seen.any() and key.latency_calls == 0
    assert key.warm_start([0, 0, 1, 2], [2, 4, 1, np.nan], [4.0, 8.0, 3.0, np.nan], [False, False, True, False]) == 2
    assert key.calls.value[:2].tolist() == [3.0, 1.0] and key.calls.censored.tolist() == [False, True, False]
    assert (key.latency_sum_s, key.latency_calls) == (15.0, 7)
