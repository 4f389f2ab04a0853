"""A control for the weight sync: without it, the rollout policy stays behind the trainer (verl's own metric)."""
import os
import sys

import numpy as np

from recipe.cpu.preset import CONFIG_NAME, PLATFORM_ENV
from recipe.preflight import run_preflight

from recipe.testing.cpu_runs import REPO

STEPS = 4


def test_without_weight_sync_the_rollout_policy_stays_behind(launcher, resampler_run):
    ckpt_root = launcher.base / "no-sync"
    env = {"PRESET": "cpu", "CKPT_ROOT": str(ckpt_root), "EXPERIMENT_NAME": "no-sync",
           "RECIPE_FIXTURE_CACHE": os.environ.get("RECIPE_FIXTURE_CACHE", "")}
    report = run_preflight(env=env)
    assert report.ok, report.errors
    driver = REPO / "tests" / "e2e" / "no_weight_sync_driver.py"
    cmd = [sys.executable, str(driver), "--config-name", CONFIG_NAME, *report.overrides,
           f"trainer.total_training_steps={STEPS}"]
    run = launcher.run_command("no-sync", cmd, {**PLATFORM_ENV, "PYTHONPATH": str(REPO)}, experiment="no-sync")
    assert run.returncode == 0, run.output[-4000:]
    control = run.metrics()
    synced = resampler_run.metrics()
    assert sorted(control) == list(range(1, STEPS + 1))
    drift = np.array([control[s]["training/rollout_probs_diff_mean"] for s in range(2, STEPS + 1)])
    synced_max = max(synced[s]["training/rollout_probs_diff_mean"] for s in synced)
    assert control[1]["training/rollout_probs_diff_mean"] < 1e-6  # before the first update both hold the same weights
    assert drift.min() > 100 * synced_max and drift[-1] > drift[0], (drift.tolist(), synced_max)
