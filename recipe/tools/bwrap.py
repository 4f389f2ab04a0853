"""Local sandbox for Python programs on Debian's ``bubblewrap`` (``bwrap``); asyncio, cancellable.

What holds each hostile program (each pinned by a test in tests/tools/test_bwrap_sandbox.py):

- the filesystem: only ``/usr`` (and ``/lib*``, ``/bin``, ``/sbin`` as on the host), the interpreter's own prefix if it
  lies elsewhere, and the program itself, all read-only; ``/proc`` of the sandbox's own pid namespace, a minimal
  ``/dev``; a size-capped tmpfs at ``/tmp`` (the scratch directory; the only other writable path is a size-capped
  ``/dev/shm`` for multiprocessing). No ``/etc``, no home, no checkout, no host ``/tmp``. bwrap's own root and its
  ``/dev`` are remounted read-only (else each is a writable tmpfs without a size cap).
- the environment: bwrap itself is started with a minimal environment (``--clearenv`` alone is not enough: the
  sandbox's pid 1 is a bwrap process whose ``/proc/1/environ`` would show the host's variables), then ``--clearenv``
  and a fixed list of ``--setenv``.
- the network: ``--unshare-net`` (a loopback of its own, nothing else).
- totals: each run gets a cgroup of its own (``recipe/tools/cgroup.py``): memory, processes and CPU time are limited
  summed over all of the program's processes, CPU bandwidth to ``cpu_cores``. A ``sh`` in front of bwrap joins
  the group and ``exec``s bwrap. Where this process's cgroups cannot be delegated, a run refuses to start unless
  per-process limits are accepted by name (``SANDBOX_ALLOW_PER_PROCESS_LIMITS=1`` or the tool config's
  ``allow_per_process_limits: true``).
- system calls: a seccomp filter compiled by libseccomp (``recipe/tools/seccomp.py``), loaded by bwrap's
  ``--seccomp``, and ``--disable-userns``; a bwrap without either option (older than 0.8.0) is refused.
- processes: ``--unshare-pid`` (when the program ends or the sandbox is killed, the kernel kills everything in the
  namespace, double-forked and ``setsid`` children included), ``--die-with-parent``, ``--new-session``, and
  RLIMIT_NPROC. The kernel never enforces RLIMIT_NPROC for host uid 0, not even inside a user namespace, so when
  this process is root, bwrap runs as ``sandbox_uid`` (65534, nobody) with ``--unshare-user``; the limit is set
  inside the sandbox (the count is per user namespace, so concurrent sandboxes do not share one budget). The uid is
  dropped by util-linux's ``setpriv`` in front of bwrap, not by ``subprocess``'s ``user=``/``group=``: Ray's async
  actors (verl's agent-loop workers) run on uvloop, whose ``subprocess_exec`` refuses those arguments.
- per-process limits: RLIMIT_CPU, RLIMIT_AS, RLIMIT_NPROC, RLIMIT_FSIZE, RLIMIT_NOFILE, RLIMIT_CORE=0, set by a Python
  launcher inside the sandbox right before it ``exec``s the program (no ``preexec_fn``: not safe in a threaded
  parent such as a Ray worker; no dependency on util-linux's ``prlimit``).
- time and output: a wall-clock timeout, an output budget (stdout + stderr, read in chunks, never buffered past
  the budget) and the group's CPU time (polled); each kills bwrap's whole process group with SIGKILL, and so the
  sandbox. So does cancelling the asyncio task that awaits ``run`` (an aborted GRPO group): the kill is synchronous,
  then the process is reaped; then whatever is left in the run's cgroup is killed and the group removed.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from recipe.tools.cgroup import HostCgroups, RunGroup, host_cgroups
from recipe.tools.limits import SandboxLimits
from recipe.tools.result import ExecResult, Status, classify_exit, killed_detail, total_limit_detail
from recipe.tools.seccomp import SeccompUnavailable, filter_fd

CODE_PATH = "/code/main.py"
SCRATCH = "/tmp"
NOBODY = 65534
ALLOW_PER_PROCESS = "SANDBOX_ALLOW_PER_PROCESS_LIMITS"
# What the sandbox relies on: bwrap 0.8.0 (Debian 12) has both.
REQUIRED_OPTIONS = ("--disable-userns", "--seccomp")
# Joins the run's cgroup (one cgroup.procs file per v1 hierarchy), then becomes the rest of the command line.
_JOIN_CGROUP = (
    'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ 2>/dev/null > "$1" '
    '|| { echo "sandbox: cannot join the run\'s cgroup ($1)" >&2; exit 125; }; shift; n=$((n-1)); done; exec "$@"'
)
CPU_POLL_S = 0.1

# Set the limits, then exec the program: runs as the sandbox's command, so the limits bind only the program.
_LAUNCHER = (
    "import os,resource as r,sys\n"
    "c,a,n,f,o=(int(x) for x in sys.argv[1:6])\n"
    "r.setrlimit(r.RLIMIT_CORE,(0,0))\n"
    "r.setrlimit(r.RLIMIT_CPU,(c,c+1))\n"
    "r.setrlimit(r.RLIMIT_AS,(a,a))\n"
    "r.setrlimit(r.RLIMIT_NPROC,(n,n))\n"
    "r.setrlimit(r.RLIMIT_FSIZE,(f,f))\n"
    "r.setrlimit(r.RLIMIT_NOFILE,(o,o))\n"
    "os.execv(sys.executable,[sys.executable,*sys.argv[6:]])\n"
)

SANDBOX_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": SCRATCH,
    "TMPDIR": SCRATCH,
    "LANG": "C.UTF-8",
    "PYTHONUNBUFFERED": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONIOENCODING": "utf-8",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "MPLBACKEND": "Agg",
}
# The environment bwrap itself starts with (see the module docstring: the sandbox's pid 1 keeps it).
BWRAP_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}


def default_python() -> str:
    for p in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.access(p, os.X_OK):
            return p
    return shutil.which("python3") or "/usr/bin/python3"


@dataclass
class BubblewrapBackend:
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    python: str = field(default_factory=lambda: os.environ.get("SANDBOX_PYTHON") or default_python())
    bwrap: str = field(default_factory=lambda: os.environ.get("SANDBOX_BWRAP") or "bwrap")
    extra_ro_binds: tuple[str, ...] = ()
    # The host uid bwrap runs as when this process is root (RLIMIT_NPROC is never enforced for uid 0); None: as is.
    sandbox_uid: int | None = NOBODY
    # Run with per-process limits only where cgroups cannot be delegated (SANDBOX_ALLOW_PER_PROCESS_LIMITS=1).
    allow_per_process_limits: bool = False
    name: str = "bubblewrap"

    def bwrap_path(self) -> str | None:
        return shutil.which(self.bwrap)

    def _run_as(self) -> list[str]:
        """The ``setpriv`` prefix that drops root to ``sandbox_uid`` (no supplementary groups); [] when not root."""
        if os.geteuid() == 0 and self.sandbox_uid is not None:
            uid = self.sandbox_uid
            return [shutil.which("setpriv") or "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
        return []

    def _ro_paths(self) -> list[list[str]]:
        args: list[list[str]] = [["--ro-bind", "/usr", "/usr"]]
        for top in ("/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"):
            if os.path.islink(top):
                args.append(["--symlink", os.readlink(top), top])
            elif os.path.isdir(top):
                args.append(["--ro-bind", top, top])
        # The interpreter's prefix (and a venv's own directory) when it is not under /usr.
        prefixes = []
        for exe in (os.path.abspath(self.python), os.path.realpath(self.python)):
            prefix = str(Path(exe).parent.parent)
            if not prefix.startswith("/usr") and prefix != "/" and prefix not in prefixes:
                prefixes.append(prefix)
        for p in [*prefixes, *self.extra_ro_binds]:
            args.append(["--ro-bind", p, p])
        return args

    def limits_mode(self) -> tuple[HostCgroups | None, str | None]:
        """(the host's cgroups, None) for limits in total; (None, None) for accepted per-process limits; else
        (None, the line that says why a run refuses to start and how to fix or accept it)."""
        host = host_cgroups()
        if isinstance(host, HostCgroups):
            return host, None
        if self.allow_per_process_limits:
            return None, None
        return None, (
            f"cgroups cannot be delegated here ({host}), so the sandbox's memory, process and CPU limits would bind "
            f"each process alone (a program forking 8 children may use 8 times the memory limit): run the recipe "
            f"where it may create cgroups under its own (root on cgroup v1, or a delegated cgroup v2 subtree, e.g. "
            f"systemd-run --scope -p Delegate=yes), or accept per-process limits with {ALLOW_PER_PROCESS}=1 "
            f"(or allow_per_process_limits: true in the tool config)"
        )

    def describe_limits(self) -> str:
        """One line for the self-check: how this backend's limits are enforced here."""
        host, problem = self.limits_mode()
        if host is not None:
            return f"in total per run, {host.describe()}"
        if problem is None:
            return (f"PER PROCESS only ({host_cgroups()}); accepted by {ALLOW_PER_PROCESS}=1: memory, "
                    f"processes and CPU time are not summed over a program's processes")
        return problem

    def version_problem(self) -> str | None:
        """None when this bwrap has every option the sandbox relies on, else the line naming its version and fix."""
        text = self._help()
        missing = [o for o in REQUIRED_OPTIONS if o not in text]
        if not missing:
            return None
        return (
            f"{self._version()} is too old for the sandbox: it lacks {' and '.join(missing)} (bubblewrap >= 0.8.0 "
            f"has both): upgrade it (Debian 12: apt-get install bubblewrap; or a newer release via SANDBOX_BWRAP), "
            f"the sandbox does not run without them"
        )

    def argv(self, code_fd: int, seccomp_fd: int, group: RunGroup | None = None) -> list[str]:
        """The full command line; ``code_fd`` holds the program (copied in read-only), ``seccomp_fd`` the compiled
        filter; with a ``group``, a ``sh`` joins it first and then ``exec``s the rest."""
        lim = self.limits
        a = []
        if group is not None:
            files = group.procs_files()
            a += ["/bin/sh", "-c", _JOIN_CGROUP, "sh", str(len(files)), *files]
        a += self._run_as() + [self.bwrap_path() or self.bwrap]
        a += ["--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts"]
        a += ["--unshare-cgroup-try", "--hostname", "sandbox", "--disable-userns", "--seccomp", str(seccomp_fd)]
        a += ["--die-with-parent", "--new-session", "--clearenv"]
        for part in self._ro_paths():
            a += part
        a += ["--proc", "/proc", "--dev", "/dev"]
        # bwrap's /dev is a tmpfs without a size cap: a capped /dev/shm (multiprocessing needs it), the rest read-only.
        a += ["--perms", "1777", "--size", str(lim.scratch_bytes), "--tmpfs", "/dev/shm", "--remount-ro", "/dev"]
        a += ["--perms", "1777", "--size", str(lim.scratch_bytes), "--tmpfs", SCRATCH]
        a += ["--ro-bind-data", str(code_fd), CODE_PATH]
        a += ["--remount-ro", "/"]  # bwrap's own root tmpfs: else writable, and not size-capped
        a += ["--chdir", SCRATCH]
        for k, v in SANDBOX_ENV.items():
            a += ["--setenv", k, v]
        cpu = max(1, int(lim.cpu_time_s))
        a += ["--", self.python, "-S", "-c", _LAUNCHER]
        a += [str(cpu), str(lim.memory_bytes), str(lim.max_processes), str(lim.max_file_bytes)]
        a += [str(lim.max_open_files), CODE_PATH]
        return a

    def _ask(self, option: str) -> str:
        path = self.bwrap_path()
        if path is None:
            return ""
        if (path, option) not in _ANSWERS:
            try:
                r = subprocess.run([path, option], capture_output=True, text=True, timeout=10, env=BWRAP_ENV)
                _ANSWERS[path, option] = r.stdout + r.stderr
            except (OSError, subprocess.SubprocessError):
                _ANSWERS[path, option] = ""
        return _ANSWERS[path, option]

    def _help(self) -> str:
        return self._ask("--help")

    def _version(self) -> str:
        return self._ask("--version").strip() or f"bubblewrap ({self.bwrap_path()}, version unknown)"

    async def run(self, code: str, stdin: str | None = None) -> ExecResult:
        """Run ``code`` with ``python3`` in the sandbox. Never raises for the program's behaviour; cancel-safe."""
        lim = self.limits
        t0 = time.monotonic()
        data = code.encode("utf-8", errors="replace")
        if len(data) > lim.max_code_bytes:
            return ExecResult(Status.CODE_TOO_LONG, detail=killed_detail(Status.CODE_TOO_LONG, lim), backend=self.name)
        if self.bwrap_path() is None:
            return ExecResult(
                Status.SANDBOX_ERROR,
                detail=f"bubblewrap ({self.bwrap}) not found: apt-get install bubblewrap",
                backend=self.name,
            )
        path = self.bwrap_path()
        if (path, "--help") not in _ANSWERS or (path, "--version") not in _ANSWERS:  # once per bwrap, off the loop
            await asyncio.to_thread(lambda: (self._help(), self._version()))
        if (problem := self.version_problem()) is not None:
            return ExecResult(Status.SANDBOX_ERROR, detail=problem, backend=self.name)
        host, problem = self.limits_mode()
        if problem is not None:
            return ExecResult(Status.SANDBOX_ERROR, detail=problem, backend=self.name)
        try:
            seccomp_fd = filter_fd()
        except SeccompUnavailable as e:
            return ExecResult(Status.SANDBOX_ERROR, detail=str(e), backend=self.name)
        group = None
        fd = os.memfd_create("sandbox-code")
        try:
            if host is not None:
                group = RunGroup.create(host, lim)
            os.write(fd, data)
            os.lseek(fd, 0, os.SEEK_SET)
            proc = await asyncio.create_subprocess_exec(
                *self.argv(fd, seccomp_fd, group),
                stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                pass_fds=(fd, seccomp_fd),
                env=BWRAP_ENV,
                start_new_session=True,  # bwrap leads its own process group: killpg reaches all of it
                cwd="/",
            )
        except OSError as e:
            if group is not None:
                group.remove()
            what = "create the run's cgroup" if group is None and host is not None else "start bwrap"
            return ExecResult(Status.SANDBOX_ERROR, detail=f"cannot {what}: {e}", backend=self.name)
        except BaseException:  # cancelled while starting: no group left behind
            if group is not None:
                group.remove()
            raise
        finally:
            os.close(fd)
            os.close(seccomp_fd)
        try:
            return await _supervise(proc, lim, t0, stdin, self.name, group)
        finally:
            if group is not None:
                group.remove()


_ANSWERS: dict[tuple[str, str], str] = {}  # (bwrap path, --help/--version): its answer


def kill_group(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL bwrap's process group (synchronous: safe in ``finally`` of a cancelled task)."""
    if proc.returncode is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            proc.kill()
        except ProcessLookupError:
            pass


async def _supervise(proc, lim: SandboxLimits, t0: float, stdin: str | None, backend: str,
                     group: RunGroup | None) -> ExecResult:
    out, err = bytearray(), bytearray()
    budget = [lim.max_output_bytes]  # one budget for both streams
    overflow = asyncio.Event()
    cpu_spent = asyncio.Event()

    async def watch_cpu():
        # The group's CPU time, summed over its processes (RLIMIT_CPU binds each one alone).
        while group.cpu_s() < lim.cpu_time_s:
            await asyncio.sleep(CPU_POLL_S)
        cpu_spent.set()

    async def pump(stream, buf: bytearray):
        # Reads to EOF (so the pipe closes cleanly after a kill) but keeps only the budget's worth.
        while True:
            chunk = await stream.read(65536)
            if not chunk:
                return
            take = chunk[: budget[0]]
            buf += take
            budget[0] -= len(take)
            if len(take) < len(chunk):
                overflow.set()

    async def feed():
        try:
            proc.stdin.write(stdin.encode("utf-8", errors="replace"))
            await proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            proc.stdin.close()

    tasks = [asyncio.ensure_future(pump(proc.stdout, out)), asyncio.ensure_future(pump(proc.stderr, err))]
    if stdin is not None:
        tasks.append(asyncio.ensure_future(feed()))
    finished = asyncio.ensure_future(asyncio.gather(proc.wait(), *tasks[:2]))
    finished.add_done_callback(_retrieve)
    over = asyncio.ensure_future(overflow.wait())
    limits_hit = {over: Status.OUTPUT_LIMIT}
    if group is not None:
        tasks.append(asyncio.ensure_future(watch_cpu()))
        limits_hit[asyncio.ensure_future(cpu_spent.wait())] = Status.CPU_LIMIT
    killed: Status | None = None
    try:
        done, _ = await asyncio.wait({finished, *limits_hit}, timeout=lim.wall_timeout_s,
                                     return_when=asyncio.FIRST_COMPLETED)
        if finished not in done:
            killed = next((status for t, status in limits_hit.items() if t in done), Status.TIMEOUT)
            kill_group(proc)
            # The pipes close once the sandbox is gone: keep what was printed up to the kill.
            await asyncio.wait({finished}, timeout=2)
    finally:
        # Reached on normal completion, on a limit, and when this task is cancelled: never leave the sandbox running.
        kill_group(proc)
        for t in limits_hit:
            t.cancel()
        for t in (*tasks, finished):
            if not t.done():
                t.cancel()
        await _reap(proc)
        transport = getattr(proc, "_transport", None)
        if transport is not None and not finished.done():
            transport.close()  # pipes still open after the grace period: close them here, not at GC
    wall = time.monotonic() - t0
    stdout = out.decode("utf-8", errors="replace")
    stderr = err.decode("utf-8", errors="replace")
    code = proc.returncode
    if code is not None and code < 0:
        code = 128 - code  # a signal that reached bwrap itself, shell convention
    if killed is None and overflow.is_set():
        killed = Status.OUTPUT_LIMIT  # it ended on its own, but its output was cut at the budget
    if killed is not None:
        detail = total_limit_detail(killed, lim) if killed == Status.CPU_LIMIT else killed_detail(killed, lim)
        if killed == Status.TIMEOUT:
            # A shell fork bomb retries forever: name the limit it hit, not only the timeout that ended it.
            hit, hit_detail = classify_exit(1, stderr, lim)
            if hit == Status.PROCESS_LIMIT:
                killed, detail = hit, f"{hit_detail}; then {detail}"
        status = killed
    elif code not in (0, None) and stderr.startswith(("bwrap: ", "sandbox: ")):  # bwrap or the cgroup join failed
        return ExecResult(Status.SANDBOX_ERROR, stdout, stderr, code, wall, stderr.strip().splitlines()[0], backend)
    else:
        status, detail = classify_exit(code, stderr, lim)
    if group is not None:
        usage = group.usage()
        status, detail = name_by_group(status, detail, usage, lim)
        extra = {"memory_peak_bytes": usage.memory_peak_bytes, "cpu_s": round(usage.cpu_s, 3)}
        return ExecResult(status, stdout, stderr, code, wall, detail, backend, extra)
    return ExecResult(status, stdout, stderr, code, wall, detail, backend)


def name_by_group(status: Status, detail: str, usage, lim: SandboxLimits) -> tuple[Status, str]:
    """Rename an outcome from what the run's cgroup recorded: any OOM kill in the group is ``memory_limit`` (a
    killed child leaves a parent that may still exit 0 or wait until the timeout); ``pids.max`` reached by a program
    that then failed is ``process_limit``. The sandbox's own CPU and output kills stand."""
    if status in (Status.CPU_LIMIT, Status.OUTPUT_LIMIT, Status.SANDBOX_ERROR):
        return status, detail
    then = f"; then {detail}" if status == Status.TIMEOUT else ""
    if usage.oom_kills > 0:
        return Status.MEMORY_LIMIT, total_limit_detail(Status.MEMORY_LIMIT, lim) + then
    if usage.pids_max_hits > 0 and status in (Status.ERROR, Status.KILLED, Status.TIMEOUT):
        return Status.PROCESS_LIMIT, total_limit_detail(Status.PROCESS_LIMIT, lim) + then
    return status, detail


def _retrieve(fut: asyncio.Future) -> None:
    if not fut.cancelled():
        fut.exception()


async def _reap(proc) -> None:
    # After SIGKILL this is immediate. A second cancellation here propagates; the process is dead already and
    # asyncio's child watcher still reaps it.
    try:
        await asyncio.wait_for(proc.wait(), timeout=10)
    except asyncio.TimeoutError:
        pass
