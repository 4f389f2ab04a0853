"""Engine model: hand-computed schedules, conservation, bounds, fitting."""
import numpy as np
import pytest

from recipe.sim.engine import (EngineParams, ReplicaTimeline, alone_time, epoch_lower_bound, fit_engine,
                               simulate_step, step_lower_bound)

RNG = np.random.default_rng(0)


def one(**kw):
    base = dict(replicas=1, max_num_seqs=8, decode_a=1.0, decode_b=0.5, decode_c=0.0, prefill_tok_s=0.0, prompt_len=0)
    return EngineParams(**{**base, **kw})


def test_two_requests_one_replica_exact():
    # 3 steps with 2 running (1 + 2*0.5 = 2 s each), then 2 steps with 1 running (1.5 s each).
    s = simulate_step([3, 5], one(), RNG)
    assert s.time_s == pytest.approx(9.0)
    assert s.finish_time.tolist() == pytest.approx([6.0, 9.0])


def test_queue_prefill_and_context_exact():
    # One slot: A (3 tokens) then B (5). Prefill 2 s each; step = 1 + 0.5 + 0.1 * (10 + generated so far).
    s = simulate_step([3, 5], one(max_num_seqs=1, decode_c=0.1, prefill_tok_s=0.2, prompt_len=10), RNG)
    a = 2 + sum(1.5 + 0.1 * (10 + t) for t in range(3))
    b = a + 2 + sum(1.5 + 0.1 * (10 + t) for t in range(5))
    assert s.finish_time.tolist() == pytest.approx([a, b])
    assert s.tokens_by(8.0).tolist() == [2, 0]  # A has done 2 steps (2 + 2.5 + 2.6 = 7.1 <= 8 < 9.8)
    # A resumed response (partial rollout) re-prefills prompt + its 5 tokens and reads them every step.
    r = simulate_step([2], one(decode_c=0.1, prefill_tok_s=0.2, prompt_len=10), RNG, context0=[15])
    assert r.time_s == pytest.approx(0.2 * 15 + (1.5 + 0.1 * 15) + (1.5 + 0.1 * 16))


def test_slot_freed_immediately_fifo():
    tl = ReplicaTimeline(np.array([4, 2, 3, 1]), np.zeros(4), one(max_num_seqs=2))
    assert tl.start.tolist() == [0, 0, 2, 4]  # the third starts when the 2-token one ends, the fourth after A


def test_conservation_every_token_decoded_once():
    # With a = 0, b = 1 a replica's time is the number of (sequence, step) pairs: the tokens it decoded.
    lengths = np.random.default_rng(1).integers(1, 3000, 700)
    p = EngineParams(replicas=4, max_num_seqs=64, decode_a=0.0, decode_b=1.0, decode_c=0.0, prefill_tok_s=0.0)
    s = simulate_step(lengths, p, RNG)
    assert sum(tl.time_s for tl in s.timelines) == pytest.approx(lengths.sum())
    assert np.bincount(s.replica, minlength=4).tolist() == [175] * 4  # least in-flight: an even deal
    assert s.tokens_by(s.time_s).sum() == lengths.sum()


def test_tokens_by_matches_finish_times():
    lengths = np.random.default_rng(2).integers(1, 5000, 300)
    s = simulate_step(lengths, EngineParams(max_num_seqs=32), RNG)
    for i in np.random.default_rng(3).choice(len(lengths), 20, replace=False):
        assert s.tokens_by(s.finish_time[i])[i] == lengths[i]
        assert s.tokens_by(s.finish_time[i] - 1e-6)[i] < lengths[i]


def test_lower_bounds_hold():
    p = EngineParams()
    rng = np.random.default_rng(4)
    for _ in range(5):
        lengths = rng.integers(1, 16384, 512)
        assert simulate_step(lengths, p, rng).time_s >= step_lower_bound(lengths, p)
    assert step_lower_bound([100], p) == pytest.approx(alone_time(100, p))
    group = rng.integers(1, 16384, (64, 16))
    bound = epoch_lower_bound(group, 32, p)
    for order in (rng.permutation(64), np.argsort(group.max(axis=1))):  # random, and sorted by group maximum
        steps = group[order].reshape(2, 32 * 16)
        assert sum(simulate_step(s, p, rng).time_s for s in steps) >= bound


def test_fit_engine_recovers_a_b():
    p = one(decode_a=0.012, decode_b=9e-5, max_num_seqs=1024)
    rng = np.random.default_rng(5)
    recs = []
    for _ in range(10):
        lengths = rng.integers(1, 16384, rng.integers(50, 300))
        t = simulate_step(lengths, p, rng).time_s
        recs.append({"max_len": lengths.max(), "sum_len": lengths.sum(), "time_s": t})
    fit = fit_engine(recs, replicas=1)
    assert fit["decode_a"] == pytest.approx(0.012, rel=1e-6) and fit["decode_b"] == pytest.approx(9e-5, rel=1e-6)
    with pytest.raises(ValueError):
        fit_engine(recs[:1])
