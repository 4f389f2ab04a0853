"""recipe.core.tailcut: the cut the trainer asks during a step and the simulator applies to finish times agree."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recipe.core.tailcut import TailCut, batch_level


def test_finished_needed_leaves_the_allowed_share_running():
    cut = TailCut(0.985)
    assert cut.finished_needed(512) == 505  # 7 of 512 (1.5% = 7.68) may still run
    assert TailCut(1.0).finished_needed(512) == 512
    assert TailCut(0.5).finished_needed(1) == 1  # never fewer than one finished response
    assert TailCut(0.5).finished_needed(3) == 2


@pytest.mark.parametrize("fraction, launched, level, need", [
    (0.9, 10, 1.0, 9), (0.75, 4, 1.0, 3), (0.985, 200, 1.0, 197),  # fraction * launched is an integer
    (0.3, 10, 1.0, 3), (0.15, 20, 1.0, 3), (0.05, 20, 1.0, 1),  # ... that floats compute just above it
    (0.8, 10, 2.0, 6), (0.9, 15, 4.0, 9)])  # with level_exponent 1: (1 - 2 * 0.2) * 10, (1 - 4 * 0.1) * 15
def test_finished_needed_is_exact_where_the_share_is_a_whole_number(fraction, launched, level, need):
    """At a fraction of launched that is a whole number of responses, exactly that many must finish: not one more
    (float error: 10 * (1 - 0.7) is 3.0000000000000004), not one fewer; one fewer finished does not cut."""
    cut = TailCut(fraction, level_exponent=1.0)
    assert cut.finished_needed(launched, level) == need
    assert not cut.should_cut(need - 1, launched, level) and cut.should_cut(need, launched, level)
    assert cut.cut_time(np.arange(1.0, launched + 1), level) == need


def test_should_cut_once_enough_are_done_and_some_still_run():
    cut = TailCut(0.985)
    assert not cut.should_cut(504, 512)
    assert cut.should_cut(505, 512) and cut.should_cut(511, 512)
    assert not cut.should_cut(512, 512)  # nothing left to abort
    assert not TailCut(1.0).should_cut(511, 512)


def test_level_exponent_scales_the_allowance_per_batch():
    cut = TailCut(0.98, level_exponent=1.0)
    assert cut.finished_needed(500, level=1.0) == 490  # 2% at the mean level
    assert cut.finished_needed(500, level=2.0) == 480  # a batch twice as long may leave 4% running
    assert cut.finished_needed(500, level=0.5) == 495  # half as long: 1%
    assert cut.finished_needed(500, level=1e6) == 1  # the allowance saturates at the whole step
    assert TailCut(0.98).finished_needed(500, level=2.0) == 490  # exponent 0: level has no effect


def test_cut_time_is_the_finish_of_the_needed_response():
    assert TailCut(0.5).cut_time([4.0, 1.0, 3.0, 2.0]) == 2.0
    assert TailCut(1.0).cut_time([4.0, 1.0]) == 4.0
    assert TailCut(0.5, level_exponent=1.0).cut_time([4.0, 1.0, 3.0, 2.0], level=0.5) == 3.0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 1e4), min_size=1, max_size=300), st.floats(0.5, 1.0), st.floats(0.0, 2.0),
       st.floats(0.1, 5.0))
def test_cut_time_is_when_should_cut_first_says_yes(finish, fraction, exponent, level):
    """Replaying the finishes in order, the trainer's should_cut fires at cut_time (or never, when the step
    ends first)."""
    cut = TailCut(fraction, exponent)
    order = np.sort(finish)
    fired = next((t for i, t in enumerate(order, 1) if cut.should_cut(i, len(order), level)), order[-1])
    assert cut.cut_time(finish, level) == fired


def test_batch_level_is_relative_to_all_known_rows():
    assert batch_level([2000.0, 4000.0], [1000.0, 3000.0, np.nan, 8000.0]) == pytest.approx(3000.0 / 4000.0)
    assert batch_level([np.nan], [1000.0]) == 1.0  # nothing known about the batch
    assert batch_level([1000.0], [np.nan, np.nan]) == 1.0


@pytest.mark.parametrize("kwargs", [dict(fraction=0.0), dict(fraction=1.1), dict(fraction=0.9, level_exponent=-1),
                                    dict(fraction=0.9, level_exponent=math.inf)])
def test_bad_parameters_name_themselves(kwargs):
    with pytest.raises(ValueError, match="tail-cut"):
        TailCut(**kwargs)


def test_bad_step_arguments_are_errors():
    cut = TailCut(0.9)
    with pytest.raises(ValueError, match="launches at least one"):
        cut.finished_needed(0)
    with pytest.raises(ValueError, match="finished=513"):
        cut.should_cut(513, 512)
    with pytest.raises(ValueError, match="batch level"):
        cut.finished_needed(10, level=0.0)
    with pytest.raises(ValueError, match="at least one response"):
        cut.cut_time([])
