"""Training-inference mismatch on trained tokens: the k3 KL (verl's estimator) and the share outside [1/2, 2]."""
import math

import numpy as np
import pytest

from recipe.core.mismatch import K3, OUT_OF_BAND, mismatch_metrics


def test_identical_log_probs_have_no_mismatch():
    lp = np.log([[0.5, 0.25, 0.9]])
    assert mismatch_metrics(lp, lp, [[1, 1, 1]]) == {K3: 0.0, OUT_OF_BAND: 0.0}


def test_k3_and_band_by_hand():
    rollout = np.zeros((1, 4))
    d = np.array([[math.log(3.0), math.log(0.4), 0.1, math.log(2.0)]])  # ratios 3, 0.4, e^0.1, 2 (on the edge)
    out = mismatch_metrics(rollout + d, rollout, np.ones((1, 4)))
    k3 = np.mean([3.0 - math.log(3.0) - 1, 0.4 - math.log(0.4) - 1, math.exp(0.1) - 0.1 - 1, 2.0 - math.log(2.0) - 1])
    assert out[K3] == pytest.approx(k3)
    assert out[OUT_OF_BAND] == pytest.approx(2 / 4)  # 3 and 0.4 leave the band; 2 is inside


def test_only_trained_tokens_count():
    """Padding and tool-reply tokens (mask 0) may hold anything: they are not trained."""
    train = np.array([[0.0, 5.0], [0.0, -7.0]])
    rollout = np.zeros((2, 2))
    assert mismatch_metrics(train, rollout, [[1, 0], [1, 0]]) == {K3: 0.0, OUT_OF_BAND: 0.0}
    assert mismatch_metrics(train, rollout, [[1, 1], [1, 0]])[OUT_OF_BAND] == pytest.approx(1 / 3)


def test_matches_verl_where_verl_computes_them():
    """verl's own k3 KL and, with token IS at threshold 2, its out-of-band fractions (rollout_corr_helper.py)."""
    torch = pytest.importorskip("torch")
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask

    rng = np.random.default_rng(0)
    rollout = np.log(rng.uniform(0.05, 1.0, (6, 20)))
    train = rollout + rng.normal(0.0, 0.6, (6, 20))
    mask = (rng.uniform(size=(6, 20)) < 0.8).astype(np.float32)
    _, _, verl = compute_rollout_correction_and_rejection_mask(
        old_log_prob=torch.tensor(train, dtype=torch.float32),
        rollout_log_prob=torch.tensor(rollout, dtype=torch.float32),
        response_mask=torch.tensor(mask), rollout_is="token", rollout_is_threshold=2.0)
    ours = mismatch_metrics(train, rollout, mask)
    assert ours[K3] == pytest.approx(verl["rollout_corr/k3_kl"], rel=1e-4)
    share = verl["rollout_corr/rollout_is_ratio_fraction_high"] + verl["rollout_corr/rollout_is_ratio_fraction_low"]
    assert 0 < ours[OUT_OF_BAND] == pytest.approx(share, abs=1e-6)


def test_nothing_trained_nothing_reported_and_shapes_must_agree():
    assert mismatch_metrics(np.zeros((1, 2)), np.zeros((1, 2)), np.zeros((1, 2))) == {}
    with pytest.raises(ValueError, match="shapes differ"):
        mismatch_metrics(np.zeros((1, 2)), np.zeros((1, 3)), np.ones((1, 2)))
