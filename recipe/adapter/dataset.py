"""``RLHFDataset`` subclass: a stable row id on every item and a train set cut to whole batches.

Plugged with ``data.custom_cls.path=pkg://recipe.adapter.dataset`` / ``data.custom_cls.name=LengthAwareRLHFDataset``.
"""
from __future__ import annotations

import logging

from omegaconf import ListConfig
from verl.utils.dataset.rl_dataset import RLHFDataset

from ..traces import prompt_key
from ..user_data import as_rl_rows
from .fields import ROW_ID

logger = logging.getLogger(__name__)


def _as_list(files) -> list[str]:
    if isinstance(files, (list, tuple, ListConfig)):
        return [str(f) for f in files]
    return [str(files)]


class LengthAwareRLHFDataset(RLHFDataset):
    """Items carry ``dataset_item_idx`` (the row's position in the loaded train set).

    The train set (not validation: verl builds both with this class) is truncated to a multiple of
    ``data.train_batch_size`` (a multiple of ``gen_batch_size``), so with ``drop_last=True`` every epoch trains the
    same fixed set of prompts and no step mixes two epochs; the length statistics then cover every row each epoch.
    ``_read_files_and_tokenize`` is also what verl calls on resume, so the cut is the same after a restart.
    """

    def is_train_set(self) -> bool:
        train_files = self.config.get("train_files")
        return train_files is not None and _as_list(self.original_data_files) == _as_list(train_files)

    def maybe_filter_out_long_prompts(self, dataframe=None):
        """A user's columns in verl's form first (``data.prompt_key``, ``data.answer_key``: recipe/user_data.py),
        so verl's length filter and everything after it see chat messages and ``reward_model.ground_truth``."""
        dataframe = as_rl_rows(dataframe, self.prompt_key, self.config.get("answer_key"),
                               self.config.get("reward_fn_key", "data_source"))
        return super().maybe_filter_out_long_prompts(dataframe)

    def _read_files_and_tokenize(self):
        super()._read_files_and_tokenize()
        if not self.is_train_set():
            return
        batch = int(self.config.get("train_batch_size") or 0)
        gen = int(self.config.get("gen_batch_size") or 0) or batch
        multiple = max(batch, gen)
        total = len(self.dataframe)
        keep = total // multiple * multiple if multiple > 0 else total
        if keep == 0:
            raise ValueError(
                f"train set has {total} rows after filtering, fewer than one batch of data.train_batch_size="
                f"{multiple}: use a larger TRAIN_FILE or a smaller batch"
            )
        if keep < total:
            self.dataframe = self.dataframe.select(range(keep))
        logger.warning(
            "length-aware dataset: kept %d of %d train rows (dropped %d) to fill whole batches of %d",
            keep, total, total - keep, multiple,
        )

    def prompt_keys(self) -> list[str]:
        """``recipe.traces.prompt_key`` of every row's prompt, in row order (computed once)."""
        if getattr(self, "_prompt_keys", None) is None or len(self._prompt_keys) != len(self.dataframe):
            self._prompt_keys = [prompt_key(m) for m in self.dataframe[self.prompt_key]]
        return self._prompt_keys

    def column(self, name: str) -> list:
        """A column of the loaded (and cut) train set, in row order."""
        if name not in self.dataframe.column_names:
            raise KeyError(name)
        return list(self.dataframe[name])

    def __getitem__(self, item):
        row = super().__getitem__(item)
        row[ROW_ID] = int(item)
        return row
