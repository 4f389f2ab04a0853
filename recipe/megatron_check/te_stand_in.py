"""A Transformer Engine stand-in offered to Megatron-Bridge's own imports only.

Megatron-Bridge 0.5.1 imports ``transformer_engine.pytorch`` at module level (e.g. its LoRA layers) even when the
model uses Megatron-Core's local layer spec, and TE cannot be installed on a CPU (nor carried to the lent GPU: its
core wheel is ~190 MB). Megatron-Core and modelopt must keep seeing no TE, so they take their non-TE paths: the finder
answers only imports made from ``megatron.bridge`` modules, and :func:`scoped` removes it and every stand-in module
afterwards. Attributes are inert classes (class statements and ``isinstance`` checks at import time pass); calling one
raises, so a code path that really needs TE fails loudly instead of computing something else.
"""
from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import sys
import types

from .stand_ins._inert import Inert

ROOT = "transformer_engine"


class _Module(types.ModuleType):
    __version__ = "0.0.0+stand-in"

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = Inert(f"{self.__name__}.{name}", (), {})
        setattr(self, name, value)
        return value


def _importing_module() -> str:
    """The ``__name__`` of the first frame outside importlib and this module: who asked for the import."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not (name.startswith(("importlib", "_frozen")) or name == __name__):
            return name
        frame = frame.f_back
    return ""


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] != ROOT:
            return None
        # submodules of a stand-in already handed out stay stand-ins (``import transformer_engine.pytorch as te``)
        if _importing_module().startswith("megatron.bridge") or ROOT in sys.modules:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Module(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def is_stand_in(value) -> bool:
    return isinstance(value, _Module) or type(value) is Inert


@contextlib.contextmanager
def scoped():
    """Offer the stand-in while the block runs; afterwards no ``transformer_engine`` module is left importable."""
    finder = _Finder()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for name in [n for n in sys.modules if n.split(".")[0] == ROOT]:
            del sys.modules[name]


def leaks(prefix_allowed: str = "megatron.bridge") -> list[str]:
    """Modules outside Megatron-Bridge that hold a stand-in: they would take a TE code path that cannot run."""
    import warnings

    found = []
    with warnings.catch_warnings():  # looking at every module attribute touches deprecated ones (torch.distributed)
        warnings.simplefilter("ignore")
        for name, module in list(sys.modules.items()):
            if module is not None and not name.startswith(prefix_allowed) and name != __name__ and \
                    _holds_stand_in(module):
                found.append(name)
    return sorted(found)


def _holds_stand_in(module) -> bool:
    try:
        return any(is_stand_in(v) for v in list(vars(module).values()))
    except TypeError:  # no __dict__
        return False
