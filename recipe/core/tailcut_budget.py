"""Tail cut at a truncation budget (pure numpy): hold the extra truncation the cut causes at what the user accepts.

``recipe.core.tailcut.TailCut`` leaves ``(1 - fraction) x level^exponent`` of a step's responses unfinished. A fixed
fraction buys a different amount of truncation on every length distribution (tuned on one trace it gives +0.9
points on the reference trace, +0.2 on a heavy-tailed one). ``TailCutBudget`` instead takes the *extra* truncation
the user accepts (``budget``, e.g. 0.01: one response in a hundred stopped that would otherwise have ended with
EOS) and sets each step's allowance from what the run has observed so far:

* **What a cut costs** is only the stopped responses that would have ended with EOS before ``response_length``; a
  stopped response bound for the limit is truncated anyway. The run never learns which were which, so the cost of
  each cut response is estimated: ``P(EOS before the limit | still running at x tokens)`` from a Kaplan-Meier
  survival curve of response lengths over every response observed so far (ended with EOS: an event; hit the limit:
  survived to the limit; stopped by a cut or a cap: survived to its length, censored), each length taken relative
  to its row's estimate (``u = length / predicted``, so a long prompt's straggler is judged against long prompts'
  lengths; rows without an estimate use the step's mean estimate, and raw lengths are used when no row has one).
  (One curve per stratum of estimates was tried and held the budget worse: its strata are thin where cuts happen.)
  Before anything is observed every cut response counts as extra (conservative).
* **The controller** sets the allowance scale ``a`` (the ``1 - fraction`` of ``TailCut`` at level 1) for the next
  step from two things it keeps: ``kappa``, the estimated extra truncation per response that one unit of allowance
  has bought in recent steps (a ratio of sums, each step weighted ``memory^age``, starting from a prior of
  ``budget / initial_allowance`` worth two steps), and the running account ``D = (budget * N - E) / (budget * n)``
  (``E``: estimated extra truncation so far over ``N`` trained responses; ``n``: responses per step; so ``D`` is the
  budget left over, in steps' worth). ``a = budget * clip(1 + D / horizon, 0.1, 3) / kappa``, clipped to
  ``[min_allowance, max_allowance]``: it aims at the budget and pays a surplus or a deficit back over ``horizon``
  steps. Too much truncation so far tightens the next cuts, too little loosens them.

Everything it reads is what the trainer has after each step: each trained response's length, whether it hit the
limit, whether the cut (or a cap) stopped it, and its row's estimate (``recipe.core.step_stats.StepResponses``).

Trainer use: ``cut()`` before each step gives the ``TailCut`` to apply; ``observe(resp)`` after it; ``state_dict`` /
``load_state_dict`` for checkpoints.
"""
from __future__ import annotations

import math

import numpy as np

from .tailcut import TailCut

LOG_U_EDGES = np.linspace(-6.0, 6.0, 241)  # bins of log(length / estimate), 0.05 wide


class TailCutBudget:
    def __init__(self, budget: float, level_exponent: float = 0.0, *, initial_allowance: float | None = None,
                 horizon: float = 8.0, memory: float = 0.9, min_allowance: float = 1e-4, max_allowance: float = 0.5):
        if not (math.isfinite(budget) and 0 < budget < 1):
            raise ValueError(f"tail-cut truncation budget must be in (0, 1), got {budget}")
        if not (math.isfinite(horizon) and horizon > 0) or not 0 <= memory < 1:
            raise ValueError(f"tail-cut budget horizon must be > 0 and memory in [0, 1), got {horizon}, {memory}")
        if not 0 < min_allowance <= max_allowance < 1:
            raise ValueError(f"need 0 < min_allowance <= max_allowance < 1, got {min_allowance}, {max_allowance}")
        self.budget = float(budget)
        self.level_exponent = float(level_exponent)
        self.horizon, self.memory = float(horizon), float(memory)
        self.min_allowance, self.max_allowance = float(min_allowance), float(max_allowance)
        init = 2.5 * self.budget if initial_allowance is None else float(initial_allowance)
        self.allowance = float(np.clip(init, self.min_allowance, self.max_allowance))
        self.kappa_num, self.kappa_den = 2.0 * self.budget, 2.0 * self.allowance  # prior: budget / allowance
        TailCut(1.0 - self.allowance, self.level_exponent)  # validates the exponent
        self.events = np.zeros(len(LOG_U_EDGES) + 1)  # ended with EOS, per bin of log u
        self.censored = np.zeros(len(LOG_U_EDGES) + 1)  # hit the limit or stopped early, per bin of log u
        self.responses = 0  # trained responses observed
        self.extra = 0.0  # estimated extra truncation so far (responses)
        self.cut_responses = 0  # responses the cut stopped so far
        self.steps = 0

    # -- per step ----------------------------------------------------------------------------------------------------
    def cut(self) -> TailCut:
        """The rule for the next step."""
        return TailCut(1.0 - self.allowance, self.level_exponent)

    def observe(self, resp) -> dict[str, float]:
        """After a step: ``resp`` (``StepResponses``: lengths, response_length, predicted, caps, aborted) are its
        trained responses. Updates the survival curve, the account and the allowance; returns the step's metrics."""
        lengths = np.asarray(resp.lengths, dtype=np.float64)
        n = len(lengths)
        if n == 0:
            return self.metrics(0.0, 0)
        limit = lengths >= resp.response_length
        stopped = np.asarray(resp.censored(), bool) & ~limit  # cut (or capped): survived to its length
        cut = (np.zeros(n, bool) if resp.aborted is None else np.asarray(resp.aborted, bool)) & ~limit
        scale = self._scale(resp.predicted, resp.response_length, n)
        u_len = self._bin(lengths / scale)
        # the step's cost, judged on what was known before it (the curve before this step's responses)
        p_eos = self.p_eos_after(u_len[cut], self._bin(resp.response_length / scale[cut]))
        step_extra = float(p_eos.sum())
        eos = ~limit & ~stopped
        np.add.at(self.events, u_len[eos], 1.0)
        np.add.at(self.censored, u_len[~eos], 1.0)
        self.responses += n
        self.extra += step_extra
        self.cut_responses += int(cut.sum())
        self.steps += 1
        self.kappa_num = self.memory * self.kappa_num + step_extra / n
        self.kappa_den = self.memory * self.kappa_den + self.allowance
        kappa = max(self.kappa_num / self.kappa_den, 1e-6)
        left = (self.budget * self.responses - self.extra) / (self.budget * n)  # budget left, in steps' worth
        aim = self.budget * float(np.clip(1.0 + left / self.horizon, 0.1, 3.0))
        self.allowance = float(np.clip(aim / kappa, self.min_allowance, self.max_allowance))
        return self.metrics(step_extra, n)

    def metrics(self, step_extra: float, n: int) -> dict[str, float]:
        return {"rollout/tail_cut/budget": self.budget,
                "rollout/tail_cut/allowance": self.allowance,
                "rollout/tail_cut/est_extra_truncation_step": step_extra / n if n else 0.0,
                "rollout/tail_cut/est_extra_truncation": self.extra / self.responses if self.responses else 0.0}

    # -- the survival curve ------------------------------------------------------------------------------------------
    @staticmethod
    def _scale(predicted, response_length: int, n: int) -> np.ndarray:
        pred = np.full(n, np.nan) if predicted is None else np.asarray(predicted, dtype=np.float64).ravel()
        ok = np.isfinite(pred) & (pred > 0)
        if not ok.any():
            return np.full(n, float(response_length))
        return np.where(ok, pred, pred[ok].mean())

    @staticmethod
    def _bin(u) -> np.ndarray:
        return np.searchsorted(LOG_U_EDGES, np.log(np.maximum(np.asarray(u, dtype=np.float64), 1e-12)), side="right")

    def p_eos_after(self, start_bin, limit_bin) -> np.ndarray:
        """P(ending with EOS before the limit | running at ``start_bin``), per response: 1 - S(limit) / S(start)
        on the Kaplan-Meier curve so far (1 where nobody is known at risk there: every cut counts)."""
        start_bin = np.asarray(start_bin, np.int64)
        limit_bin = np.maximum(np.asarray(limit_bin, np.int64), start_bin)
        if start_bin.size == 0:
            return np.zeros(0)
        at_risk = np.cumsum((self.events + self.censored)[::-1])[::-1]  # in bin j or later
        hazard = np.divide(self.events, at_risk, out=np.zeros_like(self.events), where=at_risk > 0)
        log_surv = np.concatenate([[0.0], np.cumsum(np.log1p(-np.minimum(hazard, 1 - 1e-12)))])  # before bin j
        known = at_risk[np.minimum(start_bin, len(at_risk) - 1)] > 0
        stay = np.exp(log_surv[limit_bin] - log_surv[start_bin])
        return np.where(known, 1.0 - stay, 1.0)

    # -- checkpoints -------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"allowance": self.allowance, "kappa": [self.kappa_num, self.kappa_den],
                "events": self.events.tolist(), "censored": self.censored.tolist(),
                "responses": self.responses, "extra": self.extra, "cut_responses": self.cut_responses,
                "steps": self.steps, "budget": self.budget}

    def load_state_dict(self, state: dict) -> None:
        self.allowance = float(np.clip(state["allowance"], self.min_allowance, self.max_allowance))
        self.kappa_num, self.kappa_den = (float(x) for x in state["kappa"])
        self.events = np.asarray(state["events"], dtype=np.float64)
        self.censored = np.asarray(state["censored"], dtype=np.float64)
        self.responses, self.extra = int(state["responses"]), float(state["extra"])
        self.cut_responses, self.steps = int(state["cut_responses"]), int(state["steps"])
