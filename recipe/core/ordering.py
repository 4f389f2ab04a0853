"""Epoch order from length estimates, and the resumable per-epoch plan the torch sampler wraps.

Ordering (seed design): an epoch with nothing known (no observation, no warm start, no per-row prior: the first
epoch of a cold run) is a seeded random permutation. Otherwise (later epochs, or a warm-started first one) rows are
sorted by (``floor(est / bucket_size)``, est, seeded random tie-break) so that prompts of similar expected length
share a generation batch, then whole batch-sized blocks are optionally shuffled so an epoch does not run
short-to-long (a length curriculum the user did not ask for). Block shuffling does not change which rows share a
batch, so it costs no rollout time.

With the estimate as second key the bucket only matters for ties; ``within_bucket="shuffled"`` drops the estimate
key instead, so rows inside a bucket come in seeded random order and batches mix prompts of similar (within one
bucket) but not identical expected length, trading a little grouping for more variety between epochs.
"""
from __future__ import annotations

import numpy as np

from .estimates import LengthEstimates

WITHIN_BUCKET = ("sorted", "shuffled")


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
    within_bucket: str = "sorted",
) -> np.ndarray:
    """Row order for one epoch given filled estimates (no NaN). Returns int64 row ids."""
    est = np.asarray(est, dtype=np.float64)
    if np.isnan(est).any():
        raise ValueError("length_sorted_order needs filled estimates (use LengthEstimates.filled())")
    if bucket_size <= 0:
        raise ValueError(f"bucket_size must be positive, got {bucket_size}")
    if within_bucket not in WITHIN_BUCKET:
        raise ValueError(f"within_bucket {within_bucket!r} is not one of {WITHIN_BUCKET}")
    # A seeded random permutation followed by a sort breaks ties at random (reproducibly: the sort is deterministic
    # for a given input): one sort instead of a three-key lexsort. Sorting by the estimate is sorting by
    # (bucket, estimate), the bucket being monotone in the estimate.
    perm = rng.permutation(len(est))
    key = est[perm] if within_bucket == "sorted" else np.floor(est[perm] / bucket_size)
    order = perm[np.argsort(key)]
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
        within_bucket: str = "sorted",
    ):
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.estimates = estimates
        self.batch_size = int(batch_size)
        self.bucket_size = float(bucket_size)
        self.shuffle_batch_blocks = bool(shuffle_batch_blocks)
        self.within_bucket = within_bucket
        self.seed = int(seed)
        self.epoch = -1  # epoch of ``order``; -1 before the first one starts
        self.order: np.ndarray | None = None
        self.position = 0
        self.sorted_epoch = False  # whether ``order`` came from estimates (False: random)
        self.tail_start = 0  # order[tail_start:] are re-queued rows not handed out yet (over-sampling)

    @property
    def num_rows(self) -> int:
        return self.estimates.num_rows

    def epoch_finished(self) -> bool:
        return self.order is None or self.position >= len(self.order)

    def start_next_epoch(self) -> np.ndarray:
        self.epoch += 1
        rng = epoch_rng(self.seed, self.epoch)
        if not self.estimates.known.any():
            self.order = rng.permutation(self.num_rows).astype(np.int64)
            self.sorted_epoch = False
        else:
            self.order = length_sorted_order(
                self.estimates.filled(),
                rng,
                batch_size=self.batch_size,
                bucket_size=self.bucket_size,
                shuffle_batch_blocks=self.shuffle_batch_blocks,
                within_bucket=self.within_bucket,
            )
            self.sorted_epoch = True
        self.position = 0
        self.tail_start = len(self.order)
        return self.order

    def take(self, k: int) -> np.ndarray:
        """Hand out the next ``k`` rows of the current epoch (fewer at its end)."""
        rows = self.order[self.position : self.position + k]
        self.position += len(rows)
        return rows

    def num_remaining(self) -> int:
        """Rows left in the current epoch; a full epoch when the current one is finished (the next fetch starts
        a new one)."""
        return self.num_rows if self.epoch_finished() else len(self.order) - self.position

    def requeue(self, rows, where: str = "back") -> None:
        """Put rows that were handed out but not trained (aborted by over-sampling) back into this epoch.

        ``back``: after every row not handed out yet, the re-queued rows sorted by their (censoring-raised)
        estimates, so the long prompts that lost the race are batched with each other at the end of the epoch
        (tail batching) instead of stalling a batch of short ones. ``front``: next in line, in the given order.
        """
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size == 0:
            return
        if self.order is None:
            raise RuntimeError("requeue before any epoch started")
        if where == "front":
            self.order = np.concatenate([self.order[: self.position], rows, self.order[self.position :]])
            self.tail_start += len(rows)
            return
        if where != "back":
            raise ValueError(f"requeue where={where!r} is not 'back' or 'front'")
        start = max(self.tail_start, self.position)
        tail = np.concatenate([self.order[start:], rows])
        est = self.estimates.get(tail) if self.estimates.known.any() else np.zeros(len(tail))
        tail = tail[np.argsort(est, kind="stable")]
        self.order = np.concatenate([self.order[:start], tail])
        self.tail_start = start

    def remaining(self) -> np.ndarray:
        return self.order[self.position :] if self.order is not None else np.zeros(0, np.int64)

    def state_dict(self) -> dict:
        return {
            "epoch": self.epoch,
            "order": None if self.order is None else self.order.copy(),
            "position": self.position,
            "sorted_epoch": self.sorted_epoch,
            "tail_start": self.tail_start,
            "seed": self.seed,
            "estimates": self.estimates.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.estimates.load_state_dict(state["estimates"])
        self.epoch = int(state["epoch"])
        self.order = None if state["order"] is None else np.asarray(state["order"], dtype=np.int64).copy()
        self.position = int(state["position"])
        self.sorted_epoch = bool(state["sorted_epoch"])
        self.tail_start = int(state.get("tail_start", 0 if self.order is None else len(self.order)))
        self.seed = int(state["seed"])


# -- multi-turn: order by expected time instead of tokens (issue 18 item 6; recipe/core/time_key.py) ---------------
ORDER_KEYS = ("tokens", "time")


def expected_time_key(tokens, tool_calls, tool_latency_s: float, tokens_per_s: float) -> np.ndarray:
    """A row's expected rollout time in token units: ``tokens + tool_calls * tool_latency_s * tokens_per_s``.

    A multi-turn trajectory spends ``tool_calls x tool_latency_s`` seconds outside the engine (its slot freed, its
    context re-prefilled on return), on top of decoding its ``tokens``; ``tokens_per_s`` (one sequence's decode speed
    in the step's tail, where the step's length is decided) turns those seconds into tokens, so the key can replace
    the token estimate wherever ``length_sorted_order`` sorts. With ``tool_latency_s == 0`` (or no tool calls) it is
    ``tokens`` exactly, so the order is the token order. NaN in ``tokens`` or ``tool_calls`` stays NaN (unknown)."""
    if not (np.isfinite(tool_latency_s) and tool_latency_s >= 0):
        raise ValueError(f"tool_latency_s must be a finite number >= 0, got {tool_latency_s}")
    if not (np.isfinite(tokens_per_s) and tokens_per_s > 0):
        raise ValueError(f"tokens_per_s must be a finite number > 0, got {tokens_per_s}")
    tokens = np.asarray(tokens, dtype=np.float64)
    calls = np.asarray(tool_calls, dtype=np.float64)
    if tool_latency_s == 0:
        return tokens + np.where(np.isnan(calls), np.nan, 0.0)
    return tokens + calls * (float(tool_latency_s) * float(tokens_per_s))
