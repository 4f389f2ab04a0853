"""The limits of one sandboxed program run (pure: no verl, no subprocess).

Every limit has a default, a key in the tool's config (``configs/python_tool.yaml``) and an environment variable;
the config wins over the environment, the environment over the default.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields

MiB = 1024 * 1024


@dataclass(frozen=True)
class SandboxLimits:
    wall_timeout_s: float = 10.0  # wall clock, bwrap start-up included; the whole process group is then killed
    cpu_time_s: int = 10  # CPU seconds, in total over the run's processes (cgroup) and per process (RLIMIT_CPU)
    memory_bytes: int = 1024 * MiB  # in total (cgroup: all processes, their tmpfs/shm pages) and RLIMIT_AS per process
    max_processes: int = 64  # in total (cgroup pids) and RLIMIT_NPROC in the sandbox's user namespace (threads count)
    cpu_cores: float = 1.0  # CPU bandwidth: at most this many CPUs' worth at once (cgroup cpu quota)
    max_output_bytes: int = 256 * 1024  # stdout + stderr, read incrementally; more kills the program
    scratch_bytes: int = 64 * MiB  # the size of the tmpfs at /tmp (the scratch dir) and of the one at /dev/shm
    max_file_bytes: int = 64 * MiB  # RLIMIT_FSIZE: the largest file the program may write
    max_open_files: int = 256  # RLIMIT_NOFILE
    max_code_bytes: int = 256 * 1024  # refuse longer programs before starting anything

    def __post_init__(self):
        for f in fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"sandbox limit {f.name} must be a positive number, got {v!r}")

    @classmethod
    def from_config(cls, config: dict | None = None, environ: dict | None = None) -> "SandboxLimits":
        """Keys of ``config`` (the tool config's ``limits:`` mapping) override ``SANDBOX_<KEY>`` env variables."""
        config = dict(config or {})
        environ = os.environ if environ is None else environ
        unknown = set(config) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown sandbox limit(s) {sorted(unknown)}; known: {[f.name for f in fields(cls)]}")
        values = {}
        for f in fields(cls):
            raw = config.get(f.name, environ.get(f"SANDBOX_{f.name.upper()}"))
            if raw is None:
                continue
            values[f.name] = _parse(f.name, f.type, raw)
        return cls(**values)


def _parse(name: str, declared, raw) -> int | float:
    """``raw`` (YAML value or env string) as the field's declared type; an int limit refuses a fraction."""
    try:
        if isinstance(raw, bool):
            raise TypeError(raw)
        value = float(raw)
    except (TypeError, ValueError) as e:
        raise ValueError(f"sandbox limit {name}: {raw!r} is not a number") from e
    if declared in ("float", float):
        return value
    if not value.is_integer():
        raise ValueError(f"sandbox limit {name}: {raw!r} must be a whole number")
    return int(raw) if isinstance(raw, int) else int(value)
