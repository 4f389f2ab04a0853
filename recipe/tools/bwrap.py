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
- processes: ``--unshare-pid`` (when the program ends or the sandbox is killed, the kernel kills everything in the
  namespace, double-forked and ``setsid`` children included), ``--die-with-parent``, ``--new-session``, and
  RLIMIT_NPROC. The kernel never enforces RLIMIT_NPROC for host uid 0, not even inside a user namespace, so when
  this process is root, bwrap runs as ``sandbox_uid`` (65534, nobody) with ``--unshare-user``; the limit is set
  inside the sandbox (the count is per user namespace, so concurrent sandboxes do not share one budget). The uid is
  dropped by util-linux's ``setpriv`` in front of bwrap, not by ``subprocess``'s ``user=``/``group=``: Ray's async
  actors (verl's agent-loop workers) run on uvloop, whose ``subprocess_exec`` refuses those arguments.
- limits: RLIMIT_CPU, RLIMIT_AS, RLIMIT_NPROC, RLIMIT_FSIZE, RLIMIT_NOFILE, RLIMIT_CORE=0, set by a one-line Python
  launcher inside the sandbox right before it ``exec``s the program (no ``preexec_fn``: not safe in a threaded
  parent such as a Ray worker; no dependency on util-linux's ``prlimit``).
- time and output: a wall-clock timeout and an output budget (stdout + stderr, read in chunks, never buffered past
  the budget); either one kills bwrap's whole process group with SIGKILL, and so the sandbox. So does cancelling
  the asyncio task that awaits ``run`` (an aborted GRPO group): the kill is synchronous, then the process is reaped.
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

from recipe.tools.limits import SandboxLimits
from recipe.tools.result import ExecResult, Status, classify_exit, killed_detail

CODE_PATH = "/code/main.py"
SCRATCH = "/tmp"
NOBODY = 65534

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

    def argv(self, code_fd: int, bwrap_help: str = "") -> list[str]:
        """The full bwrap command line; ``code_fd`` is a readable fd holding the program (copied in read-only)."""
        lim = self.limits
        a = self._run_as() + [self.bwrap_path() or self.bwrap]
        a += ["--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts"]
        a += ["--unshare-cgroup-try", "--hostname", "sandbox"]
        if "--disable-userns" in bwrap_help:  # bwrap >= 0.8: no nested user namespaces
            a += ["--disable-userns"]
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

    def _help(self) -> str:
        global _HELP_CACHE
        path = self.bwrap_path()
        if path is None:
            return ""
        if path not in _HELP_CACHE:
            try:
                r = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=10, env=BWRAP_ENV)
                _HELP_CACHE[path] = r.stdout + r.stderr
            except (OSError, subprocess.SubprocessError):
                _HELP_CACHE[path] = ""
        return _HELP_CACHE[path]

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
        help_text = await asyncio.to_thread(self._help) if self.bwrap_path() not in _HELP_CACHE else self._help()
        fd = os.memfd_create("sandbox-code")
        try:
            os.write(fd, data)
            os.lseek(fd, 0, os.SEEK_SET)
            try:
                proc = await asyncio.create_subprocess_exec(
                    *self.argv(fd, help_text),
                    stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                    pass_fds=(fd,),
                    env=BWRAP_ENV,
                    start_new_session=True,  # bwrap leads its own process group: killpg reaches all of it
                    cwd="/",
                )
            except OSError as e:
                return ExecResult(Status.SANDBOX_ERROR, detail=f"cannot start bwrap: {e}", backend=self.name)
        finally:
            os.close(fd)
        return await _supervise(proc, lim, t0, stdin, self.name)


_HELP_CACHE: dict[str, str] = {}


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


async def _supervise(proc, lim: SandboxLimits, t0: float, stdin: str | None, backend: str) -> ExecResult:
    out, err = bytearray(), bytearray()
    budget = [lim.max_output_bytes]
    overflow = asyncio.Event()

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
    killed: Status | None = None
    try:
        done, _ = await asyncio.wait({finished, over}, timeout=lim.wall_timeout_s, return_when=asyncio.FIRST_COMPLETED)
        if finished not in done:
            killed = Status.OUTPUT_LIMIT if over in done else Status.TIMEOUT
            kill_group(proc)
            # The pipes close once the sandbox is gone: keep what was printed up to the kill.
            await asyncio.wait({finished}, timeout=2)
    finally:
        # Reached on normal completion, on a limit, and when this task is cancelled: never leave the sandbox running.
        kill_group(proc)
        over.cancel()
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
    if killed is not None:
        detail = killed_detail(killed, lim)
        if killed == Status.TIMEOUT:
            # A shell fork bomb retries forever: name the limit it hit, not only the timeout that ended it.
            hit, hit_detail = classify_exit(1, stderr, lim)
            if hit == Status.PROCESS_LIMIT:
                killed, detail = hit, f"{hit_detail}; then {detail}"
        return ExecResult(killed, stdout, stderr, code, wall, detail, backend)
    if code not in (0, None) and stderr.startswith("bwrap: "):
        return ExecResult(Status.SANDBOX_ERROR, stdout, stderr, code, wall, stderr.strip().splitlines()[0], backend)
    status, detail = classify_exit(code, stderr, lim)
    return ExecResult(status, stdout, stderr, code, wall, detail, backend)


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
