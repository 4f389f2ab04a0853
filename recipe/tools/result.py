"""What a sandboxed run returns, how its failure is named, and the text the model sees (pure: no verl, no I/O).

Every run ends in one ``Status``. The limits the sandbox enforces itself (``timeout``, ``output_limit``) are known
for certain; the kernel's limits show up as the program's own failure and are recognised from its exit status
(SIGXCPU: ``cpu_limit``) or the tail of its stderr (``MemoryError``: ``memory_limit``; ``No space left on
device`` or ``File too large``: ``disk_limit``, naming the scratch size or the file size limit; ``Network is
unreachable``/no name resolution: ``no_network``; ``Read-only file system``: ``read_only_fs``); ``process_limit``
from ``[Errno 11] Resource temporarily unavailable`` (fork/thread start), ``can't start new thread`` or a shell's
``fork: retry`` anywhere in stderr, because at the limit many processes write their tracebacks at once,
interleaved, and the tail is often a fragment of another process's.
A program can fake those lines on its own stderr; that only changes the name of its own error. The limits a run's
cgroup sums over all processes (``recipe/tools/cgroup.py``) are named from what the group recorded (an OOM kill,
``pids.max`` reached, the CPU time used): ``total_limit_detail``.
"""

from __future__ import annotations

import signal
from dataclasses import asdict, dataclass, field
from enum import Enum

from recipe.tools.limits import SandboxLimits


class Status(str, Enum):
    OK = "ok"
    ERROR = "error"  # the program exited non-zero (its traceback is in stderr)
    TIMEOUT = "timeout"
    CPU_LIMIT = "cpu_limit"
    MEMORY_LIMIT = "memory_limit"
    PROCESS_LIMIT = "process_limit"
    OUTPUT_LIMIT = "output_limit"
    DISK_LIMIT = "disk_limit"
    NO_NETWORK = "no_network"  # the program tried the network (the sandbox has none)
    READ_ONLY = "read_only_fs"  # the program tried to write outside the scratch directory
    KILLED = "killed"  # by a signal nobody here sent (e.g. SIGKILL at the CPU hard limit, SIGSEGV)
    CODE_TOO_LONG = "code_too_long"
    SANDBOX_ERROR = "sandbox_error"  # the backend itself failed: bwrap setup, SandboxFusion unreachable, ...


@dataclass
class ExecResult:
    status: Status
    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    wall_s: float = 0.0
    detail: str = ""  # one line naming the error and the limit
    backend: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == Status.OK

    def to_dict(self) -> dict:
        d = asdict(self)
        d["status"] = self.status.value
        return d

    def metrics(self) -> dict:
        """Per-call metrics for verl's ``tool_metrics`` (numbers and short strings only)."""
        return {"sandbox_status": self.status.value, "sandbox_wall_s": round(self.wall_s, 3), "backend": self.backend}


_SHELL_FORK = ("fork: Resource temporarily unavailable", "fork: retry: Resource temporarily unavailable")
_NO_NETWORK = (
    "[Errno 101] Network is unreachable",
    "Temporary failure in name resolution",
    "[Errno -2] Name or service not known",
    "[Errno 99] Cannot assign requested address",
    "[Errno 97] Address family not supported by protocol",  # the filter's answer to AF_VSOCK, AF_PACKET, ...
)


def _stderr_tail(stderr: str, lines: int = 6) -> list[str]:
    return [ln.strip() for ln in stderr.strip().splitlines()[-lines:]]


def classify_exit(exit_code: int | None, stderr: str, limits: SandboxLimits) -> tuple[Status, str]:
    """Name the outcome of a program that ended on its own (not killed by the sandbox for time or output).

    ``exit_code`` as a shell reports it: ``128 + signal`` for a signal (bwrap's convention), negative values (Python's
    ``returncode``) are accepted too.
    """
    tail = _stderr_tail(stderr)
    last = tail[-1] if tail else ""
    text = "\n".join(tail)
    shell_fork = any(m in stderr for m in _SHELL_FORK)
    at_process_limit = shell_fork or "[Errno 11] Resource temporarily unavailable" in stderr \
        or "can't start new thread" in stderr
    if exit_code == 0:
        if shell_fork:  # a shell hit the process limit and gave up: the program "succeeded" by accident
            return Status.PROCESS_LIMIT, f"process limit exceeded ({limits.max_processes} processes/threads)"
        return Status.OK, ""
    sig = None
    if exit_code is not None and exit_code < 0:
        sig = -exit_code
    elif exit_code is not None and exit_code > 128:
        sig = exit_code - 128
    if sig == signal.SIGXCPU:
        return Status.CPU_LIMIT, f"CPU time limit exceeded ({limits.cpu_time_s} s of CPU per process)"
    mib = limits.memory_bytes // (1024 * 1024)
    if last.startswith("MemoryError") or "std::bad_alloc" in text or "[Errno 12] Cannot allocate memory" in text:
        return Status.MEMORY_LIMIT, f"memory limit exceeded ({mib} MiB of address space per process)"
    if at_process_limit:
        return Status.PROCESS_LIMIT, f"process limit exceeded ({limits.max_processes} processes/threads)"
    if "[Errno 27] File too large" in last:
        return Status.DISK_LIMIT, f"file size limit exceeded ({limits.max_file_bytes} bytes per file)"
    if "[Errno 28] No space left on device" in last:
        return Status.DISK_LIMIT, f"scratch space exhausted ({limits.scratch_bytes // (1024 * 1024)} MiB at /tmp)"
    if any(m in last for m in _NO_NETWORK):
        return Status.NO_NETWORK, "no network: the sandbox has no network access"
    if "[Errno 30] Read-only file system" in last:
        return Status.READ_ONLY, "read-only file system: only /tmp (the scratch directory) is writable"
    if sig is not None and sig in (signal.SIGKILL, signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT):
        name = signal.Signals(sig).name
        hint = " (CPU time hard limit or out of memory)" if sig == signal.SIGKILL else ""
        return Status.KILLED, f"the program was killed by {name}{hint}"
    return Status.ERROR, f"the program exited with status {exit_code}"


def total_limit_detail(status: Status, limits: SandboxLimits) -> str:
    """The detail of a limit the run's cgroup enforced over all of the program's processes together."""
    if status == Status.MEMORY_LIMIT:
        mib = limits.memory_bytes // (1024 * 1024)
        return f"memory limit exceeded ({mib} MiB in total over the program's processes; the kernel killed it)"
    if status == Status.PROCESS_LIMIT:
        return f"process limit exceeded ({limits.max_processes} processes/threads in total)"
    if status == Status.CPU_LIMIT:
        return f"CPU time limit exceeded ({limits.cpu_time_s} s of CPU in total over the program's processes)"
    raise ValueError(status)


def killed_detail(status: Status, limits: SandboxLimits) -> str:
    if status == Status.TIMEOUT:
        return f"timeout: the program ran longer than {limits.wall_timeout_s:g} s (wall clock) and was killed"
    if status == Status.OUTPUT_LIMIT:
        return f"output limit exceeded: more than {limits.max_output_bytes} bytes of output; the program was killed"
    if status == Status.CODE_TOO_LONG:
        return f"the program is longer than {limits.max_code_bytes} bytes; nothing was run"
    raise ValueError(status)


def _cut(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    half = max_chars // 2
    return f"{text[:half]}\n...({len(text) - 2 * half} characters cut)...\n{text[-half:]}"


def format_for_model(result: ExecResult, max_chars: int = 4000) -> str:
    """The tool's reply: stdout on success; otherwise ``Error (<status>): <detail>`` then what the program printed.

    ``max_chars`` bounds each stream here (verl's ``max_tool_response_length`` cuts the whole reply again).
    """
    if result.ok:
        out = _cut(result.stdout, max_chars) if result.stdout else "(no output)"
        if result.stderr.strip():
            out += "\n[stderr]\n" + _cut(result.stderr, max_chars // 2)
        return out
    parts = [f"Error ({result.status.value}): {result.detail or result.status.value}"]
    if result.stdout:
        parts.append("[stdout]\n" + _cut(result.stdout, max_chars // 2))
    if result.stderr.strip():
        parts.append("[stderr]\n" + _cut(result.stderr, max_chars))
    return "\n".join(parts)
