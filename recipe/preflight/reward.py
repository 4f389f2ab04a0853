"""The reward file and function (parsed, not imported)."""
from __future__ import annotations

import ast
import os
from collections.abc import Mapping
from pathlib import Path

from ..settings import select


def check_reward(cfg: Mapping, errors: list[str]) -> None:
    """The reward file exists and defines the function at top level (parsed, not imported)."""
    legacy = select(cfg, "custom_reward_function") or {}
    rf = legacy if any(v is not None for v in legacy.values()) else (select(cfg, "reward.custom_reward_function") or {})
    path, name = rf.get("path"), rf.get("name")
    if not path:
        return
    if not os.path.isfile(path):
        errors.append(f"REWARD_FUNCTION_PATH={path} does not exist; unset it for the repo's reward/math_reward.py")
        return
    try:
        tree = ast.parse(Path(path).read_text(), filename=path)
    except SyntaxError as e:
        errors.append(f"REWARD_FUNCTION_PATH={path} does not parse: {e}")
        return
    defined = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):
            defined |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined |= {(a.asname or a.name).split(".")[0] for a in node.names}
    if name not in defined:
        errors.append(f"REWARD_FUNCTION_NAME={name} is not defined at the top level of REWARD_FUNCTION_PATH={path}")
