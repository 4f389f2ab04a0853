"""``sandbox_self_check``: None when ``print(1+1)`` prints 2 through the backend, else one line naming the fix.

The namespace failure and an old bwrap are played by ``fake_bwrap``, a test double: a shell script that answers
``--help`` (with or without the options the sandbox relies on) and ``--version``, and otherwise prints what bwrap
prints where it cannot create namespaces (inside docker) and exits 1. Where cgroups cannot be delegated is played by
replacing ``host_cgroups``'s answer with the line it gives there; the rest runs for real.
"""

import asyncio
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from recipe.tools import bwrap as bwrap_module
from recipe.tools.bwrap import ALLOW_PER_PROCESS, BubblewrapBackend
from recipe.tools.result import Status
from recipe.tools.sandbox import make_backend, sandbox_required, sandbox_self_check

REPO = Path(__file__).resolve().parents[2]
OPTIONS = "    --disable-userns             Disable further use of user namespaces\n" \
          "    --seccomp FD                 Load and use seccomp rules from FD"


def fake_bwrap(tmp_path, message, version="bubblewrap 0.8.0", options=OPTIONS):
    path = tmp_path / "bwrap"
    path.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "--help" ]; then printf "usage: bwrap [OPTIONS...] [--] COMMAND [ARGS...]\\n{options}\\n"; '
        "exit 0; fi\n"
        f'if [ "$1" = "--version" ]; then echo "{version}"; exit 0; fi\n'
        f"echo '{message}' >&2\nexit 1\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return BubblewrapBackend(bwrap=str(path), sandbox_uid=None)


def real_sandbox():
    if shutil.which("bwrap") is None and not sandbox_required():
        pytest.skip("bubblewrap is not installed here")
    return BubblewrapBackend()


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


@pytest.mark.parametrize("options, missing", [
    ("    --seccomp FD   Load seccomp rules", "--disable-userns"),
    ("    --disable-userns   Disable user namespaces", "--seccomp"),
])
def test_too_old_bwrap_fails_closed(tmp_path, options, missing):
    """bwrap without an option the sandbox relies on is refused with its version and the fix, never run without it."""
    backend = fake_bwrap(tmp_path, "bwrap: must not be started", version="bubblewrap 0.4.1", options=options)
    r = asyncio.run(backend.run("print(1)"))
    assert r.status == Status.SANDBOX_ERROR and "bubblewrap 0.4.1 is too old" in r.detail and missing in r.detail
    assert "0.8.0" in r.detail and "must not be started" not in r.detail + r.stderr
    err = sandbox_self_check(backend)
    assert "bubblewrap 0.4.1 is too old" in err and missing in err


NO_CGROUPS = "cannot create a cgroup under /sys/fs/cgroup/memory/x: Permission denied"


def test_without_cgroups_a_run_refuses_to_start_and_names_the_knob(monkeypatch):
    monkeypatch.setattr(bwrap_module, "host_cgroups", lambda: NO_CGROUPS)
    backend = real_sandbox()
    r = asyncio.run(backend.run("print(1)"))
    assert r.status == Status.SANDBOX_ERROR and NO_CGROUPS in r.detail
    assert f"{ALLOW_PER_PROCESS}=1" in r.detail and "allow_per_process_limits: true" in r.detail
    assert "per process" in r.detail or "each process alone" in r.detail
    err = sandbox_self_check(backend)
    assert NO_CGROUPS in err and ALLOW_PER_PROCESS in err


def test_per_process_limits_run_once_accepted_by_name(monkeypatch):
    monkeypatch.setattr(bwrap_module, "host_cgroups", lambda: NO_CGROUPS)
    backend = make_backend("bubblewrap", environ={ALLOW_PER_PROCESS: "1"})
    if backend.bwrap_path() is None and not sandbox_required():
        pytest.skip("bubblewrap is not installed here")
    assert backend.allow_per_process_limits
    assert sandbox_self_check(backend) is None
    assert backend.describe_limits().startswith("PER PROCESS only") and NO_CGROUPS in backend.describe_limits()
    r = asyncio.run(backend.run("print(6 * 7)"))
    assert r.ok and r.stdout == "42\n" and "memory_peak_bytes" not in r.extra


def test_the_knob_parses_by_name():
    assert make_backend("bubblewrap", {"allow_per_process_limits": True}, environ={}).allow_per_process_limits
    assert not make_backend("bubblewrap", {"allow_per_process_limits": False},
                            environ={ALLOW_PER_PROCESS: "1"}).allow_per_process_limits  # the config wins
    assert not make_backend("bubblewrap", environ={}).allow_per_process_limits
    with pytest.raises(ValueError, match=ALLOW_PER_PROCESS):
        make_backend("bubblewrap", environ={ALLOW_PER_PROCESS: "maybe"})


def test_cli_check_reports_the_cgroup_mode():
    """On this machine: the cgroup version the runs are nested under (or the line saying they cannot be)."""
    real_sandbox()
    r = subprocess.run([sys.executable, "-m", "recipe.tools", "check"], cwd=REPO, capture_output=True, text=True,
                       timeout=120, env={k: v for k, v in os.environ.items() if k != ALLOW_PER_PROCESS})
    limits = [ln for ln in r.stdout.splitlines() if ln.startswith("limits: ")]
    assert len(limits) == 1, r.stdout + r.stderr
    if r.returncode == 0:
        assert limits[0].startswith("limits: in total per run, cgroup v") and "nested under" in limits[0]
    else:
        assert "cgroups cannot be delegated here" in limits[0] and ALLOW_PER_PROCESS in limits[0]


def test_sandbox_required_where_ci_promises_it():
    assert sandbox_required({"CI": "true"}) and sandbox_required({"RECIPE_REQUIRE_SANDBOX": "1"})
    assert not sandbox_required({}) and not sandbox_required({"CI": "false"})


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


def test_missing_libseccomp_fails_closed(monkeypatch):
    """Without the filter's library a run is refused, naming the install, and the self-check says the same."""
    import builtins

    from recipe.tools import seccomp

    real_import = builtins.__import__

    def no_pyseccomp(name, *args, **kw):
        if name == "pyseccomp":
            raise ImportError("No module named 'pyseccomp'")
        return real_import(name, *args, **kw)

    monkeypatch.setattr(builtins, "__import__", no_pyseccomp)
    seccomp.filter_bpf.cache_clear()
    try:
        backend = real_sandbox()
        r = asyncio.run(backend.run("print(1)"))
        assert r.status == Status.SANDBOX_ERROR and seccomp.PIN in r.detail and "libseccomp2" in r.detail
        assert seccomp.PIN in sandbox_self_check(backend)
    finally:
        seccomp.filter_bpf.cache_clear()


def test_before_linux_5_14_rlimit_nproc_is_not_a_per_sandbox_bound(monkeypatch):
    """RLIMIT_NPROC counted every process of the host uid before 5.14 (RHEL 8, Ubuntu 20.04): the sandboxes would
    share one budget with each other and a non-root trainer's threads. There the cgroup's pids.max alone bounds a
    run (RLIMIT_NPROC is not set), and per-process limits are refused by name."""
    assert bwrap_module.nproc_per_user_namespace("5.14.0-1") and bwrap_module.nproc_per_user_namespace("6.18.44")
    assert not bwrap_module.nproc_per_user_namespace("5.10.0-28-amd64")
    monkeypatch.setattr(bwrap_module.platform, "release", lambda: "4.18.0-553.el8.x86_64")
    b = BubblewrapBackend(sandbox_uid=None)
    argv = b.argv(3, 4)
    assert argv[argv.index("-c") + 4] == "-1"  # cpu, memory, then no RLIMIT_NPROC
    monkeypatch.setattr(bwrap_module, "host_cgroups", lambda: NO_CGROUPS)
    problem = make_backend("bubblewrap", environ={ALLOW_PER_PROCESS: "1"}).limits_mode()[1]
    assert problem and "4.18.0-553.el8.x86_64 < 5.14" in problem and "SANDBOX_BACKEND=landlock" in problem
