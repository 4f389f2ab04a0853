"""The one rule the sandbox tests share for a sandbox that fails its self-check.

They skip only where bubblewrap is not installed and nothing promises it (``sandbox_required``: CI=true or
RECIPE_REQUIRE_SANDBOX=1); anywhere else a failing self-check fails them, so a regression that breaks every
sandboxed run cannot pass as a row of skips.
"""
from __future__ import annotations

import pytest

from recipe.tools.bwrap import BubblewrapBackend
from recipe.tools.sandbox import make_backend, sandbox_required, sandbox_self_check


def require_sandbox(backend="bubblewrap"):
    """The backend (a ``BubblewrapBackend`` or a backend name) when its self-check passes; else skip or fail."""
    if isinstance(backend, str):
        backend = make_backend(backend)
    err = sandbox_self_check(backend)
    if err is None:
        return backend
    absent = isinstance(backend, BubblewrapBackend) and backend.bwrap_path() is None
    if absent and not sandbox_required():
        pytest.skip(f"bubblewrap is not installed here: {err}")
    pytest.fail(f"the bubblewrap sandbox fails its self-check: {err}")
