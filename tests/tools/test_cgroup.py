"""Where a run's cgroup goes: found from ``/proc/self/cgroup`` and ``/proc/self/mountinfo`` (here: written to a
tmp dir in the formats the kernel uses), and the run's group on this machine for real when this process may make one."""

import errno
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from recipe.tools import cgroup
from recipe.tools.cgroup import BWRAP_OWN_PROCESSES, HostCgroups, RunGroup, host_cgroups
from recipe.tools.limits import MiB, SandboxLimits

V1_CGROUP = "9:name=systemd:/\n8:pids:/job\n4:memory:/job/mem\n2:cpuacct:/job\n1:cpu:/job\n0::/\n"


def mountinfo(root="/"):
    lines = [
        "30 25 0:26 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755",
        f"31 30 0:27 {root} /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu",
        f"32 30 0:28 {root} /sys/fs/cgroup/cpuacct rw - cgroup cgroup rw,cpuacct",
        f"33 30 0:29 {root} /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory",
        f"34 30 0:30 {root} /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids",
        "35 30 0:31 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw",
    ]
    return "\n".join(lines) + "\n"


def files(tmp_path, proc_cgroup, mounts):
    (tmp_path / "cgroup").write_text(proc_cgroup)
    (tmp_path / "mountinfo").write_text(mounts)
    return str(tmp_path / "cgroup"), str(tmp_path / "mountinfo")


def test_v1_directories_are_this_processs_own_groups(tmp_path):
    version, dirs = cgroup._locate(*files(tmp_path, V1_CGROUP, mountinfo()))
    assert version == "v1"
    assert dict(dirs) == {"memory": "/sys/fs/cgroup/memory/job/mem", "pids": "/sys/fs/cgroup/pids/job",
                          "cpu": "/sys/fs/cgroup/cpu/job", "cpuacct": "/sys/fs/cgroup/cpuacct/job"}


def test_v1_mounted_at_the_containers_own_root(tmp_path):
    """A container without a cgroup namespace: its mount shows /job as /, /proc/self/cgroup still says /job/..."""
    version, dirs = cgroup._locate(*files(tmp_path, V1_CGROUP, mountinfo(root="/job")))
    assert dict(dirs)["memory"] == "/sys/fs/cgroup/memory/mem" and dict(dirs)["pids"] == "/sys/fs/cgroup/pids"


def test_a_group_outside_the_mount_is_named(tmp_path):
    found = cgroup._locate(*files(tmp_path, V1_CGROUP, mountinfo(root="/other")))
    assert isinstance(found, str) and "memory" in found


def test_v1_without_pids_is_named(tmp_path):
    mounts = "".join(ln + "\n" for ln in mountinfo().splitlines() if "pids" not in ln)
    found = cgroup._locate(*files(tmp_path, V1_CGROUP, mounts))
    assert found == "cgroup v1 without the pids controller(s) mounted for this process"


def test_v2_needs_memory_pids_and_cpu(tmp_path):
    root = tmp_path / "unified"
    (root / "job").mkdir(parents=True)
    (root / "job" / "cgroup.controllers").write_text("cpuset cpu io memory\n")
    mounts = f"35 30 0:31 / {root} rw - cgroup2 cgroup2 rw\n"
    found = cgroup._locate(*files(tmp_path, "0::/job\n", mounts))
    assert found == f"cgroup v2 at {root}/job is not given the pids controller(s)"
    (root / "job" / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    assert cgroup._locate(*files(tmp_path, "0::/job\n", mounts)) == ("v2", (("*", f"{root}/job"),))


class FakeCgroup2:
    """A cgroup v2 hierarchy in a tmp dir that keeps the kernel's rules (a test double): ``cgroup.procs`` lists
    each group's processes; writing a pid moves it (EBUSY into a group whose children have controllers); writing
    ``+ctrl`` to ``cgroup.subtree_control`` is EBUSY while the group holds processes (the no-internal-process rule;
    the root is exempt) and ENOENT for a controller the group is not given; a child gets ``cgroup.controllers`` =
    its parent's ``subtree_control``, and a controller's files (``memory.max``...) only where the parent enabled it;
    ``rmdir`` is EBUSY while a group holds processes. It patches ``Path.write_text``, ``os.mkdir`` and ``os.rmdir``
    for paths below its root only."""

    def __init__(self, root, monkeypatch):
        self.root = root
        self._write, self._mkdir, self._rmdir = cgroup.Path.write_text, os.mkdir, os.rmdir
        self._new(root, "cpuset cpu io memory pids")
        monkeypatch.setattr(cgroup.Path, "write_text", lambda path, text, *a, **kw: self.write_text(path, text, *a, **kw))
        monkeypatch.setattr(os, "mkdir", self.mkdir)
        monkeypatch.setattr(os, "rmdir", self.rmdir)

    def _new(self, d, controllers):
        self._mkdir(d)
        for name, text in (("cgroup.procs", ""), ("cgroup.controllers", controllers), ("cgroup.subtree_control", "")):
            self._write(Path(d, name), text)

    def _under(self, path):
        return str(path).startswith(str(self.root))

    def exit(self, pid):
        for procs in Path(self.root).rglob("cgroup.procs"):
            self._write(procs, " ".join(p for p in procs.read_text().split() if int(p) != pid))

    def procs(self, d):
        return [int(p) for p in Path(d, "cgroup.procs").read_text().split()]

    def mkdir(self, path, mode=0o777):
        if not self._under(path):
            return self._mkdir(path, mode)
        if os.path.exists(path):
            raise FileExistsError(17, "File exists", str(path))
        self._new(path, Path(os.path.dirname(path), "cgroup.subtree_control").read_text())

    def rmdir(self, path):
        if not self._under(path):
            return self._rmdir(path)
        if self.procs(path) or any(p.is_dir() for p in Path(path).iterdir()):
            raise OSError(errno.EBUSY, "Device or resource busy", str(path))
        for f in Path(path).iterdir():
            f.unlink()
        self._rmdir(path)

    def write_text(self, path, text, *args, **kwargs):
        path = Path(path)
        if not self._under(path):
            return self._write(path, text, *args, **kwargs)
        d, name = path.parent, path.name
        if name == "cgroup.procs":
            if Path(d, "cgroup.subtree_control").read_text().split() and d != self.root:
                raise OSError(errno.EBUSY, "Device or resource busy", str(path))
            pid = int(text)
            for procs in Path(self.root).rglob("cgroup.procs"):
                left = [p for p in procs.read_text().split() if int(p) != pid]
                self._write(procs, " ".join(left))
            return self._write(path, " ".join([*map(str, self.procs(d)), str(pid)]))
        if name == "cgroup.subtree_control":
            want = [c.lstrip("+") for c in text.split()]
            if any(c not in Path(d, "cgroup.controllers").read_text().split() for c in want):
                raise OSError(errno.ENOENT, "No such file or directory", str(path))
            if self.procs(d) and d != self.root:
                raise OSError(errno.EBUSY, "Device or resource busy", str(path))
            have = Path(d, "cgroup.subtree_control").read_text().split()
            return self._write(path, " ".join(dict.fromkeys(have + want)))
        ctrl = name.split(".")[0]
        if ctrl in ("memory", "pids", "cpu") and ctrl not in Path(d.parent, "cgroup.subtree_control").read_text():
            raise OSError(errno.ENOENT, "No such file or directory", str(path))
        return self._write(path, text, *args, **kwargs)


# pids no process here can have (above the kernel's pid_max): RunGroup.remove sends real signals to what it lists
PID_MAX = int(Path("/proc/sys/kernel/pid_max").read_text())
RECIPE, OTHER, SANDBOX = PID_MAX + 1, PID_MAX + 2, PID_MAX + 3


@pytest.fixture
def fake_v2(tmp_path, monkeypatch):
    """The recipe's process and another in /job of a fake cgroup v2 mount, nothing else."""
    fs = FakeCgroup2(tmp_path / "unified", monkeypatch)
    fs.write_text(tmp_path / "unified" / "cgroup.subtree_control", "+cpu +memory +pids")
    fs.mkdir(tmp_path / "unified" / "job")
    for pid in (RECIPE, OTHER):
        fs.write_text(tmp_path / "unified" / "job" / "cgroup.procs", str(pid))
    (tmp_path / "cgroup").write_text("0::/job\n")
    (tmp_path / "mountinfo").write_text(f"35 30 0:31 / {tmp_path / 'unified'} rw - cgroup2 cgroup2 rw\n")
    return fs, tmp_path / "unified" / "job", (str(tmp_path / "cgroup"), str(tmp_path / "mountinfo"))


def test_the_fake_keeps_the_no_internal_process_rule(fake_v2):
    fs, job, _ = fake_v2
    with pytest.raises(OSError) as e:
        fs.write_text(job / "cgroup.subtree_control", "+memory")
    assert e.value.errno == errno.EBUSY


def test_v2_cgroup_holding_processes_moves_them_into_a_leaf_and_runs_beside_it(fake_v2):
    """Every cgroup-v2 host holds the recipe's process in its cgroup: its processes move once into ``recipe-procs``
    below it, the cgroup's children get memory, pids and cpu, and each run's group is a sibling of that leaf with
    its limits written. (The earlier code refused here: EBUSY, "it holds processes of its own".)"""
    fs, job, files = fake_v2
    found = host_cgroups(*files)
    assert isinstance(found, HostCgroups), found
    assert found.version == "v2" and found.moved == 2 and f"{job}/recipe-procs" in found.describe()
    assert fs.procs(job) == [] and fs.procs(job / cgroup.V2_LEAF) == [RECIPE, OTHER]
    assert (job / "cgroup.subtree_control").read_text().split() == ["memory", "pids", "cpu"]
    group = RunGroup.create(found, SandboxLimits(memory_bytes=300 * MiB, max_processes=20, cpu_cores=0.5))
    run_dir = Path(group._dir("*"))
    assert run_dir.parent == job and (run_dir / "memory.max").read_text() == str(300 * MiB)
    assert (run_dir / "cpu.max").read_text() == "50000 100000" and (run_dir / "pids.max").read_text() == "22"
    fs.write_text(run_dir / "cgroup.procs", str(SANDBOX))  # the sandbox's sh joins its run's group
    assert fs.procs(run_dir) == [SANDBOX] and not group.try_remove()  # populated: EBUSY
    fs.exit(SANDBOX)
    assert group.remove() and not run_dir.exists()


def test_v2_processes_that_cannot_move_are_named(fake_v2, monkeypatch):
    fs, job, files = fake_v2
    real = fs.write_text

    def no_moves(path, text, *a, **kw):
        if Path(path).name == "cgroup.procs" and Path(path).parent.name == cgroup.V2_LEAF:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path, text, *a, **kw)

    monkeypatch.setattr(cgroup.Path, "write_text", no_moves)
    problem = host_cgroups(*files)
    assert isinstance(problem, str) and "no-internal-process rule" in problem and "Permission denied" in problem
    assert "systemd-run --user --scope -p Delegate=yes" in problem and fs.procs(job) == [RECIPE, OTHER]


@pytest.fixture
def host():
    found = host_cgroups()
    if not isinstance(found, HostCgroups):
        pytest.skip(f"no cgroups to delegate here: {found}")
    return found


def test_run_group_is_nested_under_this_processs_own_and_removed(host):
    lim = SandboxLimits(memory_bytes=300 * MiB, max_processes=20, cpu_cores=0.5)
    own = open("/proc/self/cgroup").read()
    group = RunGroup.create(host, lim)
    try:
        for (c, parent) in host.dirs:
            assert os.path.dirname(group._dir(c)) == parent and os.path.isdir(group._dir(c))
        if host.version == "v1":
            assert open(os.path.join(group._dir("memory"), "memory.limit_in_bytes")).read().strip() == str(300 * MiB)
            assert open(os.path.join(group._dir("cpu"), "cpu.cfs_quota_us")).read().strip() == "50000"
        else:
            assert open(os.path.join(group._dir("*"), "memory.max")).read().strip() == str(300 * MiB)
            assert open(os.path.join(group._dir("*"), "cpu.max")).read().split()[0] == "50000"
        pids = open(os.path.join(group._dir("pids"), "pids.max")).read().strip()
        assert pids == str(20 + BWRAP_OWN_PROCESSES)
        assert group.usage().oom_kills == 0 and group.cpu_s() == 0
    finally:
        assert group.remove()
    assert not any(os.path.exists(d) for d in group.dirs.values())
    assert open("/proc/self/cgroup").read() == own  # this process was never moved


def _sleeper_in(procs_file: str) -> subprocess.Popen:
    """A ``sleep`` that joins a cgroup as the sandbox's ``sh`` does (its own pid into ``cgroup.procs``, then exec)."""
    p = subprocess.Popen(["/bin/sh", "-c", 'echo $$ > "$1" && exec sleep 600', "sh", procs_file])
    deadline = time.monotonic() + 30
    while str(p.pid) not in Path(procs_file).read_text().split():
        assert p.poll() is None and time.monotonic() < deadline, "the sleeper never joined"
        time.sleep(0.01)
    return p


def test_remove_kills_a_live_leftover(host):
    """A group that still holds a process (here a sleep that joined it, as the sandbox's sh does) is emptied by
    ``remove``: the process is killed, then the group removed. The sandbox tests cannot show this (the pid
    namespace has already killed everything when ``remove`` runs)."""
    group = RunGroup.create(host, SandboxLimits())
    sleeper = _sleeper_in(group.procs_files()[0])
    try:
        assert group.remove()
        assert sleeper.wait(timeout=10) == -signal.SIGKILL
        assert not any(os.path.exists(d) for d in group.dirs.values())
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()
            group.remove()


def test_v1_cpu_quota_is_clamped_to_the_parents(host):
    """cgroup v1 refuses a child quota above its parent's (EINVAL): under a parent limited to half a CPU, a run
    asking for 2 CPUs gets the parent's half (never more). Made for real under a parent of our own."""
    if host.version != "v1":
        pytest.skip("cgroup v1 only")
    name = f"recipe-test-quota-{os.getpid()}"
    parents = {c: os.path.join(d, name) for c, d in host.dirs}
    for d in parents.values():
        os.mkdir(d)
    try:
        Path(parents["cpu"], "cpu.cfs_period_us").write_text("200000")
        Path(parents["cpu"], "cpu.cfs_quota_us").write_text("100000")  # half a CPU, in another period
        group = RunGroup.create(HostCgroups("v1", tuple(parents.items())), SandboxLimits(cpu_cores=2))
        try:
            assert Path(group._dir("cpu"), "cpu.cfs_quota_us").read_text().strip() == "50000"
            assert Path(group._dir("cpu"), "cpu.cfs_period_us").read_text().strip() == "100000"
        finally:
            assert group.remove()
    finally:
        for d in parents.values():
            os.rmdir(d)


UNIFIED = "/sys/fs/cgroup/unified"


@pytest.fixture
def real_v2():
    """A cgroup of our own on this machine's real cgroup v2 hierarchy (here beside v1: only ``hugetlb`` is free to
    enable, but the hierarchy and its no-internal-process rule are the kernel's), holding a process."""
    if not os.path.isfile(os.path.join(UNIFIED, "cgroup.procs")) or "hugetlb" not in \
            Path(UNIFIED, "cgroup.controllers").read_text().split():
        pytest.skip(f"no cgroup v2 hierarchy with a free controller at {UNIFIED}")
    root_control = Path(UNIFIED, "cgroup.subtree_control")
    enabled_here = "hugetlb" not in root_control.read_text().split()
    if enabled_here:
        root_control.write_text("+hugetlb")  # the root is exempt from the rule; our cgroup then is given hugetlb
    d = os.path.join(UNIFIED, f"recipe-test-v2-{os.getpid()}")
    os.mkdir(d)
    sleeper = _sleeper_in(os.path.join(d, "cgroup.procs"))
    yield d, sleeper
    sleeper.kill()
    sleeper.wait()
    for sub in sorted(Path(d).iterdir(), reverse=True):
        if sub.is_dir():
            for pid in Path(sub, "cgroup.procs").read_text().split():
                os.kill(int(pid), signal.SIGKILL)
            deadline = time.monotonic() + 10
            while Path(sub, "cgroup.procs").read_text().split() and time.monotonic() < deadline:
                time.sleep(0.01)
            os.rmdir(sub)
    os.rmdir(d)
    if enabled_here:
        try:
            root_control.write_text("-hugetlb")
        except OSError:
            pass  # another cgroup below the root uses it now


def test_real_v2_no_internal_process_rule_and_the_leaf(real_v2):
    """On the kernel's own cgroup v2: enabling a controller for the children of a cgroup that holds a process is
    EBUSY; ``delegate_v2`` moves the process into ``recipe-procs`` below it and enables it; a run's group beside
    the leaf is joined by a process and emptied by ``remove`` (``cgroup.kill``)."""
    d, sleeper = real_v2
    with pytest.raises(OSError) as e:
        Path(d, "cgroup.subtree_control").write_text("+hugetlb")
    assert e.value.errno == errno.EBUSY
    assert cgroup.delegate_v2(d, ("hugetlb",)) == 1
    assert Path(d, "cgroup.subtree_control").read_text().split() == ["hugetlb"]
    assert Path(f"/proc/{sleeper.pid}/cgroup").read_text().splitlines()[-1].endswith(f"/{cgroup.V2_LEAF}")
    assert cgroup.delegate_v2(d, ("hugetlb",)) == 0  # once: nothing left to move
    group = RunGroup(HostCgroups("v2", (("*", d),)), "recipe-sandbox-real-v2")
    os.mkdir(group._dir("*"))
    runner = _sleeper_in(group.procs_files()[0])
    assert Path(group._dir("*"), "cgroup.controllers").read_text().split() == ["hugetlb"]
    assert group.remove() and runner.wait(timeout=10) == -signal.SIGKILL
    assert not os.path.exists(group._dir("*")) and sleeper.poll() is None  # the leaf's process untouched


def test_v1_without_memsw_never_swaps(tmp_path):
    """Where swap is not accounted (no memory.memsw.*), the group's pages are never swapped out (swappiness 0):
    else swap would hold what the memory limit refuses. With memsw, memory + swap is limited instead."""
    dirs = {c: tmp_path / c for c in cgroup.V1_CONTROLLERS}
    for d in dirs.values():
        d.mkdir()
    host = HostCgroups("v1", tuple((c, str(d)) for c, d in dirs.items()))
    group = RunGroup(host, "run")
    for d in group.dirs.values():
        os.mkdir(d)
    Path(group._dir("memory"), "memory.swappiness").write_text("60")
    group._set_limits(SandboxLimits(memory_bytes=300 * MiB))
    assert Path(group._dir("memory"), "memory.swappiness").read_text() == "0"
    Path(group._dir("memory"), "memory.memsw.limit_in_bytes").write_text("")
    group._set_limits(SandboxLimits(memory_bytes=300 * MiB))
    assert Path(group._dir("memory"), "memory.memsw.limit_in_bytes").read_text() == str(300 * MiB)
