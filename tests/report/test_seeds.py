"""Several seeds per arm (recipe/report/seeds.py) and bench/learning_ab.py's resume and report, on synthetic run
directories in verl's file-logger format (``{"step": N, "data": {...}}`` lines under ``<run>/logs/``); no launches."""
from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from recipe.report.load import load_run
from recipe.report.seeds import per_seed, plot_arms, render_diff, render_table, reward_key, spread, val_key, window_diff

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "learning_ab.py"
REWARD = "critic/score/mean"
VAL = "val-core/countdown/reward/mean@1"


def write_run(path: Path, rewards: dict[int, float], vals: dict[int, float]) -> Path:
    """A run as verl logs it: validation-before-train as its own record at step 0, then one record per step with
    the training metrics (and the validation score on validation steps)."""
    lines = []
    for step in sorted(set(rewards) | set(vals)):
        data = {}
        if step in rewards:
            data.update({REWARD: rewards[step], "timing_s/step": 1.0})
        if step in vals:
            data[VAL] = vals[step]
        lines.append(json.dumps({"step": step, "data": data}))
    (path / "logs").mkdir(parents=True)
    (path / "logs" / "metrics.20261206T000000Z.jsonl").write_text("\n".join(lines) + "\n")
    return path


def arm_runs(tmp_path: Path, arm: str, rewards_by_seed: list[list[float]], vals_by_seed: list[dict[int, float]]):
    return [load_run(write_run(tmp_path / f"{arm}-s{s}", dict(enumerate(r, start=1)), v), f"{arm}-s{s}")
            for s, (r, v) in enumerate(zip(rewards_by_seed, vals_by_seed))]


@pytest.fixture
def arms(tmp_path):
    a = arm_runs(tmp_path, "resampler", [[0.1, 0.2, 0.3, 0.4], [0.3, 0.4, 0.5, 0.6]],
                 [{0: 0.5, 4: 0.7}, {0: 0.5, 4: 0.9}])
    b = arm_runs(tmp_path, "baseline", [[0.0, 0.1, 0.2, 0.2], [0.2, 0.2, 0.3, 0.4], [0.1, 0.3, 0.1, 0.3]],
                 [{0: 0.5, 4: 0.6}, {0: 0.5, 4: 0.6}, {0: 0.5, 4: 0.9}])
    return a, b


def test_reward_per_step_excludes_validation_before_train(arms):
    a, _ = arms
    frame = per_seed(a, REWARD, train_only=True)
    assert frame.index.tolist() == [1, 2, 3, 4] and frame.columns.tolist() == ["resampler-s0", "resampler-s1"]
    assert reward_key(a) == REWARD and val_key(a) == VAL
    assert per_seed(a, VAL).loc[0].tolist() == [0.5, 0.5]


def test_spread_across_seeds(arms):
    _, b = arms
    s = spread(per_seed(b, REWARD, train_only=True))
    assert s.loc[3, "n"] == 3 and s.loc[3, "mean"] == pytest.approx(0.2)
    assert (s.loc[3, "min"], s.loc[3, "max"]) == (0.1, 0.3)
    assert s.loc[3, "std"] == pytest.approx(0.1)


def test_window_difference_and_its_standard_error(arms):
    a, b = (per_seed(r, REWARD, train_only=True) for r in arms)
    d = window_diff(a, b, 2)
    assert d.steps == (3, 4)
    assert d.a == pytest.approx((0.35, 0.55)) and d.b == pytest.approx((0.2, 0.35, 0.2))
    assert d.diff == pytest.approx(0.25 - 0.45)
    se = math.sqrt(np.var([0.35, 0.55], ddof=1) / 2 + np.var([0.2, 0.35, 0.2], ddof=1) / 3)
    assert d.se == pytest.approx(se)
    line = render_diff("reward", ("resampler", "baseline"), d)
    assert "baseline - resampler = -0.200 +- " in line and "[0.350, 0.550]" in line
    # one seed an arm: a difference, but no spread to claim
    assert math.isnan(window_diff(a[["resampler-s0"]], b[["baseline-s0"]], 2).se)
    with pytest.raises(ValueError, match="window must be >= 1"):
        window_diff(a, b, 0)


def test_table_lists_every_step_with_mean_range_and_seed_count(arms):
    frames = {name: per_seed(r, REWARD, train_only=True) for name, r in zip(("resampler", "baseline"), arms)}
    table = render_table("reward", frames).splitlines()
    assert table[2] == "| step | resampler | baseline |"
    assert table[4] == "| 1 | 0.200 [0.100, 0.300] n=2 | 0.100 [0.000, 0.200] n=3 |"
    assert len(table) == 4 + 4


def test_plot_draws_each_arms_mean_and_min_max_band(arms):
    frames = {name: per_seed(r, REWARD, train_only=True) for name, r in zip(("resampler", "baseline"), arms)}
    fig = plot_arms([("reward", frames)])
    (ax,) = fig.axes
    means = [line.get_ydata().tolist() for line in ax.get_lines()]
    assert means[0] == pytest.approx([0.2, 0.3, 0.4, 0.5]) and means[1] == pytest.approx([0.1, 0.2, 0.2, 0.3])
    band = ax.collections[1].get_paths()[0].vertices[:, 1]  # the baseline's band spans its per-step min..max
    assert band.min() == pytest.approx(0.0) and band.max() == pytest.approx(0.4)


def load_bench():
    spec = importlib.util.spec_from_file_location("learning_ab", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def full_rewards(bench, level: float, epochs: int | None = None) -> dict[int, float]:
    return {step: level for step in range(1, (epochs or bench.EPOCHS) * bench.STEPS_PER_EPOCH + 1)}


def test_bench_keeps_complete_runs_and_relaunches_incomplete_ones(tmp_path, monkeypatch, capsys):
    bench = load_bench()
    last = bench.EPOCHS * bench.STEPS_PER_EPOCH
    out = tmp_path / "out"
    write_run(out / "resampler-s0", full_rewards(bench, 0.5), {0: 0.4, last: 0.6})
    stale = write_run(out / "baseline-s0", {1: 0.1, 2: 0.2}, {0: 0.4})  # a run cut short: no last step
    (stale / "leftover").write_text("from the cut-short launch")
    launched = []

    def fake_launch(out_dir, arm, seed, epochs, lr, model):
        launched.append((arm, seed))
        assert not (out_dir / f"{arm}-s{seed}" / "leftover").exists()
        write_run(out_dir / f"{arm}-s{seed}", full_rewards(bench, 0.3 + seed / 10), {0: 0.4, last: 0.5})
        return 1.0

    monkeypatch.setattr(bench, "launch", fake_launch)
    bench.main(["--seeds", "0,1", "--out", str(out)])
    assert launched == [("baseline", 0), ("resampler", 1), ("baseline", 1)]
    text = capsys.readouterr().out
    assert "resampler-s0: complete, kept" in text and "baseline-s0: incomplete, deleted and relaunched" in text
    assert f"steps {last - 5}-{last}: baseline - resampler = -0.100" in text
    assert "| epoch | resampler | baseline |" in text
    assert "| 0 | 0.450 [0.400, 0.500] n=2 | 0.350 [0.300, 0.400] n=2 |" in text
    assert (out / "learning_ab.png").stat().st_size > 0
    assert "reproduce: .venv/bin/python bench/learning_ab.py --seeds 0,1" in text


def test_bench_runs_of_another_setting_are_their_own(tmp_path, monkeypatch, capsys):
    """A longer benchmark (--epochs), another learning rate (--lr) or model (--model) must not take the preset's
    runs for its own."""
    bench = load_bench()
    out = tmp_path / "out"
    for arm in bench.ARMS:
        write_run(out / f"{arm}-s0", full_rewards(bench, 0.5), {0: 0.4})
    launched = []

    def fake_launch(out_dir, arm, seed, epochs, lr, model):
        launched.append(bench.run_name(arm, seed, epochs, lr, model))
        write_run(out_dir / launched[-1], full_rewards(bench, 0.7, epochs), {0: 0.4})

    monkeypatch.setattr(bench, "launch", fake_launch)
    bench.main(["--seeds", "0", "--out", str(out), "--epochs", str(bench.EPOCHS + 1), "--lr", "4e-4"])
    assert launched == [f"resampler-s0-e{bench.EPOCHS + 1}-lr4e-4", f"baseline-s0-e{bench.EPOCHS + 1}-lr4e-4"]
    bench.main(["--seeds", "0", "--out", str(out), "--model", "random"])
    assert launched[2:] == ["resampler-s0-random", "baseline-s0-random"]
    assert bench.is_complete(out / "resampler-s0") and not bench.is_complete(out / "resampler-s0", bench.EPOCHS + 1)
    with pytest.raises(SystemExit):
        bench.main(["--seeds", "0", "--out", str(out), "--lr", "fast"])
    assert "--lr must be a number > 0" in capsys.readouterr().err


def test_bench_report_only_names_a_missing_arm(tmp_path):
    out = tmp_path / "out"
    bench = load_bench()
    write_run(out / "resampler-s0", full_rewards(bench, 0.5), {0: 0.4})
    r = subprocess.run([sys.executable, str(BENCH), "--report-only", "--seeds", "0", "--out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "no complete run of baseline" in r.stderr
