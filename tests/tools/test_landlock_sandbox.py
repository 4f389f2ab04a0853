"""The landlock sandbox for real (no namespaces, no cgroups): hostile programs are denied or named, the trainer's
files, environment, processes and sockets stay out of reach, and nothing of a run is left.

Runs here as root with Landlock (this kernel has ABI 7); test_docker_nonroot.py runs the same programs as a non-root
uid under a Docker-like filter with a read-only cgroupfs. Skips only where Landlock is absent and nothing promises
a sandbox (CI=true or RECIPE_REQUIRE_SANDBOX=1 make that a failure).
"""

import asyncio
import dataclasses
import os
import socket
import tempfile
import threading
from pathlib import Path

import pytest

from harness.hostile import FILTER_ERRNOS, HOSTILE, RAISE_LIMITS
from harness.proc_tree import descendants, started_below, stat
from harness.sandbox_check import require_sandbox
from harness.syscall_corpus import CORPUS
from recipe.tools import landlock_sandbox
from recipe.tools.landlock_sandbox import LandlockBackend
from recipe.tools.limits import MiB, SandboxLimits
from recipe.tools.result import Status
from recipe.tools.sandbox import make_backend, sandbox_self_check

REPO = Path(__file__).resolve().parents[2]
LIMITS = SandboxLimits(wall_timeout_s=60, cpu_time_s=1, memory_bytes=256 * MiB, max_processes=16,
                       max_output_bytes=64 * 1024, scratch_bytes=8 * MiB)


@pytest.fixture(scope="module")
def sandbox():
    root = tempfile.mkdtemp(prefix="landlock-scratch-")  # under /tmp: pytest's own are root's only, and as root the
    os.chmod(root, 0o711)  # sandbox runs as nobody
    yield require_sandbox(LandlockBackend(limits=LIMITS, scratch_root=root))
    os.rmdir(root)


def limited(backend, **kw):
    return dataclasses.replace(backend, limits=dataclasses.replace(backend.limits, **kw))


def run(backend, code, **kw):
    return asyncio.run(backend.run(code, **kw))


def test_runs_a_program_in_its_scratch_directory(sandbox):
    r = run(sandbox, "import os, sys\nopen('f', 'w').write(input() * 2)\nprint(open('f').read(), "
                     "os.getcwd() == os.environ['TMPDIR'] == os.environ['HOME'])\nprint('w', file=sys.stderr)",
            stdin="ab\n")
    assert r.status == Status.OK and r.stdout == "abab True\n" and r.stderr == "w\n", r
    assert os.listdir(sandbox.scratch_root) == []  # each run's directory is gone once it returns


@pytest.mark.parametrize("hostile", HOSTILE, ids=lambda h: h.name)
def test_hostile_program_is_denied_or_named_and_leaves_nothing(sandbox, hostile):
    before = descendants(os.getpid())  # the session's engine, e2e launches beside the suite
    r = run(limited(sandbox, **hostile.limits), hostile.code)
    assert "ESCAPED" not in r.stdout, r
    assert (r.status == Status.OK and "DENIED" in r.stdout) or r.status.value in hostile.outcomes["landlock"], r
    assert all(line.split()[-1] in FILTER_ERRNOS for line in r.stdout.splitlines() if line.startswith("DENIED ")), r
    assert os.listdir(sandbox.scratch_root) == []
    assert started_below(os.getpid(), before) == []


@pytest.mark.parametrize("program", CORPUS, ids=lambda p: p.name)
def test_corpus_runs_or_is_named_one_process(sandbox, program):
    """The allowlist's corpus: everything but threads and processes runs; those end in ``process_limit``."""
    import subprocess

    if program.needs and subprocess.run([sandbox.python, "-c", "import " + ", ".join(program.needs)]).returncode:
        pytest.skip(f"{sandbox.python} lacks {program.needs}: bash scripts/lib/install_sandbox.sh installs them")
    r = run(limited(sandbox, cpu_time_s=60, memory_bytes=1024 * MiB, scratch_bytes=64 * MiB), program.code,
            stdin="a line\n")
    if program.processes:
        assert r.status == Status.PROCESS_LIMIT and "one process with one thread" in r.detail, r
    else:
        assert r.status == Status.OK and "CORPUS OK" in r.stdout, r


def test_the_trainers_files_environment_and_processes_are_out_of_reach(sandbox, tmp_path, monkeypatch):
    """Same uid as the trainer, so only Landlock and the filter keep these out: the checkout, a host file, /etc,
    the home, /proc of other processes (the trainer's environ), signals to the trainer."""
    secret = tmp_path / "secret.txt"
    secret.write_text("top-secret")
    monkeypatch.setenv("RECIPE_SANDBOX_SECRET", "hunter2")
    paths = [str(secret), str(REPO / "README.md"), "/etc/passwd", os.path.expanduser("~"), f"/proc/{os.getpid()}/environ",
             "/proc/1/cmdline"]
    r = run(sandbox, (
        "import os, signal\n"
        f"for p in {paths!r}:\n"
        "    try:\n"
        "        print('GOT', p, os.listdir(p) if os.path.isdir(p) else open(p, 'rb').read()[:40])\n"
        "    except OSError as e:\n"
        "        print('hidden', p, e.errno)\n"
        f"for pid in ({os.getpid()}, 1, os.getppid()):\n"
        "    try:\n"
        "        os.kill(pid, 0)\n"
        "        print('SIGNALLED', pid)\n"
        "    except OSError as e:\n"
        "        print('nosignal', pid, e.errno)\n"
        "print(sorted(os.environ))\n"
        "print(open('/proc/self/status').read().count('Seccomp:'))\n"
    ))
    assert r.status == Status.OK and "GOT" not in r.stdout and r.stdout.count("hidden") == len(paths), r
    assert "SIGNALLED" not in r.stdout and r.stdout.count("nosignal") == 3, r
    assert "hunter2" not in r.stdout and "RECIPE_SANDBOX_SECRET" not in r.stdout


def test_writes_outside_the_scratch_directory_are_named(sandbox, tmp_path):
    target = tmp_path / "escaped.txt"
    r = run(sandbox, f"open({str(target)!r}, 'w').write('x')")
    assert r.status == Status.READ_ONLY and "scratch directory" in r.detail, r
    assert not target.exists()


def test_no_socket_reaches_the_trainer(sandbox, tmp_path):
    """No socket() at all: not the network, not a unix socket the trainer or vLLM listens on (same uid, so file
    permissions would not stop it), not the loopback; the listeners see nothing."""
    path = str(tmp_path / "trainer.sock")
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(path)
    unix.listen()
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen()
    got = []
    for s in (unix, tcp):
        s.settimeout(0.2)
        threading.Thread(target=lambda s=s: got.extend(_accept(s)), daemon=True).start()
    r = run(sandbox, (
        "import socket\n"
        f"for fam, addr in ((socket.AF_UNIX, {path!r}), (socket.AF_INET, ('127.0.0.1', {tcp.getsockname()[1]})),"
        " (socket.AF_INET, ('1.1.1.1', 53))):\n"
        "    try:\n"
        "        socket.socket(fam).connect(addr)\n"
        "        print('CONNECTED', addr)\n"
        "    except OSError as e:\n"
        "        print('failed', e.errno)\n"
        "socket.create_connection(('1.1.1.1', 80), timeout=2)\n"
    ))
    unix.close()
    tcp.close()
    assert "CONNECTED" not in r.stdout and r.stdout.count("failed") == 3, r
    assert r.status == Status.NO_NETWORK, r
    assert got == []


def _accept(s):
    for _ in range(100):
        try:
            return [s.accept()]
        except OSError:
            continue
    return []


@pytest.mark.parametrize("code, status", [
    ("while True: pass", Status.CPU_LIMIT),
    ("x = bytearray(4 * 1024**3)", Status.MEMORY_LIMIT),
    ("while True:\n    print('x' * 1000)", Status.OUTPUT_LIMIT),
    ("f = open('big', 'wb')\nwhile True:\n    f.write(b'x' * (1 << 20))\n    f.flush()", Status.DISK_LIMIT),
])
def test_the_limits_name_themselves(sandbox, code, status):
    r = run(sandbox, code)
    assert r.status == status, r


def test_wall_clock_timeout(sandbox):
    r = run(limited(sandbox, wall_timeout_s=1.5), "import time\nprint('started', flush=True)\ntime.sleep(600)")
    assert r.status == Status.TIMEOUT and r.stdout == "started\n" and r.wall_s >= 1.5


def test_without_landlock_it_refuses_by_name(monkeypatch):
    monkeypatch.setattr(landlock_sandbox, "abi", lambda: "Landlock is not available here: this kernel has none")
    backend = make_backend("landlock", environ={})
    r = run(backend, "print(1)")
    assert r.status == Status.SANDBOX_ERROR and "Landlock is not available here" in r.detail
    assert "Landlock is not available here" in sandbox_self_check(backend)


def test_describe_limits_says_one_process_and_landlock(sandbox):
    line = sandbox.describe_limits()
    assert "one process with one thread" in line and "Landlock ABI" in line and "no socket()" in line


def _running_program(before) -> bool:
    """Whether the sandbox's program (the launcher exec'd into ``python3 .../code/main.py``) runs below this test."""
    for pid in started_below(os.getpid(), before):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().endswith(b"/code/main.py\0"):
                return True
        except OSError:
            pass
    return False


def test_a_cancelled_run_leaves_nothing(sandbox):
    """Cancelling the awaiting task (an aborted group) kills the program at once and removes its scratch."""
    import time

    async def scenario():
        before = descendants(os.getpid())
        task = asyncio.ensure_future(sandbox.run("import time\nopen('started', 'w').close()\ntime.sleep(60)"))
        deadline = time.monotonic() + 30
        while not _running_program(before):  # as root its scratch is a tmpfs only the program sees
            assert time.monotonic() < deadline, "the program never started"
            await asyncio.sleep(0.02)
        kids = started_below(os.getpid(), before)
        t0 = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return kids, time.monotonic() - t0

    kids, cancel_s = asyncio.run(scenario())
    assert kids and cancel_s < 10
    assert [p for p in kids if stat(p) is not None and stat(p)["state"] != "Z"] == []
    assert os.listdir(sandbox.scratch_root) == []


# ---- issue 45: no powers it does not need, a scratch the kernel bounds, removed whatever the program did -----------
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="what the sandbox does when started as root")


@as_root
def test_as_root_the_program_runs_as_nobody_without_capabilities(sandbox):
    r = run(sandbox, "import os\nprint(os.getresuid(), os.getresgid(), os.getgroups())\n"
                     "print([l.split()[1] for l in open('/proc/self/status') if l.startswith(('CapPrm', 'CapEff', "
                     "'CapAmb', 'CapInh'))])")
    assert r.status == Status.OK, r
    assert r.stdout.splitlines() == ["(65534, 65534, 65534) (65534, 65534, 65534) []", str(["0" * 16] * 4)], r


def test_limits_and_priority_can_only_be_lowered(sandbox):
    """setrlimit's values sit in memory, where the filter cannot look: every hard limit is the soft one and there is
    no CAP_SYS_RESOURCE, so raising any limit fails; RLIMIT_NICE 0, so no nice below the one it started with."""
    r = run(sandbox, RAISE_LIMITS + (
        "os.setpriority(os.PRIO_PROCESS, 0, 5); print('lowered to', os.getpriority(os.PRIO_PROCESS, 0))\n"
    ))
    assert r.status == Status.OK and "RAISED" not in r.stdout and "lowered to 5" in r.stdout, r


def test_a_file_written_in_the_scratch_is_never_executed(tmp_path):
    """Landlock itself (``recipe/tools/landlock.py``) withholds EXECUTE below the writable directory: a script the
    program wrote cannot be run, whatever its mode (the root tmpfs's noexec would hide a regression here)."""
    import subprocess
    import sys

    from recipe.tools.landlock import abi

    if isinstance(abi(), str):
        pytest.skip(abi())
    code = (
        "import os, sys\n"
        "from recipe.tools.landlock import restrict\n"
        "d = sys.argv[1]\n"
        "open(d + '/x', 'w').write('#!/bin/sh\\necho RAN\\n'); os.chmod(d + '/x', 0o755)\n"
        "restrict(read=['/usr', '/bin', '/lib', '/lib64', '/etc', sys.prefix, sys.base_prefix], write=[d])\n"
        "open(d + '/y', 'w').write('written')\n"
        "try:\n"
        "    os.execv(d + '/x', [d + '/x'])\n"
        "except PermissionError:\n"
        "    print('DENIED')\n"
    )
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60,
                       cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.stdout == "DENIED\n" and (tmp_path / "y").read_text() == "written", r.stdout + r.stderr


@as_root
def test_as_root_the_scratch_is_a_tmpfs_the_kernel_caps(sandbox):
    """Nothing to poll: a tmpfs of ``scratch_bytes`` in the program's own mount namespace; writing past it is ENOSPC
    at once (``disk_limit``), fallocate's ``KEEP_SIZE`` included, and nothing of it reaches the host's disk."""
    r = run(sandbox, (
        "import os\n"
        "st = os.statvfs('.')\n"
        "print('size', st.f_blocks * st.f_frsize, 'noexec', bool(st.f_flag & os.ST_NOEXEC), flush=True)\n"
        "fd = os.open('f', os.O_CREAT | os.O_WRONLY)\n"
        "try:\n"
        "    os.posix_fallocate(fd, 0, 1 << 30)\n"
        "except OSError as e:\n"
        "    print('fallocate', e.errno, flush=True)\n"
        "open('g', 'wb').write(b'x' * (64 << 20))\n"
    ))
    assert r.status == Status.DISK_LIMIT, r
    assert r.stdout.splitlines()[:2] == [f"size {LIMITS.scratch_bytes} noexec True", "fallocate 28"], r
    assert os.listdir(sandbox.scratch_root) == []


def test_a_deep_unreadable_tree_is_removed_and_run_returns(sandbox):
    """A 3,000-deep tree whose directories lose every right (an old ``rmtree`` raised RecursionError out of ``run``
    and left it in the scratch root)."""
    r = run(limited(sandbox, wall_timeout_s=120), (
        "import os\n"
        "fd = os.open('.', os.O_RDONLY)\n"
        "for i in range(3000):\n"
        "    os.mkdir('d', dir_fd=fd); n = os.open('d', os.O_RDONLY, dir_fd=fd); os.close(fd); fd = n\n"
        "os.close(os.open('f', os.O_CREAT | os.O_WRONLY, 0, dir_fd=fd))\n"
        "os.mkdir('hidden', 0o300)\n"
        "open('hidden/data', 'wb').write(b'x' * (1 << 20))\n"
        "os.chmod('d', 0)\n"
        "print('built')\n"
    ))
    assert "built" in r.stdout or r.status == Status.DISK_LIMIT, r
    assert os.listdir(sandbox.scratch_root) == []


def test_run_never_raises(sandbox, monkeypatch):
    """A failure of the sandbox itself (here: its launcher's path) is one ``sandbox_error``, and nothing is left."""
    def broken():
        raise RuntimeError("broken launcher path")

    monkeypatch.setattr(landlock_sandbox, "_launcher_path", broken)
    r = run(sandbox, "print(1)")
    assert r.status == Status.SANDBOX_ERROR and "broken launcher path" in r.detail, r
    assert os.listdir(sandbox.scratch_root) == []


@as_root
def test_a_scratch_root_nobody_can_reach_is_refused_by_name(tmp_path):
    backend = LandlockBackend(limits=LIMITS, scratch_root=str(tmp_path))  # pytest's: root's only
    r = run(backend, "print(1)")
    assert r.status == Status.SANDBOX_ERROR and "SANDBOX_SCRATCH_ROOT" in r.detail and "65534" in r.detail, r


def test_the_preflight_counts_the_root_tmpfs(monkeypatch):
    """Started as root, each landlock sandbox's scratch is a tmpfs in RAM beside its address space: the node's bound
    adds ``scratch_bytes``; not root, the scratch is on disk and the bound is ``memory_bytes`` alone."""
    from omegaconf import OmegaConf

    from recipe.preflight.knobs import ARR
    from recipe.preflight.tools import sandbox_memory

    class Tool:
        name, max_concurrency = "code_interpreter", 2
        backend = make_backend("landlock", {"limits": {"memory_bytes": 512 * MiB, "scratch_bytes": 256 * MiB}},
                               environ={})

    cfg = OmegaConf.create({ARR: {"rollout": {"agent": {"num_workers": 4}}}, "trainer": {"nnodes": 1}})
    monkeypatch.setattr(landlock_sandbox.os, "geteuid", lambda: 0)
    total, how = sandbox_memory(cfg, [Tool()], "t.yaml")
    assert total == 4 * 2 * 768 * MiB and "tmpfs" in how, how
    monkeypatch.setattr(landlock_sandbox.os, "geteuid", lambda: 4242)
    assert sandbox_memory(cfg, [Tool()], "t.yaml")[0] == 4 * 2 * 512 * MiB
