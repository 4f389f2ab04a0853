"""recipe.core.tailcut_budget.TailCutBudget: the Kaplan-Meier cost of a cut, and the controller that holds a budget
(tightens after too much estimated extra truncation, loosens after too little)."""
import numpy as np
import pytest

from recipe.core.step_stats import StepResponses
from recipe.core.tailcut import TailCut
from recipe.core.tailcut_budget import TailCutBudget

R = 16384


def step(lengths, predicted=4000.0, aborted=None) -> StepResponses:
    lengths = np.asarray(lengths, dtype=np.int64)
    n = len(lengths)
    return StepResponses(rows=np.arange(n), lengths=lengths, caps=np.zeros(n, np.int64),
                         predicted=np.full(n, predicted), response_length=R,
                         aborted=None if aborted is None else np.asarray(aborted, bool))


def history(ctl: TailCutBudget, steps: int = 4, limit_share: float = 0.0, seed: int = 0) -> None:
    """Uncut steps of 512 responses, lognormal around the estimate; ``limit_share`` of them run into the limit."""
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        lengths = np.minimum(rng.lognormal(np.log(4000), 0.4, 512), R - 1).astype(np.int64)
        lengths[: int(limit_share * 512)] = R
        ctl.observe(step(lengths))


def test_validation_and_the_first_rule():
    for bad in (0.0, 1.0, -0.1, float("nan")):
        with pytest.raises(ValueError, match="budget"):
            TailCutBudget(bad)
    with pytest.raises(ValueError, match="horizon"):
        TailCutBudget(0.01, horizon=0)
    ctl = TailCutBudget(0.01, 1.25, initial_allowance=0.025)
    cut = ctl.cut()
    assert isinstance(cut, TailCut) and cut.fraction == pytest.approx(0.975) and cut.level_exponent == 1.25
    assert TailCutBudget(0.01).allowance == pytest.approx(0.025)  # default start: 2.5 x the budget


def test_cost_of_a_cut_from_the_survival_curve():
    ctl = TailCutBudget(0.01)
    # nothing observed yet: every cut response counts as extra truncation (conservative)
    assert ctl.p_eos_after(np.array([120]), np.array([200])).tolist() == [1.0]
    history(ctl, limit_share=0.0)
    # responses of 2x their estimate when the curve has seen everything end with EOS well before the limit: bound
    # for EOS; at the limit itself nothing is left to end
    u2, ulim = ctl._bin(2.0), ctl._bin(R / 4000)
    assert ctl.p_eos_after(np.array([u2]), np.array([ulim]))[0] > 0.95
    ctl2 = TailCutBudget(0.01)
    history(ctl2, limit_share=0.3)  # 30% of the responses run into the limit: a long straggler likely does too
    p = ctl2.p_eos_after(np.array([u2]), np.array([ulim]))[0]
    assert 0.0 < p < 0.5


def test_tightens_after_too_much_extra_truncation():
    ctl = TailCutBudget(0.01, initial_allowance=0.025)
    history(ctl)
    before = ctl.allowance
    rng = np.random.default_rng(1)
    for _ in range(3):  # each step cuts 40 of 512 responses at ~1.2x their estimate: ~8% extra, budget 1%
        lengths = np.minimum(rng.lognormal(np.log(4000), 0.4, 512), R - 1).astype(np.int64)
        aborted = np.zeros(512, bool)
        aborted[:40] = True
        lengths[:40] = 4800
        m = ctl.observe(step(lengths, aborted=aborted))
    assert m["rollout/tail_cut/est_extra_truncation_step"] > 0.05
    assert ctl.allowance < before / 2 and ctl.cut().fraction > 1 - before / 2


def test_loosens_after_too_little():
    ctl = TailCutBudget(0.01, initial_allowance=0.025)
    history(ctl, steps=1)
    before = ctl.allowance
    history(ctl, steps=3, seed=2)  # no cut at all: the budget is unspent
    assert ctl.allowance > before
    # cuts that the curve says were bound for the limit anyway cost (almost) nothing: it loosens too
    ctl2 = TailCutBudget(0.01, initial_allowance=0.025)
    history(ctl2, limit_share=0.5)
    start = ctl2.allowance
    lengths = np.full(512, 3000)
    aborted = np.zeros(512, bool)
    aborted[:20] = True
    lengths[:20] = 15000  # stopped just short of the limit, where half of all responses end at the limit
    ctl2.observe(step(lengths, aborted=aborted))
    assert ctl2.allowance > 0.9 * start


def test_state_round_trip():
    ctl = TailCutBudget(0.01, 1.25)
    history(ctl)
    other = TailCutBudget(0.01, 1.25)
    other.load_state_dict(ctl.state_dict())
    assert other.allowance == ctl.allowance and other.extra == ctl.extra and other.responses == ctl.responses
    a = step(np.full(512, 4000))
    assert ctl.observe(a) == other.observe(a)
