"""Epoch order from length estimates, and the resumable per-epoch plan the torch sampler wraps.

Ordering (seed design): the first epoch (nothing observed) is a seeded random permutation. Later epochs sort rows by
(``floor(est / bucket_size)``, est, seeded random tie-break) so that prompts of similar expected length share a
generation batch, then optionally shuffle whole batch-sized blocks so an epoch does not run short-to-long (a length
curriculum the user did not ask for). Block shuffling does not change which rows share a batch, so it costs no
rollout time.
"""
from __future__ import annotations

import numpy as np

from .estimates import LengthEstimates


def epoch_rng(seed: int, epoch: int) -> np.random.Generator:
    """One independent, reproducible stream per (seed, epoch)."""
    return np.random.default_rng([int(seed), int(epoch)])


def length_sorted_order(
    est: np.ndarray,
    rng: np.random.Generator,
    *,
    batch_size: int,
    bucket_size: float = 1024,
    shuffle_batch_blocks: bool = True,
) -> np.ndarray:
    """Row order for one epoch given filled estimates (no NaN). Returns int64 row ids."""
    est = np.asarray(est, dtype=np.float64)
    if np.isnan(est).any():
        raise ValueError("length_sorted_order needs filled estimates (use LengthEstimates.filled())")
    if bucket_size <= 0:
        raise ValueError(f"bucket_size must be positive, got {bucket_size}")
    tie = rng.random(len(est))
    bucket = np.floor(est / bucket_size)
    order = np.lexsort((tie, est, bucket))  # last key is the primary one
    if shuffle_batch_blocks and batch_size > 0 and len(order) >= 2 * batch_size:
        full = len(order) // batch_size * batch_size
        blocks = order[:full].reshape(-1, batch_size)
        order = np.concatenate([blocks[rng.permutation(len(blocks))].ravel(), order[full:]])
    return order.astype(np.int64)


class EpochPlan:
    """Which row comes next: the current epoch's order, the position in it, and the estimates behind it.

    The order of an epoch is fixed when the epoch starts (estimates keep changing during the epoch), so it is part
    of the state; together with ``position`` it lets a resumed run hand out exactly the rows the interrupted epoch
    had left. Everything is plain numpy so a simulator can drive the same object the trainer does.
    """

    def __init__(
        self,
        estimates: LengthEstimates,
        *,
        batch_size: int,
        bucket_size: float = 1024,
        shuffle_batch_blocks: bool = True,
        seed: int = 0,
    ):
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.estimates = estimates
        self.batch_size = int(batch_size)
        self.bucket_size = float(bucket_size)
        self.shuffle_batch_blocks = bool(shuffle_batch_blocks)
        self.seed = int(seed)
        self.epoch = -1  # epoch of ``order``; -1 before the first one starts
        self.order: np.ndarray | None = None
        self.position = 0
        self.sorted_epoch = False  # whether ``order`` came from estimates (False: random)

    @property
    def num_rows(self) -> int:
        return self.estimates.num_rows

    def epoch_finished(self) -> bool:
        return self.order is None or self.position >= len(self.order)

    def start_next_epoch(self) -> np.ndarray:
        self.epoch += 1
        rng = epoch_rng(self.seed, self.epoch)
        if not self.estimates.seen.any():
            self.order = rng.permutation(self.num_rows).astype(np.int64)
            self.sorted_epoch = False
        else:
            self.order = length_sorted_order(
                self.estimates.filled(),
                rng,
                batch_size=self.batch_size,
                bucket_size=self.bucket_size,
                shuffle_batch_blocks=self.shuffle_batch_blocks,
            )
            self.sorted_epoch = True
        self.position = 0
        return self.order

    def take(self, k: int) -> np.ndarray:
        """Hand out the next ``k`` rows of the current epoch (fewer at its end)."""
        rows = self.order[self.position : self.position + k]
        self.position += len(rows)
        return rows

    def remaining(self) -> np.ndarray:
        return self.order[self.position :] if self.order is not None else np.zeros(0, np.int64)

    def state_dict(self) -> dict:
        return {
            "epoch": self.epoch,
            "order": None if self.order is None else self.order.copy(),
            "position": self.position,
            "sorted_epoch": self.sorted_epoch,
            "seed": self.seed,
            "estimates": self.estimates.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.estimates.load_state_dict(state["estimates"])
        self.epoch = int(state["epoch"])
        self.order = None if state["order"] is None else np.asarray(state["order"], dtype=np.int64).copy()
        self.position = int(state["position"])
        self.sorted_epoch = bool(state["sorted_epoch"])
        self.seed = int(state["seed"])
