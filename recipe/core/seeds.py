"""Per-response sampling seeds (``recipe.sampling_seed``), pure numpy.

With a seed per response derived from (run seed, epoch, dataset row, sample index), a rerun of the same step with the
same weights draws the same random numbers whatever else runs in the same vLLM batch, so a run resumed from a
checkpoint reproduces the responses an uninterrupted run generates, and two A/B arms share their random draws for the
same prompt in the same epoch. vLLM seeds are 31-bit here (what every backend accepts).
"""
from __future__ import annotations

import numpy as np

_MASK = 0x7FFFFFFF


def row_seeds(seed: int, epoch: int, rows) -> np.ndarray:
    """One well-mixed base seed per row for this epoch."""
    return np.array([np.random.SeedSequence([seed, epoch, int(r)]).generate_state(1)[0] & _MASK for r in rows],
                    dtype=np.int64)


def response_seed(row_seed: int, sample_index: int) -> int:
    """The vLLM seed of one response of a row (the row's n samples differ)."""
    return int(np.random.SeedSequence([int(row_seed), int(sample_index)]).generate_state(1)[0] & _MASK)


def turn_seed(row_seed: int, sample_index: int, turn: int) -> int:
    """The vLLM seed of one assistant turn of a multi-turn response: turn 0 draws what the single-turn response with
    the same seed draws; each later turn its own stream (a resumed run redraws every turn identically)."""
    if turn == 0:
        return response_seed(row_seed, sample_index)
    return int(np.random.SeedSequence([int(row_seed), int(sample_index), int(turn)]).generate_state(1)[0] & _MASK)
