"""``POLICY_PRESET``: one variable for a configuration the simulator chose, named as its policy there.

``best-onpolicy-spec`` is the fastest strictly on-policy configuration of ``recipe/sim/policies.py`` (same name): the
length-aware sampler's order (EMA 0.3 mean estimates in 1,024-token buckets), vLLM priority longest-first, no cap,
the tail cut held at 0.8 point of extra truncation, and the group drafter at every batch size (its group affinity
with it). Simulated over verl's random order on the reference trace, H100, seeds 0-2, every cost charged
(``python -m recipe.sim.speed_table``, each row's ``python -m recipe.sim`` command printed): 1.79x on code with
history (CodeT's HumanEval samples, measured outside the repository; the history is the same model's, an upper bound),
1.43x on code without history (a first epoch, or the first after a restart), 1.80x / 1.89x on held-out math without
history at the acceptance issue 43 reports (1.92 / 2.01 tokens per step, measured outside the repository), against
1.22x for the cut alone; issue 44's goal is 3x. Its warm start is the user's: ``SAMPLER_INIT_FROM=<an earlier run>``
(the simulator's figure assumes one). The values go under the user's own (an explicit variable wins), like
``PRESET``'s; ``tests/spec/test_policy_preset.py`` pins them to the simulator's policy. Stdlib only: the preflight
reads it first.
"""
from __future__ import annotations

from collections.abc import Mapping

POLICY_PRESETS: dict[str, dict[str, str]] = {
    "best-onpolicy-spec": {
        "SAMPLER_EMA_DECAY": "0.3", "SAMPLER_STATISTIC": "mean", "SAMPLER_BUCKET_SIZE": "1024",
        "ROLLOUT_SCHEDULING_POLICY": "priority", "VLLM_ROLLOUT_EARLY_STOP_ENABLE": "0",
        "TAIL_CUT_ENABLE": "1", "TAIL_CUT_FRACTION": "0.975", "TAIL_CUT_LEVEL_EXPONENT": "1.25",
        "TAIL_CUT_MAX_EXTRA_TRUNCATION": "0.008",
        "ROLLOUT_SPECULATIVE": "group", "ROLLOUT_SPECULATIVE_MAX_BATCH": "0",
    },
}


def policy_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with ``POLICY_PRESET``'s values under the user's explicit (non-empty) ones; unknown names are left
    for the preflight's own check of the variable."""
    preset = POLICY_PRESETS.get((env.get("POLICY_PRESET") or "").strip())
    if preset is None:
        return dict(env)
    return {**preset, **{k: v for k, v in env.items() if v.strip() != ""}}
