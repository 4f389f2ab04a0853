"""Per-batch response caps applied as vLLM ``max_tokens``.

Three policies with one interface (``cap_for_batch`` before generation, ``observe_step`` with the step's trained
responses after it; ``observe`` is the older group-tail form of the same, kept by the seed and calibrated caps):

* ``SeedCap`` (default, the seed's formula): ``cap = min(response_length, max(min_tokens, factor * mean_est))``
  over the batch's length estimates.
* ``CalibratedCap``: the batch's predicted tail (max estimate) times the 0.95-quantile of recent per-prompt
  under-prediction ratios (observed group max / estimate at the time, last K epochs), rounded up to a multiple of
  ``align`` tokens and floored at ``min_tokens``. It adapts to how wrong the estimates actually are instead of a
  fixed factor.
* ``BudgetCap``: the lowest cap whose expected *extra* truncation in the batch stays within a budget: responses the
  cap would cut that ``response_length`` would not. A response's length is modelled as its row's estimate times a
  ratio drawn from the recent per-response ratios observed / predicted. Short batches, where one runaway response
  holds up hundreds of finished ones, get low caps; long batches, whose tails ``response_length`` cuts anyway, get
  caps near the limit. The budget is spent where it saves the most time per truncated response.

``warm_start_cap`` calibrates the learning caps from an earlier run's responses (how that run's own estimates
predicted each of its epochs from the ones before), so that they can cap a warm-started first epoch.

All return None (no cap) when the batch has no estimates or when the cap would be >= ``response_length``: the
configured response length already bounds every response, so such a cap changes nothing.
"""
from __future__ import annotations

import math
from collections import deque

import numpy as np

from .estimates import LengthEstimates
from .step_stats import StepResponses, group_tails


def _finite(est) -> np.ndarray:
    est = np.asarray(est, dtype=np.float64)
    return est[np.isfinite(est)]


class SeedCap:
    name = "seed"

    def __init__(self, response_length: int, factor: float = 2.0, min_tokens: int = 10000):
        if factor <= 0:
            raise ValueError(f"cap factor must be positive, got {factor}")
        if min_tokens < 1:
            raise ValueError(f"cap min_tokens must be >= 1, got {min_tokens}")
        self.response_length = int(response_length)
        self.factor = float(factor)
        self.min_tokens = int(min_tokens)

    def cap_for_batch(self, estimates) -> int | None:
        est = _finite(estimates)
        if est.size == 0:
            return None
        cap = min(self.response_length, max(self.min_tokens, int(math.ceil(self.factor * float(est.mean())))))
        return None if cap >= self.response_length else cap

    def observe(self, epoch: int, predicted, observed_tail, censored) -> None:
        """The seed formula does not learn."""

    def observe_step(self, epoch: int, resp: StepResponses) -> None:
        """The seed formula does not learn."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class _RatioHistory:
    """Per-epoch arrays of observed / predicted ratios, the last ``history_epochs`` epochs kept."""

    def __init__(self, history_epochs: int):
        self.history_epochs = int(history_epochs)
        self.items: deque[tuple[int, np.ndarray]] = deque()

    def add(self, epoch: int, ratios: np.ndarray) -> None:
        if self.items and self.items[-1][0] == epoch:
            self.items[-1] = (epoch, np.concatenate([self.items[-1][1], ratios]))
        else:
            self.items.append((int(epoch), ratios))
        while self.items and self.items[0][0] <= epoch - self.history_epochs:
            self.items.popleft()

    def all(self) -> np.ndarray:
        return np.concatenate([r for _, r in self.items]) if self.items else np.zeros(0)

    def state(self) -> list:
        return [(e, r.copy()) for e, r in self.items]

    def load(self, items) -> None:
        self.items = deque((int(e), np.asarray(r, dtype=np.float64)) for e, r in items)


class CalibratedCap:
    name = "calibrated"

    def __init__(
        self,
        response_length: int,
        quantile: float = 0.95,
        history_epochs: int = 3,
        align: int = 512,
        min_tokens: int = 4096,
    ):
        if not 0 < quantile <= 1:
            raise ValueError(f"calibrated cap quantile must be in (0, 1], got {quantile}")
        if history_epochs < 1 or align < 1 or min_tokens < 1:
            raise ValueError("calibrated cap history_epochs, align and min_tokens must be >= 1")
        self.response_length = int(response_length)
        self.quantile = float(quantile)
        self.history_epochs = int(history_epochs)
        self.align = int(align)
        self.min_tokens = int(min_tokens)
        self._ratios = _RatioHistory(history_epochs)

    def ratio(self) -> float | None:
        """The quantile of the under-prediction ratios kept (None before the first observation)."""
        allr = self._ratios.all()
        return float(np.quantile(allr, self.quantile)) if allr.size else None

    def cap_for_batch(self, estimates) -> int | None:
        est = _finite(estimates)
        ratio = self.ratio()
        if est.size == 0 or ratio is None:
            return None
        raw = float(est.max()) * max(ratio, 1.0)
        cap = max(self.min_tokens, int(math.ceil(raw / self.align)) * self.align)
        return None if cap >= self.response_length else cap

    def observe(self, epoch: int, predicted, observed_tail, censored) -> None:
        """Record per-prompt ratios observed/predicted. Censored tails are lower bounds and enter as such: they sit
        at or above the cap that cut them, so they keep the quantile from shrinking under its own cap."""
        pred = np.asarray(predicted, dtype=np.float64)
        obs = np.asarray(observed_tail, dtype=np.float64)
        ok = np.isfinite(pred) & (pred > 0)
        if ok.any():
            self._ratios.add(epoch, obs[ok] / pred[ok])

    def observe_step(self, epoch: int, resp: StepResponses) -> None:
        """``observe`` with each row's group tail (max) and the prediction its responses carried."""
        tails = group_tails(resp)
        self.observe(epoch, _row_predictions(resp, tails.rows), tails.value, tails.censored)

    def state_dict(self) -> dict:
        return {"ratios": self._ratios.state()}

    def load_state_dict(self, state: dict) -> None:
        self._ratios.load(state.get("ratios", []))


def _row_predictions(resp: StepResponses, rows: np.ndarray) -> np.ndarray:
    """The prediction each of ``rows`` carried (all responses of a row carry the same one)."""
    first = np.unique(resp.rows, return_index=True)[1]
    pred_of = dict(zip(resp.rows[first].tolist(), resp.predicted[first].tolist()))
    return np.array([pred_of[r] for r in rows.tolist()], dtype=np.float64)


class BudgetCap:
    name = "budget"

    def __init__(self, response_length: int, budget: float = 0.008, history_epochs: int = 3, align: int = 256,
                 min_tokens: int = 1024):
        if not 0 <= budget < 1:
            raise ValueError(f"budget cap budget (expected extra-truncated fraction) must be in [0, 1), got {budget}")
        if history_epochs < 1 or align < 1 or min_tokens < 1:
            raise ValueError("budget cap history_epochs, align and min_tokens must be >= 1")
        self.response_length = int(response_length)
        self.budget = float(budget)
        self.align = int(align)
        self.min_tokens = int(min_tokens)
        self._ratios = _RatioHistory(history_epochs)
        lo = -(-self.min_tokens // self.align) * self.align
        self._candidates = np.arange(lo, self.response_length, self.align, dtype=np.float64)

    def extra_truncation(self, estimates, caps) -> np.ndarray | None:
        """Expected fraction of the batch's responses each of ``caps`` would cut that ``response_length`` would
        not (None before any observation)."""
        est = _finite(estimates)
        ratios = np.sort(self._ratios.all())
        if est.size == 0 or ratios.size == 0:
            return None
        caps = np.asarray(caps, dtype=np.float64)
        above_cap = np.searchsorted(ratios, caps[:, None] / est[None, :], side="right")
        below_limit = np.searchsorted(ratios, self.response_length / est, side="left")
        return np.clip(below_limit[None, :] - above_cap, 0, None).mean(axis=1) / ratios.size

    def cap_for_batch(self, estimates) -> int | None:
        extra = self.extra_truncation(estimates, self._candidates)
        if extra is None:
            return None
        ok = np.flatnonzero(extra <= self.budget)
        return int(self._candidates[ok[0]]) if ok.size else None

    def observe_step(self, epoch: int, resp: StepResponses) -> None:
        """Record per-response ratios length / prediction. A censored response enters at its observed length, a
        lower bound: for the caps below the one that cut it the model counts it as cut again (right), above that
        as not (optimistic, but only about raising the cap, which then corrects itself when it cuts)."""
        ok = np.isfinite(resp.predicted) & (resp.predicted > 0)
        if ok.any():
            self._ratios.add(epoch, resp.lengths[ok] / resp.predicted[ok])

    def state_dict(self) -> dict:
        return {"ratios": self._ratios.state()}

    def load_state_dict(self, state: dict) -> None:
        self._ratios.load(state.get("ratios", []))


CAP_MODES = ("seed", "calibrated", "budget")


def make_cap_policy(mode: str, response_length: int, **kw):
    """``mode``: one of ``CAP_MODES``; unknown keyword arguments for that mode are an error."""
    if mode == "seed":
        return SeedCap(response_length, **kw)
    if mode == "calibrated":
        return CalibratedCap(response_length, **kw)
    if mode == "budget":
        return BudgetCap(response_length, **kw)
    raise ValueError(f"cap mode {mode!r} is not one of {CAP_MODES}")


WARM_EPOCH = -1  # the epoch the earlier run's calibration is filed under (it ages out like this run's epoch -1)


def warm_start_cap(cap, row_ids, lengths, censored, epochs, *, response_length: int, ema_decay: float,
                   statistic: str) -> int:
    """Calibrate a learning cap from an earlier run's responses (one entry per response, ``epochs`` = that run's
    epoch of each) before this run's first step: replay that run's estimates (``LengthEstimates`` with this run's
    ``ema_decay`` and ``statistic``), and feed the cap, for each epoch after the first, the responses with the
    predictions the estimates made for them from the epochs before. Filed under ``WARM_EPOCH``, so the cap forgets
    them as it forgets this run's old epochs. Returns the number of responses fed (0: one epoch only, nothing
    to calibrate on)."""
    rows = np.asarray(row_ids, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.float64)
    cens = np.asarray(censored, dtype=bool)
    ep = np.asarray(epochs, dtype=np.int64)
    if not rows.shape == lengths.shape == cens.shape == ep.shape:
        raise ValueError("warm_start_cap: row_ids, lengths, censored and epochs need one entry per response")
    if rows.size == 0:
        return 0
    replay = LengthEstimates(int(rows.max()) + 1, ema_decay=ema_decay, statistic=statistic)
    fed = 0
    for e in np.unique(ep):
        sel = ep == e
        if replay.seen.any():
            resp = StepResponses(rows=rows[sel], lengths=lengths[sel], caps=np.zeros(int(sel.sum()), np.int64),
                                 predicted=replay.get(rows[sel], fill_prior=False), response_length=response_length,
                                 aborted=cens[sel] & (lengths[sel] < response_length))
            cap.observe_step(WARM_EPOCH, resp)
            fed += int(sel.sum())
        replay.update(rows[sel], lengths[sel], cens[sel])
    return fed
