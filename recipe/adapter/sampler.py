"""``LengthAwareEpochSampler``: a torch ``Sampler`` over dataset rows driven by ``recipe.core``.

verl 0.9.1 builds its train ``StatefulDataLoader`` with torchdata; the trainer adapter rebuilds it with this sampler
(``data.sampler.class_path=pkg://recipe.adapter.sampler``). Resume: torchdata stores ``state_dict()`` in the
checkpoint's ``data.pt`` and on load calls ``load_state_dict`` then ``iter()`` (more than once) without
fast-forwarding, so the sampler keeps epoch, order, position and estimates itself, and decides what to do only when
the first index is requested (iterators created and dropped during a restore change nothing).

``order_by="time"`` (multi-turn) sorts epochs by expected rollout time (``recipe.core.time_key``): the plan holds a
``TimeKeyEstimates`` around the token estimates, and the tool calls and tool seconds ``update`` receives travel in
its state. ``estimates`` stays the token estimates either way (caps, the tail cut's level, priorities).
"""
from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import torch
from torch.utils.data import Sampler

from ..core.estimates import GroupObservation, LengthEstimates
from ..core.ordering import ORDER_KEYS, EpochPlan
from ..core.time_key import TimeKeyEstimates


def _to_torch(obj: Any) -> Any:
    """numpy arrays -> tensors, recursively: compact in ``data.pt`` and loadable with ``weights_only=True``."""
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(obj.copy())
    if isinstance(obj, dict):
        return {k: _to_torch(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_torch(v) for v in obj)
    return obj


def _to_numpy(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.numpy()
    if isinstance(obj, dict):
        return {k: _to_numpy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_numpy(v) for v in obj)
    return obj


class LengthAwareEpochSampler(Sampler[int]):
    """Yields row indices: seeded random order in the first epoch, length-sorted (bucketed) order afterwards.

    ``extra_state`` is carried in the checkpoint with the sampler, for driver-side state that must resume with it
    (the calibrated cap's ratio history, the over-sample re-queue). torchdata applies a loaded state only when the
    dataloader is next iterated (verl's first batch fetch, after ``on_init_end``), so owners of that state collect
    it with ``consume_restored_extra_state`` after fetching.
    """

    def __init__(
        self,
        data_source,
        *,
        batch_size: int,
        bucket_size: float = 1024,
        ema_decay: float = 0.7,
        shuffle_batch_blocks: bool = True,
        statistic: str = "mean",
        seed: int = 0,
        within_bucket: str = "sorted",
        order_by: str = "tokens",
        time_tokens_per_s: float = 120.0,
    ):
        if order_by not in ORDER_KEYS:
            raise ValueError(f"order_by {order_by!r} is not one of {ORDER_KEYS}")
        self.num_rows = len(data_source)
        self._tokens = LengthEstimates(self.num_rows, ema_decay=ema_decay, statistic=statistic)
        self.time_key = TimeKeyEstimates(self._tokens, time_tokens_per_s) if order_by == "time" else None
        self.plan = EpochPlan(
            self.time_key or self._tokens,
            batch_size=batch_size,
            bucket_size=bucket_size,
            shuffle_batch_blocks=shuffle_batch_blocks,
            seed=seed,
            within_bucket=within_bucket,
        )
        self.extra_state: dict[str, Any] = {}
        self._resume_pending = False
        self._restored_extra: dict[str, Any] | None = None

    @classmethod
    def from_settings(cls, data_source, settings) -> "LengthAwareEpochSampler":
        s = settings.sampler
        return cls(
            data_source,
            batch_size=settings.batch_size,
            bucket_size=s.bucket_size,
            ema_decay=s.ema_decay,
            shuffle_batch_blocks=s.shuffle_batch_blocks,
            statistic=s.statistic,
            seed=s.seed,
            within_bucket=s.within_bucket,
            order_by=s.order_by,
            time_tokens_per_s=s.time_tokens_per_s,
        )

    @property
    def estimates(self) -> LengthEstimates:
        """The token estimates (what caps and priorities read), whatever the epoch is ordered by."""
        return self._tokens

    def __len__(self) -> int:
        return self.num_rows

    def __iter__(self) -> Iterator[int]:
        return self._iterate()

    def _iterate(self) -> Iterator[int]:
        if self._resume_pending:
            self._resume_pending = False  # continue the restored epoch where it stopped
        elif self.plan.epoch_finished():
            self.plan.start_next_epoch()
        plan = self.plan
        while plan.position < len(plan.order):
            idx = int(plan.order[plan.position])
            plan.position += 1
            yield idx

    def update(self, row_ids, lengths, censored=None, tool_calls=None, tool_s=None) -> GroupObservation:
        """Fold one step's responses into the estimates (called by the trainer before the checkpoint save).

        ``tool_calls`` and ``tool_s`` (per response; NaN calls: not reported) feed the time key with
        ``order_by=time`` and are ignored otherwise; responses without them (over-sample aborts) leave it as is."""
        obs = self._tokens.update(row_ids, lengths, censored)
        if self.time_key is not None and tool_calls is not None:
            self.time_key.observe(row_ids, tool_calls, tool_s, censored)
        return obs

    def state_dict(self) -> dict:
        return _to_torch({"plan": self.plan.state_dict(), "extra": self.extra_state, "num_rows": self.num_rows})

    def load_state_dict(self, state: dict) -> None:
        state = _to_numpy(state)
        if int(state["num_rows"]) != self.num_rows:
            raise ValueError(
                f"sampler state in the checkpoint covers {int(state['num_rows'])} rows but the train set has "
                f"{self.num_rows}: resume with the same TRAIN_FILE and batch size, or start a new experiment"
            )
        self.plan.load_state_dict(state["plan"])
        self.extra_state = dict(state.get("extra", {}))
        self._restored_extra = dict(self.extra_state)
        self._resume_pending = True

    def consume_restored_extra_state(self) -> dict[str, Any] | None:
        """The extra state of the last checkpoint load, once (None when nothing was loaded since)."""
        restored, self._restored_extra = self._restored_extra, None
        return restored
