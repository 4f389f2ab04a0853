"""A control for the weight sync: without it, the rollout policy stays behind the trainer (verl's own metric)."""
import numpy as np


def test_without_weight_sync_the_rollout_policy_stays_behind(restart_without_sync_run, resampler_run):
    control, synced = restart_without_sync_run.metrics(), resampler_run.metrics()
    drift = np.array([control[s]["training/rollout_probs_diff_mean"] for s in sorted(control)])
    synced_max = max(m["training/rollout_probs_diff_mean"] for m in synced.values())
    assert drift[0] < 1e-6  # before the first update both hold the same weights
    assert drift[1:].min() > 100 * synced_max and drift[-1] > drift[1], (drift.tolist(), synced_max)
