"""A tail cut that knows the future (not realisable): how far any cut rule could go on a given order.

A synchronous step that is cut at time ``t`` saves ``T - t`` (``T``: when its last response would finish) and
truncates every response still running at ``t``; the ones that would have ended with EOS are the extra truncation
the on-policy goal counts (those running into ``response_length`` are truncated anyway, in the baseline too). Any
cut rule, on counts, elapsed time or a model of the remaining tokens, picks one ``t`` per step, so the best it can do
is the best trade-off over those choices. ``best_cut_time`` makes it with the step's true finish times: the ``t``
maximising ``(T - t) - lam * extra(t)``, ``lam`` seconds per extra truncated response. With one ``lam`` for every
step, that is the Lagrangian of spending a truncation budget over the steps: for the budget it ends at, no choice of
one cut per step saves more time in total. ``ForesightCutExecutor`` runs a tail-cut policy with it in place of the
policy's own rule; everything else (order, estimates fed the cut responses as censored, the engine model) stays.
What it leaves out: the cut responses feed back into the estimates, so the order of later epochs differs from the
count rule's; the reference is for the order that results, not a bound over every order.
"""
from __future__ import annotations

import numpy as np

from .run import ModelExecutor, token_limit


def best_cut_time(finish, natural, lam: float) -> float:
    """The cut time maximising ``(T - t) - lam * (natural responses still running at t)``, over the responses' finish
    times ``t`` (no cut: ``T``, the last finish). ``natural``: which responses would end with EOS (same shape)."""
    f = np.asarray(finish, dtype=np.float64).ravel()
    nat = np.asarray(natural, dtype=bool).ravel()
    if f.size == 0 or f.shape != nat.shape:
        raise ValueError(f"need one natural flag per finish time, got {f.shape} and {nat.shape}")
    if not lam >= 0:
        raise ValueError(f"lam (seconds per extra truncated response) must be >= 0, got {lam}")
    order = np.argsort(f)
    t, n = f[order], nat[order]
    still = np.concatenate([np.cumsum(n[::-1])[::-1][1:], [0]])  # natural ones after the k-th in this order
    # ties: a cut at t stops none of the responses finishing at t, yet ``still`` counts the tied ones after the k-th
    # as running; it is least at the last of a tied run, so that one scores highest and any of them gives the same t
    return float(t[int(np.argmax((t[-1] - t) - lam * still))])


def ends_with_eos(policy, plan, launch) -> np.ndarray:
    """Which launched responses would end with EOS, i.e. stop before their token limit (cap or response_length)."""
    return launch.target < token_limit(plan.caps, policy.response_length)[:, None]


class ForesightCutExecutor(ModelExecutor):
    """``ModelExecutor`` whose tail cut is ``best_cut_time`` at ``lam`` (the policy must be a tail-cut policy: its
    own rule is replaced, its order and estimates are not). ``limit_bound_free=False`` charges every response the
    cut stops, as if it could not tell the ones bound for the limit: the part of the foresight that is timing alone."""

    def __init__(self, engine, seed: int = 0, *, lam: float, limit_bound_free: bool = True):
        super().__init__(engine, seed)
        self.lam, self.limit_bound_free = float(lam), limit_bound_free

    def cut_time(self, policy, plan, launch, finish, kept) -> float:
        charged = ends_with_eos(policy, plan, launch) if self.limit_bound_free else np.ones(launch.target.shape, bool)
        return best_cut_time(finish[kept], charged[kept], self.lam)
