"""The foresight cut (recipe/sim/foresight.py), the reference bench/cut_ceiling.py measures realisable cuts against:
its per-step choice is the best trade-off, it replaces only a tail-cut policy's rule, and knowing the future it is at
least as fast as the count rule at the same truncation."""
import functools
from pathlib import Path

import numpy as np
import pytest

from recipe.sim import trace as T
from recipe.sim.engine import EngineParams
from recipe.sim.foresight import ForesightCutExecutor, best_cut_time
from recipe.sim.run import run_policy
from harness.script_module import load_script

ROOT = Path(__file__).resolve().parents[2]
TRACE = T.generate("reference", num_prompts=128, n=8, epochs=3)
PREVIOUS = TRACE.previous_run()


@functools.cache
def _bench():
    return load_script(ROOT / "bench" / "cut_ceiling.py")


def _brute(finish, natural, lam):
    """Every cut time, by definition: saved time minus lam per natural response still running."""
    return max(((finish.max() - t) - lam * np.sum(natural & (finish > t)), -t) for t in np.unique(finish))


@pytest.mark.parametrize("lam", [0.0, 0.5, 3.0, 1e6])
def test_best_cut_time_is_the_best_trade_off(lam):
    rng = np.random.default_rng(7)
    for _ in range(50):
        finish = np.round(rng.lognormal(3.0, 0.6, size=int(rng.integers(1, 40))), 0)  # rounded: ties happen
        natural = rng.random(finish.size) < 0.8
        t = best_cut_time(finish, natural, lam)
        assert t in finish
        value = (finish.max() - t) - lam * np.sum(natural & (finish > t))
        assert value == pytest.approx(_brute(finish, natural, lam)[0])
    assert best_cut_time([5.0, 1.0, 9.0], [True, True, True], 1e6) == 9.0  # nothing is worth a truncation
    assert best_cut_time([5.0, 1.0, 9.0], [True, True, False], 1e6) == 5.0  # a limit-bound straggler is free


def test_a_cut_at_tied_finishes_stops_none_of_them():
    """Responses finishing at the same time as the cut are done, not cut: at lam 2 a cut at 4 (after the three tied
    finishes at 4) saves 6 s for the one natural response at 10, worth 4; were the tied ones counted as still
    running, the cut at 4 would be worth 6 - 2 * 3 = 0, less than a cut at 1 (9 - 2 * 4 = 1)."""
    finish, natural = np.array([4.0, 1.0, 10.0, 4.0, 4.0]), np.ones(5, bool)
    assert best_cut_time(finish, natural, 2.0) == 4.0 == -_brute(finish, natural, 2.0)[1]
    assert best_cut_time([4.0, 1.0, 4.0], [True, True, True], 2.0) == 4.0  # a tie at the end: no cut, nothing stopped
    # a tie after the cut: both are running, and only a natural one is charged
    assert best_cut_time([1.0, 2.0, 9.0, 9.0], [True, True, True, False], 5.0) == 2.0  # 7 - 5 > 0
    assert best_cut_time([1.0, 2.0, 9.0, 9.0], [True, True, True, True], 5.0) == 9.0  # 7 - 2 * 5 < 0


def test_best_cut_time_rejects_bad_input():
    with pytest.raises(ValueError, match="one natural flag per finish time"):
        best_cut_time([1.0, 2.0], [True], 1.0)
    with pytest.raises(ValueError, match="lam .* must be >= 0"):
        best_cut_time([1.0], [True], -1.0)


def test_it_replaces_the_cut_and_nothing_else():
    """At a lam no natural truncation is worth, the foresight cut still stops responses bound for the limit (free:
    truncated either way), and only those: the same responses are truncated as without a cut, and epoch 0 (its
    batches fixed by the warm start) is no slower step by step. At lam 0 every step ends at its first finish."""
    eng = EngineParams()
    free = run_policy(TRACE, "tailcut-level", eng, batch_size=16, previous=PREVIOUS,
                      executor=ForesightCutExecutor(eng, lam=1e9))
    uncut = run_policy(TRACE, "onpolicy-order", eng, batch_size=16, previous=PREVIOUS)
    assert sum(s.truncated for s in free.steps) == sum(s.truncated for s in uncut.steps) == np.sum(
        TRACE.lengths == TRACE.response_length)
    first = [(a.time_s, b.time_s) for a, b in zip(free.steps, uncut.steps) if a.epoch == 0]
    assert all(a <= b for a, b in first) and any(a < b for a, b in first)
    eager = run_policy(TRACE, "tailcut-level", eng, batch_size=16, previous=PREVIOUS,
                       executor=ForesightCutExecutor(eng, lam=0.0))
    assert all(a.time_s < b.time_s for a, b in zip(eager.steps, uncut.steps))
    assert sum(s.truncated for s in eager.steps) > 0.9 * sum(s.responses for s in eager.steps)


def test_foresight_is_at_least_as_fast_as_the_count_rule_at_its_truncation():
    bench = _bench()
    s = bench.Seeded("reference", 0, batch_size=16, num_prompts=128, n=8, epochs=3)
    count = s.entry("tailcut-level")
    fore = s.fastest_within("tailcut-level", count["extra"])
    assert fore["extra"] <= count["extra"] + 1e-12 and fore["speedup"] >= count["speedup"]
    rows = bench.measure("reference", [0], batch_size=16, num_prompts=128, n=8, epochs=3)
    assert rows[0]["count_rule"] == count and rows[0]["foresight_equal"]["speedup"] == fore["speedup"]
    text = bench.section("reference", [0], rows)
    assert "| 0 | " in text and "| mean | " in text and bench.COMMAND in text
    # the breakdown replays that run: every response that would have ended with EOS and was cut is extra truncation
    # (the limit-bound ones are truncated in the baseline too), so its steps add up to the run's extra truncation
    steps = rows[0]["steps"]
    assert len(steps) == 2 * 128 // 16  # epochs 1-2, every step
    cut_natural = sum(st["foresight"][1] for st in steps)
    assert cut_natural / (2 * 128 * 8) == pytest.approx(fore["extra"], abs=1e-5)  # summarize rounds to 5 places
    assert all(0 <= st[c][1] <= st[c][0] and st[c][2] >= 0 and st[c][3] >= 0 for st in steps for c in bench.CUTS)
    assert "| batch level | steps |" in text
