"""The reward file and function (parsed, not imported): verl's custom reward path, ``REWARD_FUNCTION_PATH`` /
``REWARD_FUNCTION_NAME``. verl's reward loop calls the function with the keywords :data:`VERL_KEYWORDS`
(``verl/experimental/reward_loop/reward_manager/naive.py``): a function that does not take them fails in the reward
loop after the cluster has started, so the preflight names it first."""
from __future__ import annotations

import ast
import os
from collections.abc import Mapping
from pathlib import Path

from ..settings import select

VERL_KEYWORDS = ("data_source", "solution_str", "ground_truth", "extra_info")


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
    defined, functions = set(), {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
            if not isinstance(node, ast.ClassDef):
                functions[node.name] = node.args
        elif isinstance(node, ast.Assign):
            defined |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined |= {(a.asname or a.name).split(".")[0] for a in node.names}
    if name not in defined:
        errors.append(f"REWARD_FUNCTION_NAME={name} is not defined at the top level of REWARD_FUNCTION_PATH={path}")
    elif name in functions and (missing := _missing_keywords(functions[name])):
        errors.append(f"REWARD_FUNCTION_NAME={name} in {path} does not take verl's keyword argument(s) "
                      f"{', '.join(missing)}: define it as `def {name}(data_source, solution_str, ground_truth, "
                      "extra_info=None, **kwargs) -> float` (solution_str: the response text; ground_truth: "
                      "the row's reward_model.ground_truth, or its ANSWER_KEY column)")


def _missing_keywords(args: ast.arguments) -> list[str]:
    """verl's keywords the function cannot receive (none when it takes ``**kwargs``)."""
    if args.kwarg is not None:
        return []
    named = {a.arg for a in args.args + args.kwonlyargs}
    return [k for k in VERL_KEYWORDS if k not in named]
