"""What a corpus really holds: the bytes of every numpy array reachable from it, found by walking the garbage
collector's references (not the corpus's own accounting), for the leak test and ``bench/group_corpus_bytes.py``."""
from __future__ import annotations

import gc
import types

import numpy as np

_SKIP = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType)


def reachable_bytes(root) -> int:
    """The bytes of every numpy array and torch tensor reachable from ``root``, each buffer once (a view counts its
    base)."""
    seen, todo, total = set(), [root], 0
    while todo:
        o = todo.pop()
        if id(o) in seen or isinstance(o, _SKIP):
            continue
        seen.add(id(o))
        if isinstance(o, np.ndarray):
            if o.base is None:
                total += o.nbytes
            else:
                todo.append(o.base)  # a view: its base (an array, or a torch tensor it was made from)
            continue
        storage = getattr(o, "untyped_storage", None) if type(o).__module__.startswith("torch") else None
        if storage is not None:  # a torch tensor (an array from .numpy() keeps one as its base): its storage once
            s = storage()
            if ("storage", s.data_ptr()) not in seen:
                seen.add(("storage", s.data_ptr()))
                total += s.nbytes()
            continue
        todo.extend(gc.get_referents(o))
    return total
