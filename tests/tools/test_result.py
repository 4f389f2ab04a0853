"""Limits from config/env, the naming of failures and the model-facing text (pure: no sandbox needed)."""

import signal

import pytest

from dataclasses import fields

from recipe.tools.supervise import name_by_group
from recipe.tools.cgroup import Usage
from recipe.tools.limits import SandboxLimits
from recipe.tools.result import ExecResult, Status, classify_exit, format_for_model, total_limit_detail

LIM = SandboxLimits()


def test_limits_config_beats_env_beats_default():
    env = {"SANDBOX_WALL_TIMEOUT_S": "3.5", "SANDBOX_MAX_PROCESSES": "9"}
    lim = SandboxLimits.from_config({"max_processes": 5}, env)
    assert lim.wall_timeout_s == 3.5 and lim.max_processes == 5 and lim.cpu_time_s == SandboxLimits().cpu_time_s


def test_limits_parse_to_their_declared_types():
    """Every limit from a string (env) or a YAML number becomes its declared type: float limits float, int ones int."""
    raw = {"wall_timeout_s": "3", "cpu_time_s": "2", "memory_bytes": 536870912.0, "cpu_cores": "2",
           "max_processes": 9, "max_output_bytes": "1024", "scratch_bytes": "4096", "max_file_bytes": "4096",
           "max_open_files": "32", "max_code_bytes": "100"}
    lim = SandboxLimits.from_config(raw, {})
    declared = {f.name: f.type for f in fields(SandboxLimits)}
    assert set(raw) == set(declared)
    for name, kind in declared.items():
        assert type(getattr(lim, name)).__name__ == kind, name
    assert lim.memory_bytes == 512 * 1024 * 1024 and lim.wall_timeout_s == 3.0 and lim.cpu_cores == 2.0


@pytest.mark.parametrize("bad", [{"wall_timeout_s": 0}, {"memory_bytes": -1}, {"max_processes": "many"}, {"nope": 1},
                                 {"cpu_time_s": 2.5}, {"max_processes": "8.5"}, {"max_processes": True}])
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
        (1, "OSError: [Errno 27] File too large", Status.DISK_LIMIT),
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


def test_file_size_and_scratch_are_named_apart():
    assert classify_exit(1, "OSError: [Errno 27] File too large", LIM)[1] == \
        f"file size limit exceeded ({LIM.max_file_bytes} bytes per file)"
    assert "scratch space exhausted (64 MiB at /tmp)" == classify_exit(1, "[Errno 28] No space left on device", LIM)[1]


def test_total_limits_are_named_as_totals():
    assert "1024 MiB in total" in total_limit_detail(Status.MEMORY_LIMIT, LIM)
    assert f"{LIM.max_processes} processes/threads in total" in total_limit_detail(Status.PROCESS_LIMIT, LIM)
    assert f"{LIM.cpu_time_s} s of CPU in total" in total_limit_detail(Status.CPU_LIMIT, LIM)


@pytest.mark.parametrize("status, usage, named", [
    (Status.OK, Usage(0, 1, 0, 0.1), Status.MEMORY_LIMIT),  # a child OOM-killed, the parent exited 0
    (Status.TIMEOUT, Usage(0, 2, 0, 0.1), Status.MEMORY_LIMIT),  # a pool waiting for its killed worker
    (Status.KILLED, Usage(0, 1, 0, 0.1), Status.MEMORY_LIMIT),
    (Status.ERROR, Usage(0, 0, 3, 0.1), Status.PROCESS_LIMIT),
    (Status.OK, Usage(0, 0, 3, 0.1), Status.OK),  # the program met pids.max, handled it and succeeded
    (Status.OUTPUT_LIMIT, Usage(0, 1, 0, 0.1), Status.OUTPUT_LIMIT),  # the sandbox's own kill stands
    (Status.CPU_LIMIT, Usage(0, 0, 1, 0.1), Status.CPU_LIMIT),
    (Status.ERROR, Usage(0, 0, 0, 0.1), Status.ERROR),
])
def test_outcome_named_by_the_group(status, usage, named):
    got, detail = name_by_group(status, "the program's own", usage, LIM)
    assert got == named
    if named != status:
        assert "in total" in detail and (status != Status.TIMEOUT or detail.endswith("; then the program's own"))


def test_format_for_model():
    assert format_for_model(ExecResult(Status.OK, stdout="42\n")) == "42\n"
    assert format_for_model(ExecResult(Status.OK)) == "(no output)"
    err = format_for_model(ExecResult(Status.TIMEOUT, stdout="partial", stderr="", detail="timeout: 10 s"))
    assert err.startswith("Error (timeout): timeout: 10 s") and "[stdout]\npartial" in err
    long = format_for_model(ExecResult(Status.OK, stdout="x" * 100_000), max_chars=1000)
    assert len(long) < 1100 and "characters cut" in long
