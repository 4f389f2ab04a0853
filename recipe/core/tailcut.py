"""Tail cut (pure numpy): end a rollout step once enough of its responses are done.

A synchronous step lasts as long as its slowest response, and every request of a step starts at once, so the last
responses to finish are the longest ones: a handful of stragglers decode alone, at single-stream speed, while the
rest of the step waits. Stopping the step once ``fraction`` of its launched responses have finished (vLLM abort of
the requests still running; each stopped response keeps its tokens and is trained as truncated, exactly like a cap
hit) spends the truncation budget on those stragglers, which a cap chosen before the step can only guess at. No
group is dropped and nothing is resumed later, so every prompt is still trained once per epoch, on-policy.

``level_exponent`` makes the allowance per step: a batch whose mean estimate is ``level`` times the mean estimate of
all known rows (``batch_level``) may leave ``(1 - fraction) * level ** level_exponent`` of its responses unfinished.
Responses spread multiplicatively around their prompt's level, so cutting the stragglers of a long batch saves more
time per truncated response than cutting those of a short one.

Trainer use, per step: ``need = cut.finished_needed(launched, level)`` when the batch is formed (``level`` from
``batch_level`` over the estimates the sampler formed it by, 1.0 without ``level_exponent``), then after each
finished response ``cut.should_cut(finished, launched, level)``: True once ``need`` responses are done and some are
still running, i.e. abort the rest now. ``cut_time`` is the same rule applied to known finish times (the simulator).
"""
from __future__ import annotations

import math

import numpy as np


class TailCut:
    def __init__(self, fraction: float, level_exponent: float = 0.0):
        if not 0 < fraction <= 1:
            raise ValueError(f"tail-cut fraction must be in (0, 1], got {fraction}")
        if not math.isfinite(level_exponent) or level_exponent < 0:
            raise ValueError(f"tail-cut level_exponent must be a finite number >= 0, got {level_exponent}")
        self.fraction = float(fraction)
        self.level_exponent = float(level_exponent)

    def finished_needed(self, launched: int, level: float = 1.0) -> int:
        """Responses of a step of ``launched`` that must have finished before it is cut (at least 1)."""
        if launched < 1:
            raise ValueError(f"a step launches at least one response, got launched={launched}")
        if not (math.isfinite(level) and level > 0):
            raise ValueError(f"tail-cut batch level must be a finite number > 0, got {level}")
        allowed = min(1.0, (1.0 - self.fraction) * level**self.level_exponent)
        return max(1, math.ceil(launched * (1.0 - allowed) - 1e-9))

    def should_cut(self, finished: int, launched: int, level: float = 1.0) -> bool:
        """Whether to abort the step's still-running responses now."""
        if not 0 <= finished <= launched:
            raise ValueError(f"finished={finished} responses must lie in [0, launched={launched}]")
        return finished < launched and finished >= self.finished_needed(launched, level)

    def cut_time(self, finish_time, level: float = 1.0) -> float:
        """When the step ends, given when each of its responses finishes: the ``finished_needed``-th finish."""
        t = np.sort(np.asarray(finish_time, dtype=np.float64).ravel())
        if t.size == 0:
            raise ValueError("cut_time needs the finish time of at least one response")
        return float(t[self.finished_needed(t.size, level) - 1])


def batch_level(batch_estimates, all_estimates) -> float:
    """The batch's mean estimate over the mean estimate of all known rows (NaN = unknown, ignored); 1.0 when either
    has none."""
    batch = np.asarray(batch_estimates, dtype=np.float64).ravel()
    every = np.asarray(all_estimates, dtype=np.float64).ravel()
    batch, every = batch[np.isfinite(batch)], every[np.isfinite(every)]
    if batch.size == 0 or every.size == 0 or every.mean() <= 0 or batch.mean() <= 0:
        return 1.0
    return float(batch.mean() / every.mean())
