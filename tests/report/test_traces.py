"""Length traces: finish-reason precedence, append-only writing that survives crash + resume, last-record-wins load."""
from __future__ import annotations

import json
import math

import pytest

from recipe.traces import TRACE_COLUMNS, LengthTraceWriter, finish_reasons, load_traces


def test_finish_reason_precedence():
    lengths = [10, 50, 100, 100, 30, 60]
    aborted = [False, False, False, True, True, True]
    # cap 50 < response_length 100: the cap wins over the (unreachable) length limit and over abort.
    assert finish_reasons(lengths, 50, 100, aborted) == ["eos", "cap", "cap", "cap", "abort", "cap"]
    assert finish_reasons(lengths, None, 100, aborted) == ["eos", "eos", "length", "length", "abort", "abort"]
    assert finish_reasons(lengths, None, 100) == ["eos", "eos", "length", "length", "eos", "eos"]
    # A cap at or above response_length is not binding: responses at the limit stopped at "length".
    assert finish_reasons([100, 99], 100, 100) == ["length", "eos"]
    assert finish_reasons([100, 99], 4096, 100) == ["length", "eos"]
    with pytest.raises(ValueError, match="aborted has 1 entries for 2 lengths"):
        finish_reasons([1, 2], None, 100, [True])


def _append(w, step, lengths, **kw):
    n = len(lengths)
    args = dict(epoch=0, step=step, cap=None, response_length=100, gen_time_s=1.5,
                rows=list(range(n)), sample_index=[0] * n, lengths=lengths)
    return w.append(**{**args, **kw})


def test_writer_record_format(tmp_path):
    path = tmp_path / "sub" / "traces.jsonl"
    with LengthTraceWriter(path) as w:
        rec = _append(w, 3, [10, 60, 100], cap=60, predicted=[5.0, float("nan"), None], aborted=[True, False, False])
    line = json.loads(path.read_text())
    assert line == rec
    assert set(line) == {"epoch", "step", "cap", "response_length", "gen_time_s", "rows", "sample_index", "lengths",
                         "finish", "predicted", "time"}
    assert line["finish"] == ["abort", "cap", "cap"]
    assert line["predicted"] == [5.0, None, None]
    assert line["cap"] == 60 and line["response_length"] == 100
    with LengthTraceWriter(path) as w:
        assert _append(w, 4, [5], cap=0)["cap"] is None  # 0 = no cap, stored as null
        assert _append(w, 5, [5], finish=["length"])["finish"] == ["length"]  # real stop reasons override


def test_writer_rejects_inconsistent_records(tmp_path):
    with LengthTraceWriter(tmp_path / "t.jsonl") as w:
        with pytest.raises(ValueError, match="rows has 1 entries for 2 lengths"):
            _append(w, 1, [1, 2], rows=[0])
        with pytest.raises(ValueError, match="unknown finish reasons"):
            _append(w, 1, [1], finish=["stop"])
    assert (tmp_path / "t.jsonl").read_text() == ""


def test_resume_after_crash_keeps_last_record_per_step(tmp_path):
    path = tmp_path / "traces.jsonl"
    with LengthTraceWriter(path) as w:
        _append(w, 1, [10, 20])
        _append(w, 2, [30, 40])
    with open(path, "ab") as fp:
        fp.write(b'{"step": 3, "len')  # partial line left by a crash
    with LengthTraceWriter(path) as w:  # resume from the step-1 checkpoint: step 2 is redone
        _append(w, 2, [31, 100], cap=None)
        _append(w, 3, [50, 60, 70])
    with pytest.warns(UserWarning, match=r"traces.jsonl:3: skipped unparseable"):
        df = load_traces(path)
    assert tuple(df.columns) == TRACE_COLUMNS
    assert df["step"].tolist() == [1, 1, 2, 2, 3, 3, 3]
    assert df["response_length"].tolist() == [10, 20, 31, 100, 50, 60, 70]
    assert df["finish_reason"].tolist() == ["eos", "eos", "eos", "length", "eos", "eos", "eos"]
    assert df["dataset_item_idx"].tolist() == [0, 1, 0, 1, 0, 1, 2]
    assert df["max_response_length"].unique().tolist() == [100]
    assert df["gen_time_s"].eq(1.5).all()


def test_load_traces_dtypes(tmp_path):
    path = tmp_path / "t.jsonl"
    with LengthTraceWriter(path) as w:
        _append(w, 1, [10, 20], cap=15, predicted=[12.0, None])
        _append(w, 2, [30], cap=None)
    df = load_traces([path])
    assert str(df["cap"].dtype) == "Int64"
    assert df["cap"].isna().tolist() == [False, False, True]
    assert df["cap"].iloc[0] == 15
    assert df["finish_reason"].tolist() == ["eos", "cap", "eos"]
    assert df["predicted_length"].iloc[0] == 12.0 and math.isnan(df["predicted_length"].iloc[1])

    empty = tmp_path / "empty.jsonl"
    empty.touch()
    assert load_traces(empty).empty and tuple(load_traces(empty).columns) == TRACE_COLUMNS


def test_multi_turn_fields_are_stored_per_response_and_length_checked(tmp_path):
    turns = {"num_turns": [4, 2], "tool_calls": [1, None], "tool_tokens": [12, 0], "tool_s": [1.23456, 0.0]}
    with LengthTraceWriter(tmp_path / "t.jsonl") as w:
        rec = _append(w, 1, [40, 20], turns=turns)
        assert rec["num_turns"] == [4, 2] and rec["tool_calls"] == [1, None] and rec["tool_tokens"] == [12, 0]
        assert rec["tool_s"] == [1.2346, 0.0]
        with pytest.raises(ValueError, match="tool_s has 1 entries for 2 lengths"):
            _append(w, 2, [40, 20], turns={**turns, "tool_s": [1.0]})
    with LengthTraceWriter(tmp_path / "u.jsonl") as w:
        assert "num_turns" not in _append(w, 1, [5])  # single-turn records are unchanged
