"""One compact console line per training step.

verl's console logger prints every metric of a step on one line (hundreds of keys); a person watching a run wants
the handful that say whether it is healthy and what the recipe did. Pure formatting of the step's metrics dict.
"""
from __future__ import annotations

from collections.abc import Mapping


def _f(m: Mapping, key: str, fmt: str) -> str:
    value = m.get(key)
    return "-" if value is None else format(float(value), fmt)


def progress_line(step: int, total_steps: int, m: Mapping) -> str:
    cap = m.get("rollout/response_max_tokens_cap")
    parts = [
        f"[recipe] step {step}/{total_steps}",
        f"epoch {_f(m, 'sampler/epoch', '.0f') if 'sampler/epoch' in m else _f(m, 'training/epoch', '.0f')}",
        f"gen {_f(m, 'timing_s/gen', '.1f')}s step {_f(m, 'timing_s/step', '.1f')}s",
        f"reward {_f(m, 'critic/score/mean', '.3f')}",
        f"len {_f(m, 'response_length/mean', '.1f')} (max {_f(m, 'response_length/max', '.0f')})",
        f"cap {int(cap) if cap else 'off'} (hit {_f(m, 'rollout/cap_hit_ratio', '.0%')})",
    ]
    if "rollout/tools/calls_mean" in m:
        parts.append(f"tools {_f(m, 'rollout/tools/calls_mean', '.2f')}/traj ({_f(m, 'rollout/tools/called_share', '.0%')} "
                     f"call, {_f(m, 'rollout/tools/tool_s_mean', '.2f')}s)")
    if m.get("rollout/tail_cut/cut"):
        parts.append(f"tail cut {_f(m, 'rollout/tail_cut/cut_responses', '.0f')} responses")
    if "rollout/over_sample/aborted_groups" in m:
        parts.append(f"aborted {_f(m, 'rollout/over_sample/aborted_groups', '.0f')} groups")
    val = sorted(k for k in m if k.startswith("val-core/") and "/mean@" in k)
    if val:
        parts.append(f"val {_f(m, val[0], '.3f')}")
    return " | ".join(parts)
