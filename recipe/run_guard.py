"""``python -m recipe.run_guard --timeout S -- CMD...``: run CMD with a hard time limit, and end its process tree.

A verl run on a CPU starts a Ray cluster, a vLLM replica, FSDP workers and TransferQueue; when something inside
raises at the wrong moment (e.g. vLLM during a weight sync) verl's driver can wait forever. CMD runs in its own
session, and on the time limit, on SIGINT/SIGTERM to the guard, when the guard's parent ends (``train_grpo.sh``
killed on its own, e.g. ``pkill -f train_grpo.sh``: bash dies at once and would leave the run going), or when CMD
itself exits, the guard signals that whole session (TERM, then KILL after a grace period), so nothing it started
outlives it. Exit status: CMD's, 124 on the time limit (as coreutils ``timeout``), 128 + the signal on a signal,
129 (as SIGHUP) when the parent ended. Linux only (a session's processes are found through /proc).
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time


def session_pids(sid: int) -> list[int]:
    """Processes of session ``sid`` (Ray and vLLM children stay in the session of the process that started them)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and int(entry) != os.getpid():  # field 6 of stat: the session id
            pids.append(int(entry))
    return pids


def end_session(sid: int, grace_s: float = 10.0) -> None:
    """SIGTERM every process of the session, SIGKILL what is left after ``grace_s``."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        pids = session_pids(sid)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        while session_pids(sid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if not session_pids(sid):
            return


def run(cmd: list[str], timeout_s: float, grace_s: float = 10.0) -> int:
    parent = os.getppid()
    child = subprocess.Popen(cmd, start_new_session=True)
    stop = {"signal": None}

    def forward(signum, _frame):
        stop["signal"] = signum

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    deadline = time.monotonic() + timeout_s
    status, orphaned = None, False
    while status is None and stop["signal"] is None and not orphaned and time.monotonic() < deadline:
        try:
            status = child.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            orphaned = os.getppid() != parent  # re-parented: whoever started the guard has gone
    if status is None:
        why = (f"signal {stop['signal']}" if stop["signal"] is not None
               else f"parent process {parent} ended" if orphaned else f"time limit {timeout_s:g}s")
        print(f"run_guard: {why}: ending {' '.join(cmd[:3])}... and everything it started", file=sys.stderr,
              flush=True)
    end_session(child.pid, grace_s)
    if status is None:
        child.wait()
        if stop["signal"] is not None:
            return 128 + stop["signal"]
        return 128 + signal.SIGHUP if orphaned else 124
    return status


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m recipe.run_guard", description=__doc__.split("\n\n")[0])
    ap.add_argument("--timeout", type=float, required=True, help="seconds before the whole tree is ended")
    ap.add_argument("--grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL")
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    args = ap.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        ap.error("no command given (use: --timeout S -- CMD ...)")
    return run(cmd, args.timeout, args.grace)


if __name__ == "__main__":
    sys.exit(main())
