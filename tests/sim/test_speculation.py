"""recipe.sim.speculation: the roofline of verifying k draft tokens on Qwen3-30B-A3B, its break-even acceptance
lengths against hand computation and the probe's table, and what it does to the engine model and the policies."""
import dataclasses

import numpy as np
import pytest

from recipe.sim import trace as T
from recipe.sim.engine import EngineParams, simulate_step
from recipe.sim.policies import POLICIES, PolicySpec
from recipe.sim.run import simulate
from recipe.sim.speculation import (DENSE_BYTES, EXPERT_BYTES, FLOP_PER_CTX, FLOP_PER_TOKEN, KV_BYTES, AcceptanceCurve,
                                    SpecCost, Speculation, acceptance_rate, expected_acceptance, experts_touched,
                                    needed_tau)

PROBE = dict(tp=1, bandwidth=4e12, flops=6e14, t0=1e-3, rho=0.6)  # REPORT.md section 4's example


def test_model_constants():
    assert DENSE_BYTES == pytest.approx(2.434e9, rel=1e-3) and EXPERT_BYTES == 9_437_184 and KV_BYTES == 98_304
    assert FLOP_PER_TOKEN == pytest.approx(6.06e9, rel=1e-3) and FLOP_PER_CTX == 786_432
    assert experts_touched(1) == pytest.approx(8.0) and experts_touched(1e4) == pytest.approx(128.0)


def test_break_even_by_hand():
    # B=1, k=4, ctx 12000, rho 0.6, TP1, 4 TB/s, 600 TFLOP/s, t0 1 ms; both steps memory-bound:
    # k=0: 8 experts; M = 2.4343e9 + 48 x 8 x 9.437e6 + 12000 x 98304 = 7.2377e9 B -> 1.8094 ms, t = 2.8094 ms
    # k=4: 128 (1 - (15/16)^3.4) = 25.219 experts; M = 15.038e9 B -> 3.7594 ms, t = 4.7594 ms; tau* = 1.694
    c = SpecCost(tau=2.0, k=4, **PROBE)
    assert float(c.step_time(1, 0, 12000)) == pytest.approx(2.8094e-3, rel=1e-3)
    assert float(c.step_time(1, 4, 12000)) == pytest.approx(4.7594e-3, rel=1e-3)
    assert float(c.break_even(1, 12000)) == pytest.approx(1.694, abs=0.002)
    # the probe's table (REPORT.md: 1.69 at B=1, 1.85 at B=4, 1.30 at 16, 1.08 at 32, 1.01 at B>=64)
    got = [round(float(c.break_even(b, 12000)), 2) for b in (1, 4, 16, 32, 64)]
    assert got == [1.69, 1.85, 1.30, 1.08, 1.01]
    assert float(c.speedup(1, 12000)) == pytest.approx(2.0 / 1.694, abs=0.002)
    # a compute-bound case: B=512, k=7 at TP1 (C / FL > M / BW)
    b, k, ctx = 512, 7, 1000
    mem = (DENSE_BYTES + 48 * float(experts_touched(b * (1 + 0.6 * k))) * EXPERT_BYTES + b * ctx * KV_BYTES) / 4e12
    flop = b * (1 + k) * (FLOP_PER_TOKEN + FLOP_PER_CTX * ctx) / 6e14
    assert flop > mem and float(c.step_time(b, k, ctx)) == pytest.approx(1e-3 + flop)


def test_monotone():
    c = SpecCost(tau=2.0, k=3)
    b = np.arange(1, 257)
    t = c.step_time(b, 3, 6000)
    assert (np.diff(t) > 0).all()  # more sequences, more time
    assert (c.step_time(8, np.arange(0, 8), 6000)[1:] > c.step_time(8, np.arange(0, 8), 6000)[:-1]).all()  # more drafts
    assert (np.diff(experts_touched(np.arange(1, 100))) > 0).all()
    be = c.break_even(b, 6000)
    assert (be >= 1).all() and be[-1] < 1.01 and be[:8].max() > 1.3  # dearest at small batch (the expert tax)
    assert float(c.break_even(4, 6000)) > float(SpecCost(tau=2.0, k=3, rho=0.3).break_even(4, 6000))
    assert float(SpecCost(k=3, tau=2.5).speedup(16, 6000)) > float(SpecCost(k=3, tau=2.0).speedup(16, 6000))


def test_acceptance_helpers_and_validation():
    for k, a in ((3, 0.6), (4, 0.8)):
        assert acceptance_rate(expected_acceptance(a, k), k) == pytest.approx(a, abs=1e-6)
    assert expected_acceptance(1.0, 3) == 4.0
    with pytest.raises(ValueError):
        SpecCost(tau=4.5, k=3)
    with pytest.raises(ValueError):
        SpecCost(tau=0.9)
    assert needed_tau(lambda t: t, 2.5) == pytest.approx(2.5, abs=0.01)
    assert needed_tau(lambda t: t / 10, 1.5) is None


def test_schedule_factor():
    bare = dict(sync_penalty=0.0, draft_s_per_token=0.0, graph_penalty=0.0)
    c = SpecCost(tau=2.0, k=3, **bare)
    always, tail = Speculation(c), Speculation(c, max_batch=16)
    r = np.array([1, 8, 16, 17, 128])
    f = always.factor(r, np.full(5, 6000.0))
    assert np.allclose(f, c.break_even(r, 6000) / 2.0)
    assert np.allclose(tail.factor(r, np.full(5, 6000.0)), np.where(r <= 16, f, 1.0))
    # async scheduling off: every step of the run, drafting or not; the graph penalty: the tail schedule's run only
    pen = Speculation(dataclasses.replace(c, sync_penalty=0.1, graph_penalty=0.03), max_batch=16)
    assert np.allclose(pen.factor(r, np.full(5, 6000.0)), 1.13 * tail.factor(r, np.full(5, 6000.0)))
    assert np.allclose(Speculation(dataclasses.replace(c, sync_penalty=0.1, graph_penalty=0.03)).factor(r, 6000.0),
                       1.1 * f)
    # CPU drafting: seconds per context token of each drafting sequence, added to the verify step
    d = Speculation(dataclasses.replace(c, draft_s_per_token=1e-9))
    want = (c.step_time(r, 3, 6000) + 1e-9 * r * 6000) / (2.0 * c.step_time(r, 0, 6000))
    assert np.allclose(d.factor(r, 6000.0), want)
    assert SpecCost().sync_penalty > 0 and SpecCost().draft_s_per_token > 0  # charged by default
    # a corpus drafter: seconds per token each drafting sequence emits (tau per step), whatever the context
    g = Speculation(dataclasses.replace(c, draft_s_per_new_token=2e-5))
    want = (c.step_time(r, 3, 6000) + 2e-5 * r * 2.0) / (2.0 * c.step_time(r, 0, 6000))
    assert np.allclose(g.factor(r, 6000.0), want)
    with pytest.raises(ValueError, match="draft_s_per_new_token"):
        SpecCost(draft_s_per_new_token=-1.0)


def test_measured_curve_replaces_tau_by_position():
    bare = dict(sync_penalty=0.0, draft_s_per_token=0.0, graph_penalty=0.0)
    report = {"ngram:k=4:min=1:max=3": {
        "groups": 10, "steps": 100, "draft_tokens": 200, "tokens_per_step": 1.5,
        "by_position": [{"from": 0, "to": 256, "tokens_per_step": 1.2},
                        {"from": 256, "to": 1024, "tokens_per_step": 2.0},
                        {"from": 1024, "to": None, "tokens_per_step": None}]}}
    curve = AcceptanceCurve.from_report(report, "ngram:k=4:min=1:max=3")
    assert curve.tau == (1.2, 2.0, 2.0) and curve.drafted == (2.0, 2.0, 2.0)  # an empty bucket takes the one before
    c = SpecCost(curve=curve, prompt_len=100, **bare)
    s = Speculation(c)
    ctx = np.array([100.0, 355.0, 356.0, 5000.0])  # positions 0, 255, 256, 4900
    want = c.step_time(8, 2.0, ctx) / (np.array([1.2, 1.2, 2.0, 2.0]) * c.step_time(8, 0, ctx))
    assert np.allclose(s.factor(8, ctx), want)
    # at a measured 1.0 token per step speculation can only lose
    flat = SpecCost(curve=AcceptanceCurve((0,), (1.0,), (4.0,)), **bare)
    assert (Speculation(flat).factor(np.arange(1, 300), 6000.0) > 1).all()
    with pytest.raises(ValueError, match="not in the acceptance report"):
        AcceptanceCurve.from_report(report, "suffix:own")
    with pytest.raises(ValueError, match=">= 1"):
        AcceptanceCurve((0,), (0.5,), (1.0,))
    # the simulator runs on it: a better curve is faster
    eng = EngineParams(replicas=2)
    good = SpecCost(curve=AcceptanceCurve((0,), (2.0,), (3.0,)))
    bad = SpecCost(curve=AcceptanceCurve((0,), (1.05,), (3.0,)))
    sp = {cc: {p["name"]: p for p in simulate(TRACE, ["best-onpolicy-spec"], eng, batch_size=16,
                                              spec_cost=cc)["policies"]}["best-onpolicy-spec"]["speedup_vs_baseline"]
          for cc in (good, bad)}
    assert sp[good] > sp[bad]


def test_engine_step_with_speculation():
    p = EngineParams(replicas=1, kv_tokens=None)
    lengths = np.full(64, 2000)
    plain = simulate_step(lengths, p, np.random.default_rng(0))
    c = SpecCost(tau=2.0, k=3, draft_s_per_token=0.0)  # a factor linear enough in the context for the mean
    fast = simulate_step(lengths, p, np.random.default_rng(0), speculation=Speculation(c))
    f = float(Speculation(c).factor(64, p.prompt_len + 1000))
    assert fast.time_s == pytest.approx((plain.time_s - p.prefill_tok_s * 64 * p.prompt_len) * f
                                        + p.prefill_tok_s * 64 * p.prompt_len, rel=0.01)
    # tokens_by stays consistent with the faster clock: at the faster step's half time about half is decoded
    assert fast.tokens_by(fast.time_s / 2).mean() == pytest.approx(plain.tokens_by(plain.time_s / 2).mean(), rel=0.02)
    # a schedule that never drafts at this batch changes nothing
    bare = dataclasses.replace(c, sync_penalty=0.0, graph_penalty=0.0)
    off = simulate_step(lengths, p, np.random.default_rng(0), speculation=Speculation(bare, max_batch=8))
    assert off.time_s == pytest.approx(plain.time_s)
    # ... but for the run-wide costs: async scheduling off and the schedule's CUDA graphs, on every decode step
    off = simulate_step(lengths, p, np.random.default_rng(0), speculation=Speculation(c, max_batch=8))
    prefill = p.prefill_tok_s * 64 * p.prompt_len
    assert off.time_s - prefill == pytest.approx((plain.time_s - prefill) * (1 + c.sync_penalty + c.graph_penalty))
    # with KV pressure (the event-driven path) the speed-up is the same factor
    small = dataclasses.replace(p, kv_tokens=60_000)
    a = simulate_step(lengths, small, np.random.default_rng(0))
    b = simulate_step(lengths, small, np.random.default_rng(0), speculation=Speculation(c))
    assert a.num_preempted.sum() > 0 and b.time_s < a.time_s * 0.75


TRACE = T.generate("reference", num_prompts=128, n=8, epochs=3)


def test_spec_policies_are_on_policy_and_ordered_by_schedule():
    names = ["tailcut-budget-spec-off", "onpolicy-spec-tail", "best-onpolicy-spec"]
    eng = EngineParams(replicas=2)  # 64 sequences per replica at a step's start: above the tail schedule's 32
    by = {p["name"]: p for p in simulate(TRACE, names, eng, batch_size=16, spec_cost=SpecCost(tau=2.0))["policies"]}
    for nm in names:
        assert by[nm]["max_policy_versions"] == 1 and by[nm]["stale_token_fraction"] == 0
        assert by[nm]["every_prompt_once_per_epoch"]
    assert by["tailcut-budget-spec-off"]["speedup_vs_baseline"] < by["onpolicy-spec-tail"]["speedup_vs_baseline"] \
        < by["best-onpolicy-spec"]["speedup_vs_baseline"]
    assert POLICIES["best-onpolicy-spec"].speculate == "always" and POLICIES["best-onpolicy-spec"].tail_cut_budget
    # no gain at acceptance length 1 (every verify step costs at least a decode step)
    one = {p["name"]: p for p in simulate(TRACE, ["best-onpolicy-spec", "tailcut-budget-spec-off"], EngineParams(),
                                          batch_size=16, spec_cost=SpecCost(tau=1.0))["policies"]}
    assert one["best-onpolicy-spec"]["speedup_vs_baseline"] \
        <= one["tailcut-budget-spec-off"]["speedup_vs_baseline"] + 1e-3
    with pytest.raises(ValueError, match="speculate"):
        PolicySpec("x", speculate="tail")
    with pytest.raises(ValueError, match="tail_cut_budget"):
        PolicySpec("x", tail_cut_budget=0.01)


def test_cli_reports_the_acceptance_length_it_assumes():
    import json
    import subprocess
    import sys
    from pathlib import Path

    out = subprocess.run([sys.executable, "-m", "recipe.sim", "--json", "--prompts", "64", "--n", "4", "--epochs", "2",
                          "--batch-size", "16", "--policies", "best-onpolicy-spec,onpolicy-spec-tail",
                          "--acceptance-length", "2.73", "--gpu", "h200"],
                         cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    assert rep["speculation"]["acceptance_length"] == 2.73
    assert "Cohere" in rep["speculation"]["acceptance_length_source"]
    assert rep["speculation"]["bandwidth"] == 4.0e12
    bad = subprocess.run([sys.executable, "-m", "recipe.sim", "--acceptance-length", "5"],
                         cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "acceptance length" in bad.stderr


def test_ragged_drafts_pay_the_graph_fallback_on_every_step():
    """A model-free drafter proposes 0..K tokens per request: vLLM's uniform-decode FULL graphs do not apply, so the
    PIECEWISE penalty is charged on every step, not only under a batch-size schedule."""
    from recipe.sim.speculation import SpecCost, Speculation

    flat = SpecCost(tau=2.0, k=4)
    ragged = SpecCost(tau=2.0, k=4, ragged_drafts=True)
    f, g = Speculation(flat).factor(64, 3000), Speculation(ragged).factor(64, 3000)
    assert g == pytest.approx(f * (1 + flat.sync_penalty + flat.graph_penalty) / (1 + flat.sync_penalty))


def test_group_affinity_places_groups_at_home_as_the_router():
    """placement="group" routes as recipe/sim/routing.py (tests/sim/test_routing.py checks it against the router):
    groups at their rows' homes, whole while the guard does not act (8 groups x 4 responses: at most 32 apart)."""
    import numpy as np

    from recipe.sim.engine import EngineParams, simulate_step
    from recipe.sim.routing import homes

    rng = np.random.default_rng(0)
    rows = np.arange(100, 108)
    groups = np.repeat(rows, 4)
    lengths = np.random.default_rng(1).integers(100, 4000, 32)
    t = simulate_step(lengths, EngineParams(), np.random.default_rng(2), placement="group", groups=groups)
    assert (t.replica == homes(groups, 4)).all()
    with pytest.raises(ValueError, match="needs the group"):
        simulate_step(lengths, EngineParams(), rng, placement="group")
