"""A cgroup of its own for each sandboxed run: memory, process count and CPU time summed over all its processes.

RLIMIT_AS, RLIMIT_NPROC and RLIMIT_CPU bind one process each: a program forking 8 children of 900 MiB held 7 GiB
under a "1 GiB" limit. Here each run gets a child cgroup of the one this process runs in (read from
``/proc/self/cgroup``): ``memory`` (every page of every process, their tmpfs and ``/dev/shm`` pages and inodes
included; no swap), ``pids`` (processes and threads), ``cpu`` bandwidth, and CPU time read from ``cpuacct.usage``
(v1) or ``cpu.stat`` (v2). cgroup v1's per-controller hierarchies where this process has them, else cgroup v2.
Only the sandbox joins the group: a ``sh`` in front of bwrap writes its own pid into the group's ``cgroup.procs``
and then ``exec``s bwrap, so every process of the sandbox is born inside it (no ``preexec_fn``).

On cgroup v2 the runs' groups need controllers the recipe's cgroup can give only while it holds no process: while
this process has runs it steps into a leaf of its own below that cgroup, and puts everything back after its last
(``recipe/tools/cgroup_v2.py``); it never moves another process, and refuses where one shares its cgroup.

:func:`host_cgroups` only reads (and on v1 makes and removes one probe group): it says whether this works here, or
why not (no write access, a missing controller, another process in the v2 cgroup): the caller then refuses to run
unless per-process limits are accepted by name.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import os
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from recipe.tools import cgroup_v2
from recipe.tools.cgroup_v2 import DELEGATE_HINT  # noqa: F401 (bwrap names it in its refusals)
from recipe.tools.cgroup_v2 import V2_CONTROLLERS, V2Plan
from recipe.tools.limits import SandboxLimits

V1_CONTROLLERS = ("memory", "pids", "cpu", "cpuacct")
CFS_PERIOD_US = 100_000
# bwrap's own processes inside the group: the outer bwrap (it waits for the sandbox) and the pid namespace's init.
BWRAP_OWN_PROCESSES = 2
REMOVE_POLL_S = 0.005
REMOVE_AT_SHUTDOWN_S = 2.0


@dataclass(frozen=True)
class HostCgroups:
    """Where this process's cgroups are and that a child can be made in each."""

    version: str  # "v1" or "v2"
    dirs: tuple[tuple[str, str], ...]  # (controller, this process's cgroup directory); v2: one ("*", dir)
    v2: V2Plan | None = None  # v2: what a run needs done in that directory, and undone after

    def describe(self) -> str:
        where = ", ".join(f"{c} {d}" if c != "*" else d for c, d in self.dirs)
        what = "memory, processes and CPU time summed over each run's processes"
        leaf = (f"; while it has runs this process waits in {self.dirs[0][1]}/{cgroup_v2.LEAF_PREFIX}<pid> and "
                f"{' '.join(self.v2.controllers)} are enabled for the runs, all undone after its last"
                if self.v2 is not None and self.v2.move_self else "")
        return f"cgroup {self.version} ({what}; runs nested under {where}{leaf})"


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


def _locate(proc_cgroup: str, mountinfo: str, v2_controllers: tuple[str, ...] = V2_CONTROLLERS
            ) -> tuple[str, tuple[tuple[str, str], ...]] | str:
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
        if fstype == "cgroup2" and unified and (d := _join(root, point, unified[0])) and os.path.isdir(d):
            have = set(Path(d, "cgroup.controllers").read_text().split())
            missing = [c for c in v2_controllers if c not in have]
            if missing:
                return f"cgroup v2 at {d} is not given the {', '.join(missing)} controller(s)"
            return "v2", (("*", d),)
    return "no cgroup v1 memory/pids/cpu hierarchy and no cgroup v2 mount for this process"


def _probe(version: str, dirs: tuple[tuple[str, str], ...], v2_controllers: tuple[str, ...]
           ) -> V2Plan | None | str:
    """v1: make and remove one child group in each directory; v2: :func:`cgroup_v2.plan`, which only reads. The
    v2 plan (None on v1) when that works, else the line saying why not."""
    if version == "v2":
        return cgroup_v2.plan(dirs[0][1], v2_controllers)
    name = f"recipe-sandbox-probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    for _, d in dirs:
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


@functools.lru_cache(maxsize=None)
def host_cgroups(proc_cgroup: str = "/proc/self/cgroup", mountinfo: str = "/proc/self/mountinfo",
                 v2_controllers: tuple[str, ...] = V2_CONTROLLERS) -> HostCgroups | str:
    """This process's cgroups when a run's own group can be made under them, else one line saying why not. Changes
    nothing (the self-check calls it)."""
    try:
        found = _locate(proc_cgroup, mountinfo, v2_controllers)
        if isinstance(found, str):
            return found
        version, dirs = found
        v2 = _probe(version, dirs, v2_controllers)
    except OSError as e:
        return f"cannot read this process's cgroups: {e}"
    return v2 if isinstance(v2, str) else HostCgroups(version, dirs, v2)


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
        self.v2 = host.v2  # held (cgroup_v2.acquire) from create until the group is removed
        self.owner = os.getpid()  # a forked child inherits the object, not the duty to remove it

    @classmethod
    def create(cls, host: HostCgroups, limits: SandboxLimits) -> "RunGroup":
        group = cls(host, f"recipe-sandbox-{os.getpid()}-{uuid.uuid4().hex[:12]}")
        if group.v2 is not None:
            cgroup_v2.acquire(group.v2)
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
            if group.v2 is not None:
                cgroup_v2.release(group.v2)
            raise
        _LIVE.add(group)
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
            elif os.path.exists(os.path.join(m, "memory.swappiness")):  # no memsw (swapaccount=0): never swap out
                Path(m, "memory.swappiness").write_text("0")
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

    def kill(self) -> None:
        """SIGKILL whatever is left in the group (``cgroup.kill`` on v2, every pid listed on both)."""
        left = self._pids()
        kill = os.path.join(self._dir("*"), "cgroup.kill") if self.version == "v2" else None
        if kill and left and os.path.exists(kill):
            try:
                Path(kill).write_text("1")
            except OSError:
                pass
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def try_remove(self) -> bool:
        """Kill what is left, then remove the group's directories (and, on v2, after this process's last group, put
        its cgroup back as found); False while a killed process is still dying."""
        self.kill()
        removed = True
        for d in dict.fromkeys(self.dirs.values()):
            try:
                os.rmdir(d)
            except FileNotFoundError:
                pass
            except OSError:
                removed = False
        if removed:
            try:
                _LIVE.remove(self)  # once, whichever of two removers (a run's end, a shutdown) gets here first
            except KeyError:
                return removed
            if self.v2 is not None:
                cgroup_v2.release(self.v2)
        return removed

    def remove(self, wait_s: float = 2.0) -> bool:
        """:meth:`try_remove` until it works; False if the group is still populated after ``wait_s``. Blocks: on
        an event loop use :meth:`remove_async`."""
        deadline = time.monotonic() + wait_s
        while not self.try_remove():
            if time.monotonic() > deadline:
                return False
            time.sleep(REMOVE_POLL_S)
        return True

    async def remove_async(self, wait_s: float = 30.0) -> bool:
        """:meth:`remove` without blocking the event loop (a cancelled run's group, at a gate close, is one of
        many). It may wait long: the sandbox's init, reparented to the host's PID 1, keeps the group populated until
        PID 1 reaps it, which a busy PID 1 does late."""
        deadline = time.monotonic() + wait_s
        try:
            while not self.try_remove():
                if time.monotonic() > deadline:
                    return False
                await asyncio.sleep(REMOVE_POLL_S)
        except asyncio.CancelledError:  # the event loop is shutting down: nothing else to run, so wait here
            self.remove(wait_s=REMOVE_AT_SHUTDOWN_S)
            raise
        return True


_LIVE: set[RunGroup] = set()  # groups created and not yet removed: at exit they are emptied before v2 is restored


@atexit.register  # registered after cgroup_v2's release_all, so it runs first
def _remove_left_groups() -> None:
    for group in list(_LIVE):
        if group.owner == os.getpid():
            group.remove(wait_s=REMOVE_AT_SHUTDOWN_S)
