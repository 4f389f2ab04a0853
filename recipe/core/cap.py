"""Per-batch response caps applied as vLLM ``max_tokens``.

Two policies with one interface (``cap_for_batch`` before generation, ``observe`` after it):

* ``SeedCap`` (default, the seed's formula): ``cap = min(response_length, max(min_tokens, factor * mean_est))``
  over the batch's length estimates.
* ``CalibratedCap``: the batch's predicted tail (max estimate) times the 0.95-quantile of recent per-prompt
  under-prediction ratios (observed group max / estimate at the time, last K epochs), rounded up to a multiple of
  ``align`` tokens and floored at ``min_tokens``. It adapts to how wrong the estimates actually are instead of a
  fixed factor.

Both return None (no cap) when the batch has no estimates or when the cap would be >= ``response_length``: the
configured response length already bounds every response, so such a cap changes nothing.
"""
from __future__ import annotations

import math
from collections import deque

import numpy as np


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

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


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
        self._ratios: deque[tuple[int, np.ndarray]] = deque()  # (epoch, ratios observed in that epoch)

    def ratio(self) -> float | None:
        """The quantile of the under-prediction ratios kept (None before the first observation)."""
        if not self._ratios:
            return None
        allr = np.concatenate([r for _, r in self._ratios])
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
        if not ok.any():
            return
        r = obs[ok] / pred[ok]
        if self._ratios and self._ratios[-1][0] == epoch:
            self._ratios[-1] = (epoch, np.concatenate([self._ratios[-1][1], r]))
        else:
            self._ratios.append((int(epoch), r))
        while self._ratios and self._ratios[0][0] <= epoch - self.history_epochs:
            self._ratios.popleft()

    def state_dict(self) -> dict:
        return {"ratios": [(e, r.copy()) for e, r in self._ratios]}

    def load_state_dict(self, state: dict) -> None:
        self._ratios = deque((int(e), np.asarray(r, dtype=np.float64)) for e, r in state.get("ratios", []))


def make_cap_policy(mode: str, response_length: int, **kw):
    """``mode``: 'seed' or 'calibrated'; unknown keyword arguments for that mode are an error."""
    if mode == "seed":
        return SeedCap(response_length, **kw)
    if mode == "calibrated":
        return CalibratedCap(response_length, **kw)
    raise ValueError(f"cap mode {mode!r} is not 'seed' or 'calibrated'")
