"""What a realisable tail cut can know of which stragglers are bound for the limit (pure numpy).

Half of the foresight cut's gain over the count rule (``recipe.sim.foresight``) is that it knows which of a step's
still-running responses would run into ``response_length`` anyway: cutting those costs nothing. A rule that runs in
the trainer cannot know; the most it can have is a posterior. ``expected_natural`` is that posterior, on the best
terms the simulator can give it: the trace's own model (each group's responses lognormal around the group's level
with the trace's within-group spread; the heavy_tail shape's runaway multipliers are left out), a prior on the level from the row's estimate, and everything the trainer sees
by time ``t``: which responses finished, their lengths, which of them hit the limit, and that the others have at
least ``g`` tokens (``g``: the longest response that ended with EOS by ``t``; every response of a step starts at
once). ``bench/cut_ceiling.py`` compares it with what the foresight cut's chosen moments really held.
"""
from __future__ import annotations

import math

import numpy as np

GRID = np.linspace(-4.0, 4.0, 161)  # the level's prior, in prior standard deviations


def normal_sf(x: np.ndarray) -> np.ndarray:
    """P(Z > x) for a standard normal (erfc by its Chebyshev fit, relative error < 1.2e-7; numpy has no erfc)."""
    z = np.abs(np.asarray(x, dtype=np.float64)) / math.sqrt(2.0)
    t = 1.0 / (1.0 + 0.5 * z)
    poly = -z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (
        -0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))))
    erfc = t * np.exp(poly)
    return np.where(np.asarray(x) >= 0, 0.5 * erfc, 1.0 - 0.5 * erfc)


def expected_natural(finish, length, predicted, t: float, *, response_length: int, within_sigma: float,
                     prior_sd: float) -> float:
    """The expected number of the responses still running at ``t`` that would end with EOS before the limit.

    ``finish`` and ``length`` are ``(groups, n)``: when each response finishes and its length (only those finished
    by ``t`` are read); ``predicted``: each group's estimate (mean length; NaN: unknown, a flat prior)."""
    f = np.asarray(finish, dtype=np.float64)
    x = np.asarray(length, dtype=np.float64)
    est = np.asarray(predicted, dtype=np.float64).ravel()
    if f.ndim != 2 or f.shape != x.shape or est.shape != (f.shape[0],):
        raise ValueError(f"need finish and length as (groups, n) and one estimate per group, got {f.shape}, "
                         f"{x.shape} and {est.shape}")
    if not (within_sigma > 0 and prior_sd > 0 and response_length > 0):
        raise ValueError("within_sigma, prior_sd and response_length must be > 0")
    done = f <= t
    running = (~done).sum(axis=1)
    natural_done = done & (x < response_length)
    if not running.any():
        return 0.0
    g = x[natural_done].max() if natural_done.any() else 1.0
    known = np.isfinite(est) & (est > 0)
    centre = np.where(known, np.log(np.where(known, est, 1.0)) - within_sigma**2 / 2, math.log(g))
    level = centre[:, None] + np.where(known, prior_sd, 3 * within_sigma)[:, None] * GRID[None, :]
    log_post = np.where(known[:, None], -0.5 * GRID[None, :] ** 2, 0.0)
    beyond_g = np.clip(normal_sf((math.log(g) - level) / within_sigma), 1e-300, 1.0)
    beyond_limit = normal_sf((math.log(response_length) - level) / within_sigma)
    log_post += running[:, None] * np.log(beyond_g)
    z = (np.log(np.where(natural_done, x, 1.0))[:, :, None] - level[:, None, :]) / within_sigma
    log_post += np.where(natural_done[:, :, None], -0.5 * z**2, 0.0).sum(axis=1)
    hit = (done & (x >= response_length)).sum(axis=1)
    log_post += hit[:, None] * np.log(np.clip(beyond_limit, 1e-300, 1.0))
    w = np.exp(log_post - log_post.max(axis=1, keepdims=True))
    w /= w.sum(axis=1, keepdims=True)
    p_natural = 1.0 - np.minimum(beyond_limit / beyond_g, 1.0)
    return float((running * (w * p_natural).sum(axis=1)).sum())
