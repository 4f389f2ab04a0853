"""Per-row response-length estimates, updated from every training step.

One estimate per dataset row (``dataset_item_idx``). Each step observes the n responses of a row's GRPO group,
reduces them to one number with a configurable statistic and folds it into an EMA whose ``ema_decay`` is the weight of
the old value (the seed's convention). The first observation initialises the estimate.

Censoring: a response that stopped because of a cap, ``response_length`` or an abort is only a lower bound on the
length the prompt wants. An observation containing such a response may raise an estimate but never lower it, so a
cap that is on for many epochs cannot drag the estimates of long prompts down toward the cap (which would in turn
lower the next cap: a feedback loop).

Warm start: without any observation the first epoch has nothing to order or cap by. ``warm_start`` folds the
responses of an earlier run on the same prompts in as observations (censored ones as lower bounds, the same rules),
and ``set_row_prior`` gives rows a per-row expected length (e.g. a dataset column; NaN = unknown) that stands in for
the estimate of a row until it is observed. Rows with either are *known*; ordering and caps treat known rows like
observed ones, and a row known by neither gets the population prior.
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

    ``prior`` is what an unknown row is assumed to need when at least one row is known (observed, warm-started or
    with a per-row prior): the median of the known rows' estimates (a row we know nothing about is put in the
    middle, neither in the short nor the long tail). With no row known at all there is no estimate and callers fall
    back to random order and no cap.
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
        self.row_prior = np.full(self.num_rows, np.nan)  # per-row expected length until observed (NaN: none)

    # -- queries -------------------------------------------------------------------------------------------------
    @property
    def seen(self) -> np.ndarray:
        """Rows with at least one observation (of this run, or of an earlier one through ``warm_start``)."""
        return self.count > 0

    @property
    def known(self) -> np.ndarray:
        """Rows with an estimate: observed, warm-started, or given a per-row prior."""
        return self.seen | np.isfinite(self.row_prior)

    def seen_ratio(self) -> float:
        return float(self.seen.mean())

    def known_ratio(self) -> float:
        return float(self.known.mean())

    def _own(self) -> np.ndarray:
        """Every row's own estimate: the observed one, else its per-row prior, else NaN."""
        return np.where(self.seen, self.value, self.row_prior)

    def prior(self) -> float:
        own = self._own()
        known = np.isfinite(own)
        return float(np.median(own[known])) if known.any() else float("nan")

    def get(self, rows, fill_prior: bool = True) -> np.ndarray:
        """Estimates for ``rows`` (observed, else the row's prior); rows known by neither get the population prior
        (NaN if no row is known or fill_prior is False)."""
        rows = np.asarray(rows, dtype=np.int64)
        est = np.where(self.seen[rows], self.value[rows], self.row_prior[rows])
        if fill_prior:
            est = np.where(np.isnan(est), self.prior(), est)
        return est

    def filled(self) -> np.ndarray:
        """All estimates, rows known by nothing set to the population prior."""
        return self.get(np.arange(self.num_rows))

    # -- warm start ----------------------------------------------------------------------------------------------
    def set_row_prior(self, prior) -> int:
        """Per-row expected lengths (one per row; NaN = unknown), used for a row until it is observed. Returns the
        number of rows it makes known."""
        prior = np.asarray(prior, dtype=np.float64)
        if prior.shape != (self.num_rows,):
            raise ValueError(f"row prior has shape {prior.shape}; want one value per row ({self.num_rows},), NaN for"
                             " rows without one")
        bad = ~np.isnan(prior) & ~(np.isfinite(prior) & (prior > 0))
        if bad.any():
            raise ValueError(f"row prior must be a positive length or NaN; rows {np.flatnonzero(bad)[:8].tolist()} "
                             f"have {prior[bad][:8].tolist()}")
        self.row_prior = prior.copy()
        return int(np.isfinite(prior).sum())

    def warm_start(self, row_ids, lengths, censored=None, epochs=None) -> int:
        """Fold an earlier run's responses on the same rows in before this run observes anything.

        One entry per response (``row_ids`` already mapped to this dataset's rows). With ``epochs`` (the earlier
        run's epoch of each response) every (epoch, row) group is one observation, folded in epoch order as that run
        would have; without, all of a row's responses form one group. Censored entries (cut by a cap, the response
        length or an abort) are lower bounds, as in ``update``. Returns the number of rows seeded.
        """
        if self.seen.any():
            raise RuntimeError("warm_start must come before the run's first update (a resumed run restores its "
                               "estimates from the checkpoint instead)")
        row_ids = np.asarray(row_ids, dtype=np.int64)
        lengths = np.asarray(lengths, dtype=np.float64)
        cens = np.zeros(row_ids.shape, bool) if censored is None else np.asarray(censored, dtype=bool)
        ep = np.zeros(row_ids.shape, np.int64) if epochs is None else np.asarray(epochs, dtype=np.int64)
        if not (row_ids.shape == lengths.shape == cens.shape == ep.shape) or row_ids.ndim != 1:
            raise ValueError(f"warm_start: row_ids {row_ids.shape}, lengths {lengths.shape}, censored {cens.shape} "
                             f"and epochs {ep.shape} must be 1-d with one entry per response")
        for e in np.unique(ep):
            sel = ep == e
            self.update(row_ids[sel], lengths[sel], cens[sel])
        return int(self.seen.sum())

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
            "row_prior": self.row_prior.copy(),
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
        if "row_prior" in state:  # absent in checkpoints written before per-row priors existed
            self.set_row_prior(state["row_prior"])
