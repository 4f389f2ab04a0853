"""``recipe.run_guard``, which bounds every CPU run of ``train_grpo.sh``: the command's status passes through, and on
the time limit, a signal to the guard, or the death of the script that started it, nothing the command started is
left running. Each case runs a real process tree (a shell that leaves a grandchild ``sleep`` behind)."""
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def guard(timeout_s: float, script: str) -> list[str]:
    return [sys.executable, "-m", "recipe.run_guard", "--timeout", str(timeout_s), "--grace", "2", "--",
            "sh", "-c", script]


@pytest.fixture()
def marker():
    """A ``sleep`` command line no other process has, to find the grandchild by; killed after the test if a failing
    guard left it (and its guard) behind."""
    sleep = f"sleep {random.randint(1000, 9999)}.{random.randint(100, 999)}"
    yield sleep
    subprocess.run(["pkill", "-f", sleep], capture_output=True)


def running(cmdline: str) -> bool:
    return subprocess.run(["pgrep", "-f", f"^{cmdline}$"], capture_output=True).returncode == 0


def within(seconds: float, holds) -> bool:
    """Whether ``holds()`` becomes true within ``seconds``."""
    deadline = time.monotonic() + seconds
    while not holds() and time.monotonic() < deadline:
        time.sleep(0.1)
    return holds()


def gone_within(cmdline: str, seconds: float) -> bool:
    return within(seconds, lambda: not running(cmdline))


def started(cmdline: str) -> bool:
    return within(10, lambda: running(cmdline))


def popen(cmd: list[str]) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def test_the_commands_status_passes_through():
    proc = popen(guard(30, "echo out; exit 3"))
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 3 and "out" in out


def test_the_time_limit_ends_the_whole_tree_with_124(marker):
    sleep = marker
    proc = popen(guard(2, f"{sleep} & wait"))
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 124 and "time limit 2s" in out
    assert gone_within(sleep, 5)


def test_sigterm_to_the_guard_ends_the_whole_tree(marker):
    sleep = marker
    proc = popen(guard(60, f"{sleep} & wait"))
    assert started(sleep)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM and "signal 15" in out
    assert gone_within(sleep, 5)


def test_killing_the_script_that_started_it_ends_the_run(tmp_path, marker):
    """As ``train_grpo.sh`` runs it (``guard ... 2>&1 | tee -a LOG`` in bash): ``pkill -f train_grpo.sh`` kills only
    bash, at once; the guard, re-parented, ends the run and says why in the log."""
    sleep, log = marker, tmp_path / "console.log"
    cmd = " ".join(f"'{a}'" for a in guard(60, f"{sleep} & wait"))
    bash = popen(["bash", "-c", f"{cmd} 2>&1 | tee -a {log}; echo after"])
    assert started(sleep)
    bash.send_signal(signal.SIGTERM)
    bash.wait(timeout=10)
    assert gone_within(sleep, 15), "the run outlived the script"
    assert within(5, lambda: f"parent process {bash.pid} ended" in log.read_text())
