"""Engine model: hand-computed schedules, conservation, bounds, fitting."""
import numpy as np
import pytest

from recipe.sim.engine import (KV_TOKENS, EngineParams, ReplicaTimeline, admission_order, alone_time,
                               assign_by_predicted, epoch_lower_bound, fit_engine, kv_tokens_per_replica,
                               simulate_step, step_lower_bound)

RNG = np.random.default_rng(0)


def one(**kw):
    base = dict(replicas=1, max_num_seqs=8, decode_a=1.0, decode_b=0.5, decode_c=0.0, prefill_tok_s=0.0, prompt_len=0,
                kv_tokens=None)
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


def test_kv_admission_and_preemption_by_recompute_exact():
    # Block size 1 (token blocks), 8 blocks, prompts of 2, 1 s per decode step. Both admitted (3 + 3 blocks). After
    # two steps both need 5 blocks for the next token: 10 > 8, so the one admitted last (B) is preempted with its 2
    # tokens; A finishes 3 steps later (t=5); B is re-admitted (prefill of prompt + 2 generated tokens, recomputed)
    # and needs 3 more steps (t=8).
    p = one(max_num_seqs=8, block_size=1, kv_tokens=8, decode_b=0.0)
    tl = ReplicaTimeline(np.array([5, 5]), np.array([2, 2]), p)
    assert tl.finish_time.tolist() == [5.0, 8.0] and tl.num_preempted.tolist() == [0, 1]
    assert tl.recomputed_tokens == 4 and tl.time_s == 8.0
    assert tl.tokens_by(1.5).tolist() == [1, 1] and tl.tokens_by(4.0).tolist() == [4, 2]
    # priority scheduling: B (lower value) is admitted first and A is the preemption victim
    pr = ReplicaTimeline(np.array([5, 5]), np.array([2, 2]), p, priority=np.array([0.0, -1.0]))
    assert pr.finish_time.tolist() == [8.0, 5.0] and pr.num_preempted.tolist() == [1, 0]
    # a waiting request is admitted only when its whole context fits (4 + 1 blocks twice > 9): B waits for A
    q = ReplicaTimeline(np.array([4, 3]), np.array([4, 4]), one(max_num_seqs=8, block_size=1, kv_tokens=9,
                                                                 decode_b=0.0))
    assert q.num_preempted.tolist() == [0, 0] and q.finish_time.tolist() == [4.0, 7.0]
    with pytest.raises(ValueError, match="cannot hold one request"):
        ReplicaTimeline(np.array([20]), np.array([2]), p)


def test_event_driven_schedule_equals_the_closed_form_without_pressure():
    rng = np.random.default_rng(7)
    lengths, ctx = rng.integers(1, 3000, 120), rng.integers(10, 300, 120)
    p = EngineParams(max_num_seqs=32, kv_tokens=10**12, prefill_tok_s=1e-4)
    for prio in (None, -lengths.astype(float)):
        closed = ReplicaTimeline(lengths, ctx, p, prio)
        events = ReplicaTimeline(lengths, ctx, p, prio)
        events._event_driven(admission_order(len(lengths), prio))  # the path KV pressure takes, forced
        assert events.finish_time == pytest.approx(closed.finish_time) and events.time_s == pytest.approx(closed.time_s)
        for t in np.linspace(0, closed.time_s, 9):
            assert np.array_equal(events.tokens_by(t), closed.tokens_by(t))


def test_kv_pressure_slows_a_step_and_longest_first_helps():
    lengths = np.clip(np.rint(np.exp(np.random.default_rng(8).normal(8.3, 0.8, 512))), 16, 16384).astype(int)
    times, preempted = {}, {}
    for kv in (None, KV_TOKENS["h100"], 100_000):
        for prio in (None, -lengths):
            s = simulate_step(lengths, EngineParams(kv_tokens=kv), np.random.default_rng(9), priority=prio)
            assert s.tokens_by(s.time_s).sum() == lengths.sum() and (s.finish_time <= s.time_s + 1e-9).all()
            times[kv, prio is None], preempted[kv, prio is None] = s.time_s, int(s.num_preempted.sum())
    assert preempted[None, True] == 0 and times[KV_TOKENS["h100"], True] == pytest.approx(times[None, True])
    assert preempted[100_000, True] > 0 and times[100_000, True] > 1.5 * times[None, True]
    assert times[100_000, False] < times[100_000, True]  # longest first: long ones start early, short ones yield


def test_tokens_by_matches_finish_times_under_preemption():
    lengths = np.random.default_rng(10).integers(1, 4000, 200)
    s = simulate_step(lengths, EngineParams(replicas=2, kv_tokens=60_000), RNG)
    assert s.num_preempted.sum() > 0
    for i in np.random.default_rng(11).choice(len(lengths), 20, replace=False):
        assert s.tokens_by(s.finish_time[i])[i] == lengths[i]
        assert s.tokens_by(s.finish_time[i] - 1e-6)[i] < lengths[i]


def test_kv_capacity_derivation():
    assert 1.3e6 < KV_TOKENS["h100"] < 1.45e6 and 2.9e6 < KV_TOKENS["h200"] < 3.05e6
    assert EngineParams().kv_tokens == KV_TOKENS["h100"]
    # TP8: the 4 KV heads are replicated (one per GPU), so per-GPU KV bytes per token stay 24 KiB
    assert kv_tokens_per_replica("h100", tp=8) > kv_tokens_per_replica("h100", tp=4)
    with pytest.raises(ValueError, match="gpu"):
        kv_tokens_per_replica("a100")
    with pytest.raises(ValueError, match="weights do not fit"):
        kv_tokens_per_replica("h100", tp=1, gpu_memory_utilization=0.3)


def test_placement_by_predicted_tokens_balances_predicted_load():
    pred = np.array([1000, 10, 10, 10, 900, 500, 500, 20] * 4, float)
    rep = assign_by_predicted(pred, 4, np.random.default_rng(0))
    load = np.bincount(rep, weights=pred, minlength=4)
    assert load.max() - load.min() <= pred.max()
    s = simulate_step(np.full(32, 10), one(replicas=4), np.random.default_rng(0), predicted=pred,
                      placement="predicted_tokens")
    assert np.array_equal(s.replica, rep)
    with pytest.raises(ValueError, match="placement"):
        simulate_step([5], one(), RNG, placement="random")
    with pytest.raises(ValueError, match="predicted"):
        simulate_step([5], one(), RNG, placement="predicted_tokens")
