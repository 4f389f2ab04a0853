"""The group drafter's figure under the engine's limits (recipe/sim/corpus_limits.py): homes, the texts an engine
keeps, and when a prompt comes back."""
import numpy as np
import pytest

from recipe.sim.corpus_limits import EngineLimits, engine_line, engine_tokens_per_step


def test_a_corpus_that_holds_one_group_per_home_prompt_keeps_every_history():
    lim = EngineLimits()  # 17,408 prompts x 16 over 4 engines: 69,632 texts an engine serves in an epoch
    assert lim.kept_share == 1.0 and lim.history_share == pytest.approx(0.957)
    assert engine_tokens_per_step(2.0, 1.5, lim) == pytest.approx(0.957 * 2.0 + 0.043 * 1.5)


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
    assert "**1.978**" in line and "2.000 with unlimited history" in line
    assert engine_line({"ngram:k=4:min=1:max=3": {"tokens_per_step": 1.3}}, EngineLimits()) == ""
    with pytest.raises(ValueError, match="engine limits"):
        EngineLimits(engines=0)
