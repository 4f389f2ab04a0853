"""Run comparison over logs in verl's real file-logger format (see conftest): merging of resumed runs, table values,
plots (checked through the data actually drawn) and the shell wrapper's behaviour and error messages."""
from __future__ import annotations

import math
import os
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from recipe.report import (
    compare,
    cumulative_time,
    load_run,
    main,
    plot_cap,
    plot_response_lengths,
    plot_speculation,
    plot_times,
    plot_val_score,
    read_metrics,
    render_markdown,
    summarize,
    truncation,
    val_curve,
    write_plots,
)

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "compare_runs.sh"


def test_reads_verl_file_logger_format(runs_dir, inputs):
    # The fixture's first line is exactly what verl's FileLogger wrote: {"step": N, "data": {...}}.
    first = (runs_dir / "baseline" / "logs" / "metrics.jsonl").read_text().splitlines()[0]
    assert first == '{"step":0,"data":{"%s":0.2}}' % inputs.VAL
    run = load_run(runs_dir / "baseline")
    assert run.name == "baseline" and run.traces is None
    assert run.metrics.index.tolist() == [0, 1, 2, 3, 4, 5, 6]
    assert run.metrics["timing_s/gen"].dropna().to_dict() == inputs.BASE_GEN
    assert run.metrics[inputs.VAL].dropna().to_dict() == inputs.BASE_VAL


def test_resumed_run_is_merged_in_segment_order(runs_dir, inputs):
    run = load_run(runs_dir / "capped")
    assert [f.name for f in run.metric_files] == ["metrics.1.jsonl", "metrics.jsonl"]
    assert [f.name for f in run.trace_files] == ["length_traces.jsonl"]  # the rollout dump is ignored
    m = run.metrics
    # Step 4 was redone after the resume: the resumed values win although the rotated file has the newer mtime.
    assert m["timing_s/gen"].dropna().to_dict() == inputs.CAP_GEN
    # Validation-before-train at the resume step replaced step 3's val score but kept its training metrics.
    assert m.loc[3, inputs.VAL] == inputs.CAP_VAL_SEG2[3] and m.loc[3, "timing_s/gen"] == 50.0
    assert any("2 step(s) were logged more than once" in n for n in run.notes)
    assert any("length_traces.jsonl:5: skipped unparseable" in n for n in run.notes)
    # Traces: last record per step, the partial line skipped.
    t = run.traces
    assert t.groupby("step")["response_length"].apply(list).to_dict() == inputs.TRACE_LENGTHS


def test_segments_with_same_first_step_are_ordered_by_mtime(tmp_path, inputs):
    old, new = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    inputs.write_verl_log(new, [(1, {"timing_s/gen": 2.0})])
    inputs.write_verl_log(old, [(1, {"timing_s/gen": 1.0}), (2, {"timing_s/gen": 1.0})])
    now = time.time()
    os.utime(old, (now - 60, now - 60))
    frame, notes = read_metrics([new, old])
    assert frame["timing_s/gen"].to_dict() == {1: 2.0, 2: 1.0}
    assert notes == ["1 step(s) were logged more than once (resume); the last value of each metric was kept"]


def test_partial_and_foreign_lines_are_skipped(tmp_path, inputs):
    log = tmp_path / "m.jsonl"
    inputs.write_verl_log(log, [(1, {"timing_s/gen": 1.0, "note": "text", "hist": [1, 2], "nan": float("nan")})])
    with open(log, "a") as fp:
        fp.write('{"other": 1}\n{"step": 2, "da')
    run = load_run(log)
    assert run.name == "m"
    assert run.metrics.columns.tolist() == ["timing_s/gen", "nan"]  # strings and lists are not metrics
    assert math.isnan(run.metrics.loc[1, "nan"])  # orjson writes NaN as null
    assert [n.split(": ", 1)[1] for n in run.notes] == [
        "skipped line that is not a verl file-logger record",
        "skipped unparseable line (partial write at a crash?)",
    ]


def test_summary_values(runs_dir, inputs):
    base, capped = load_run(runs_dir / "baseline"), load_run(runs_dir / "capped")
    sa, sb = summarize(base), summarize(capped)
    gen_a = np.array(list(inputs.BASE_GEN.values()))
    assert sa["gen time/step mean [s]"] == pytest.approx(88 / 6)
    assert sa["gen time/step p50 [s]"] == 12.0
    assert sa["gen time/step p95 [s]"] == pytest.approx(np.percentile(gen_a, 95))
    assert sa["gen time/step max [s]"] == 30.0
    assert sa["step time mean [s]"] == pytest.approx(88 / 6 + 20)
    assert sa["total step time [s]"] == pytest.approx(88 + 120)
    assert sa["gen share of step time"] == pytest.approx(88 / 208)
    assert sa["training steps"] == 6 and sa["last step"] == 6  # step 0 only holds validation
    assert sa["throughput mean [tok/s/GPU]"] == pytest.approx(1035.0)
    assert sa["response length max [tok]"] == 2006
    assert sa["train reward mean (all steps)"] == pytest.approx(0.35)  # critic/score/mean, not critic/rewards/mean
    assert sa["cap mean over capped steps [tok]"] is None and sa["capped steps fraction"] is None
    assert sb["gen time/step mean [s]"] == pytest.approx(94 / 6)
    assert sb["gen time/step max [s]"] == 50.0
    assert sb["capped steps fraction"] == pytest.approx(5 / 6)
    assert sb["cap mean over capped steps [tok]"] == pytest.approx((3000 + 3000 + 2500 + 2500 + 2800) / 5)
    # Truncated: 8 of 24 responses stopped at the cap or response_length, from traces or from the metrics alike.
    assert truncation(capped) == (pytest.approx(1 / 3), "traces")
    capped.traces = None
    assert truncation(capped) == (pytest.approx(1 / 3), "clip_ratio+cap_hit_ratio")
    assert truncation(base) == (pytest.approx(0.125), "clip_ratio")


def _table(markdown: str) -> dict[str, list[str]]:
    rows = [line.strip("|").split("|") for line in markdown.splitlines()[2:] if line.startswith("|")]
    return {cells[0].strip(): [c.strip() for c in cells[1:]] for cells in rows}


def test_markdown_table(runs_dir):
    base, capped = load_run(runs_dir / "baseline"), load_run(runs_dir / "capped")
    md = render_markdown(compare(base, capped), (base.name, capped.name))
    assert md.splitlines()[0] == "| metric | baseline | capped | capped/baseline |"
    t = _table(md)
    assert t["gen time/step mean [s]"] == ["14.67", "15.67", f"{94 / 88:.3f}"]
    assert t["gen time/step max [s]"] == ["30", "50", "1.667"]
    assert t["capped steps fraction"] == ["n/a", "0.8333", "n/a"]
    assert t["truncated fraction (cap+length; from clip_ratio / traces)"] == ["0.125", "0.3333", "2.667"]
    assert t["val openai/gsm8k reward/mean@4 last"] == ["0.35", "0.45", f"{0.45 / 0.35:.3f}"]
    assert t["val openai/gsm8k reward/mean@4 best"] == ["0.35", "0.45", f"{0.45 / 0.35:.3f}"]
    # Time-to-score: the first validation at or above 0.35 (the lower best) comes after steps 1-6 (A), 1-3 (B).
    assert t["val openai/gsm8k reward/mean@4 training time to reach 0.35 [s]"] == ["208", "112", f"{112 / 208:.3f}"]
    assert not any(label.startswith("val-aux") or "std@" in label for label in t)


def test_plots_draw_the_logged_data(runs_dir, tmp_path, inputs):
    base, capped = load_run(runs_dir / "baseline"), load_run(runs_dir / "capped")
    gen_ax, step_ax = plot_times([base, capped]).axes
    assert [line.get_label() for line in gen_ax.lines] == ["baseline", "capped"]
    assert gen_ax.lines[1].get_xydata().tolist() == [[s, g] for s, g in inputs.CAP_GEN.items()]
    assert step_ax.lines[0].get_ydata().tolist() == [g + 20.0 for g in inputs.BASE_GEN.values()]

    (ax,) = plot_cap([base, capped]).axes
    caps = {line.get_label(): line for line in ax.lines}
    assert caps["baseline cap"].get_xydata().size == 0
    y = caps["capped cap"].get_ydata()
    assert math.isnan(y[0]) and y[1:].tolist() == [float(inputs.CAP[s]) for s in range(2, 7)]  # step 1: cap off, a gap

    # Baseline has no traces: per-step mean/max lines for both runs.
    (ax,) = plot_response_lengths([base, capped]).axes
    assert [line.get_label() for line in ax.lines] == ["baseline mean", "baseline max", "capped mean", "capped max"]
    assert ax.lines[3].get_ydata().tolist() == [float(max(v)) for v in inputs.TRACE_LENGTHS.values()]

    # Both with traces: histograms over every response, shared bins, as fractions.
    base.traces = capped.traces.assign(response_length=capped.traces["response_length"] // 2)
    (ax,) = plot_response_lengths([base, capped]).axes
    (_, edges_a, _), (frac_b, edges_b, _) = (p.get_data() for p in ax.patches)
    all_b = np.concatenate(list(inputs.TRACE_LENGTHS.values()))
    assert np.array_equal(edges_a, edges_b) and edges_b[0] == all_b.min() // 2 and edges_b[-1] == all_b.max()
    assert frac_b.sum() == pytest.approx(1.0)
    assert np.allclose(frac_b * 24, np.histogram(all_b, bins=edges_b)[0])

    paths = write_plots([base, capped], tmp_path / "out")
    assert sorted(paths) == ["cap.png", "mismatch.png", "response_length.png", "speculation.png", "time_per_step.png",
                             "val_score.png"]
    for p in paths.values():
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000


def test_speculation_plot_draws_acceptance_and_the_online_heads_top1(runs_dir):
    frozen, online = load_run(runs_dir / "baseline"), load_run(runs_dir / "capped")
    frozen.metrics["rollout/spec_acceptance_length"] = [1.5 + 0.01 * i for i in range(len(frozen.metrics))]
    online.metrics["rollout/spec_acceptance_length"] = [1.5 + 0.05 * i for i in range(len(online.metrics))]
    online.metrics["draft_head/top1_before_train"] = [0.2 + 0.02 * i for i in range(len(online.metrics))]
    acc_ax, head_ax = plot_speculation([frozen, online]).axes
    assert [line.get_label() for line in acc_ax.lines] == [frozen.name, online.name]
    assert acc_ax.lines[1].get_ydata().tolist() == online.metrics["rollout/spec_acceptance_length"].tolist()
    assert [line.get_label() for line in head_ax.lines] == [online.name]  # the frozen head logs no top-1


def test_training_time_to_each_validation(runs_dir, inputs):
    base, capped = load_run(runs_dir / "baseline"), load_run(runs_dir / "capped")
    step_a = {s: g + 20.0 for s, g in inputs.BASE_GEN.items()}
    assert cumulative_time(base).to_dict() == {0: 0.0, **{s: sum(step_a[k] for k in step_a if k <= s) for s in step_a}}
    # The capped run's lost first try of step 4 (gen 99 s) is not counted: the merged log keeps the redone step.
    step_b = {s: g + 15.0 for s, g in inputs.CAP_GEN.items()}
    assert val_curve(capped, inputs.VAL).to_dict("index") == {
        0: {"score": 0.21, "time_s": 0.0},
        3: {"score": inputs.CAP_VAL_SEG2[3], "time_s": step_b[1] + step_b[2] + step_b[3]},
        6: {"score": inputs.CAP_VAL_SEG2[6], "time_s": sum(step_b.values())},
    }


def test_val_score_plot_over_steps_and_training_time(runs_dir, inputs):
    base, capped = load_run(runs_dir / "baseline"), load_run(runs_dir / "capped")
    by_step, by_time = plot_val_score([base, capped]).axes
    assert [line.get_label() for line in by_step.lines] == ["baseline", "capped"]
    assert by_step.lines[0].get_xydata().tolist() == [[s, v] for s, v in inputs.BASE_VAL.items()]
    assert by_time.lines[0].get_xdata() == pytest.approx([0.0, 93 / 3600, 208 / 3600])  # hours
    assert by_time.lines[1].get_xdata() == pytest.approx([0.0, 112 / 3600, 184 / 3600])
    assert by_time.lines[1].get_ydata().tolist() == [0.21, 0.41, 0.45]
    assert by_time.get_xlabel() == "training time [h]"
    # A run without timing_s/step has no time axis to draw, rather than one at zero.
    base.metrics = base.metrics.drop(columns="timing_s/step")
    by_step, by_time = plot_val_score([base, capped]).axes
    assert len(by_step.lines[0].get_xdata()) == 3 and len(by_time.lines[0].get_xdata()) == 0


def _script(*args, cwd):
    return subprocess.run(["bash", str(SCRIPT), *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_script_end_to_end(runs_dir, tmp_path):
    out = _script(runs_dir / "baseline", runs_dir / "capped" / "logs", "--names", "base,cap", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    t = _table(out.stdout)
    assert t["gen time/step mean [s]"][:2] == ["14.67", "15.67"]
    # Pointing at the logs folder alone: no traces, so truncation comes from the metrics.
    assert t["truncated fraction (cap+length; from clip_ratio / clip_ratio+cap_hit_ratio)"][:2] == ["0.125", "0.3333"]
    # The logs folder holds no Hydra config: the config comparison says so instead of failing.
    assert out.stdout.startswith("## Config: cap vs base\n\nNot compared: no Hydra config")
    assert "under cap; pass the run directory itself" in out.stdout
    report = tmp_path / "compare_base_vs_cap"  # default output: a new folder in the caller's directory
    assert {p.name for p in report.iterdir()} == {
        "compare.md", "time_per_step.png", "response_length.png", "cap.png", "val_score.png", "mismatch.png",
        "speculation.png"
    }
    assert "| gen time/step mean [s] | 14.67 | 15.67 |" in (report / "compare.md").read_text()


def test_script_default_names_and_out(runs_dir, tmp_path):
    single = tmp_path / "base_copy"
    shutil.copytree(runs_dir / "baseline", single)
    (single / "logs" / "metrics.jsonl").rename(single / "logs" / "run.jsonl")  # any *.jsonl name is found
    out = _script(single, runs_dir / "capped" / "logs" / "metrics.jsonl", "--out", tmp_path / "r", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "| metric | base_copy | metrics | metrics/base_copy |" in out.stdout
    assert (tmp_path / "r" / "cap.png").stat().st_size > 10_000
    assert not list(single.rglob("*.png"))  # nothing written into a run


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "the following arguments are required: RUN_A, RUN_B"),
        (["{tmp}", "{base}"], "RUN_A: no verl file-logger records"),
        (["{base}", "{base}", "--names", "only"], "--names: expected two comma-separated names"),
    ],
)
def test_cli_errors(runs_dir, tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.chdir(tmp_path)
    fill = {"base": runs_dir / "baseline", "tmp": tmp_path}
    with pytest.raises(SystemExit) as exit_info:
        main([a.format(**fill) for a in args], prog="compare_runs.sh")
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "usage: compare_runs.sh" in err and message.format(**fill) in err
    assert not list(tmp_path.glob("compare_*"))


def test_script_missing_run_dir(runs_dir, tmp_path):
    out = _script(runs_dir / "baseline", "missing", cwd=tmp_path)
    assert out.returncode == 2 and out.stdout == ""
    assert "usage: compare_runs.sh [-h] [--out DIR] [--names A,B] RUN_A RUN_B" in out.stderr
    assert "RUN_B: 'missing' does not exist; pass a run directory holding verl's file-logger JSONL" in out.stderr
    assert not list(tmp_path.iterdir())


def test_first_epoch_rollout_time_is_reported_apart():
    """A warm-started arm differs from a cold one in its first epoch: the table shows it apart from the rest."""
    import pandas as pd

    from recipe.report.load import Run
    from recipe.report.summary import summarize

    metrics = pd.DataFrame({"timing_s/gen": [4.0, 6.0, 1.0, 3.0], "timing_s/step": [5.0] * 4}, index=[1, 2, 3, 4])
    traces = pd.DataFrame({"step": [1, 2, 3, 4], "epoch": [0, 0, 1, 1], "response_length": [1] * 4, "cap": [None] * 4,
                           "finish_reason": ["eos"] * 4})
    out = summarize(Run("r", Path("."), metrics, traces))
    assert out["gen time/step mean, first epoch [s]"] == 5.0 and out["gen time/step mean, later epochs [s]"] == 2.0
    one_epoch = summarize(Run("r", Path("."), metrics.iloc[:2], traces.iloc[:2]))
    assert one_epoch["gen time/step mean, later epochs [s]"] is None
