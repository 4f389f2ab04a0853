"""The landlock sandbox: a local sandbox that needs no namespaces, no cgroups and no privilege, for where bubblewrap
cannot run (inside Docker as non-root: Docker's default seccomp profile denies user namespaces; a read-only
cgroupfs). ``SANDBOX_BACKEND=landlock``.

What holds each hostile program (pinned by tests/tools/test_landlock_sandbox.py and, in the non-root Docker-like
setting, test_docker_nonroot.py):

- one process, one thread: ``fork``, ``vfork``, ``clone`` and ``clone3`` fail with EAGAIN (``process_limit``).
  Nothing else could count a sandbox's processes here: RLIMIT_NPROC counts every process of the uid (the trainer's
  threads included, per host uid before Linux 5.14), and there is no cgroup. So the per-process limits are the
  run's totals: RLIMIT_AS (memory), RLIMIT_CPU (CPU time), at most one core.
- memory outside the address space is denied: ``memfd_create``, SysV shm/semaphores/message queues, POSIX message
  queues, io_uring, userfaultfd (the seccomp allowlist); ``/dev/shm`` is not writable.
- no powers it does not need: started as root, the launcher drops to ``sandbox_uid`` (65534, nobody) with no
  supplementary groups, which clears every capability (checked before the program starts); every hard limit is
  lowered to its soft one and RLIMIT_NICE/RLIMIT_RTPRIO to 0, so the program can only lower a limit or its priority.
- the filesystem (Landlock, ``recipe/tools/landlock.py``): read and execute only ``/usr``, ``/lib*``, ``/bin``,
  ``/sbin``, Debian's ``/etc/alternatives``, the interpreter's own tree and the program; read and write only a fresh
  scratch directory (the program's cwd, ``HOME`` and ``TMPDIR``); ``/proc`` only of the program itself. Not root,
  the sandbox runs as the trainer's uid, so this is what keeps its files (tokens, checkpoints, the checkout) out of
  reach.
- the scratch directory's size: started as root, a size-capped tmpfs in a mount namespace of the program's own
  (the kernel bounds it: ENOSPC, ``disk_limit``; its pages count in the trainer's memory, the preflight adds them).
  Otherwise it lies on the host's disk: RLIMIT_FSIZE per file, ``fallocate`` denied (EOPNOTSUPP: glibc then writes),
  and the supervisor measures its size and file count every 0.1 s by descriptor (``recipe/tools/scratch.py``); a
  directory the program makes unreadable, or nests deeper than 128 levels, ends the run (``disk_limit``). It is
  removed after each run, whatever the program did to it.
- no ``socket()`` at all (no network, no unix sockets to the trainer's or vLLM's), only ``socketpair``; signals only
  to itself; ``ptrace`` and every other call outside the allowlist: ENOSYS (``recipe/tools/syscalls.py``).
- the wall clock, the output budget, the kill of the session's process group and the reap are the bubblewrap
  sandbox's (``recipe/tools/supervise.py``). ``run`` never raises (but for its own cancellation): a failure of the
  sandbox itself is one ``sandbox_error``.
"""
from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import recipe
from recipe.tools.bwrap import ALTERNATIVES, BWRAP_ENV, NOBODY, SANDBOX_ENV, default_python
from recipe.tools.interpreter import interpreter_tree
from recipe.tools.landlock import abi
from recipe.tools.limits import MiB, SandboxLimits
from recipe.tools.result import ExecResult, Status, killed_detail
from recipe.tools.scratch import remove
from recipe.tools.seccomp import SeccompUnavailable, filter_bpf
from recipe.tools.supervise import max_scratch_files, supervise
from recipe.tools.syscalls import Policy

SYSTEM_READ = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32", ALTERNATIVES, "/dev/urandom",
               "/dev/random", "/dev/zero", "/sys/devices/system/cpu")  # the last for os.cpu_count() and BLAS
RECIPE_ROOT = str(Path(recipe.__file__).resolve().parents[1])


def _launcher_path() -> str:
    """PYTHONPATH for the launcher: the recipe and wherever its two bindings are installed (site-packages, or a
    directory on this process's PYTHONPATH)."""
    import landlock as ll
    import pyseccomp

    dirs = [RECIPE_ROOT, os.path.dirname(pyseccomp.__file__), os.path.dirname(os.path.dirname(ll.__file__))]
    return os.pathsep.join(dict.fromkeys(dirs))
ONE_PROCESS = ("process limit: the landlock sandbox runs one process with one thread (fork, threads and "
               "subprocesses get EAGAIN)")


@dataclass
class LandlockBackend:
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    python: str = field(default_factory=lambda: os.environ.get("SANDBOX_PYTHON") or default_python())
    # Where the scratch directories go (default: the system's temp dir); each run gets a fresh one, removed after.
    scratch_root: str | None = field(default_factory=lambda: os.environ.get("SANDBOX_SCRATCH_ROOT") or None)
    extra_ro_paths: tuple[str, ...] = ()
    sandbox_uid: int = NOBODY  # who the program runs as when this process is root (and its gid)
    name: str = "landlock"

    def drop_uid(self) -> int | None:
        """The uid the launcher drops to: ``sandbox_uid`` when this process is root, else none (it runs as ours)."""
        return self.sandbox_uid if os.geteuid() == 0 else None

    def problem(self) -> str | None:
        """None when this machine can run the sandbox, else the line naming what is missing and the fix."""
        version = abi()
        if isinstance(version, str):
            return f"{version}; the landlock sandbox cannot run here"
        try:
            filter_bpf(Policy(processes=False, sockets=False, signal_pid=1))
        except SeccompUnavailable as e:
            return str(e)
        if not os.access(self.python, os.X_OK):
            return f"the sandbox's python {self.python} is not executable here: set SANDBOX_PYTHON to a python3"
        root, uid = os.path.realpath(self.scratch_root or tempfile.gettempdir()), self.drop_uid()
        closed = [d for d in _ancestors(root) if uid is not None and not os.stat(d).st_mode & 0o001]
        if closed:
            return (f"the scratch root {root} is out of reach of uid {uid}, which the landlock sandbox drops root to "
                    f"({closed[0]} is not searchable by others): set SANDBOX_SCRATCH_ROOT to a directory it can "
                    "reach, e.g. /tmp")
        tree = interpreter_tree(self.python)
        return tree if isinstance(tree, str) else None

    def describe_limits(self) -> str:
        lim = self.limits
        version, uid = abi(), self.drop_uid()
        where = (f"a tmpfs where a mount namespace can be had (as uid {uid}), else on the host's disk under "
                 f"{self.scratch_root or tempfile.gettempdir()} (measured every 0.1 s)" if uid is not None else
                 f"on the host's disk under {self.scratch_root or tempfile.gettempdir()} (measured every 0.1 s, "
                 "fallocate denied)")
        return (f"in total per run, one process with one thread (fork and threads: EAGAIN): {lim.memory_bytes // MiB}"
                f" MiB of address space (memfd, SysV/POSIX IPC and /dev/shm denied), {lim.cpu_time_s} s of CPU, one "
                f"core; scratch {lim.scratch_bytes // MiB} MiB or {max_scratch_files(lim)} files, {where}; no "
                f"socket(); Landlock ABI {version}")

    def _read_paths(self, code: str) -> list[str]:
        tree = interpreter_tree(self.python)
        return [*SYSTEM_READ, *(tree if isinstance(tree, tuple) else ()), *self.extra_ro_paths, self.python, code]

    async def run(self, code: str, stdin: str | None = None) -> ExecResult:
        """Run ``code`` with ``python3`` in the sandbox. Never raises for the program's behaviour; cancel-safe."""
        lim = self.limits
        t0 = time.monotonic()
        data = code.encode("utf-8", errors="replace")
        if len(data) > lim.max_code_bytes:
            return ExecResult(Status.CODE_TOO_LONG, detail=killed_detail(Status.CODE_TOO_LONG, lim), backend=self.name)
        if (problem := await asyncio.to_thread(self.problem)) is not None:
            return ExecResult(Status.SANDBOX_ERROR, detail=problem, backend=self.name)
        base = None
        try:
            base = tempfile.mkdtemp(prefix="recipe-sandbox-", dir=self.scratch_root)
            result = _name(await self._run_in(base, data, stdin, t0), lim)
        except OSError as e:
            result = ExecResult(Status.SANDBOX_ERROR, detail=f"cannot start the landlock sandbox: {e}",
                                backend=self.name)
        except Exception as e:  # noqa: BLE001 - the sandbox's own failure: one tool error, never an exception
            result = ExecResult(Status.SANDBOX_ERROR, detail=f"the landlock sandbox failed: {type(e).__name__}: {e}",
                                backend=self.name)
        finally:
            if base is not None:  # after the program's end or kill: nothing writes there any more
                left = await asyncio.shield(asyncio.ensure_future(asyncio.to_thread(remove, base)))
        if base is not None and left is not None:
            return ExecResult(Status.SANDBOX_ERROR, result.stdout, result.stderr, result.exit_code, result.wall_s,
                              left, self.name)
        return result

    async def _run_in(self, base: str, data: bytes, stdin: str | None, t0: float) -> ExecResult:
        lim, uid = self.limits, self.drop_uid()
        scratch, code_path = os.path.join(base, "work"), os.path.join(base, "code", "main.py")
        os.mkdir(scratch, 0o700)
        os.mkdir(os.path.dirname(code_path), 0o700)
        Path(code_path).write_bytes(data)
        if uid is not None:  # the program's uid: its scratch (the tmpfs's root where it gets one) and its code
            for path in (base, scratch, os.path.dirname(code_path), code_path):
                os.chown(path, uid, uid)
        spec = {
            "limits": {"cpu": max(1, int(lim.cpu_time_s)), "memory": lim.memory_bytes,
                       "file": lim.max_file_bytes, "files": lim.max_open_files},
            "scratch": scratch, "code": code_path, "python": self.python, "read": self._read_paths(code_path),
            "env": {**SANDBOX_ENV, "HOME": scratch, "TMPDIR": scratch}, "uid": uid,
            "tmpfs": {"bytes": lim.scratch_bytes, "inodes": max_scratch_files(lim)},
        }
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-s", "-m", "recipe.tools.confine", json.dumps(spec),
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={**BWRAP_ENV, "PYTHONPATH": _launcher_path()}, cwd=scratch,
            start_new_session=True,  # the program leads its own session and process group: killpg reaches it
        )
        # under a tmpfs the directory the supervisor sees stays empty: the kernel caps the tmpfs (ENOSPC)
        return await supervise(proc, lim, t0, stdin, self.name, scratch=scratch)


def _ancestors(path: str) -> list[str]:
    """``path`` and every directory above it."""
    out = [path]
    while (up := os.path.dirname(out[-1])) != out[-1]:
        out.append(up)
    return out


def _name(r: ExecResult, lim: SandboxLimits) -> ExecResult:
    """The landlock sandbox's words for what the shared classification found."""
    last = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
    if r.status == Status.PROCESS_LIMIT:
        r.detail = ONE_PROCESS
    elif r.status == Status.DISK_LIMIT and "No space left on device" in last:  # the root tmpfs's ENOSPC
        r.detail = (f"scratch space exhausted ({lim.scratch_bytes // MiB} MiB or {max_scratch_files(lim)} files: the "
                    "scratch directory's tmpfs)")
    elif r.status == Status.MEMORY_LIMIT:
        r.detail = (f"memory limit exceeded ({lim.memory_bytes // MiB} MiB of address space: in total, the landlock "
                    f"sandbox runs one process)")
    elif r.status == Status.ERROR and "[Errno 13] Permission denied" in last and "/multiprocessing/" in r.stderr:
        r.status, r.detail = Status.PROCESS_LIMIT, ONE_PROCESS  # its locks need /dev/shm, before any fork
    elif r.status == Status.ERROR and "[Errno 13] Permission denied" in last:
        r.status = Status.READ_ONLY
        r.detail = ("permission denied: the landlock sandbox reads only the interpreter's tree and writes only its "
                    "scratch directory (the current directory, $HOME and $TMPDIR)")
    return r
