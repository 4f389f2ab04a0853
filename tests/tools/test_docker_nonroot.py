"""The recipe's sandboxes where the users' GPU nodes often run it: inside Docker as a non-root user, with Docker's
default seccomp profile (user namespaces denied) and a read-only cgroupfs. ``docker_nonroot.py`` (beside this
file) makes that setting here, as root: a private mount namespace with every cgroup mount read-only, a drop to
uid 4242, ``no_new_privs`` and a parent filter denying CLONE_NEWUSER as moby's profile does.

There, each hostile program of tests/support/harness/hostile.py is held by the landlock sandbox with a named status, the
default bubblewrap sandbox is refused by name (its self-check and its runs), and nothing of any run is left.
The recipe runs there on Debian's /usr/bin/python3, with itself, pyseccomp and landlock copied to a directory the
uid can read (the venv's interpreter lives under /root, which it cannot).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HARNESS = Path(__file__).with_name("docker_nonroot.py")
UID = 4242
PYTHON = "/usr/bin/python3"

RUNNER = r"""
import asyncio, dataclasses, json, os, sys, tempfile
from harness.hostile import HOSTILE
from recipe.tools.landlock_sandbox import LandlockBackend
from recipe.tools.limits import MiB, SandboxLimits
from recipe.tools.sandbox import make_backend, sandbox_self_check
root = tempfile.mkdtemp(prefix="nonroot-scratch-")
base = LandlockBackend(limits=SandboxLimits(wall_timeout_s=60, cpu_time_s=2, memory_bytes=256 * MiB,
                       max_output_bytes=64 * 1024, scratch_bytes=8 * MiB), scratch_root=root)
out = {"uid": os.getuid(), "landlock_check": sandbox_self_check(base), "bubblewrap_check":
       sandbox_self_check(make_backend("bubblewrap", environ={})), "runs": {}}
default = asyncio.run(make_backend(environ={}).run("print(1)"))
out["default_run"] = [default.status.value, default.detail]
for h in HOSTILE:
    b = dataclasses.replace(base, limits=dataclasses.replace(base.limits, **h.limits))
    r = asyncio.run(b.run(h.code))
    out["runs"][h.name] = [r.status.value, r.stdout[-2000:], r.detail, os.listdir(root)]
os.rmdir(root)
print(json.dumps(out))
"""


def _uid_processes() -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.stat(f"/proc/{pid}").st_uid == UID:
                found.append(int(pid))
        except FileNotFoundError:
            pass
    return found


@pytest.fixture(scope="module")
def nonroot():
    if os.geteuid() != 0:
        pytest.skip("making the non-root Docker setting needs root (a mount namespace, a uid drop)")
    if not os.path.exists(PYTHON):
        pytest.skip(f"{PYTHON} is not installed")
    import landlock
    import pyseccomp

    site = Path(tempfile.mkdtemp(prefix="nonroot-site-"))  # under /tmp: pytest's own tmp dirs are root's only
    try:
        site.chmod(0o755)
        shutil.copy(pyseccomp.__file__, site)
        shutil.copytree(os.path.dirname(landlock.__file__), site / "landlock")
        # the recipe too: the checkout may sit where the uid cannot read (a CI clone under /root)
        shutil.copytree(REPO / "recipe", site / "recipe", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copytree(REPO / "tests" / "support" / "harness", site / "harness",
                        ignore=shutil.ignore_patterns("__pycache__"))
        for d, _, names in os.walk(site):
            os.chmod(d, 0o755)
            for n in names:
                os.chmod(os.path.join(d, n), 0o644)
        env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "LANG": "C.UTF-8", "PYTHONPATH": str(site)}
        r = subprocess.run([sys.executable, str(HARNESS), str(UID), PYTHON, "-c", RUNNER], cwd="/", env=env,
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        check = subprocess.run([sys.executable, str(HARNESS), str(UID), PYTHON, "-m", "recipe.tools", "check"],
                               cwd="/", env=env, capture_output=True, text=True, timeout=300)
    finally:
        shutil.rmtree(site)
    return json.loads(r.stdout.strip().splitlines()[-1]), check


def test_the_setting_is_non_root_without_user_namespaces_or_writable_cgroups(nonroot):
    out, _ = nonroot
    assert out["uid"] == UID
    assert out["landlock_check"] is None  # the landlock sandbox works there
    line = out["bubblewrap_check"]  # bubblewrap does not, and says so by name with the fix
    assert line is not None and ("cgroups cannot be delegated" in line or "cannot create namespaces" in line), line
    assert "SANDBOX_BACKEND=landlock" in line


def test_the_default_sandbox_refuses_by_name(nonroot):
    out, check = nonroot
    status, detail = out["default_run"]
    assert status == "sandbox_error" and "SANDBOX_BACKEND=landlock" in detail, detail
    assert check.returncode == 1 and "SANDBOX_BACKEND=landlock" in check.stdout, check.stdout + check.stderr


@pytest.mark.parametrize("name", [h.name for h in __import__("harness.hostile", fromlist=["HOSTILE"]).HOSTILE])
def test_hostile_program_is_held_there(nonroot, name):
    from harness.hostile import BY_NAME, FILTER_ERRNOS

    status, stdout, detail, left = nonroot[0]["runs"][name]
    assert "ESCAPED" not in stdout, (status, stdout, detail)
    assert (status == "ok" and "DENIED" in stdout) or status in BY_NAME[name].outcomes["landlock"], (status, detail)
    assert all(line.split()[-1] in FILTER_ERRNOS for line in stdout.splitlines() if line.startswith("DENIED "))
    assert left == []  # its scratch directory is gone


def test_nothing_is_left_of_the_uid(nonroot):
    """Every process of the uid ends with its run: a killed one may take a moment to be reaped on a loaded machine
    (three test workers and an e2e launch beside it), not 30 s."""
    import time

    deadline = time.monotonic() + 30
    while _uid_processes() and time.monotonic() < deadline:
        time.sleep(0.2)
    left = _uid_processes()
    assert left == [], [(pid, Path(f"/proc/{pid}/stat").read_text()[:80]) for pid in left
                        if Path(f"/proc/{pid}/stat").exists()]
