"""The tail cut at a truncation budget (``tailcut-budget``: recipe.core.tailcut_budget.TailCutBudget in the
simulator's policy) holds the extra truncation over baseline within half a point of the budget on every trace
shape, with no knob tuned per shape; a fixed fraction does not."""
import dataclasses

import pytest

from recipe.sim import trace as T
from recipe.sim.engine import EngineParams
from recipe.sim.policies import POLICIES, register
from recipe.sim.run import simulate

for _b in (0.005, 0.01):
    register(dataclasses.replace(POLICIES["tailcut-budget"], name=f"test-budget-{_b}", tail_cut_budget=_b,
                                 tail_cut=1 - 2.5 * _b))


def extra(shape: str, seed: int, names: list[str]) -> dict[str, float]:
    tr = T.generate(shape, num_prompts=256, n=16, epochs=3, seed=seed)
    by = {p["name"]: p for p in simulate(tr, names, EngineParams(), batch_size=32, seed=seed)["policies"]}
    base = by["baseline"]["truncated_fraction"]
    for nm in names:
        assert by[nm]["max_policy_versions"] == 1 and by[nm]["every_prompt_once_per_epoch"]
    return {nm: by[nm]["truncated_fraction"] - base for nm in names}


@pytest.mark.parametrize("shape", T.SHAPES)
def test_budget_held_within_half_a_point(shape):
    for seed in (0, 1):
        got = extra(shape, seed, ["test-budget-0.005", "test-budget-0.01", "tailcut-level"])
        assert abs(got["test-budget-0.01"] - 0.01) <= 0.005, (shape, seed, got)
        assert abs(got["test-budget-0.005"] - 0.005) <= 0.005, (shape, seed, got)
        assert got["test-budget-0.01"] > got["test-budget-0.005"]


def test_a_fixed_fraction_spends_a_different_budget_per_shape():
    level = {shape: extra(shape, 0, ["tailcut-level"])["tailcut-level"] for shape in ("reference", "heavy_tail")}
    assert level["reference"] - level["heavy_tail"] > 0.005  # the fixed 0.975 buys +0.9 vs +0.2 points
