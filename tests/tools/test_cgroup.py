"""Where a run's cgroup goes: found from ``/proc/self/cgroup`` and ``/proc/self/mountinfo`` (here: written to a
tmp dir in the formats the kernel uses), and the run's group on this machine for real when this process may make one.
cgroup v2 (leave the host's cgroups as found, move no process but the recipe's own) on a fake that keeps the kernel's
rules and on this machine's real v2 hierarchy (mounted for the test where there is none)."""

import errno
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from recipe.tools import cgroup, cgroup_v2
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
    the root is exempt) and ENOENT for a controller the group is not given, ``-ctrl`` is EBUSY while a child
    enables it for its own children; a child gets ``cgroup.controllers`` = its parent's ``subtree_control`` and a
    ``cgroup.type`` (the root has none), and a controller's files (``memory.max``...) only where the parent enabled
    it; ``rmdir`` is EBUSY while a group holds processes or children. It patches ``Path.write_text``, ``os.mkdir``
    and ``os.rmdir`` for paths below its root only."""

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
        if Path(d) != Path(self.root):
            self._write(Path(d, "cgroup.type"), "domain")

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
            want = [c[1:] for c in text.split() if c.startswith("+")]
            drop = [c[1:] for c in text.split() if c.startswith("-")]
            if any(c not in Path(d, "cgroup.controllers").read_text().split() for c in want + drop):
                raise OSError(errno.ENOENT, "No such file or directory", str(path))
            if want and self.procs(d) and d != self.root:
                raise OSError(errno.EBUSY, "Device or resource busy", str(path))
            if any(c in Path(sub, "cgroup.subtree_control").read_text().split()
                   for sub in d.iterdir() if sub.is_dir() for c in drop):
                raise OSError(errno.EBUSY, "Device or resource busy", str(path))
            have = Path(d, "cgroup.subtree_control").read_text().split()
            return self._write(path, " ".join(c for c in dict.fromkeys(have + want) if c not in drop))
        ctrl = name.split(".")[0]
        if ctrl in ("memory", "pids", "cpu") and ctrl not in Path(d.parent, "cgroup.subtree_control").read_text():
            raise OSError(errno.ENOENT, "No such file or directory", str(path))
        return self._write(path, text, *args, **kwargs)


# pids no process here can have (above the kernel's pid_max): RunGroup.remove sends real signals to what it lists.
# The recipe is this process (the code moves os.getpid() only); the fake never signals it.
PID_MAX = int(Path("/proc/sys/kernel/pid_max").read_text())
RECIPE, OTHER, SANDBOX, LATER = os.getpid(), PID_MAX + 2, PID_MAX + 3, PID_MAX + 4
LIMITS = SandboxLimits(memory_bytes=300 * MiB, max_processes=20, cpu_cores=0.5)


def _v2(tmp_path, monkeypatch, pids):
    """The recipe's process (and ``pids`` beside it) in /job of a fake cgroup v2 mount whose root gives its
    children memory, pids and cpu."""
    fs = FakeCgroup2(tmp_path / "unified", monkeypatch)
    fs.write_text(tmp_path / "unified" / "cgroup.subtree_control", "+cpu +memory +pids")
    fs.mkdir(tmp_path / "unified" / "job")
    for pid in pids:
        fs.write_text(tmp_path / "unified" / "job" / "cgroup.procs", str(pid))
    (tmp_path / "cgroup").write_text("0::/job\n")
    (tmp_path / "mountinfo").write_text(f"35 30 0:31 / {tmp_path / 'unified'} rw - cgroup2 cgroup2 rw\n")
    return fs, tmp_path / "unified" / "job", (str(tmp_path / "cgroup"), str(tmp_path / "mountinfo"))


@pytest.fixture
def fake_v2(tmp_path, monkeypatch):
    """The recipe's process and another in /job of a fake cgroup v2 mount."""
    return _v2(tmp_path, monkeypatch, (RECIPE, OTHER))


@pytest.fixture
def alone_v2(tmp_path, monkeypatch):
    """The recipe's process alone in /job of a fake cgroup v2 mount."""
    return _v2(tmp_path, monkeypatch, (RECIPE,))


def snapshot(root):
    """Every cgroup below ``root`` with its processes and enabled controllers."""
    return {str(d.relative_to(root)): (sorted(Path(d, "cgroup.procs").read_text().split()),
                                       Path(d, "cgroup.subtree_control").read_text().split())
            for d in [Path(root), *sorted(p for p in Path(root).rglob("*") if p.is_dir())]}


def test_the_fake_keeps_the_no_internal_process_rule(fake_v2):
    fs, job, _ = fake_v2
    with pytest.raises(OSError) as e:
        fs.write_text(job / "cgroup.subtree_control", "+memory")
    assert e.value.errno == errno.EBUSY


@pytest.mark.parametrize("pids", [(RECIPE,), (RECIPE, OTHER)], ids=["alone", "shared"])
def test_v2_check_changes_nothing(tmp_path, monkeypatch, pids):
    """What ``python -m recipe.tools check`` asks before its run (``host_cgroups``) only reads: no process moved, no
    leaf made, no controller enabled, whether the recipe is alone in its cgroup or not. (The earlier code moved
    every process of the cgroup into a leaf ``recipe-procs`` here and left them there.)"""
    fs, job, files = _v2(tmp_path, monkeypatch, pids)
    before = snapshot(job.parent)
    host_cgroups(*files)
    assert snapshot(job.parent) == before


def test_v2_another_process_in_the_cgroup_is_never_moved(fake_v2):
    """Where the recipe's cgroup holds another process, the runs are refused by name (the rule, the pid, the fix)
    and that process stays where it is; a process joins the cgroup afterwards. (The earlier code moved both into a
    leaf and enabled the controllers: the process that joins afterwards got EBUSY.)"""
    fs, job, files = fake_v2
    problem = host_cgroups(*files)
    assert isinstance(problem, str), problem
    assert f"holds 1 process(es) besides this one (e.g. pid {OTHER})" in problem and "no-internal-process" in problem
    assert "moves no process but its own" in problem
    assert fs.procs(job) == [RECIPE, OTHER] and list(job.iterdir()) == [p for p in job.iterdir() if p.is_file()]
    fs.write_text(job / "cgroup.procs", str(LATER))  # a process joins the original cgroup afterwards
    assert fs.procs(job) == [RECIPE, OTHER, LATER]


def test_v2_alone_moves_only_itself_while_it_has_runs_and_restores_after(alone_v2):
    """Alone in its cgroup, the recipe steps into a leaf of its own while it has runs (memory, pids and cpu enabled
    for the runs' groups beside it, their limits written), and after its last group is removed everything is as it
    was found: the process back, the controllers disabled, the leaf gone, and a process joins the original cgroup.
    (The earlier code left the process in ``recipe-procs`` and the controllers on: the join got EBUSY.)"""
    fs, job, files = alone_v2
    before = snapshot(job.parent)
    host = host_cgroups(*files)
    assert isinstance(host, HostCgroups), host
    assert f"{job}/recipe-self-<pid>" in host.describe()
    first = RunGroup.create(host, LIMITS)
    second = RunGroup.create(host, LIMITS)
    leaf = job / f"recipe-self-{RECIPE}"
    assert fs.procs(job) == [] and fs.procs(leaf) == [RECIPE]
    assert (job / "cgroup.subtree_control").read_text().split() == ["memory", "pids", "cpu"]
    run_dir = Path(first._dir("*"))
    assert run_dir.parent == job and (run_dir / "memory.max").read_text() == str(300 * MiB)
    assert (run_dir / "cpu.max").read_text() == "50000 100000" and (run_dir / "pids.max").read_text() == "22"
    fs.write_text(run_dir / "cgroup.procs", str(SANDBOX))  # the sandbox's sh joins its run's group
    assert fs.procs(run_dir) == [SANDBOX] and not first.try_remove()  # populated: EBUSY, nothing restored yet
    fs.exit(SANDBOX)
    assert first.remove() and not run_dir.exists()
    assert fs.procs(leaf) == [RECIPE] and (job / "cgroup.subtree_control").read_text()  # the second run still holds
    assert second.remove()
    assert snapshot(job.parent) == before and not leaf.exists()
    fs.write_text(job / "cgroup.procs", str(LATER))  # a process joins the original cgroup afterwards
    assert fs.procs(job) == [RECIPE, LATER]


def test_v2_a_process_that_joined_since_the_check_is_not_moved(alone_v2):
    """Alone at the check, not at the run: the kernel refuses the controllers (EBUSY), the run's group is not made,
    the recipe's own step is undone and the newcomer stays. (The earlier code had already closed the cgroup at the
    check: the newcomer itself got EBUSY.)"""
    fs, job, files = alone_v2
    host = host_cgroups(*files)
    assert isinstance(host, HostCgroups), host
    fs.write_text(job / "cgroup.procs", str(OTHER))
    before = snapshot(job.parent)
    with pytest.raises(OSError) as e:
        RunGroup.create(host, LIMITS)
    assert e.value.errno == errno.EBUSY and f"1 other process(es) joined it, e.g. pid {OTHER}" in str(e.value)
    assert snapshot(job.parent) == before and sorted(fs.procs(job)) == sorted([RECIPE, OTHER])


def test_v2_groups_left_at_exit_are_emptied_and_the_cgroup_restored(alone_v2):
    """A run's group still populated when the recipe exits (its removal timed out): the exit hooks kill what is in
    it, remove it and put the cgroup back as found. (The earlier code restored nothing, at exit or ever.)"""
    fs, job, files = alone_v2
    before = snapshot(job.parent)
    group = RunGroup.create(host_cgroups(*files), LIMITS)
    fs.write_text(Path(group._dir("*"), "cgroup.procs"), str(SANDBOX))
    fs.exit(SANDBOX)  # what the kill would do to a real one
    cgroup._remove_left_groups()
    cgroup_v2.release_all()
    assert snapshot(job.parent) == before


def test_v2_own_process_that_cannot_move_is_named_and_undone(alone_v2, monkeypatch):
    fs, job, files = alone_v2
    before = snapshot(job.parent)
    real = fs.write_text

    def no_moves(path, text, *a, **kw):
        if Path(path).name == "cgroup.procs" and Path(path).parent.name.startswith(cgroup_v2.LEAF_PREFIX):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path, text, *a, **kw)

    host = host_cgroups(*files)
    monkeypatch.setattr(cgroup.Path, "write_text", no_moves)
    with pytest.raises(OSError) as e:
        RunGroup.create(host, LIMITS)
    assert "Permission denied" in str(e.value) and f"stepping into {job}/recipe-self-{RECIPE}" in str(e.value)
    assert snapshot(job.parent) == before


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


def _cgroup2_mount(tmp_path):
    """(mount point, its mountinfo line) of the whole cgroup v2 hierarchy: this machine's, else one mounted here for
    the test (unmounted by the caller when the second value says so)."""
    def find():
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            if right.split()[:1] == ["cgroup2"] and left.split()[3] == "/":
                return left.split()[4], line
        return None
    found = find()
    if found is not None:
        return (*found, False)
    target = tmp_path / "cg2"
    target.mkdir()
    r = subprocess.run(["mount", "-t", "cgroup2", "none", str(target)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"no cgroup v2 hierarchy here and mount -t cgroup2 failed: {r.stderr.strip()}")
    return (*find(), True)


@pytest.fixture
def real_v2(tmp_path):
    """This process alone in a cgroup of its own on the kernel's cgroup v2 hierarchy, given one controller by its
    parent (here, beside cgroup v1, only ``hugetlb`` is free: the hierarchy and its rules are the kernel's), and
    two sleepers left in this process's own cgroup (processes from outside that may join it); all undone after."""
    top, line, mounted = _cgroup2_mount(tmp_path)
    control = Path(top, "cgroup.subtree_control")
    have, offered = control.read_text().split(), Path(top, "cgroup.controllers").read_text().split()
    real_root = not os.path.exists(os.path.join(top, "cgroup.type"))
    usable = [c for c in ("pids", "memory", "cpu", "hugetlb") if c in have or (real_root and c in offered)]
    own = [ln.split(":", 2)[2] for ln in Path("/proc/self/cgroup").read_text().splitlines() if ln.startswith("0::")]
    if not usable or not own or own[0].startswith("/.."):
        pytest.skip(f"cgroup v2 at {top} gives a new cgroup no controller, or this process is outside it")
    ctrl, orig = usable[0], os.path.normpath(top + own[0])
    enabled_here = ctrl not in have
    c = os.path.join(top, f"recipe-test-v2-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        if enabled_here:
            control.write_text(f"+{ctrl}")  # the real root is exempt from the rule
        os.mkdir(c)
    except OSError as e:
        pytest.skip(f"cannot make a cgroup under {top}: {e}")
    outsiders = [subprocess.Popen(["sleep", "600"]) for _ in range(2)]
    Path(c, "cgroup.procs").write_text(str(os.getpid()))
    (tmp_path / "cgroup").write_text(f"0::{c[len(top):]}\n")
    (tmp_path / "mountinfo").write_text(line + "\n")
    yield c, ctrl, outsiders, (str(tmp_path / "cgroup"), str(tmp_path / "mountinfo"))
    Path(orig, "cgroup.procs").write_text(str(os.getpid()))
    for p in outsiders:
        p.kill()
        p.wait()
    for sub in sorted((d for d in Path(c).rglob("*") if d.is_dir()), reverse=True) + [Path(c)]:
        for pid in Path(sub, "cgroup.procs").read_text().split():
            os.kill(int(pid), signal.SIGKILL)
        deadline = time.monotonic() + 10
        while Path(sub, "cgroup.procs").read_text().split() and time.monotonic() < deadline:
            time.sleep(0.01)
        os.rmdir(sub)
    if enabled_here:
        try:
            control.write_text(f"-{ctrl}")
        except OSError:
            pass  # another cgroup below the root uses it now
    if mounted:
        subprocess.run(["umount", top], check=True)


def _v2_path(pid):
    return [ln for ln in Path(f"/proc/{pid}/cgroup").read_text().splitlines() if ln.startswith("0::")][0][3:]


def test_real_v2_alone_moves_only_itself_and_a_process_joins_afterwards(real_v2, monkeypatch):
    """On the kernel's own cgroup v2, this process alone in cgroup C: the check's question changes nothing; a run
    moves this process into ``recipe-self-<pid>`` below C and enables the controller for the run's group beside it
    (joined by a process, emptied by ``cgroup.kill``); while that lasts the kernel refuses a newcomer to C (EBUSY);
    after the group is removed, C is as found and a process from outside joins it. (The earlier code moved C's
    processes into ``recipe-procs`` for good: the newcomer got EBUSY afterwards too.)"""
    c, ctrl, outsiders, files = real_v2
    monkeypatch.setattr(RunGroup, "_set_limits", lambda self, lim: None)  # only `ctrl` here: no memory.max to write
    before = snapshot(c)
    host = host_cgroups(*files, (ctrl,))
    assert isinstance(host, HostCgroups) and host.v2.move_self, host
    assert snapshot(c) == before
    with pytest.raises(OSError) as e:
        Path(c, "cgroup.subtree_control").write_text(f"+{ctrl}")  # the kernel's rule: C holds this process
    assert e.value.errno == errno.EBUSY
    rel = _v2_path(os.getpid())
    group = RunGroup.create(host, LIMITS)
    try:
        assert _v2_path(os.getpid()) == f"{rel}/recipe-self-{os.getpid()}"
        assert Path(c, "cgroup.subtree_control").read_text().split() == [ctrl]
        runner = _sleeper_in(group.procs_files()[0])
        assert Path(group._dir("*"), "cgroup.controllers").read_text().split() == [ctrl]
        with pytest.raises(OSError) as e:
            Path(c, "cgroup.procs").write_text(str(outsiders[0].pid))
        assert e.value.errno == errno.EBUSY
    finally:
        assert group.remove()
    assert runner.wait(timeout=10) == -signal.SIGKILL
    assert snapshot(c) == before and _v2_path(os.getpid()) == rel
    Path(c, "cgroup.procs").write_text(str(outsiders[0].pid))  # a process joins the original cgroup afterwards
    assert _v2_path(outsiders[0].pid) == rel


def test_real_v2_another_process_in_the_cgroup_is_never_moved(real_v2):
    """On the kernel's own cgroup v2, C holding this process and another: the runs are refused by name, nothing in C
    changes (the other process stays), and a further process joins C afterwards. (The earlier code moved both into
    ``recipe-procs``: the further process got EBUSY.)"""
    c, ctrl, outsiders, files = real_v2
    Path(c, "cgroup.procs").write_text(str(outsiders[0].pid))
    before = snapshot(c)
    problem = host_cgroups(*files, (ctrl,))
    assert isinstance(problem, str) and f"(e.g. pid {outsiders[0].pid})" in problem, problem
    assert snapshot(c) == before and _v2_path(outsiders[0].pid).endswith(os.path.basename(c))
    Path(c, "cgroup.procs").write_text(str(outsiders[1].pid))  # a process joins the original cgroup afterwards
    assert _v2_path(outsiders[1].pid).endswith(os.path.basename(c))


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
