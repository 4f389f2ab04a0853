"""Import a repository script that is not in a package (``bench/*.py``, ``scripts/*.py``) as a module, so tests
can call its functions in-process; verl's top-level ``scripts`` package rules out importing them by name."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType


def load_script(path: str | Path, name: str | None = None) -> ModuleType:
    """A fresh module executed from ``path`` (named ``name``, default the file's stem)."""
    path = Path(path)
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
