"""The group drafter's figure under the engine's limits (recipe/sim/corpus_limits.py): homes, the texts an engine
keeps, and when a prompt comes back."""
import numpy as np
import pytest

from recipe.sim.corpus_limits import EngineLimits, engine_line, engine_tokens_per_step
from recipe.sim.routing import home_share


def test_a_corpus_that_holds_one_group_per_home_prompt_keeps_every_history():
    lim = EngineLimits()  # 17,408 prompts x 16 over 4 engines: 69,632 texts an engine serves in an epoch
    routed = home_share(17408, 16, 32, 4)["history"]  # the router's homes and guard (recipe/sim/routing.py)
    assert 0.9 < routed < 0.97
    assert lim.kept_share == 1.0 and lim.history_share == pytest.approx(routed, abs=1e-4)
    assert engine_tokens_per_step(2.0, 1.5, lim) == pytest.approx(lim.home * 2.0 + (1 - lim.home) * 1.5)


def test_an_engine_holds_more_steps_of_history_when_more_engines_share_a_step():
    """A step's batch x n texts are spread over the engines: 8 engines each finish half what 4 do, so the same
    ``kept`` holds twice the steps, and more of the prompts that come back (sampled as below)."""
    four, eight = EngineLimits(kept=10000, engines=4, home=1.0), EngineLimits(kept=10000, engines=8, home=1.0)
    assert four.history_steps == pytest.approx(10000 / (32 * 16 / 4))
    assert eight.history_steps == pytest.approx(2 * four.history_steps)
    rng = np.random.default_rng(1)
    steps = four.prompts / four.batch
    gap = steps - rng.uniform(0, steps, 200000) + rng.uniform(0, steps, 200000)
    for lim in (four, eight, EngineLimits(kept=10000, engines=2, home=1.0)):
        assert lim.kept_share == pytest.approx(np.mean(gap <= lim.history_steps), abs=0.005)


def test_a_smaller_corpus_keeps_the_prompts_that_come_back_soonest():
    """A prompt comes back after S - U1 + U2 steps of two shuffled epochs: the share kept, checked by sampling."""
    lim = EngineLimits(kept=10000, home=1.0)  # 78 of an epoch's 544 steps: ~1%
    rng = np.random.default_rng(0)
    steps = lim.prompts / lim.batch
    gap = steps - rng.uniform(0, steps, 200000) + rng.uniform(0, steps, 200000)
    for kept in (10000, 40000, 60000):
        lim = EngineLimits(kept=kept, home=1.0)
        assert lim.kept_share == pytest.approx(np.mean(gap <= lim.history_steps), abs=0.005)
    assert EngineLimits(kept=10000, home=0.25).history_share < 0.01  # the router before issue 34 (LRU, cleared)


def test_the_line_names_both_figures_and_needs_both_drafters():
    report = {"suffix:own+group:k=4:depth=8:min=1": {"tokens_per_step": 1.5},
              "suffix:own+group+history:k=4:depth=8:min=1": {"tokens_per_step": 2.0}}
    line = engine_line(report, EngineLimits())
    assert f"**{engine_tokens_per_step(2.0, 1.5, EngineLimits()):.3f}**" in line
    assert "2.000 with unlimited history" in line
    assert engine_line({"ngram:k=4:min=1:max=3": {"tokens_per_step": 1.3}}, EngineLimits()) == ""
    with pytest.raises(ValueError, match="engine limits"):
        EngineLimits(engines=0)
