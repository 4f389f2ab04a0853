"""``sandbox_self_check``: None when ``print(1+1)`` prints 2 through the backend, else one line naming the fix.

The namespace failure is played by ``fake_bwrap``, a test double: a shell script that answers ``--help`` and
otherwise prints what bwrap prints where it cannot create namespaces (inside docker) and exits 1.
"""

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from recipe.tools.bwrap import BubblewrapBackend
from recipe.tools.sandbox import make_backend, sandbox_self_check

REPO = Path(__file__).resolve().parents[2]


def fake_bwrap(tmp_path, message):
    path = tmp_path / "bwrap"
    path.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "--help" ]; then echo "usage: bwrap [OPTIONS...] [--] COMMAND [ARGS...]"; exit 0; fi\n'
        f"echo '{message}' >&2\nexit 1\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return BubblewrapBackend(bwrap=str(path), sandbox_uid=None)


@pytest.mark.parametrize(
    "message",
    [
        "bwrap: Creating new namespace failed: Operation not permitted",
        "bwrap: No permissions to create new namespace, likely because the kernel does not allow non-privileged "
        "user namespaces.",
        "bwrap: setting up uid map: Permission denied",
    ],
)
def test_no_namespaces_names_the_docker_fix(tmp_path, message):
    err = sandbox_self_check(fake_bwrap(tmp_path, message))
    assert err is not None and message in err
    assert "bwrap cannot create namespaces here (inside docker?)" in err
    assert "SANDBOX_BACKEND=sandbox_fusion" in err and "SANDBOX_FUSION_URL" in err


def test_missing_bwrap_names_the_install():
    err = sandbox_self_check(BubblewrapBackend(bwrap="/nonexistent/bwrap"))
    assert "apt-get install bubblewrap" in err and "install_sandbox.sh" in err


def test_missing_python_names_the_fix():
    err = sandbox_self_check(make_backend("bubblewrap", {"python": "/nonexistent/python3"}, environ={}))
    assert "SANDBOX_PYTHON" in err


def test_self_check_inside_a_running_loop():
    """The preflight may call it from async code: it runs in a thread then."""
    import asyncio

    async def inside():
        return sandbox_self_check(BubblewrapBackend(bwrap="/nonexistent/bwrap"))

    assert "apt-get install bubblewrap" in asyncio.run(inside())


def test_cli_check_exit_status():
    env = {**os.environ, "SANDBOX_BWRAP": "/nonexistent/bwrap", "SANDBOX_BACKEND": "bubblewrap"}
    r = subprocess.run([sys.executable, "-m", "recipe.tools", "check"], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1 and "apt-get install bubblewrap" in r.stdout


def test_install_sandbox_script_when_bwrap_is_present():
    """Idempotent: with bwrap installed it only reports (no apt-get)."""
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap not installed: bash scripts/lib/install_sandbox.sh installs it (root + apt-get)")
    r = subprocess.run(["bash", str(REPO / "scripts/lib/install_sandbox.sh")], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and "bubblewrap" in r.stdout + r.stderr
