"""Multi-turn tool calling (``MULTI_TURN=1``): the tool config loads, and every sandbox it uses runs a program.

verl loads the tool config in each agent-loop worker, minutes into a launch, and a sandbox that cannot start (no
bubblewrap, no user namespaces inside docker, an unreachable SandboxFusion server) would only show up as a tool
error in every trajectory. Here the tools are loaded with verl's own loader and each tool that holds a sandbox
backend (``recipe.tools.verl_tools.PythonTool``) runs ``print(1+1)`` through it before anything starts.
"""
from __future__ import annotations

import os
from collections.abc import Mapping

from ..settings import select
from .knobs import ARR


def check_tools(cfg: Mapping, errors: list[str]) -> None:
    mt = select(cfg, f"{ARR}.rollout.multi_turn") or {}
    if not mt.get("enable"):
        return
    path = mt.get("tool_config_path")
    if not path:
        errors.append("MULTI_TURN=1 needs a tool config: export TOOL_CONFIG=recipe/tools/configs/calculator.yaml "
                      "(or python_tool.yaml)")
        return
    if not os.path.isfile(path):
        errors.append(f"TOOL_CONFIG={path} does not exist (sets {ARR}.rollout.multi_turn.tool_config_path); the "
                      "recipe's are in recipe/tools/configs/")
        return
    from verl.tools.tool_registry import load_all_tools

    try:
        tools = load_all_tools(tool_config_path=path, function_tool_path=mt.get("function_tool_path"))
    except Exception as e:  # noqa: BLE001 - any failure here is the config's, reported by name
        errors.append(f"TOOL_CONFIG={path} does not load with verl's tool loader: {type(e).__name__}: {e}")
        return
    if not tools:
        errors.append(f"TOOL_CONFIG={path} defines no tools: a multi-turn rollout would never call one")
    from ..tools.sandbox import sandbox_self_check

    for tool in tools:
        backend = getattr(tool, "backend", None)
        if backend is None:
            continue
        problem = sandbox_self_check(backend)
        if problem is not None:
            errors.append(f"TOOL_CONFIG={path}: tool {tool.name!r} cannot run a program in its sandbox: {problem}")
