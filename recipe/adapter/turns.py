"""Per-trajectory turn signals of a multi-turn step, read back from TransferQueue (pure formatting, no verl).

verl's agent-loop worker stores each trajectory's ``num_turns``, ``response_mask`` (0 on tool replies and turn
markers), ``metrics`` (``tool_calls``: tool wall time in seconds) and ``extra_fields`` (``CappedToolAgentLoop`` adds
``tool_calls``: the calls whose replies joined it); the trainer turns them into the length traces' per-response
lists and the step's ``rollout/tools/*`` metrics.
"""
from __future__ import annotations

import numpy as np

from .columns import column_to_numpy

TOOL_CALLS = "tool_calls"  # the key CappedToolAgentLoop writes into a trajectory's extra_fields


def trajectory_turns(data, lengths: np.ndarray) -> dict[str, list]:
    """Per trained trajectory (multi-turn): verl's ``num_turns``, the tool calls whose replies joined it
    (``CappedToolAgentLoop``'s ``extra_fields.tool_calls``; None for other loops), its tokens with mask 0 (tool
    replies and turn markers) and its tool wall time (verl's ``metrics.tool_calls``, seconds)."""
    masks = data["response_mask"]
    masks = masks.unbind() if getattr(masks, "is_nested", False) else list(masks)
    extra = [e if isinstance(e, dict) else {} for e in list(data["extra_fields"])]
    metrics = [m if isinstance(m, dict) else {} for m in list(data["metrics"])]
    return {
        "num_turns": [int(t) for t in column_to_numpy(data["num_turns"], dtype=np.int64)],
        "tool_calls": [e.get(TOOL_CALLS) for e in extra],
        "tool_tokens": [int(n) - int(m[:int(n)].sum()) for n, m in zip(lengths.tolist(), masks)],
        "tool_s": [float(m.get("tool_calls", 0.0)) for m in metrics],
    }


def tool_observations(turns: dict[str, list] | None, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Per trained response: tool calls (NaN where the loop does not report them) and tool seconds, what the
    sampler's time key folds in; a single-turn step (``turns`` None) made no calls."""
    if turns is None:
        return np.zeros(count), np.zeros(count)
    calls = np.array([np.nan if c is None else c for c in turns["tool_calls"]], dtype=np.float64)
    return calls, np.asarray(turns["tool_s"], dtype=np.float64)


def turn_metrics(turns: dict[str, list]) -> dict[str, float]:
    """The step's ``rollout/tools/*``: mean tool calls, the share of trajectories that called a tool, mean tool tokens
    and tool seconds per trajectory."""
    calls = np.array([np.nan if c is None else c for c in turns["tool_calls"]], dtype=np.float64)
    known = calls[np.isfinite(calls)]
    out = {"rollout/tools/tool_tokens_mean": float(np.mean(turns["tool_tokens"])),
           "rollout/tools/tool_s_mean": float(np.mean(turns["tool_s"]))}
    if known.size:
        out["rollout/tools/calls_mean"] = float(known.mean())
        out["rollout/tools/called_share"] = float((known > 0).mean())
    return out
