"""Limits from config/env, the naming of failures and the model-facing text (pure: no sandbox needed)."""

import signal

import pytest

from recipe.tools.limits import SandboxLimits
from recipe.tools.result import ExecResult, Status, classify_exit, format_for_model

LIM = SandboxLimits()


def test_limits_config_beats_env_beats_default():
    env = {"SANDBOX_WALL_TIMEOUT_S": "3.5", "SANDBOX_MAX_PROCESSES": "9"}
    lim = SandboxLimits.from_config({"max_processes": 5}, env)
    assert lim.wall_timeout_s == 3.5 and lim.max_processes == 5 and lim.cpu_time_s == SandboxLimits().cpu_time_s


@pytest.mark.parametrize("bad", [{"wall_timeout_s": 0}, {"memory_bytes": -1}, {"max_processes": "many"}, {"nope": 1}])
def test_limits_reject_bad_values(bad):
    with pytest.raises(ValueError):
        SandboxLimits.from_config(bad, {})


@pytest.mark.parametrize(
    "code, stderr, status",
    [
        (0, "", Status.OK),
        (1, "Traceback...\nZeroDivisionError: division by zero", Status.ERROR),
        (128 + signal.SIGXCPU, "", Status.CPU_LIMIT),
        (-signal.SIGXCPU, "", Status.CPU_LIMIT),
        (1, "Traceback (most recent call last):\n  File ...\nMemoryError", Status.MEMORY_LIMIT),
        (1, "  File ...\nBlockingIOError: [Errno 11] Resource temporarily unavailable", Status.PROCESS_LIMIT),
        (1, "RuntimeError: can't start new thread", Status.PROCESS_LIMIT),
        # a fork bomb's processes, killed with the sandbox mid-traceback: the tail is fragments of other processes'
        (1, "Traceback (most recent call last):\n  File \"/code/main.py\", line 2, in <module>\n"
            "BlockingIOError: [Errno 11] Resource temporarily unavailable\n"
            + "Traceback (most recent call last):\n  File \"/code/main.py\", line 2, in <module>\n" * 4,
         Status.PROCESS_LIMIT),
        (254, "bash: fork: retry: Resource temporarily unavailable", Status.PROCESS_LIMIT),
        (0, "environment: fork: retry: Resource temporarily unavailable", Status.PROCESS_LIMIT),
        (0, "MemoryError caught and printed by the program", Status.OK),
        (1, "OSError: [Errno 101] Network is unreachable", Status.NO_NETWORK),
        (1, "URLError: <urlopen error [Errno -3] Temporary failure in name resolution>", Status.NO_NETWORK),
        (1, "OSError: [Errno 30] Read-only file system: '/usr/x'", Status.READ_ONLY),
        (1, "ConnectionRefusedError: [Errno 111] Connection refused", Status.ERROR),
        (1, "OSError: [Errno 28] No space left on device", Status.DISK_LIMIT),
        (128 + signal.SIGKILL, "", Status.KILLED),
        (128 + signal.SIGSEGV, "", Status.KILLED),
    ],
)
def test_classify_exit(code, stderr, status):
    got, detail = classify_exit(code, stderr, LIM)
    assert got == status and (status == Status.OK or detail)


def test_details_name_the_limit():
    assert "1024 MiB" in classify_exit(1, "MemoryError", LIM)[1]
    assert f"{LIM.max_processes} processes" in classify_exit(1, "[Errno 11] Resource temporarily unavailable", LIM)[1]
    assert f"{LIM.cpu_time_s} s of CPU" in classify_exit(152, "", LIM)[1]


def test_format_for_model():
    assert format_for_model(ExecResult(Status.OK, stdout="42\n")) == "42\n"
    assert format_for_model(ExecResult(Status.OK)) == "(no output)"
    err = format_for_model(ExecResult(Status.TIMEOUT, stdout="partial", stderr="", detail="timeout: 10 s"))
    assert err.startswith("Error (timeout): timeout: 10 s") and "[stdout]\npartial" in err
    long = format_for_model(ExecResult(Status.OK, stdout="x" * 100_000), max_chars=1000)
    assert len(long) < 1100 and "characters cut" in long
