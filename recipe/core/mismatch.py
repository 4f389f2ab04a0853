"""Training-inference mismatch on the trained tokens of a step (pure numpy).

verl 0.9.1 already logs the k3 KL between the trainer's and the rollout's log-probs whenever the rollout returns
them (``rollout_corr/k3_kl``, ``verl/trainer/ppo/rollout_corr_helper.py`` ``compute_offpolicy_metrics``, run in the
v1 trainer's ``_compute_advantage``). The share of tokens whose ratio ``pi_train / pi_rollout`` leaves [1/2, 2] it
logs only with token-level importance weights on (``rollout_is_ratio_fraction_high`` + ``_low`` with
``algorithm.rollout_correction.rollout_is=token``), which also reweights the loss; this module computes it (and the
k3 KL, the same estimator) without touching the loss, for ``rollout/mismatch/*``. Router replay (``ROUTER_REPLAY``)
exists to shrink both.
"""
from __future__ import annotations

import numpy as np

BAND = (0.5, 2.0)  # ratios outside it are the tokens whose trainer and rollout disagree by more than 2x
K3 = "rollout/mismatch/k3_kl"
OUT_OF_BAND = "rollout/mismatch/ratio_out_of_band"


def mismatch_metrics(train_log_probs, rollout_log_probs, mask) -> dict[str, float]:
    """``K3``: mean of ``exp(d) - d - 1`` with ``d = log pi_train - log pi_rollout`` (verl's convention); and
    ``OUT_OF_BAND``: the share of tokens with ``exp(d)`` outside ``BAND``; both over the tokens where ``mask`` is set
    (the trained ones). Empty when there is none."""
    train, rollout = np.asarray(train_log_probs, np.float64), np.asarray(rollout_log_probs, np.float64)
    keep = np.asarray(mask).astype(bool)
    if train.shape != rollout.shape or train.shape != keep.shape:
        raise ValueError(f"log-prob and mask shapes differ: {train.shape}, {rollout.shape}, {keep.shape}")
    if not keep.any():
        return {}
    d = train[keep] - rollout[keep]
    lo, hi = np.log(BAND[0]), np.log(BAND[1])
    return {K3: float(np.mean(np.expm1(d) - d)), OUT_OF_BAND: float(np.mean((d < lo) | (d > hi)))}
