"""The bubblewrap sandbox for real: hostile programs get a named tool error within the limits and the host is untouched.

Needs Debian's ``bubblewrap`` and user namespaces (``scripts/lib/install_sandbox.sh`` installs it; inside docker
bwrap cannot create namespaces): otherwise every test here is skipped with ``sandbox_self_check``'s reason.
Small limits keep the whole file to a few seconds: CPU 1 s, 256 MiB, 16 processes, 64 KiB of output; a wall clock
of 10 s (so that on a loaded machine each other limit still fires first; "< LIMITS.wall_timeout_s" asserts that),
1.5 s for the timeout test.
"""

import asyncio
import dataclasses
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from recipe.tools.bwrap import BubblewrapBackend
from recipe.tools.limits import SandboxLimits
from recipe.tools.result import Status, format_for_model
from recipe.tools.sandbox import sandbox_self_check

REPO = Path(__file__).resolve().parents[2]
LIMITS = SandboxLimits(
    wall_timeout_s=10,
    cpu_time_s=1,
    memory_bytes=256 * 1024 * 1024,
    max_processes=16,
    max_output_bytes=64 * 1024,
    scratch_bytes=8 * 1024 * 1024,
)


@pytest.fixture(scope="module")
def sandbox():
    backend = BubblewrapBackend(limits=LIMITS)
    err = sandbox_self_check(backend)
    if err is not None:
        pytest.skip(f"bubblewrap sandbox unavailable here: {err}")
    return backend


def run(backend, code, **kw):
    return asyncio.run(backend.run(code, **kw))


# ---- /proc helpers: which processes exist on the host -------------------------------------------------------------
def _stat(pid):
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    comm = raw[raw.index("(") + 1 : raw.rindex(")")]
    fields = raw[raw.rindex(")") + 2 :].split()
    return {"comm": comm, "state": fields[0], "ppid": int(fields[1]), "pgid": int(fields[2])}


def _all_pids():
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _descendants(root):
    kids = {}
    for pid in _all_pids():
        st = _stat(pid)
        if st:
            kids.setdefault(st["ppid"], []).append(pid)
    out, todo = [], [root]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _with_cmdline(marker: bytes):
    found = []
    for pid in _all_pids():
        try:
            if marker in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            pass
    return found


def _group_alive(pgid):
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def _wait_gone(pids, pgid=None, timeout=5.0):
    """Poll until none of ``pids`` exists and ``pgid`` is empty; returns what is left."""
    deadline = time.monotonic() + timeout
    while True:
        left = [p for p in pids if _stat(p) is not None]
        group = pgid is not None and _group_alive(pgid)
        if (not left and not group) or time.monotonic() > deadline:
            return left + ([f"pgid {pgid}"] if group else [])
        time.sleep(0.05)


# ---- ordinary programs -------------------------------------------------------------------------------------------
def test_runs_a_program(sandbox):
    r = run(sandbox, "import sys\nprint(sum(range(10)))\nprint('warn', file=sys.stderr)")
    assert r.status == Status.OK and r.stdout == "45\n" and r.stderr == "warn\n" and r.exit_code == 0
    assert format_for_model(r) == "45\n\n[stderr]\nwarn\n"


def test_error_exit_and_traceback(sandbox):
    r = run(sandbox, "1/0")
    assert r.status == Status.ERROR and r.exit_code == 1 and "ZeroDivisionError" in r.stderr
    assert 'File "/code/main.py", line 1' in r.stderr


def test_stdin_and_scratch_dir(sandbox):
    r = run(sandbox, "import os\nopen('f.txt','w').write(input()*2)\nprint(open('/tmp/f.txt').read(), os.getcwd())",
            stdin="ab\n")
    assert r.status == Status.OK and r.stdout == "abab /tmp\n"
    # The scratch directory is a fresh tmpfs per run.
    assert run(sandbox, "import os; print(os.listdir('/tmp'))").stdout == "[]\n"


# ---- hostile programs: each a named error, within the limits, host unaffected -------------------------------------
def test_endless_loop_hits_cpu_limit(sandbox):
    r = run(sandbox, "while True: pass")
    assert r.status == Status.CPU_LIMIT and "CPU time limit" in r.detail
    assert r.wall_s < LIMITS.wall_timeout_s  # 1 s of CPU, long before the wall clock


def test_sleeping_program_hits_wall_clock_timeout(sandbox):
    short = dataclasses.replace(sandbox, limits=dataclasses.replace(LIMITS, wall_timeout_s=1.5))
    r = run(short, "import time\nprint('started', flush=True)\ntime.sleep(600)")
    assert r.status == Status.TIMEOUT and r.detail.startswith("timeout") and "1.5 s" in r.detail
    assert 1.5 <= r.wall_s < 1.5 + 2
    assert r.stdout == "started\n"  # what it printed before the kill is kept


def test_fork_bomb_hits_process_limit(sandbox):
    t0 = time.monotonic()
    r = run(sandbox, "import os\nwhile True:\n    os.fork()")
    assert r.status == Status.PROCESS_LIMIT and "process limit" in r.detail
    assert time.monotonic() - t0 < LIMITS.wall_timeout_s + 2
    # The host still forks, and the next sandbox runs.
    assert subprocess.run(["true"]).returncode == 0
    assert run(sandbox, "print('after')").stdout == "after\n"


def test_fork_bomb_is_capped_at_max_processes(sandbox):
    """RLIMIT_NPROC holds (bwrap runs as a non-root uid when we are root: the kernel never limits uid 0)."""
    r = run(sandbox, (
        "import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n            time.sleep(30)\n"
        "            os._exit(0)\n        n += 1\nexcept BlockingIOError as e:\n    print(n, e.errno)"
    ))
    assert r.status == Status.OK, r
    n, errno = map(int, r.stdout.split())
    assert errno == 11 and 1 <= n < LIMITS.max_processes


def test_thread_bomb_hits_process_limit(sandbox):
    r = run(sandbox, (
        "import threading, time\nfor _ in range(1000):\n    threading.Thread(target=time.sleep, args=(0.5,)).start()"
    ))
    assert r.status == Status.PROCESS_LIMIT


def test_shell_fork_bomb_is_contained(sandbox):
    t0 = time.monotonic()
    r = run(sandbox, "import subprocess\nsubprocess.run(['bash', '-c', ':(){ :|:& };: ; wait'])")
    assert time.monotonic() - t0 < LIMITS.wall_timeout_s + 2
    assert "Resource temporarily unavailable" in r.stderr  # bash's own "fork: retry" at the limit
    assert r.status == Status.PROCESS_LIMIT  # bash gives up on its own (or the timeout ends it): named either way
    assert run(sandbox, "print('after')").stdout == "after\n"


def test_memory_hog_hits_memory_limit(sandbox):
    r = run(sandbox, "x = bytearray(4 * 1024**3)")
    assert r.status == Status.MEMORY_LIMIT and "256 MiB" in r.detail


def test_growing_memory_hits_memory_limit(sandbox):
    r = run(sandbox, "a = []\nwhile True:\n    a.append(' ' * 10**6)")
    assert r.status == Status.MEMORY_LIMIT and r.wall_s < LIMITS.wall_timeout_s


def test_output_flood_hits_output_limit(sandbox):
    r = run(sandbox, "while True:\n    print('x' * 1000)")
    assert r.status == Status.OUTPUT_LIMIT and "output limit" in r.detail
    assert len(r.stdout.encode()) + len(r.stderr.encode()) <= LIMITS.max_output_bytes
    assert r.wall_s < LIMITS.wall_timeout_s


def test_single_huge_write_is_never_buffered_whole(sandbox):
    r = run(sandbox, "import sys\nsys.stdout.write('y' * 10**8)")  # 100 MB in one write
    assert r.status == Status.OUTPUT_LIMIT and len(r.stdout) == LIMITS.max_output_bytes


def test_stderr_flood_counts_too(sandbox):
    r = run(sandbox, "import sys\nwhile True:\n    sys.stderr.write('e' * 1000)")
    assert r.status == Status.OUTPUT_LIMIT and len(r.stderr) <= LIMITS.max_output_bytes


@pytest.mark.parametrize("where", ["/tmp", "/dev/shm"])
def test_disk_fill_hits_scratch_limit(sandbox, where):
    r = run(sandbox, f"open('{where}/big', 'wb').write(b'x' * (64 * 1024 * 1024))")
    assert r.status == Status.DISK_LIMIT and "scratch" in r.detail


def test_dev_null_and_multiprocessing_work(sandbox):
    r = run(sandbox, (
        "import multiprocessing as mp\nopen('/dev/null', 'w').write('x')\n"
        "if __name__ == '__main__':\n    with mp.Pool(2) as pool:\n        print(pool.map(abs, [-1, -2]))"
    ))
    assert r.status == Status.OK and r.stdout == "[1, 2]\n", r


def test_network_is_unreachable(sandbox):
    """No network: neither the internet, nor a server on the host's loopback (which sees no connection)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(5)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    accepted = []
    stop = threading.Event()

    def accept():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
                accepted.append(conn)
            except OSError:
                pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        r = run(sandbox, (
            "import socket\n"
            "for addr in [('127.0.0.1', %d), ('1.1.1.1', 53), ('8.8.8.8', 443)]:\n"
            "    try:\n"
            "        socket.create_connection(addr, timeout=2)\n"
            "        print('CONNECTED', addr)\n"
            "    except OSError as e:\n"
            "        print('failed', addr[0], e.errno)\n"
            "try:\n"
            "    socket.getaddrinfo('pypi.org', 443)\n"
            "    print('RESOLVED')\n"
            "except OSError as e:\n"
            "    print('dns failed')\n"
            "socket.create_connection(('1.1.1.1', 80), timeout=2)\n"
        ) % port)
    finally:
        stop.set()
        t.join()
        server.close()
    assert "CONNECTED" not in r.stdout and "RESOLVED" not in r.stdout and "dns failed" in r.stdout
    assert r.stdout.count("failed") == 4
    assert r.status == Status.NO_NETWORK and "Network is unreachable" in r.stderr and "no network" in r.detail
    assert accepted == []


def test_writes_outside_scratch_fail(sandbox, tmp_path):
    target = tmp_path / "escaped.txt"
    r = run(sandbox, (
        "import os\n"
        f"for p in ['/usr/escaped.txt', '/code/main.py', '/escaped.txt', '/dev/escaped', {str(target)!r}, "
        f"'/proc/escaped', {str(REPO / 'escaped.txt')!r}]:\n"
        "    try:\n"
        "        open(p, 'w').write('x')\n"
        "        print('WROTE', p)\n"
        "    except OSError as e:\n"
        "        print('denied', p, e.strerror)\n"
        "open('/usr/lib/escaped.txt', 'w')\n"
    ))
    assert "WROTE" not in r.stdout and r.stdout.count("denied") == 7
    assert r.status == Status.READ_ONLY and "Read-only file system" in r.stderr and "only /tmp" in r.detail
    assert not target.exists() and not (REPO / "escaped.txt").exists()
    assert not Path("/usr/escaped.txt").exists() and not Path("/escaped.txt").exists()


def test_host_environment_is_invisible(sandbox, monkeypatch):
    secret = "hunter2-" + os.urandom(4).hex()
    monkeypatch.setenv("RECIPE_SANDBOX_SECRET", secret)
    r = run(sandbox, (
        "import os, glob\n"
        "print(dict(os.environ))\n"
        "for p in glob.glob('/proc/*/environ'):\n"
        "    try:\n"
        "        print(p, open(p, 'rb').read())\n"
        "    except OSError as e:\n"
        "        print(p, e)\n"
    ))
    assert r.status == Status.OK and "/proc/1/environ" in r.stdout  # bwrap's own pid 1 was readable...
    assert secret not in r.stdout and "RECIPE_SANDBOX_SECRET" not in r.stdout  # ...and holds nothing of ours
    assert "'HOME': '/tmp'" in r.stdout


def test_host_files_are_invisible(sandbox, tmp_path):
    secret_file = tmp_path / "secret.txt"
    secret_file.write_text("top-secret-" + os.urandom(4).hex())
    paths = [str(secret_file), "/etc/passwd", "/etc/shadow", "/etc/hostname", "/root", str(REPO / "README.md"),
             os.path.expanduser("~/.ssh")]
    r = run(sandbox, (
        "import os\n"
        f"for p in {paths!r}:\n"
        "    try:\n"
        "        print('GOT', p, os.listdir(p) if os.path.isdir(p) else open(p).read()[:50])\n"
        "    except OSError as e:\n"
        "        print('hidden', p, type(e).__name__)\n"
        "print(sorted(os.listdir('/')))\n"
    ))
    assert r.status == Status.OK and "GOT" not in r.stdout and r.stdout.count("hidden") == len(paths)
    assert secret_file.read_text() not in r.stdout
    assert "'etc'" not in r.stdout and "'root'" not in r.stdout and "'work'" not in r.stdout


def test_code_too_long_is_refused_before_running(sandbox):
    r = run(sandbox, "x = 1\n" * (LIMITS.max_code_bytes // 6 + 10))
    assert r.status == Status.CODE_TOO_LONG and r.exit_code is None


# ---- processes never outlive the call ----------------------------------------------------------------------------
def test_background_and_setsid_children_die_with_the_program(sandbox):
    """A daemon (new session, double fork) started by the program is gone once the call returns (pid namespace)."""
    marker = "61.%d" % (os.getpid() % 1000)
    r = run(sandbox, (
        "import subprocess, os\n"
        f"subprocess.Popen(['sleep', '{marker}'], start_new_session=True)\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        f"    os.execvp('sleep', ['sleep', '{marker}'])\n"
        "print('parent exits')\n"
    ))
    assert r.status == Status.OK
    assert _wait_gone(_with_cmdline(f"sleep\0{marker}".encode())) == []


def test_cancelled_call_kills_the_whole_sandbox(sandbox):
    """Cancelling the asyncio task (an aborted group) SIGKILLs bwrap's process group and reaps it: nothing left."""
    marker = "62.%d" % (os.getpid() % 1000)
    seen = {}

    async def scenario():
        task = asyncio.create_task(sandbox.run(
            f"import subprocess, time\nsubprocess.Popen(['sleep', '{marker}'])\ntime.sleep(60)"
        ))
        deadline = time.monotonic() + 10
        while not _with_cmdline(f"sleep\0{marker}".encode()):
            assert time.monotonic() < deadline, "the sandboxed program never started"
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        bwraps = [p for p in _descendants(os.getpid()) if (_stat(p) or {}).get("comm") == "bwrap"]
        outer = min(bwraps)
        seen["pgid"] = _stat(outer)["pgid"]
        seen["tree"] = [outer, *_descendants(outer)]
        t0 = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        seen["cancel_s"] = time.monotonic() - t0

    asyncio.run(scenario())
    assert seen["pgid"] == min(seen["tree"])  # bwrap leads its own group
    assert len(seen["tree"]) >= 3  # bwrap, the sandbox's init, python (and sleep)
    assert seen["cancel_s"] < 2
    assert _wait_gone(seen["tree"], pgid=seen["pgid"]) == []
    assert _with_cmdline(f"sleep\0{marker}".encode()) == []


def test_concurrent_sandboxes_have_their_own_process_budget(sandbox):
    """RLIMIT_NPROC counts per user namespace: two sandboxes with 10 children each both succeed under a limit of 16."""
    code = (
        "import os, time\npids = []\nfor _ in range(10):\n    pid = os.fork()\n    if pid == 0:\n"
        "        time.sleep(1)\n        os._exit(0)\n    pids.append(pid)\n"
        "for p in pids:\n    os.waitpid(p, 0)\nprint('ok')"
    )

    async def both():
        return await asyncio.gather(sandbox.run(code), sandbox.run(code))

    for r in asyncio.run(both()):
        assert r.status == Status.OK and r.stdout == "ok\n", r


def test_sigterm_from_inside_cannot_reach_the_host(sandbox):
    r = run(sandbox, "import os, signal\nfor pid in range(1, 200):\n    try:\n        os.kill(pid, signal.SIGKILL)\n"
                     "    except OSError:\n        pass\nprint('survived')")
    # Only the sandbox's own pid namespace is visible: killing "everything" kills the program itself at worst.
    assert r.status in (Status.OK, Status.KILLED)
    assert os.getpid() > 0 and signal.SIGKILL  # this process is still here


def test_runs_on_uvloop_as_in_rays_async_actors(sandbox):
    """verl's agent-loop workers are Ray async actors on uvloop, whose subprocess_exec refuses ``user=``/``group=``:
    the sandbox must start there too (and, as root, still drop to its own uid)."""
    uvloop = pytest.importorskip("uvloop")
    result = uvloop.run(sandbox.run("import os\nprint(os.getuid(), os.getgid(), os.getgroups())"))
    assert result.ok, result
    if os.geteuid() == 0:  # root drops to nobody, without supplementary groups
        assert result.stdout.strip() == "65534 65534 []"
