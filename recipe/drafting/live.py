"""What a corpus really holds: the bytes of every numpy array reachable from it, found by walking the garbage
collector's references (not the corpus's own accounting), for the leak test and ``bench/group_corpus_bytes.py``."""
from __future__ import annotations

import gc
import types

import numpy as np

_SKIP = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType)


def reachable_bytes(root) -> int:
    """The bytes of every numpy array reachable from ``root``, each buffer once (a view counts its base)."""
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
                todo.append(o.base)
            continue
        todo.extend(gc.get_referents(o))
    return total
