"""The interpreter's stack in the preflight: the versions that matter, printed, and the ones that stop a launch.

Whichever Python ``scripts/train_grpo.sh`` picked, the preflight runs in it, so this reads what the launch will
import (``recipe/stack_versions.py``). ``RECIPE_STACK_TARGET`` (set by the script) says what the launch needs:
``gpu`` for a launch or a ``DRY_RUN`` on a GPU node or with ``RAY_ADDRESS`` (every Megatron and vLLM part, CUDA
torch), ``cpu`` for the CPU preset and anywhere without a GPU (verl 0.9.1 and a supported Python; the GPU parts may be
absent, and the report says that they were not checked).
"""
from __future__ import annotations

from collections.abc import Mapping


def check_stack(env: Mapping[str, str], errors: list[str], notes: list[str]) -> list[str]:
    """Append the stack's problems; return one line per part for the summary."""
    from ..stack_versions import collect, describe, problems

    target = (env.get("RECIPE_STACK_TARGET") or "cpu").strip()
    if target not in ("gpu", "cpu"):
        errors.append(f"RECIPE_STACK_TARGET={target!r} must be 'gpu' or 'cpu' (scripts/train_grpo.sh sets it)")
        return []
    stack = collect()
    for p in problems(stack, target):
        (errors if p.level == "error" else notes).append(p.text)
    if target == "cpu" and (env.get("PRESET") or "").strip() != "cpu":
        notes.append("the GPU stack (Megatron-Bridge, Transformer Engine, vLLM's CUDA build) was NOT checked: no GPU "
                     "is visible here (RECIPE_STACK_TARGET=cpu); a DRY_RUN on a GPU node checks it")
    return describe(stack) + [_speculative(env, errors)]


def _speculative(env: Mapping[str, str], errors: list[str]) -> str:
    """arctic-inference (vLLM's suffix decoding needs it): reported always, an error when ROLLOUT_SPECULATIVE=suffix
    would need it and it is not importable (before composition, so the message names the variable)."""
    from ..rollout_spec import arctic_inference_version, arctic_problem

    problem = arctic_problem((env.get("ROLLOUT_SPECULATIVE") or "").strip())
    if problem:
        errors.append(problem)
    version = arctic_inference_version()
    return ("arctic-inference not installed (ROLLOUT_SPECULATIVE=suffix needs it)" if version is None
            else f"arctic-inference {version} (ROLLOUT_SPECULATIVE=suffix can run)")
