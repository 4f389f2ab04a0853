"""Policies drive recipe.core as the trainer does; every prompt is trained once per epoch; determinism."""
import json
import math

import numpy as np
import pytest

from recipe.core.cap import SeedCap
from recipe.sim import trace as T
from recipe.sim.engine import EngineParams
from recipe.sim.policies import POLICIES, make_policy
from recipe.sim.run import run_policy, simulate, summarize
from recipe.sim.tailcut import TailCut

TRACE = T.generate("reference", num_prompts=128, n=8, epochs=3)


@pytest.mark.parametrize("name", list(POLICIES))
def test_every_prompt_trained_once_per_epoch(name):
    run = run_policy(TRACE, name, EngineParams(), batch_size=16)
    s = summarize(run, TRACE.epochs, TRACE.num_prompts)
    assert s["every_prompt_once_per_epoch"] and s["prompts_trained_per_epoch"] == [128] * 3
    assert all(len(st.trained_rows) == 16 for st in run.steps)  # every step trains exactly one batch
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


def test_best_calibrated_cap_learns_and_binds():
    run = run_policy(TRACE, "best", EngineParams(), batch_size=16)
    caps = [st.caps[0] for st in run.steps]
    assert all(c == 0 for c in caps[:8]) and any(c > 0 for c in caps[8:])


def test_oversample_follows_the_trainer_protocol():
    """recipe.core's controller and EpochPlan.requeue drive it: losers are re-queued, trained later in the epoch
    (the controller's epoch accounting raises on a double training), and their partial lengths raise estimates."""
    pol = make_policy("oversample", num_rows=64, batch_size=8, response_length=1000, seed=0)
    pol.start_epoch(0)
    plan = pol.plan_step()
    assert len(plan.rows) == 9 and plan.keep == 8  # ceil(8 * 1.125)
    lengths = np.full((9, 2), 100)
    lengths[3] = [400, 30]  # lost the race: partial lengths
    kept = np.ones(9, bool)
    kept[3] = False
    stopped = np.zeros((9, 2), bool)
    stopped[3] = True
    pol.observe(plan, lengths, kept, stopped)
    lost = plan.rows[3]
    assert pol.plan.remaining()[-1] == lost and pol.estimates.censored[lost]
    assert pol.estimates.get([lost])[0] == 215  # the mean of the partial lengths, a lower bound
    run = run_policy(TRACE, "partial-rollout", EngineParams(), batch_size=16)
    assert sum(s.wasted_tokens for s in run.steps) == 0 and sum(s.tokens for s in run.steps) == TRACE.lengths.sum()
    s = summarize(run, TRACE.epochs, TRACE.num_prompts)
    assert s["resumed_group_fraction"] > 0 and 1 < s["max_policy_versions"] <= 4  # front: resumed next step
    restart = run_policy(TRACE, "oversample", EngineParams(), batch_size=16)
    assert sum(s.wasted_tokens for s in restart.steps) > 0


def test_tail_cut_stops_stragglers_and_counts_them_truncated():
    assert TailCut(0.5).cut_time([4.0, 1.0, 3.0, 2.0]) == 2.0
    assert TailCut(1.0).cut_time([4.0, 1.0]) == 4.0
    run = run_policy(TRACE, "tailcut", EngineParams(), batch_size=16)
    full = run_policy(TRACE, "best", EngineParams(), batch_size=16)
    assert sum(s.time_s for s in run.steps) < sum(s.time_s for s in full.steps)
    assert sum(s.truncated for s in run.steps) >= 0.02 * sum(s.responses for s in run.steps)


def test_determinism_and_seed_sensitivity():
    names = ["seed", "best", "oversample"]
    a = simulate(TRACE, names, EngineParams(), batch_size=16, seed=1)["policies"]
    b = simulate(TRACE, names, EngineParams(), batch_size=16, seed=1)["policies"]
    c = simulate(TRACE, names, EngineParams(), batch_size=16, seed=2)["policies"]
    assert json.dumps(a) == json.dumps(b) and json.dumps(a) != json.dumps(c)


def test_oracle_orders_better_than_estimates():
    tr = T.generate("reference", num_prompts=512, n=16, epochs=2)
    by = {p["name"]: p for p in simulate(tr, ["seed-nocap", "oracle"], EngineParams(), batch_size=32)["policies"]}
    assert by["oracle"]["speedup_vs_baseline"] > by["seed-nocap"]["speedup_vs_baseline"] > 1.0
