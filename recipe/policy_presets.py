"""``POLICY_PRESET``: one variable for a configuration the simulator chose, named as its policy there.

``best-onpolicy-spec`` is the fastest strictly on-policy configuration of ``recipe/sim/policies.py`` (same name): the
length-aware sampler's order (EMA 0.3 mean estimates in 1,024-token buckets), vLLM priority longest-first, no cap,
the tail cut held at 0.8 point of extra truncation, and speculative decoding at every batch size with the drafter
``python -m recipe.sim.learned`` ranks first among those the run has (H100, seeds 0-2, every cost charged):

- with ``DRAFT_MODEL_PATH`` (an EAGLE-3 head for MODEL_PATH): ``eagle3`` learning online (``ROLLOUT_DRAFT_ONLINE=1``),
  3.56x over verl's random order at the acceptance a published head reports for math (3.40 / 3.53 tokens per step at
  batch 1, AQ-MedAI's Qwen3.5-397B-A17B head card) and an ASSUMED drift half-life, against 2.60x frozen;
- without one: the ``group`` drafter (no model; its group affinity with it), 1.80x / 1.89x on held-out math at the
  acceptance issue 43 reports (1.92 / 2.01 tokens per step, measured outside the repository), 1.79x on code with
  history (``python -m recipe.sim.speed_table``), against 1.22x for the cut alone.

Its warm start is the user's: ``SAMPLER_INIT_FROM=<an earlier run>`` (the simulator's figure assumes one). The values
go under the user's own (an explicit variable wins), like ``PRESET``'s; ``tests/spec/test_policy_preset.py`` pins them
to the simulator's policy. Stdlib only: the preflight reads it first.
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
WITH_HEAD = {"ROLLOUT_SPECULATIVE": "eagle3", "ROLLOUT_DRAFT_ONLINE": "1"}  # best-onpolicy-spec with DRAFT_MODEL_PATH


def preset_values(name: str, env: Mapping[str, str]) -> dict[str, str] | None:
    """The values of preset ``name`` for ``env`` (None for an unknown name): ``best-onpolicy-spec`` drafts with the
    user's EAGLE-3 head, learning online, where ``DRAFT_MODEL_PATH`` names one, else with the group drafter."""
    values = POLICY_PRESETS.get(name)
    if values is None:
        return None
    if name == "best-onpolicy-spec" and (env.get("DRAFT_MODEL_PATH") or "").strip() not in ("", "none"):
        return {**values, **WITH_HEAD}
    return dict(values)


def policy_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with ``POLICY_PRESET``'s values under the user's explicit (non-empty) ones; unknown names are left
    for the preflight's own check of the variable."""
    preset = preset_values((env.get("POLICY_PRESET") or "").strip(), env)
    if preset is None:
        return dict(env)
    return {**preset, **{k: v for k, v in env.items() if v.strip() != ""}}
