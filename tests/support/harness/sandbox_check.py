"""The one rule the sandbox tests share for a sandbox that fails its self-check.

They skip only where the sandbox's tool is absent (bubblewrap not installed; for the landlock sandbox, a kernel
without Landlock) and nothing promises it (``sandbox_required``: CI=true or RECIPE_REQUIRE_SANDBOX=1); anywhere else
a failing self-check fails them, so a regression that breaks every sandboxed run cannot pass as a row of skips.
"""
from __future__ import annotations

import pytest

from recipe.tools.bwrap import BubblewrapBackend
from recipe.tools.landlock import abi
from recipe.tools.landlock_sandbox import LandlockBackend
from recipe.tools.sandbox import make_backend, sandbox_required, sandbox_self_check


def require_sandbox(backend="bubblewrap"):
    """The backend (a local backend or its name) when its self-check passes; else skip or fail."""
    if isinstance(backend, str):
        backend = make_backend(backend)
    err = sandbox_self_check(backend)
    if err is None:
        return backend
    absent = (isinstance(backend, BubblewrapBackend) and backend.bwrap_path() is None) or \
        (isinstance(backend, LandlockBackend) and isinstance(abi(), str))
    if absent and not sandbox_required():
        pytest.skip(f"the {backend.name} sandbox cannot run here: {err}")
    pytest.fail(f"the {backend.name} sandbox fails its self-check: {err}")
