"""recipe.adapter.warm_start on its own: an earlier run's length traces (written by the real ``LengthTraceWriter``)
and a per-row prior column, read into this run's estimates and cap with the run's real ``RecipeSettings``. ``Rows``
stands in for the recipe's dataset (only its prompt keys and columns are read); the trainer-level path, with verl's
dataset, is in test_trainer_hooks.py."""
import numpy as np
import pytest

from recipe.adapter.warm_start import matched_entries, warm_start
from recipe.core.cap import WARM_EPOCH, BudgetCap
from recipe.core.estimates import LengthEstimates
from recipe.core.time_key import TimeKeyEstimates
from recipe.settings import SAMPLER_CLASS_NAME, SAMPLER_CLASS_PATH, parse_settings
from recipe.traces import LengthTraceWriter, prompt_key

RL = 64


class Rows:
    """The dataset as warm start reads it: one prompt per row, and named columns."""

    def __init__(self, num_rows, **columns):
        self.keys = [prompt_key([{"role": "user", "content": f"question {i}"}]) for i in range(num_rows)]
        self.columns = columns

    def prompt_keys(self):
        return self.keys

    def column(self, name):
        return self.columns[name]


def settings(response_length=RL, **sampler):
    return parse_settings({"data": {"train_batch_size": 1, "max_response_length": response_length, "sampler": {
        "class_path": SAMPLER_CLASS_PATH, "class_name": SAMPLER_CLASS_NAME, **sampler}}})


def write(path, data, epoch, rows, lengths, finish, cap=None, response_length=RL, turns=None):
    with LengthTraceWriter(path) as w:
        w.append(epoch=epoch, step=epoch + 1, cap=cap, response_length=response_length, gen_time_s=1.0, rows=rows,
                 sample_index=[0] * len(rows), lengths=lengths, finish=finish,
                 prompt_keys=[data.keys[r] for r in rows], turns=turns)


def test_responses_stopped_by_a_cap_or_the_tail_cut_below_the_limit_are_lower_bounds(tmp_path):
    """``cap`` and ``cut`` entries end below the length limit, so only their finish reason says they were
    stopped: they must seed lower bounds (censored), like ``length`` and ``abort`` entries, unlike ``eos`` ones."""
    data, path = Rows(5), tmp_path / "length_traces.jsonl"
    write(path, data, 0, [0, 1, 2, 3, 4], [20, 32, 10, RL, 5], ["eos", "cap", "cut", "length", "abort"], cap=32)
    e = matched_entries(str(path), data.prompt_keys())
    assert e["rows"].tolist() == [0, 1, 2, 3, 4]
    assert e["censored"].tolist() == [False, True, True, True, True]
    est = LengthEstimates(5)
    report = warm_start(est, None, data, settings(init_from=str(tmp_path)))
    assert (report.rows, report.responses) == (5, 5)
    assert est.value.tolist() == [20, 32, 10, RL, 5] and est.censored.tolist() == [False, True, True, True, True]


def test_prior_column_drops_zero_missing_and_negative_values(tmp_path):
    """A prior column may hold 0, nulls, NaN or negative numbers for rows nobody measured: those rows get no prior
    (they keep the population prior) instead of stopping the run or claiming a length of 0."""
    data = Rows(6, expected=[250.0, 0, None, -3.0, float("nan"), 80])
    est = LengthEstimates(6)
    report = warm_start(est, None, data, settings(prior_column="expected"))
    assert report.prior_rows == 2 and report.rows == 0 and report.source == ""
    assert np.array_equal(est.row_prior, [250.0, np.nan, np.nan, np.nan, np.nan, 80.0], equal_nan=True)
    assert est.get(np.arange(6)).tolist() == [250.0, 165.0, 165.0, 165.0, 165.0, 80.0]  # the rest: the median


def test_the_cap_is_calibrated_with_the_runs_ema_decay_and_statistic(tmp_path):
    """warm start hands the cap's replay ``data.sampler.ema_decay`` and ``statistic`` (0.9 and max here, neither a
    default): three epochs, so the decay shapes the last epoch's predictions, and unequal responses, so the
    statistic does. The estimates themselves come from the first epoch only."""
    data, path = Rows(2), tmp_path / "length_traces.jsonl"
    epochs = {0: [100, 300, 1000, 1000], 1: [500, 500, 200, 600], 2: [400, 400, 800, 800]}
    for epoch, lengths in epochs.items():
        write(path, data, epoch, [0, 0, 1, 1], lengths, ["eos"] * 4, response_length=2000)
    est, cap = LengthEstimates(2, ema_decay=0.9, statistic="max"), BudgetCap(2000)
    report = warm_start(est, cap, data, settings(response_length=2000, init_from=str(path), ema_decay=0.9,
                                                 statistic="max"))
    assert (report.responses, report.rows, report.cap_responses) == (4, 2, 8)
    assert est.value.tolist() == [300, 1000]
    # predictions: epoch 1 from epoch 0's maxima (300, 1000); epoch 2 from 0.9 * old + 0.1 * (500, 600) = (320, 960)
    want = [500 / 300, 500 / 300, 200 / 1000, 600 / 1000, 400 / 320, 400 / 320, 800 / 960, 800 / 960]
    (epoch, got), = cap.state_dict()["ratios"]
    assert epoch == WARM_EPOCH and got.tolist() == pytest.approx(want)


def test_multi_turn_traces_seed_the_time_keys_tool_calls_and_latency(tmp_path):
    """order_by=time: the first epoch's tool calls (censored like the lengths) and tool seconds seed the time key;
    entries without a call count (over-sample aborts, other agent loops) are skipped, later epochs ignored."""
    data, path = Rows(3), tmp_path / "length_traces.jsonl"
    write(path, data, 0, [0, 0, 1, 2], [20, 30, RL, 5], ["eos", "eos", "length", "abort"],
          turns={"num_turns": [6, 10, 4, None], "tool_calls": [2, 4, 1, None], "tool_tokens": [3, 5, 2, None],
                 "tool_s": [4.0, 8.0, 3.0, None]})
    write(path, data, 1, [2], [9], ["eos"], turns={"num_turns": [20], "tool_calls": [9], "tool_tokens": [1],
                                                  "tool_s": [90.0]})
    est = LengthEstimates(3)
    key = TimeKeyEstimates(est, 120.0)
    report = warm_start(est, None, data, settings(init_from=str(path), order_by="time"), key)
    assert (report.rows, report.tool_rows) == (3, 2) and "2 rows with tool-call estimates" in report.line(3)
    assert np.array_equal(key.calls.value, [3.0, 1.0, np.nan], equal_nan=True)
    assert key.calls.censored.tolist() == [False, True, False]
    assert (key.latency_sum_s, key.latency_calls) == (15.0, 7)


def test_single_turn_traces_leave_the_time_key_empty(tmp_path):
    data, path = Rows(2), tmp_path / "length_traces.jsonl"
    write(path, data, 0, [0, 1], [20, 30], ["eos", "eos"])
    e = matched_entries(str(path), data.prompt_keys())
    assert np.isnan(e["tool_calls"]).all() and np.isnan(e["tool_s"]).all()
    est = LengthEstimates(2)
    key = TimeKeyEstimates(est, 120.0)
    report = warm_start(est, None, data, settings(init_from=str(path), order_by="time"), key)
    assert (report.rows, report.tool_rows) == (2, 0)
    assert not key.calls.seen.any() and key.mean_latency_s() == 0.0
    assert np.array_equal(key.filled(), est.filled())
