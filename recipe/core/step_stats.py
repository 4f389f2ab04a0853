"""What one finished training step tells the sampler and the logs (pure numpy).

The trainer adapter fetches, per response: the row id, the response length (``response_mask.sum(-1)``), the cap
that was in force for its row (0 = none) and the length predicted for its row when the batch was formed. This module
turns those arrays into the censoring flags the estimator needs and the step metrics the recipe logs.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .estimates import GroupObservation, reduce_groups


@dataclass
class StepResponses:
    rows: np.ndarray  # dataset_item_idx per response
    lengths: np.ndarray  # tokens generated per response
    caps: np.ndarray  # per-response cap in force, 0 = none
    predicted: np.ndarray  # row estimate at batch formation, NaN = none
    response_length: int  # configured rollout.response_length
    aborted: np.ndarray | None = None  # bool per response (over-sample aborts)
    sample_index: np.ndarray | None = None  # 0..n-1 within the row's group (verl's session id)
    num_preempted: np.ndarray | None = None  # vLLM's preemptions of each response's request, -1 = not reported

    def __post_init__(self):
        self.rows = np.asarray(self.rows, dtype=np.int64).reshape(-1)
        self.lengths = np.asarray(self.lengths, dtype=np.float64).reshape(-1)
        self.caps = np.asarray(self.caps, dtype=np.int64).reshape(-1)
        self.predicted = np.asarray(self.predicted, dtype=np.float64).reshape(-1)
        n = len(self.rows)
        if not (len(self.lengths) == len(self.caps) == len(self.predicted) == n):
            raise ValueError("rows, lengths, caps and predicted must have one entry per response")
        if self.aborted is not None:
            self.aborted = np.asarray(self.aborted, dtype=bool).reshape(-1)
        if self.sample_index is not None:
            self.sample_index = np.asarray(self.sample_index, dtype=np.int64).reshape(-1)
        if self.num_preempted is not None:
            self.num_preempted = np.asarray(self.num_preempted, dtype=np.int64).reshape(-1)
        for name in ("aborted", "sample_index", "num_preempted"):
            if getattr(self, name) is not None and len(getattr(self, name)) != n:
                raise ValueError(f"{name} must have one entry per response")

    def cap_hit(self) -> np.ndarray:
        return (self.caps > 0) & (self.lengths >= self.caps)

    def censored(self) -> np.ndarray:
        """Responses whose length is only a lower bound: cut by the cap, by response_length, or aborted."""
        c = self.cap_hit() | (self.lengths >= self.response_length)
        return c | self.aborted if self.aborted is not None else c


def step_metrics(resp: StepResponses, obs: GroupObservation | None) -> dict[str, float]:
    """The recipe's per-step metrics (docs/design.md, "Metrics and traces")."""
    m: dict[str, float] = {}
    n = len(resp.lengths)
    if n == 0:
        return m
    capped = resp.caps[resp.caps > 0]
    m["rollout/response_max_tokens_cap"] = float(capped.max()) if capped.size else 0.0
    m["rollout/cap_hit_ratio"] = float(resp.cap_hit().mean())
    m["rollout/truncated_ratio"] = float(resp.censored().mean())
    med = float(np.median(resp.lengths))
    m["rollout/response_length/max_over_median"] = float(resp.lengths.max() / med) if med > 0 else 0.0
    pred = resp.predicted
    have = np.isfinite(pred)
    if have.any():
        m["sampler/batch_pred_mean"] = float(pred[have].mean())
        m["sampler/batch_pred_spread"] = float(pred[have].max() - pred[have].min())
    if obs is not None and len(obs.rows) and have.any():
        # One prediction per row (all its responses carry the same one); compare with the row's observed statistic.
        first = np.unique(resp.rows, return_index=True)[1]
        row_pred = dict(zip(resp.rows[first].tolist(), pred[first].tolist()))
        p = np.array([row_pred.get(r, np.nan) for r in obs.rows.tolist()])
        ok = np.isfinite(p) & ~obs.censored & (obs.value > 0)
        if ok.any():
            m["sampler/pred_abs_rel_error"] = float(np.mean(np.abs(p[ok] - obs.value[ok]) / obs.value[ok]))
    return m


def group_tails(resp: StepResponses) -> GroupObservation:
    """Per-row maximum response length (the step's tail), with censoring; used to calibrate caps."""
    return reduce_groups(resp.rows, resp.lengths, resp.censored(), "max")
