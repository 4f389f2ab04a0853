"""A control for the weight sync: without it, the rollout policy stays behind the trainer (verl's own metric, and the
recipe's training-inference mismatch, ``rollout/mismatch/*``, which router replay is meant to shrink)."""
import numpy as np

K3, OUT_OF_BAND, MISALIGNED = ("rollout/mismatch/k3_kl", "rollout/mismatch/ratio_out_of_band",
                               "rollout/mismatch/misaligned_records")


def test_without_weight_sync_the_rollout_policy_stays_behind(restart_without_sync_run, resampler_run):
    control, synced = restart_without_sync_run.metrics(), resampler_run.metrics()
    drift = np.array([control[s]["training/rollout_probs_diff_mean"] for s in sorted(control)])
    synced_max = max(m["training/rollout_probs_diff_mean"] for m in synced.values())
    assert drift[0] < 1e-6  # before the first update both hold the same weights
    assert drift[1:].min() > 100 * synced_max and drift[-1] > drift[1], (drift.tolist(), synced_max)


def test_the_mismatch_is_logged_every_step_and_follows_the_weight_sync(restart_without_sync_run, resampler_run):
    """``rollout/mismatch/k3_kl`` on every step of both runs, no record left out; it stays at float noise where the
    weights reach vLLM after every update and grows where they never do."""
    control, synced = restart_without_sync_run.metrics(), resampler_run.metrics()
    for run in (control, synced):
        assert all(K3 in m and OUT_OF_BAND in m and MISALIGNED not in m for m in run.values()), \
            [s for s, m in run.items() if K3 not in m or MISALIGNED in m]
    k3 = np.array([control[s][K3] for s in sorted(control)])
    synced_max = max(m[K3] for m in synced.values())
    assert synced_max < 1e-6 and k3[0] < 1e-6, (synced_max, k3.tolist())
    assert k3[1:].min() > 100 * max(synced_max, 1e-12) and k3[-1] > k3[1], (k3.tolist(), synced_max)
