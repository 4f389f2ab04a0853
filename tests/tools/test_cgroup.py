"""Where a run's cgroup goes: found from ``/proc/self/cgroup`` and ``/proc/self/mountinfo`` (here: written to a
tmp dir in the formats the kernel uses), and the run's group on this machine for real when this process may make one."""

import os

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


def test_v2_group_with_processes_of_its_own_is_named(tmp_path, monkeypatch):
    """cgroup v2 refuses controllers to the children of a group that holds processes (EBUSY): said so, by name."""
    d = tmp_path / "job"
    d.mkdir()
    (d / "cgroup.subtree_control").write_text("")

    def busy(self, text):
        raise OSError(16, "Device or resource busy")

    monkeypatch.setattr(cgroup.Path, "write_text", busy)
    problem = cgroup._enable_v2_controllers(str(d))
    assert "memory, pids, cpu" in problem and "processes of its own" in problem


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
