"""Order an epoch by expected rollout time instead of tokens (multi-turn; ``data.sampler.order_by=time``).

:class:`TimeKeyEstimates` stands in for the token ``LengthEstimates`` inside an ``EpochPlan``: it answers what the plan
reads (``known``, ``filled``, ``get``, ``num_rows``, ``state_dict``) with each row's ``expected_time_key`` (tokens plus
tool calls x the run's mean tool latency, in tokens). The token estimates it wraps are shared, not copied, and stay
what caps, the tail cut's level and priorities read. The simulator drives the same class (``recipe/sim/multiturn``),
which is where ``tokens`` came out as the default: time ordering never beat it (docs/results.md, issue 18).
"""
from __future__ import annotations

import numpy as np

from .estimates import GroupObservation, LengthEstimates
from .ordering import expected_time_key


class TimeKeyEstimates:
    """Token estimates plus per-row tool-call estimates and the run's mean tool latency, keyed by expected time.

    Tool calls get their own ``LengthEstimates`` (EMA of the group mean, censored like the lengths: a trajectory cut
    by a cap or an abort made at least the calls it shows). The latency is one running mean over all calls of the
    run (total tool seconds / calls), not per row: per-call latencies are independent draws no row can predict.
    Rows whose calls are unknown take the calls' population prior, and 0 while no row has any.
    """

    def __init__(self, tokens: LengthEstimates, tokens_per_s: float):
        if not (np.isfinite(tokens_per_s) and tokens_per_s > 0):
            raise ValueError(f"tokens_per_s must be a finite number > 0, got {tokens_per_s}")
        self.tokens = tokens
        self.tokens_per_s = float(tokens_per_s)
        self.calls = LengthEstimates(tokens.num_rows, ema_decay=tokens.ema_decay, statistic="mean")
        self.latency_sum_s = 0.0
        self.latency_calls = 0

    # -- what EpochPlan reads ------------------------------------------------------------------------------------
    @property
    def num_rows(self) -> int:
        return self.tokens.num_rows

    @property
    def known(self) -> np.ndarray:
        """Rows with a token estimate: ordering by time starts when ordering by tokens would."""
        return self.tokens.known

    def get(self, rows, fill_prior: bool = True) -> np.ndarray:
        calls = np.nan_to_num(self.calls.get(rows, fill_prior), nan=0.0)
        return expected_time_key(self.tokens.get(rows, fill_prior), calls, self.mean_latency_s(), self.tokens_per_s)

    def filled(self) -> np.ndarray:
        return self.get(np.arange(self.num_rows))

    def mean_latency_s(self) -> float:
        """Seconds per tool call over the run so far (0 before any call: the order is then the token order)."""
        return self.latency_sum_s / self.latency_calls if self.latency_calls else 0.0

    # -- updates -------------------------------------------------------------------------------------------------
    def update_calls(self, row_ids, calls, censored=None) -> GroupObservation | None:
        """Fold one step's tool calls (one entry per response) into the per-row estimates; NaN entries (calls not
        reported) are skipped. Returns the reduced groups (None when nothing was reported)."""
        row_ids, calls, cens = _reported(row_ids, calls, censored)
        return self.calls.update(row_ids, calls, cens) if len(row_ids) else None

    def add_latency(self, seconds: float, calls: int) -> None:
        """Add ``calls`` tool calls that took ``seconds`` in total to the running mean."""
        if not (np.isfinite(seconds) and seconds >= 0 and calls >= 0):
            raise ValueError(f"tool latency: seconds ({seconds}) and calls ({calls}) must be finite and >= 0")
        self.latency_sum_s += float(seconds)
        self.latency_calls += int(calls)

    def observe(self, row_ids, calls, tool_s, censored=None) -> None:
        """One step's responses: their tool calls into the estimates, their tool seconds into the latency (over the
        responses whose calls were reported)."""
        calls = np.asarray(calls, dtype=np.float64)
        tool_s = np.asarray(tool_s, dtype=np.float64)
        if calls.shape != tool_s.shape:
            raise ValueError(f"tool calls {calls.shape} and tool seconds {tool_s.shape} differ in shape")
        self.update_calls(row_ids, calls, censored)
        ok = np.isfinite(calls)
        self.add_latency(float(np.nan_to_num(tool_s[ok]).sum()), int(calls[ok].sum()))

    def warm_start(self, row_ids, calls, tool_s, censored=None) -> int:
        """Seed the tool-call estimates and the latency from an earlier run's responses (``LengthEstimates.
        warm_start``'s rules); NaN calls are skipped. Returns the rows seeded."""
        rows, c, cens = _reported(row_ids, calls, censored)
        if not len(rows):
            return 0
        self.calls.warm_start(rows, c, cens)
        ok = np.isfinite(np.asarray(calls, dtype=np.float64))
        self.add_latency(float(np.nan_to_num(np.asarray(tool_s, dtype=np.float64)[ok]).sum()), int(c.sum()))
        return int(self.calls.seen.sum())

    # -- state ---------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The token estimates' state with the tool state beside it: a plain ``LengthEstimates`` loads it too (and
        ignores the tool keys), so a checkpoint can switch ``order_by`` on resume."""
        return {**self.tokens.state_dict(), "tool_calls": self.calls.state_dict(),
                "tool_latency_sum_s": self.latency_sum_s, "tool_latency_calls": self.latency_calls}

    def load_state_dict(self, state: dict) -> None:
        """Also a token-only state (order_by=tokens, or a checkpoint from before the time key): tool state empty."""
        self.tokens.load_state_dict(state)
        self.calls = LengthEstimates(self.num_rows, ema_decay=self.tokens.ema_decay, statistic="mean")
        if state.get("tool_calls") is not None:
            self.calls.load_state_dict(state["tool_calls"])
        self.latency_sum_s = float(state.get("tool_latency_sum_s", 0.0))
        self.latency_calls = int(state.get("tool_latency_calls", 0))


def _reported(row_ids, calls, censored) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The responses whose tool calls were reported (finite), with their censoring."""
    row_ids = np.asarray(row_ids, dtype=np.int64)
    calls = np.asarray(calls, dtype=np.float64)
    cens = np.zeros(calls.shape, bool) if censored is None else np.asarray(censored, dtype=bool)
    if not (row_ids.shape == calls.shape == cens.shape):
        raise ValueError(f"row_ids {row_ids.shape}, tool calls {calls.shape} and censored {cens.shape} differ in "
                         "shape (one entry per response)")
    ok = np.isfinite(calls)
    return row_ids[ok], calls[ok], cens[ok]
