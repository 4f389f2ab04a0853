"""The supervisor the local sandboxes share (bubblewrap, landlock): feed stdin, read stdout and stderr within one
output budget, and end the program at the first limit: the wall clock, the output budget, the run's cgroup's CPU
time (polled) or a scratch directory's size (polled, where no mount caps it; one it cannot measure ends the run).
Every end kills the sandbox's whole process group with SIGKILL (synchronously, in a ``finally``: a cancelled task too), then reaps it; the outcome is
named from what ended it, the exit status and stderr, and the run's cgroup's records."""

from __future__ import annotations

import asyncio
import os
import signal
import time

from recipe.tools.cgroup import RunGroup
from recipe.tools.limits import SandboxLimits
from recipe.tools.result import ExecResult, Status, classify_exit, killed_detail, total_limit_detail
from recipe.tools.scratch import Unmeasurable, measure

POLL_S = 0.1
SCRATCH_BYTES_PER_FILE = 4096  # the file count cap: one file per 4 KiB of scratch (an empty file still costs)


def max_scratch_files(lim: SandboxLimits) -> int:
    return max(64, lim.scratch_bytes // SCRATCH_BYTES_PER_FILE)


def scratch_detail(lim: SandboxLimits, hidden: list[str] = ()) -> str:
    if hidden:
        return f"disk limit: {hidden[0]}; the scratch directory must stay measurable"
    return (f"scratch space exhausted ({lim.scratch_bytes // (1024 * 1024)} MiB or {max_scratch_files(lim)} files "
            f"in the scratch directory, measured every {POLL_S:g} s)")


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


async def supervise(proc, lim: SandboxLimits, t0: float, stdin: str | None, backend: str,
                    group: RunGroup | None = None, scratch: str | None = None) -> ExecResult:
    """Read the program's output within its budget until it ends or a limit ends it; name the outcome. ``group``:
    the run's cgroup (its CPU time is polled, its records name the limits); ``scratch``: a scratch directory on the
    host's disk (the landlock sandbox's), whose size and file count are polled."""
    out, err = bytearray(), bytearray()
    budget = [lim.max_output_bytes]  # one budget for both streams
    overflow = asyncio.Event()
    cpu_spent = asyncio.Event()
    scratch_full = asyncio.Event()
    hidden: list[str] = []  # why the scratch directory could not be measured

    async def watch_scratch():
        # No mount to cap it (not root): measured every poll; a program may pass the cap by what it writes in one
        # poll interval, at most max_file_bytes per file (fallocate is denied). A part it hides ends the run.
        while True:
            try:
                used, files = await asyncio.to_thread(measure, scratch)  # up to ~16k entries: off the loop
            except Unmeasurable as e:
                hidden.append(str(e))
                break
            if used > lim.scratch_bytes or files > max_scratch_files(lim):
                break
            await asyncio.sleep(POLL_S)
        scratch_full.set()

    async def watch_cpu():
        # The group's CPU time, summed over its processes (RLIMIT_CPU binds each one alone).
        while group.cpu_s() < lim.cpu_time_s:
            await asyncio.sleep(POLL_S)
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
    if scratch is not None:
        tasks.append(asyncio.ensure_future(watch_scratch()))
        limits_hit[asyncio.ensure_future(scratch_full.wait())] = Status.DISK_LIMIT
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
        detail = total_limit_detail(killed, lim) if killed == Status.CPU_LIMIT else \
            scratch_detail(lim, hidden) if killed == Status.DISK_LIMIT else killed_detail(killed, lim)
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
