"""Tail cut (pure, numpy only; a candidate for ``recipe/core``): end a step once a fraction of its responses is done.

A synchronous step lasts as long as its slowest response, and the slowest responses of a step are mostly the ones
``response_length`` truncates anyway. Stopping the step when ``fraction`` of its responses have finished (vLLM abort;
the stopped responses keep their partial tokens and are trained as truncated, like a cap hit) spends the truncation
budget exactly on those stragglers, which a cap chosen before the step can only guess at. No group is dropped, so
every prompt is still trained once per epoch.
"""
from __future__ import annotations

import math

import numpy as np


class TailCut:
    def __init__(self, fraction: float):
        if not 0 < fraction <= 1:
            raise ValueError(f"tail-cut fraction must be in (0, 1], got {fraction}")
        self.fraction = float(fraction)

    def cut_time(self, finish_time) -> float:
        """When the step ends: the finish time of its ceil(fraction * responses)-th response."""
        t = np.sort(np.asarray(finish_time, dtype=np.float64).ravel())
        return float(t[max(1, math.ceil(self.fraction * len(t) - 1e-9)) - 1])
