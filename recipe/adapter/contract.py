"""Checks that a verl hook the recipe relies on is still there and still looks the way the recipe expects.

Used by tests/contract: a verl upgrade that renames a method, changes a signature or drops a behaviour the adapter
depends on fails there with a message naming the hook and what to re-check, instead of at a 16-GPU launch.
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
from typing import Any


class HookContractError(AssertionError):
    pass


def resolve(path: str) -> Any:
    """'pkg.module:Attr.attr' -> the object."""
    module_name, _, attr_path = path.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in filter(None, attr_path.split(".")):
        if not hasattr(obj, part):
            raise HookContractError(f"verl hook {path} is gone: {part!r} not found on {obj!r}")
        obj = getattr(obj, part)
    return obj


def check_params(path: str, expected: list[str], recheck: str) -> None:
    """The callable at ``path`` takes exactly ``expected`` parameters (names, in order; '*x'/'**x' for var-args)."""
    obj = resolve(path)
    params = []
    for p in inspect.signature(obj).parameters.values():
        if p.name == "_ray_trace_ctx":  # injected by Ray's actor decorator, not part of verl's API
            continue
        prefix = "*" if p.kind is p.VAR_POSITIONAL else "**" if p.kind is p.VAR_KEYWORD else ""
        params.append(prefix + p.name)
    if params != expected:
        raise HookContractError(
            f"verl hook {path} changed: parameters {params}, the recipe expects {expected}. Re-check {recheck}"
        )


def check_source(path: str, snippets: list[str], recheck: str) -> None:
    """The source of ``path`` still contains each snippet (a behaviour the recipe relies on)."""
    source = inspect.getsource(resolve(path))
    missing = [s for s in snippets if s not in source]
    if missing:
        raise HookContractError(f"verl hook {path} no longer contains {missing}. Re-check {recheck}")


def check_module_source(module: str, snippets: list[str], recheck: str) -> None:
    """Like ``check_source`` for a module that cannot be imported here (verl's vLLM server package refuses to import
    without a distribution named ``vllm``), located from its top-level package without importing it."""
    top, *rest = module.split(".")
    spec = importlib.util.find_spec(top)
    path = os.path.join(spec.submodule_search_locations[0], *rest) + ".py" if spec else ""
    if not os.path.isfile(path):
        raise HookContractError(f"verl module {module} is gone (no {path}). Re-check {recheck}")
    with open(path, encoding="utf-8") as f:
        source = f.read()
    missing = [s for s in snippets if s not in source]
    if missing:
        raise HookContractError(f"verl module {module} no longer contains {missing}. Re-check {recheck}")


def check_order(path: str, first: str, then: str, recheck: str) -> None:
    """In the source of ``path``, ``first`` appears before ``then``."""
    source = inspect.getsource(resolve(path))
    i, j = source.find(first), source.find(then)
    if i < 0 or j < 0 or i > j:
        raise HookContractError(f"verl hook {path}: expected {first!r} before {then!r}. Re-check {recheck}")
