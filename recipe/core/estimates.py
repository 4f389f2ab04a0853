"""Per-row response-length estimates, updated from every training step.

One estimate per dataset row (``dataset_item_idx``). Each step observes the n responses of a row's GRPO group,
reduces them to one number with a configurable statistic and folds it into an EMA whose ``ema_decay`` is the weight of
the old value (the seed's convention). The first observation initialises the estimate.

Censoring: a response that stopped because of a cap, ``response_length`` or an abort is only a lower bound on the
length the prompt wants. An observation containing such a response may raise an estimate but never lower it, so a
cap that is on for many epochs cannot drag the estimates of long prompts down toward the cap (which would in turn
lower the next cap: a feedback loop).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

STATISTICS = ("mean", "max", "p90", "p75", "median")


def parse_statistic(name: str) -> float | None:
    """Return the quantile for a statistic name (None for the mean)."""
    if name == "mean":
        return None
    if name == "max":
        return 1.0
    if name == "median":
        return 0.5
    if name.startswith("p") and name[1:].isdigit() and 0 < int(name[1:]) <= 100:
        return int(name[1:]) / 100.0
    raise ValueError(f"length statistic {name!r} is not one of {STATISTICS} (or pNN with 0 < NN <= 100)")


@dataclass
class GroupObservation:
    """The reduced observation of each row seen in one step."""

    rows: np.ndarray  # unique row ids, int64
    value: np.ndarray  # the statistic over the row's responses (a lower bound where censored)
    censored: np.ndarray  # bool: at least one response was cut by cap/response_length/abort
    n: np.ndarray  # responses per row


def reduce_groups(
    row_ids: np.ndarray, lengths: np.ndarray, censored: np.ndarray | None, statistic: str = "mean"
) -> GroupObservation:
    """Group responses by row and reduce each group with ``statistic``.

    Censored responses enter with their observed (partial) length, so the result is a lower bound for that row.
    """
    row_ids = np.asarray(row_ids, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.float64)
    if row_ids.shape != lengths.shape:
        raise ValueError(f"row_ids {row_ids.shape} and lengths {lengths.shape} differ in shape")
    cens = np.zeros(row_ids.shape, bool) if censored is None else np.asarray(censored, dtype=bool)
    q = parse_statistic(statistic)
    order = np.argsort(row_ids, kind="stable")
    r, v, c = row_ids[order], lengths[order], cens[order]
    rows, starts, counts = np.unique(r, return_index=True, return_counts=True)
    any_cens = np.logical_or.reduceat(c, starts) if len(r) else np.zeros(0, bool)
    if q is None:
        value = np.add.reduceat(v, starts) / counts if len(r) else np.zeros(0)
    elif q == 1.0:
        value = np.maximum.reduceat(v, starts) if len(r) else np.zeros(0)
    elif np.all(counts == counts[0]) if len(counts) else True:
        # Equal group sizes (the GRPO case): one vectorised quantile over a (rows, n) matrix.
        value = np.quantile(v.reshape(len(rows), -1), q, axis=1) if len(r) else np.zeros(0)
    else:
        value = np.array([np.quantile(v[s : s + k], q) for s, k in zip(starts, counts)])
    return GroupObservation(rows=rows, value=value, censored=any_cens, n=counts)


class LengthEstimates:
    """EMA length estimate per dataset row, with censoring-aware updates and a documented prior.

    ``prior`` is what an unseen row is assumed to need when at least one row has been seen: the median of the
    current estimates (a row we know nothing about is put in the middle, neither in the short nor the long tail).
    With no row seen at all there is no estimate and callers fall back to random order and no cap.
    """

    def __init__(self, num_rows: int, ema_decay: float = 0.7, statistic: str = "mean"):
        if num_rows <= 0:
            raise ValueError(f"num_rows must be positive, got {num_rows}")
        if not 0.0 <= ema_decay < 1.0:
            raise ValueError(f"ema_decay is the weight of the old value and must be in [0, 1), got {ema_decay}")
        parse_statistic(statistic)
        self.num_rows = int(num_rows)
        self.ema_decay = float(ema_decay)
        self.statistic = statistic
        self.value = np.full(self.num_rows, np.nan)
        self.count = np.zeros(self.num_rows, np.int64)
        self.censored = np.zeros(self.num_rows, bool)  # the estimate is only a lower bound (set by a censored obs)

    # -- queries -------------------------------------------------------------------------------------------------
    @property
    def seen(self) -> np.ndarray:
        return self.count > 0

    def seen_ratio(self) -> float:
        return float(self.seen.mean())

    def prior(self) -> float:
        seen = self.seen
        return float(np.median(self.value[seen])) if seen.any() else float("nan")

    def get(self, rows, fill_prior: bool = True) -> np.ndarray:
        """Estimates for ``rows``; unseen rows get the prior (NaN if nothing is seen or fill_prior is False)."""
        est = self.value[np.asarray(rows, dtype=np.int64)]
        if fill_prior:
            est = np.where(np.isnan(est), self.prior(), est)
        return est

    def filled(self) -> np.ndarray:
        """All estimates with unseen rows set to the prior."""
        return self.get(np.arange(self.num_rows))

    # -- updates -------------------------------------------------------------------------------------------------
    def update(self, row_ids, lengths, censored=None) -> GroupObservation:
        """Fold one step's responses (one entry per response) into the estimates; returns the reduced groups."""
        obs = reduce_groups(row_ids, lengths, censored, self.statistic)
        self.apply(obs)
        return obs

    def apply(self, obs: GroupObservation) -> None:
        rows = obs.rows
        if len(rows) and (rows.min() < 0 or rows.max() >= self.num_rows):
            raise IndexError(f"row id out of range [0, {self.num_rows}): {rows.min()}..{rows.max()}")
        old = self.value[rows]
        first = self.count[rows] == 0
        ema = self.ema_decay * old + (1.0 - self.ema_decay) * obs.value
        new = np.where(first, obs.value, ema)
        # Censored: a lower bound may raise the estimate through the EMA step, never lower it.
        new = np.where(obs.censored & ~first, np.maximum(old, ema), new)
        # An exact observation above an estimate that is itself only a lower bound replaces it: averaging the two
        # would bias the estimate low (e.g. a prompt first seen as an aborted partial response).
        replace = ~first & ~obs.censored & self.censored[rows] & (obs.value > old)
        new = np.where(replace, obs.value, new)
        self.value[rows] = new
        self.count[rows] += 1
        # still a lower bound only while every observation so far was censored or the bound was not exceeded
        self.censored[rows] = obs.censored & (first | self.censored[rows] | (new > old))

    # -- state ---------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "value": self.value.copy(),
            "count": self.count.copy(),
            "censored": self.censored.copy(),
            "ema_decay": self.ema_decay,
            "statistic": self.statistic,
        }

    def load_state_dict(self, state: dict) -> None:
        value = np.asarray(state["value"], dtype=np.float64)
        if value.shape != (self.num_rows,):
            raise ValueError(
                f"length estimates in the checkpoint cover {value.shape[0]} rows but the dataset has {self.num_rows}:"
                " the train file or its truncation changed since the checkpoint was written"
            )
        self.value = value.copy()
        self.count = np.asarray(state["count"], dtype=np.int64).copy()
        self.censored = np.asarray(state["censored"], dtype=bool).copy()
