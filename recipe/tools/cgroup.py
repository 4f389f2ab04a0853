"""A cgroup of its own for each sandboxed run: memory, process count and CPU time summed over all its processes.

RLIMIT_AS, RLIMIT_NPROC and RLIMIT_CPU bind one process each: a program forking 8 children of 900 MiB held 7 GiB
under a "1 GiB" limit. Here each run gets a child cgroup of the one this process already runs in (read from
``/proc/self/cgroup``; this process is never moved): ``memory`` (every page of every process, their tmpfs and
``/dev/shm`` pages included; no swap), ``pids`` (processes and threads), ``cpu`` bandwidth, and CPU time read from
``cpuacct.usage`` (v1) or ``cpu.stat`` (v2). cgroup v1's per-controller hierarchies where this process has them,
else cgroup v2. Only the sandbox joins the group: a ``sh`` in front of bwrap writes its own pid into the group's
``cgroup.procs`` and then ``exec``s bwrap, so every process of the sandbox is born inside it (no ``preexec_fn``).

:func:`host_cgroups` says whether this works here, or why not (no write access, a missing controller, a v2
cgroup with processes of its own): the caller then refuses to run unless per-process limits are accepted by name.
"""

from __future__ import annotations

import errno
import functools
import os
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from recipe.tools.limits import SandboxLimits

V1_CONTROLLERS = ("memory", "pids", "cpu", "cpuacct")
V2_CONTROLLERS = ("memory", "pids", "cpu")
CFS_PERIOD_US = 100_000
# bwrap's own processes inside the group: the outer bwrap (it waits for the sandbox) and the pid namespace's init.
BWRAP_OWN_PROCESSES = 2


@dataclass(frozen=True)
class HostCgroups:
    """Where this process's cgroups are and that a child can be made in each."""

    version: str  # "v1" or "v2"
    dirs: tuple[tuple[str, str], ...]  # (controller, this process's cgroup directory); v2: one ("*", dir)

    def describe(self) -> str:
        where = ", ".join(f"{c} {d}" if c != "*" else d for c, d in self.dirs)
        what = "memory, processes and CPU time summed over each run's processes"
        return f"cgroup {self.version} ({what}; runs nested under {where})"


def _mounts(mountinfo: str) -> list[tuple[str, str, str, set[str]]]:
    """(fstype, mount root, mount point, super options) of each cgroup mount."""
    out = []
    for line in Path(mountinfo).read_text().splitlines():
        left, _, right = line.partition(" - ")
        f, r = left.split(), right.split()
        if len(f) >= 5 and len(r) >= 3 and r[0] in ("cgroup", "cgroup2"):
            out.append((r[0], f[3], f[4].replace("\\040", " "), set(r[2].split(","))))
    return out


def _join(mount_root: str, mount_point: str, path: str) -> str | None:
    rel = os.path.relpath(path, mount_root)
    if rel.startswith(".."):
        return None  # this process's cgroup is not visible through the mount (a container's own view)
    return os.path.normpath(os.path.join(mount_point, rel))


def _locate(proc_cgroup: str, mountinfo: str) -> tuple[str, tuple[tuple[str, str], ...]] | str:
    """The version and directories, or a line saying what is missing."""
    lines = [ln.split(":", 2) for ln in Path(proc_cgroup).read_text().splitlines() if ln.count(":") >= 2]
    mounts = _mounts(mountinfo)
    v1 = {}
    for _, ctrls, path in lines:
        for c in ctrls.split(","):
            if c in V1_CONTROLLERS:
                for fstype, root, point, opts in mounts:
                    if fstype == "cgroup" and c in opts and (d := _join(root, point, path)):
                        v1[c] = d
                        break
    if v1:
        missing = [c for c in V1_CONTROLLERS if c not in v1]
        if missing:
            return f"cgroup v1 without the {', '.join(missing)} controller(s) mounted for this process"
        return "v1", tuple((c, v1[c]) for c in V1_CONTROLLERS)
    unified = [path for hid, ctrls, path in lines if hid == "0" and ctrls == ""]
    for fstype, root, point, _ in mounts:
        if fstype == "cgroup2" and unified and (d := _join(root, point, unified[0])):
            have = set(Path(d, "cgroup.controllers").read_text().split())
            missing = [c for c in V2_CONTROLLERS if c not in have]
            if missing:
                return f"cgroup v2 at {d} is not given the {', '.join(missing)} controller(s)"
            return "v2", (("*", d),)
    return "no cgroup v1 memory/pids/cpu hierarchy and no cgroup v2 mount for this process"


def _probe(version: str, dirs: tuple[tuple[str, str], ...]) -> str | None:
    """Make and remove one child group in each directory; None when that works."""
    name = f"recipe-sandbox-probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    for _, d in dirs:
        if version == "v2":
            problem = _enable_v2_controllers(d)
            if problem:
                return problem
        child = os.path.join(d, name)
        try:
            os.mkdir(child)
        except OSError as e:
            return f"cannot create a cgroup under {d}: {e.strerror}"
        try:
            os.rmdir(child)
        except OSError:
            pass
    return None


def _enable_v2_controllers(d: str) -> str | None:
    have = set(Path(d, "cgroup.subtree_control").read_text().split())
    want = [c for c in V2_CONTROLLERS if c not in have]
    if not want:
        return None
    try:
        Path(d, "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in want))
    except OSError as e:
        why = " (it holds processes of its own: cgroup v2 gives controllers only to groups without)" \
            if e.errno == errno.EBUSY else ""
        return f"cannot enable {', '.join(want)} for the children of {d}: {e.strerror}{why}"
    return None


@functools.lru_cache(maxsize=None)
def host_cgroups(proc_cgroup: str = "/proc/self/cgroup", mountinfo: str = "/proc/self/mountinfo"
                 ) -> HostCgroups | str:
    """This process's cgroups when a run's own group can be made under them, else one line saying why not."""
    try:
        found = _locate(proc_cgroup, mountinfo)
        if isinstance(found, str):
            return found
        version, dirs = found
        problem = _probe(version, dirs)
    except OSError as e:
        return f"cannot read this process's cgroups: {e}"
    return problem or HostCgroups(version, dirs)


@dataclass
class Usage:
    """What a run's group recorded: the facts that name a limit."""

    memory_peak_bytes: int
    oom_kills: int
    pids_max_hits: int
    cpu_s: float


def _read_keyed(path: str) -> dict[str, int]:
    out = {}
    try:
        for line in Path(path).read_text().splitlines():
            k, _, v = line.partition(" ")
            if v.strip().lstrip("-").isdigit():
                out[k] = int(v)
    except OSError:
        pass
    return out


def _read_int(path: str) -> int:
    try:
        return int(Path(path).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


class RunGroup:
    """One run's cgroup (v1: one directory per controller). Create with :meth:`create`; always :meth:`remove`."""

    def __init__(self, host: HostCgroups, name: str):
        self.version = host.version
        self.dirs = {c: os.path.join(d, name) for c, d in host.dirs}

    @classmethod
    def create(cls, host: HostCgroups, limits: SandboxLimits) -> "RunGroup":
        group = cls(host, f"recipe-sandbox-{os.getpid()}-{uuid.uuid4().hex[:12]}")
        made = []
        try:
            for d in dict.fromkeys(group.dirs.values()):
                os.mkdir(d)
                made.append(d)
            group._set_limits(limits)
        except OSError:
            for d in reversed(made):
                try:
                    os.rmdir(d)
                except OSError:
                    pass
            raise
        return group

    def _dir(self, controller: str) -> str:
        return self.dirs.get(controller) or self.dirs["*"]

    def _set_limits(self, lim: SandboxLimits) -> None:
        quota = max(1000, int(lim.cpu_cores * CFS_PERIOD_US))
        if self.version == "v1":  # v1 refuses a child quota above its parent's (EINVAL): at most the parent's
            parent = os.path.dirname(self._dir("cpu"))
            pq = _read_int(os.path.join(parent, "cpu.cfs_quota_us"))
            pp = _read_int(os.path.join(parent, "cpu.cfs_period_us"))
            if pq > 0 and pp > 0:
                quota = min(quota, pq * CFS_PERIOD_US // pp)
        pids = str(lim.max_processes + BWRAP_OWN_PROCESSES)
        if self.version == "v1":
            m = self._dir("memory")
            Path(m, "memory.limit_in_bytes").write_text(str(lim.memory_bytes))
            if os.path.exists(os.path.join(m, "memory.memsw.limit_in_bytes")):  # no swap either
                Path(m, "memory.memsw.limit_in_bytes").write_text(str(lim.memory_bytes))
            Path(self._dir("pids"), "pids.max").write_text(pids)
            Path(self._dir("cpu"), "cpu.cfs_period_us").write_text(str(CFS_PERIOD_US))
            Path(self._dir("cpu"), "cpu.cfs_quota_us").write_text(str(quota))
            return
        d = self._dir("*")
        Path(d, "memory.max").write_text(str(lim.memory_bytes))
        for name, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
            if os.path.exists(os.path.join(d, name)):
                Path(d, name).write_text(value)
        Path(d, "pids.max").write_text(pids)
        Path(d, "cpu.max").write_text(f"{quota} {CFS_PERIOD_US}")

    def procs_files(self) -> list[str]:
        """The ``cgroup.procs`` files a process writes its pid into to join the group (each v1 hierarchy's)."""
        return [os.path.join(d, "cgroup.procs") for d in dict.fromkeys(self.dirs.values())]

    def cpu_s(self) -> float:
        if self.version == "v1":
            return _read_int(os.path.join(self._dir("cpuacct"), "cpuacct.usage")) / 1e9
        return _read_keyed(os.path.join(self._dir("*"), "cpu.stat")).get("usage_usec", 0) / 1e6

    def usage(self) -> Usage:
        if self.version == "v1":
            m = self._dir("memory")
            oom = _read_keyed(os.path.join(m, "memory.oom_control")).get("oom_kill", 0)
            peak = _read_int(os.path.join(m, "memory.max_usage_in_bytes"))
        else:
            m = self._dir("*")
            oom = _read_keyed(os.path.join(m, "memory.events")).get("oom_kill", 0)
            peak = _read_int(os.path.join(m, "memory.peak"))
        hits = _read_keyed(os.path.join(self._dir("pids"), "pids.events")).get("max", 0)
        return Usage(peak, oom, hits, self.cpu_s())

    def _pids(self) -> set[int]:
        pids = set()
        for f in self.procs_files():
            try:
                pids.update(int(p) for p in Path(f).read_text().split())
            except (OSError, ValueError):
                pass
        return pids

    def remove(self, wait_s: float = 2.0) -> bool:
        """SIGKILL whatever is left in the group, then remove it; False if it is still populated after ``wait_s``."""
        kill = os.path.join(self._dir("*"), "cgroup.kill") if self.version == "v2" else None
        deadline = time.monotonic() + wait_s
        while True:
            left = self._pids()
            if kill and left and os.path.exists(kill):
                Path(kill).write_text("1")
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            removed = True
            for d in dict.fromkeys(self.dirs.values()):
                try:
                    os.rmdir(d)
                except FileNotFoundError:
                    pass
                except OSError:
                    removed = False
            if removed or time.monotonic() > deadline:
                return removed
            time.sleep(0.005)
