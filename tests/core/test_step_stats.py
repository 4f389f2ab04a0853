"""Censoring flags and step metrics from one step's responses."""
import numpy as np
import pytest

from recipe.core.estimates import reduce_groups
from recipe.core.step_stats import StepResponses, group_tails, step_metrics


def _resp(**kw):
    base = dict(rows=[0, 0, 1, 1], lengths=[100, 4000, 300, 500], caps=[4000] * 4,
                predicted=[1000.0, 1000.0, 400.0, 400.0], response_length=8192)
    base.update(kw)
    return StepResponses(**base)


def test_censoring_flags():
    r = _resp(lengths=[100, 4000, 300, 8192], caps=[4000, 4000, 0, 0])
    assert r.cap_hit().tolist() == [False, True, False, False]
    assert r.censored().tolist() == [False, True, False, True]
    r2 = _resp(aborted=[False, False, True, False])
    assert r2.censored().tolist() == [False, True, True, False]


def test_step_metrics_values():
    r = _resp()
    obs = reduce_groups(r.rows, r.lengths, r.censored(), "mean")
    m = step_metrics(r, obs)
    assert m["rollout/response_max_tokens_cap"] == 4000
    assert m["rollout/cap_hit_ratio"] == 0.25
    assert m["rollout/response_length/max_over_median"] == pytest.approx(4000 / 400)
    assert m["sampler/batch_pred_mean"] == pytest.approx(700)
    assert m["sampler/batch_pred_spread"] == pytest.approx(600)
    # row 0 is censored (cap hit) and excluded; row 1: |400 - 400| / 400 = 0
    assert m["sampler/pred_abs_rel_error"] == pytest.approx(0.0)


def test_metrics_without_cap_or_predictions():
    r = _resp(caps=[0] * 4, predicted=[np.nan] * 4)
    m = step_metrics(r, None)
    assert m["rollout/response_max_tokens_cap"] == 0.0
    assert "sampler/batch_pred_mean" not in m


def test_group_tails_are_maxima_with_censoring():
    t = group_tails(_resp())
    assert t.value.tolist() == [4000, 500] and t.censored.tolist() == [True, False]


def test_mismatched_lengths_are_rejected():
    with pytest.raises(ValueError, match="one entry per response"):
        StepResponses(rows=[0], lengths=[1, 2], caps=[0], predicted=[0.0], response_length=10)
