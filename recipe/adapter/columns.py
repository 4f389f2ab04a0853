"""Turn a column of a verl TensorDict (dense or nested tensor, NonTensorStack, list) into numpy or a list of rows."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch


def column_to_numpy(value: Any, dtype=None) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        if value.is_nested:
            return np.asarray([t.numpy() for t in value.unbind()], dtype=dtype)
        return value.detach().cpu().numpy().astype(dtype) if dtype else value.detach().cpu().numpy()
    if hasattr(value, "tolist"):
        value = value.tolist()
    return np.asarray([v.item() if hasattr(v, "item") else v for v in value], dtype=dtype)


def sequences(column) -> list:
    """The rows of a TransferQueue column (nested tensors: one tensor per row, of its own length)."""
    return column.unbind() if getattr(column, "is_nested", False) else list(column)
