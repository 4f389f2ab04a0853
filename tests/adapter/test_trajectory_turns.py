"""The trainer's per-trajectory turn signals, read from TransferQueue-shaped columns (multi-turn runs)."""
import numpy as np
import pytest
import torch

from recipe.adapter.turns import trajectory_turns, turn_metrics


def test_turn_signals_from_the_records():
    data = {
        "num_turns": torch.tensor([4, 2, 6]),
        # nested rows, as TransferQueue returns variable-length responses
        "response_mask": torch.nested.nested_tensor([torch.tensor([1, 1, 0, 0, 0, 1]), torch.tensor([1, 1]),
                                                     torch.tensor([1, 0, 0, 1, 0, 0, 1, 1])]),
        "extra_fields": [{"tool_calls": 1}, {}, {"tool_calls": 2}],
        "metrics": [{"tool_calls": 1.5}, {"tool_calls": 0.0}, {"tool_calls": 3.25}],
    }
    turns = trajectory_turns(data, np.array([6, 2, 8]))
    assert turns == {"num_turns": [4, 2, 6], "tool_calls": [1, None, 2], "tool_tokens": [3, 0, 4],
                     "tool_s": [1.5, 0.0, 3.25]}
    m = turn_metrics(turns)
    assert m["rollout/tools/calls_mean"] == pytest.approx(1.5)  # over the trajectories that report calls
    assert m["rollout/tools/called_share"] == 1.0
    assert m["rollout/tools/tool_tokens_mean"] == pytest.approx(7 / 3)
    assert m["rollout/tools/tool_s_mean"] == pytest.approx(4.75 / 3)


def test_without_call_counts_only_the_token_and_time_means():
    m = turn_metrics({"num_turns": [2], "tool_calls": [None], "tool_tokens": [0], "tool_s": [0.0]})
    assert set(m) == {"rollout/tools/tool_tokens_mean", "rollout/tools/tool_s_mean"}
