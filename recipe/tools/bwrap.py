"""Local sandbox for Python programs on Debian's ``bubblewrap`` (``bwrap``); asyncio, cancellable.

What holds each hostile program (each pinned by a test in tests/tools/test_bwrap_sandbox.py):

- the filesystem: only ``/usr`` (and ``/lib*``, ``/bin``, ``/sbin`` as on the host, and Debian's ``/etc/alternatives``
  symlinks), the interpreter's own tree if it lies elsewhere (as it reports it; a home directory is refused:
  ``recipe/tools/interpreter.py``), and the program itself, all read-only; ``/proc`` of the sandbox's own pid namespace, a minimal
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
- system calls: an allowlist (``recipe/tools/syscalls.py``; everything else ENOSYS) compiled by libseccomp
  (``recipe/tools/seccomp.py``), loaded by bwrap's ``--seccomp``, and ``--disable-userns``; a bwrap without either
  option (older than 0.8.0) is refused.
- processes: ``--unshare-pid`` (when the program ends or the sandbox is killed, the kernel kills everything in the
  namespace, double-forked and ``setsid`` children included), ``--die-with-parent``, ``--new-session``, and
  RLIMIT_NPROC. The kernel never enforces RLIMIT_NPROC for host uid 0, not even inside a user namespace, so when
  this process is root, bwrap runs as ``sandbox_uid`` (65534, nobody) with ``--unshare-user``; the limit is set
  inside the sandbox (the count is per user namespace, so concurrent sandboxes do not share one budget). The uid is
  dropped by util-linux's ``setpriv`` in front of bwrap, not by ``subprocess``'s ``user=``/``group=``: Ray's async
  actors (verl's agent-loop workers) run on uvloop, whose ``subprocess_exec`` refuses those arguments.
- per-process limits: RLIMIT_CPU, RLIMIT_AS, RLIMIT_NPROC, RLIMIT_FSIZE, RLIMIT_NOFILE, RLIMIT_CORE=0 (and
  RLIMIT_NICE/RLIMIT_RTPRIO 0, every other hard limit lowered to its soft one: a limit can only be lowered), set by
  a Python launcher inside the sandbox right before it ``exec``s the program (no ``preexec_fn``: not safe in a threaded
  parent such as a Ray worker; no dependency on util-linux's ``prlimit``).
- time and output: a wall-clock timeout, an output budget (stdout + stderr, read in chunks, never buffered past
  the budget) and the group's CPU time (polled); each kills bwrap's whole process group with SIGKILL, and so the
  sandbox. So does cancelling the asyncio task that awaits ``run`` (an aborted GRPO group): the kill is synchronous,
  then the process is reaped; then whatever is left in the run's cgroup is killed and the group removed.
"""

from __future__ import annotations

import asyncio
import os
import platform
import shutil
import subprocess
import time
from dataclasses import dataclass, field

from recipe.tools.cgroup import DELEGATE_HINT, HostCgroups, RunGroup, host_cgroups
from recipe.tools.interpreter import interpreter_tree
from recipe.tools.limits import SandboxLimits
from recipe.tools.result import ExecResult, Status, killed_detail
from recipe.tools.seccomp import SeccompUnavailable, filter_fd
from recipe.tools.supervise import supervise

CODE_PATH = "/code/main.py"
ALTERNATIVES = "/etc/alternatives"  # symlinks only: no secrets
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

# Set the limits, then exec the program: runs as the sandbox's command, so the limits bind only the program. Every hard
# limit but RLIMIT_CPU's (SIGXCPU one second before SIGKILL names cpu_limit) is then lowered to its soft one, and
# RLIMIT_NICE/RLIMIT_RTPRIO to 0: without CAP_SYS_RESOURCE the program can only lower a limit (setrlimit's values sit
# in memory, where the seccomp filter cannot check them).
_LAUNCHER = (
    "import os,resource as r,sys\n"
    "c,a,n,f,o=(int(x) for x in sys.argv[1:6])\n"
    "r.setrlimit(r.RLIMIT_CORE,(0,0))\n"
    "r.setrlimit(r.RLIMIT_CPU,(c,c+1))\n"
    "r.setrlimit(r.RLIMIT_AS,(a,a))\n"
    "n<0 or r.setrlimit(r.RLIMIT_NPROC,(n,n))\n"
    "r.setrlimit(r.RLIMIT_FSIZE,(f,f))\n"
    "r.setrlimit(r.RLIMIT_NOFILE,(o,o))\n"
    "r.setrlimit(r.RLIMIT_NICE,(0,0))\n"
    "r.setrlimit(r.RLIMIT_RTPRIO,(0,0))\n"
    "for k in dir(r):\n"
    " k.startswith('RLIMIT_') and k!='RLIMIT_CPU' and r.setrlimit(getattr(r,k),(r.getrlimit(getattr(r,k))[0],)*2)\n"
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


def nproc_per_user_namespace(release: str | None = None) -> bool:
    """Whether RLIMIT_NPROC counts per user namespace (Linux 5.14+: ucounts), so each sandbox has its own budget."""
    parts = (release or platform.release()).split("-")[0].split(".")
    try:
        return (int(parts[0]), int(parts[1])) >= (5, 14)
    except (ValueError, IndexError):
        return False


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
        if os.path.isdir(ALTERNATIVES):  # Debian's symlinks from /usr (numpy's libblas.so.3 goes through them)
            args.append(["--ro-bind", ALTERNATIVES, ALTERNATIVES])
        # The interpreter's own tree (a venv and its base) when it is not under /usr, as the interpreter reports it.
        tree = interpreter_tree(self.python)
        for p in [*(tree if isinstance(tree, tuple) else ()), *self.extra_ro_binds]:
            args.append(["--ro-bind", p, p])
        return args

    def interpreter_problem(self) -> str | None:
        """None when the interpreter's tree can be shown to the program, else the line saying why not."""
        tree = interpreter_tree(self.python)
        return tree if isinstance(tree, str) else None

    def limits_mode(self) -> tuple[HostCgroups | None, str | None]:
        """(the host's cgroups, None) for limits in total; (None, None) for accepted per-process limits; else
        (None, the line that says why a run refuses to start and how to fix or accept it)."""
        host = host_cgroups()
        if isinstance(host, HostCgroups):
            return host, None
        if self.allow_per_process_limits and not nproc_per_user_namespace():
            return None, (
                f"cgroups cannot be delegated here ({host}), and per-process limits cannot bound a sandbox's "
                f"processes on this kernel ({platform.release()} < 5.14: RLIMIT_NPROC counts every process of the "
                f"host uid, so sandboxes share one budget and a non-root trainer's own threads use it up): delegate "
                f"cgroups (on cgroup v2 {DELEGATE_HINT}) or use SANDBOX_BACKEND=landlock"
            )
        if self.allow_per_process_limits:
            return None, None
        return None, (
            f"cgroups cannot be delegated here ({host}), so the sandbox's memory, process and CPU limits would bind "
            f"each process alone (a program forking 8 children may use 8 times the memory limit): run the recipe "
            f"where it may create cgroups under its own (root on cgroup v1; on cgroup v2 {DELEGATE_HINT}), or use "
            f"SANDBOX_BACKEND=landlock (no namespaces or cgroups needed: one process per run), or accept "
            f"per-process limits with {ALLOW_PER_PROCESS}=1 (or allow_per_process_limits: true in the tool config)"
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
        # Before Linux 5.14 RLIMIT_NPROC counts every process of the host uid (all sandboxes, a non-root trainer's
        # threads): there the group's pids.max alone bounds the run (per-process limits are refused there).
        nproc = lim.max_processes if nproc_per_user_namespace() else -1
        a += [str(cpu), str(lim.memory_bytes), str(nproc), str(lim.max_file_bytes)]
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
        if (problem := await asyncio.to_thread(self.interpreter_problem)) is not None:
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
                group.try_remove()  # nothing joined it yet
            what = "create the run's cgroup" if group is None and host is not None else "start bwrap"
            return ExecResult(Status.SANDBOX_ERROR, detail=f"cannot {what}: {e}", backend=self.name)
        except BaseException:  # cancelled while starting: no group left behind
            if group is not None and not group.try_remove():
                _in_background(group.remove_async())
            raise
        finally:
            os.close(fd)
            os.close(seccomp_fd)
        removal = None
        try:
            result = await supervise(proc, lim, t0, stdin, self.name, group)
        finally:
            # bwrap is reaped; the sandbox's init, reparented to the host's PID 1, may still be exiting for a few ms.
            # The group is removed by a task of its own that never sleeps on this event loop; a cancelled run
            # (an aborted group) returns at once and leaves it to finish.
            if group is not None and not group.try_remove():
                removal = _in_background(group.remove_async())
        if removal is not None:
            await asyncio.shield(removal)
        return result


_ANSWERS: dict[tuple[str, str], str] = {}  # (bwrap path, --help/--version): its answer
_BACKGROUND: set[asyncio.Task] = set()  # groups still being removed (a strong reference until done)


def _in_background(coro) -> asyncio.Task:
    task = asyncio.ensure_future(coro)
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)
    return task
