"""The fair baseline arm through verl's real loop, and the A/B report built from two real runs' logs."""
import subprocess

from recipe.cpu.preset import N_TRAIN

from harness.cpu_runs import REPO


def test_fair_baseline_reads_verls_random_order_without_cap(baseline_run):
    assert baseline_run.experiment == "cpu-grpo-baseline-group"
    traces, metrics = baseline_run.traces(), baseline_run.metrics()
    orders = {}
    for step, rec in traces.items():
        assert rec["cap"] is None and metrics[step]["rollout/response_max_tokens_cap"] == 0
        assert all(p is None for p in rec["predicted"])  # no sampler, no predictions
        orders.setdefault(rec["epoch"], []).extend(dict.fromkeys(rec["rows"]))
    for epoch, rows in orders.items():
        assert sorted(rows) == list(range(N_TRAIN)), f"epoch {epoch}: every prompt once"
    assert orders[0] != orders[1] and orders[0] != list(range(N_TRAIN)), "a new random order each epoch"


def test_ab_report_from_two_real_runs(resampler_run, baseline_run, tmp_path):
    out = tmp_path / "compare"
    res = subprocess.run(["bash", str(REPO / "scripts" / "compare_runs.sh"), str(baseline_run.run_dir),
                          str(resampler_run.run_dir), "--out", str(out), "--names", "baseline,resampler"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    report = res.stdout
    # the arms differ in their own switches only: no warning about anything else
    assert "data.sampler.class_path" in report and "recipe.cap.enable" in report and "data.shuffle" in report
    assert "WARNING" not in report, report[:3000]
    assert "| metric | baseline | resampler | resampler/baseline |" in report
    assert "| gen time/step mean, first epoch [s] |" in report and "| cap hit ratio mean |" in report
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert {"val_score.png"} <= set(pngs) and len(pngs) >= 4, pngs
    assert (out / "compare.md").read_text().strip()
