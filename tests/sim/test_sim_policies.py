"""Policies drive recipe.core as the trainer does; every prompt is trained once per epoch; over-sampling's restart
and continue (max_resumes) semantics come from the controller; determinism."""
import dataclasses
import json
import math

import numpy as np
import pytest

from recipe.core.cap import BudgetCap, SeedCap, warm_start_cap
from recipe.core.estimates import LengthEstimates
from recipe.core.tailcut import TailCut
from recipe.sim import trace as T
from recipe.sim.engine import EngineParams
from recipe.sim.policies import ONPOLICY_BUDGET, ONPOLICY_EMA, POLICIES, PolicySpec, make_policy, register
from recipe.sim.run import run_policy, simulate, summarize

TRACE = T.generate("reference", num_prompts=128, n=8, epochs=3)
PREVIOUS = TRACE.previous_run()


@pytest.mark.parametrize("name", list(POLICIES))
def test_every_prompt_trained_once_per_epoch(name):
    run = run_policy(TRACE, name, EngineParams(), batch_size=16, previous=PREVIOUS)
    s = summarize(run, TRACE.epochs, TRACE.num_prompts)
    assert s["every_prompt_once_per_epoch"] and s["prompts_trained_per_epoch"] == [128] * 3
    assert all(len(st.trained_rows) == 16 for st in run.steps)  # every step trains exactly one batch
    # every decoded token is either trained or thrown away by a restart
    assert sum(st.tokens for st in run.steps) == sum(st.trained_tokens + st.wasted_tokens for st in run.steps)
    assert s["max_policy_versions"] <= POLICIES[name].max_resumes + 1
    if POLICIES[name].oversample_requeue != "continue" or POLICIES[name].oversample_ratio == 0:
        assert s["max_policy_versions"] == 1 and s["stale_token_fraction"] == 0 == s["resumed_response_fraction"]
    if POLICIES[name].oversample_ratio == 0:
        assert s["steps_per_epoch"] == [8] * 3 and s["wasted_tokens_fraction"] == 0
    if POLICIES[name].oversample_ratio == 0 and POLICIES[name].tail_cut == 1.0:
        # conservation through the driver: every desired token (capped) is decoded exactly once
        assert sum(st.tokens for st in run.steps) <= TRACE.lengths.sum()
        if POLICIES[name].cap == "none":
            assert sum(st.tokens for st in run.steps) == TRACE.lengths.sum()


def test_seed_cap_formula_reaches_the_engine(tmp_path):
    path = tmp_path / "seed.jsonl"
    run_policy(TRACE, "seed", EngineParams(), batch_size=16, record_path=str(path))
    formula = SeedCap(TRACE.response_length, factor=2.0, min_tokens=10000)
    bound = 0
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        pred = np.array([np.nan if p is None else p for p in rec["predicted"]][:: TRACE.n])
        if rec["epoch"] == 0:
            assert rec["cap"] is None  # nothing observed yet: no cap
            continue
        assert np.isfinite(pred).all()
        expect = min(TRACE.response_length, max(10000, math.ceil(2.0 * pred.mean())))
        assert rec["cap"] == (None if expect >= TRACE.response_length else expect) == formula.cap_for_batch(pred)
        if rec["cap"]:
            assert max(rec["lengths"]) <= rec["cap"]
            bound += sum(f == "cap" for f in rec["finish"])
    assert bound > 0


def test_observe_feeds_estimates_with_censoring():
    pol = make_policy("seed", num_rows=8, batch_size=4, response_length=100, seed=0)
    pol.start_epoch(0)
    plan = pol.plan_step()
    assert plan.caps.tolist() == [0] * 4 and np.isnan(plan.predicted).all()
    lengths = np.array([[10, 20], [30, 100], [50, 50], [5, 7]])
    resp = pol.observe(plan, lengths, np.ones(4, bool), np.zeros_like(lengths, bool))
    assert resp.censored().tolist() == [False, False, False, True, False, False, False, False]
    est = pol.estimates.get(plan.rows, fill_prior=False)
    assert est.tolist() == [15, 65, 50, 6] and pol.estimates.censored[plan.rows].tolist() == [False, True, False, False]


def test_calibrated_cap_learns_and_binds():
    run = run_policy(TRACE, "calibrated", EngineParams(), batch_size=16)
    caps = [st.caps[0] for st in run.steps]
    assert all(c == 0 for c in caps[:8]) and any(c > 0 for c in caps[8:])


def test_warm_start_orders_and_caps_epoch_0_from_the_earlier_run_only():
    cold = make_policy("best-onpolicy-cold", num_rows=128, batch_size=16, response_length=TRACE.response_length)
    cold.start_epoch(0)
    assert not cold.plan.sorted_epoch and not cold.plan_step().caps.any()  # nothing known: random, no cap
    with pytest.raises(ValueError, match="previous="):
        make_policy("best-onpolicy", num_rows=128, batch_size=16, response_length=TRACE.response_length)
    warm = make_policy("best-onpolicy", num_rows=128, batch_size=16, response_length=TRACE.response_length,
                       previous=PREVIOUS)
    assert warm.warm_rows == 128 and warm.estimates.count.tolist() == [1] * 128  # warm_epochs="first": one epoch
    ref = LengthEstimates(128)
    ref.update(np.repeat(np.arange(128), 8), PREVIOUS.lengths[0].ravel(), PREVIOUS.truncated[0].ravel())
    assert np.allclose(warm.estimates.value, ref.value)  # seeded from the earlier run's first epoch ...
    assert not np.allclose(warm.estimates.value, TRACE.lengths[0].mean(axis=1))  # ... not from the replayed one
    warm.start_epoch(0)
    plan = warm.plan_step()
    assert warm.plan.sorted_epoch and np.isfinite(plan.predicted).all()
    # the budget cap, calibrated on all of the earlier run's epochs with the policy's own EMA and statistic
    ref = BudgetCap(TRACE.response_length, budget=ONPOLICY_BUDGET)
    shape = PREVIOUS.lengths.shape
    assert warm_start_cap(ref, np.broadcast_to(PREVIOUS.row_ids[None, :, None], shape).ravel(),
                          PREVIOUS.lengths.ravel(), (PREVIOUS.censored | PREVIOUS.truncated).ravel(),
                          np.broadcast_to(np.arange(shape[0])[:, None, None], shape).ravel(),
                          response_length=TRACE.response_length, ema_decay=ONPOLICY_EMA, statistic="mean") > 0
    want = ref.cap_for_batch(plan.predicted)
    assert want is not None and plan.caps.tolist() == [want] * len(plan.rows)
    assert np.array_equal(plan.priority, -plan.expected)  # longest first, no resumed groups
    # and the earlier run's rows are matched by row id: a reordered earlier run seeds the same estimates
    perm = np.random.default_rng(0).permutation(128)
    shuffled = dataclasses.replace(PREVIOUS, lengths=PREVIOUS.lengths[:, perm], censored=PREVIOUS.censored[:, perm],
                                   row_ids=PREVIOUS.row_ids[perm])
    again = make_policy("best-onpolicy", num_rows=128, batch_size=16, response_length=TRACE.response_length,
                        previous=shuffled)
    assert np.allclose(again.estimates.value, warm.estimates.value)


def test_warm_start_speeds_up_epoch_0_and_prediction_quality_is_reported():
    by = {p["name"]: p for p in simulate(TRACE, ["onpolicy-order", "best-onpolicy", "oracle"], EngineParams(),
                                         batch_size=16)["policies"]}
    assert by["baseline"]["prediction_rank_corr_per_epoch"] == [None] * 3  # random order: no estimates
    assert by["oracle"]["prediction_rank_corr_per_epoch"] == [1.0] * 3
    assert by["oracle"]["top_decile_hit_per_epoch"] == [1.0] * 3
    order = by["onpolicy-order"]
    assert order["warm_started_rows"] == 128 and order["epoch0_speedup_vs_baseline"] > 1.0
    assert all(0.5 < c < 1.0 for c in order["prediction_rank_corr_per_epoch"])
    assert by["best-onpolicy"]["epoch0_speedup_vs_baseline"] > order["epoch0_speedup_vs_baseline"]  # capped too


def _lose(pol, plan, lost_index, partial=(400, 30)):
    """Observe a step of 2-response groups in which launched row ``lost_index`` lost the race."""
    lengths = np.full((len(plan.rows), 2), 100)
    lengths[lost_index] = partial
    kept = np.ones(len(plan.rows), bool)
    kept[lost_index] = False
    stopped = np.zeros(lengths.shape, bool)
    stopped[lost_index] = True
    pol.observe(plan, lengths, kept, stopped)
    return plan.rows[lost_index]


def test_restart_requeues_at_the_back_and_redraws():
    """recipe.core's controller and EpochPlan.requeue drive it: losers go to the back, are trained later in the
    epoch (the controller's epoch accounting raises on a double training), and their partial lengths raise
    estimates; nothing of them is kept."""
    pol = make_policy("oversample-restart", num_rows=64, batch_size=8, response_length=1000, seed=0)
    assert pol.oversample.requeue == "restart" and not pol.oversample.keeps_partial(0)
    pol.start_epoch(0)
    plan = pol.plan_step()
    assert len(plan.rows) == 9 and plan.keep == 8 and plan.resumes.tolist() == [0] * 9  # ceil(8 * 1.125)
    lost = _lose(pol, plan, 3)
    assert pol.plan.remaining()[-1] == lost and pol.estimates.censored[lost]
    assert pol.estimates.get([lost])[0] == 215  # the mean of the partial lengths, a lower bound
    assert not plan.keep_partial.any() and not pol.partial_resumes
    run = run_policy(TRACE, "oversample-restart", EngineParams(), batch_size=16)
    s = summarize(run, TRACE.epochs, TRACE.num_prompts)
    assert s["wasted_tokens_fraction"] > 0 and s["restarted_groups"] > 0 and s["stale_token_fraction"] == 0
    assert s["every_prompt_once_per_epoch"] and s["max_policy_versions"] == 1


def test_continue_requeues_at_the_front_and_resumes_at_most_max_resumes_times():
    pol = make_policy("best", num_rows=64, batch_size=8, response_length=1000, seed=0)
    ctl = pol.oversample
    assert (ctl.requeue, ctl.max_resumes) == ("continue", POLICIES["best"].max_resumes)
    assert ctl.max_resumes == 1
    pol.start_epoch(0)
    plan = pol.plan_step()
    lost = _lose(pol, plan, 5)
    assert pol.plan.remaining()[0] == lost and plan.keep_partial.tolist() == [i == 5 for i in range(len(plan.rows))]
    again = pol.plan_step()
    assert again.rows[0] == lost and again.resumes.tolist() == [1] + [0] * (len(again.rows) - 1)
    _lose(pol, again, 0)  # lost a second time after its one resume: the controller restarts it, at the back
    assert pol.plan.remaining()[-1] == lost and not again.keep_partial.any() and not pol.partial_resumes
    # when it comes up again it is a fresh group (no resume count), which may be resumed once again


def test_longest_first_priorities_put_resumed_groups_first_and_unknown_rows_at_the_prior():
    """priority=longest_first: minus the row's estimate, the population prior for rows not observed yet (not 0,
    which would run them after every known row), and RESUMED_PRIORITY for a group resuming its partial responses."""
    from recipe.sim.policies import RESUMED_PRIORITY

    register(dataclasses.replace(POLICIES["best"], name="test-best-longest-first", priority="longest_first"))
    try:
        pol = make_policy("test-best-longest-first", num_rows=64, batch_size=8, response_length=1000, seed=0)
    finally:
        del POLICIES["test-best-longest-first"]
    pol.start_epoch(0)
    lost = _lose(pol, pol.plan_step(), 5)
    again = pol.plan_step()
    assert again.rows[0] == lost and again.priority[0] == RESUMED_PRIORITY
    assert np.isnan(pol.estimates.get(again.rows[1:], fill_prior=False)).all()  # none observed yet (epoch 0)
    prior = pol.estimates.prior()  # the median of the 9 rows the first step observed
    assert prior > 0 and again.priority[1:].tolist() == [-prior] * (len(again.rows) - 1)


@pytest.mark.parametrize("max_resumes", [0, 1, 2, 10_000])
def test_continue_bounds_policy_versions(max_resumes):
    name = f"test-continue-{max_resumes}"
    register(PolicySpec(name, ema_decay=0.5, oversample_ratio=1.0, oversample_requeue="continue",
                        max_resumes=max_resumes))
    try:
        run = run_policy(TRACE, name, EngineParams(), batch_size=16)
    finally:
        del POLICIES[name]
    s = summarize(run, TRACE.epochs, TRACE.num_prompts)
    assert s["every_prompt_once_per_epoch"]
    versions = np.concatenate([st.versions for st in run.steps])  # per trained response, every epoch
    assert versions.max() <= max_resumes + 1 and s["max_policy_versions"] <= versions.max()
    stale = sum(st.stale_tokens for st in run.steps)
    if max_resumes == 0:  # continue without resumes: every aborted group restarts (at the front), on-policy
        assert stale == 0 and versions.max() == 1 and s["wasted_tokens_fraction"] > 0
    else:
        assert versions.max() == max_resumes + 1 or max_resumes > 3
        assert 0 < s["stale_token_fraction"] < 1 and 0 < s["resumed_response_fraction"] <= 1
    if max_resumes == 1:  # stale tokens come from the previous step only; groups lost twice restart (wasted)
        assert all(b.stale_tokens <= a.tokens for a, b in zip(run.steps, run.steps[1:]))
        assert s["restarted_groups"] > 0 and s["wasted_tokens_fraction"] > 0
    if max_resumes >= 10:  # effectively unbounded: nothing is thrown away, every desired token decoded once
        assert sum(st.wasted_tokens for st in run.steps) == 0
        assert sum(st.tokens for st in run.steps) == TRACE.lengths.sum()


@pytest.mark.parametrize("exponent", [0.0, 1.0])
def test_tail_cut_stops_stragglers_and_counts_them_truncated(tmp_path, exponent):
    """Each step ends once TailCut.finished_needed responses are done; every response it stops is trained as
    truncated (finish reason "abort", counted in truncated_fraction like a cap hit); with a level exponent the
    allowance follows the batch's level, so long batches leave more running than short ones."""
    register(dataclasses.replace(POLICIES["tailcut"], name="test-tailcut", tail_cut=0.9, tail_cut_exponent=exponent))
    register(dataclasses.replace(POLICIES["tailcut"], name="test-no-tailcut", tail_cut=1.0))
    try:
        run = run_policy(TRACE, "test-tailcut", EngineParams(), batch_size=16, previous=PREVIOUS,
                         record_path=tmp_path / "cut.jsonl")
        full = run_policy(TRACE, "test-no-tailcut", EngineParams(), batch_size=16, previous=PREVIOUS)
    finally:
        del POLICIES["test-tailcut"], POLICIES["test-no-tailcut"]
    assert sum(s.time_s for s in run.steps) < sum(s.time_s for s in full.steps)
    cut = TailCut(0.9, exponent)
    recs = [json.loads(line) for line in (tmp_path / "cut.jsonl").read_text().splitlines()]
    stopped = np.array([sum(f == "abort" for f in r["finish"]) for r in recs])
    level = np.array([np.nanmean(np.array(r["predicted"], dtype=float)) for r in recs])
    for rec, step, aborted in zip(recs, run.steps, stopped):
        assert step.truncated >= aborted and step.responses == len(rec["lengths"])
        if exponent == 0:  # the responses still running at the cut
            assert aborted <= len(rec["lengths"]) - cut.finished_needed(len(rec["lengths"]))
    warm = np.array([st.epoch > 0 for st in run.steps])
    s = summarize(run, TRACE.epochs, TRACE.num_prompts)
    assert stopped.sum() > 0
    assert s["truncated_fraction"] >= stopped[warm].sum() / sum(st.responses for st in run.steps if st.epoch > 0)
    if exponent > 0:
        long = level[warm] > np.median(level[warm])
        assert stopped[warm][long].mean() > stopped[warm][~long].mean()


def test_tail_cut_level_is_the_batch_level_at_planning():
    policy = make_policy("tailcut-level", num_rows=TRACE.num_prompts, batch_size=16,
                         response_length=TRACE.response_length, previous=PREVIOUS)
    policy.start_epoch(0)  # warm-started: epoch 0 already has estimates, and a level
    plan = policy.plan_step()
    every = policy.estimates.get(np.arange(TRACE.num_prompts), fill_prior=False)
    assert plan.cut_level == pytest.approx(np.nanmean(plan.predicted) / np.nanmean(every)) != 1.0
    plain = make_policy("tailcut", num_rows=TRACE.num_prompts, batch_size=16, response_length=TRACE.response_length,
                        previous=PREVIOUS)
    plain.start_epoch(0)
    assert plain.plan_step().cut_level == 1.0  # no exponent: no level


def test_tail_cut_with_over_sampling_is_refused():
    with pytest.raises(ValueError, match="tail_cut < 1 with oversample_ratio > 0"):
        dataclasses.replace(POLICIES["best"], name="x", tail_cut=0.98)


def test_determinism_and_seed_sensitivity():
    names = ["seed", "best", "oversample-restart"]
    a = simulate(TRACE, names, EngineParams(), batch_size=16, seed=1)["policies"]
    b = simulate(TRACE, names, EngineParams(), batch_size=16, seed=1)["policies"]
    c = simulate(TRACE, names, EngineParams(), batch_size=16, seed=2)["policies"]
    assert json.dumps(a) == json.dumps(b) and json.dumps(a) != json.dumps(c)


def test_oracle_orders_better_than_estimates():
    tr = T.generate("reference", num_prompts=512, n=16, epochs=2)
    by = {p["name"]: p for p in simulate(tr, ["seed-nocap", "oracle"], EngineParams(), batch_size=32)["policies"]}
    assert by["oracle"]["speedup_vs_baseline"] > by["seed-nocap"]["speedup_vs_baseline"] > 1.0
