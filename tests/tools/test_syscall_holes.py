"""The seccomp filter against the holes a review found (issue 45), through the compiled filter itself: a child loads
it as uid 4242 (a non-root user, as a sandboxed program runs) and makes the raw system call with the arguments the
kernel would truncate or act on; a victim process of the same uid stands in for the trainer, Ray and vLLM.

For both policies: bubblewrap's (``Policy()``) and the landlock sandbox's (one process, signals to itself only).
Raw system call numbers are x86_64's.
"""
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UID = 4242
POLICIES = {"bubblewrap": {}, "landlock": {"processes": False, "sockets": False, "fallocate": False}}

pytestmark = [
    pytest.mark.skipif(platform.machine() != "x86_64", reason="raw x86_64 system call numbers"),
    pytest.mark.skipif(os.geteuid() != 0, reason="dropping to uid 4242 (a victim of the same uid) needs root"),
]

CHILD = r"""
import ctypes, errno, json, os, socket, sys
from recipe.tools import seccomp
from recipe.tools.syscalls import Policy
kw = json.loads(sys.argv[1])
if "processes" in kw:
    kw["signal_pid"] = os.getpid()
f = seccomp.compile_filter(Policy(**kw))
a, b = socket.socketpair()
os.setgroups([]); os.setresgid(4242, 4242, 4242); os.setresuid(4242, 4242, 4242)
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[a if isinstance(a, ctypes.c_void_p) else ctypes.c_long(a) for a in args])
    return "ok" if r >= 0 else errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno())
value = ctypes.c_int(8 << 20)
int_p = ctypes.cast(ctypes.pointer(value), ctypes.c_void_p)
f.load()
exec(sys.argv[2])
"""


def under_filter(policy: str, code: str) -> dict:
    """Run ``code`` (which fills the dict ``out``) in a child under ``policy``'s filter as uid 4242."""
    r = subprocess.run([sys.executable, "-c", CHILD + "\nprint('OUT', json.dumps(out))", json.dumps(POLICIES[policy]),
                        "out = {}\n" + code], cwd=REPO, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    lines = [line for line in r.stdout.splitlines() if line.startswith("OUT ")]
    assert r.returncode == 0 and lines, r.stdout + r.stderr
    return json.loads(lines[-1][4:])


@pytest.fixture
def victim():
    """A process of uid 4242 outside any sandbox (the trainer's, Ray's, vLLM's under the landlock sandbox)."""
    p = subprocess.Popen(["sleep", "120"], user=UID, group=UID, extra_groups=[])
    yield p.pid
    p.kill()
    p.wait()


@pytest.fixture
def shared_dir():
    """A directory uid 4242 may write (pytest's own are root's only)."""
    d = tempfile.mkdtemp(prefix="syscall-holes-")
    os.chmod(d, 0o777)
    yield d
    shutil.rmtree(d)


def nice(pid: int) -> int:
    raw = Path(f"/proc/{pid}/stat").read_text()
    return int(raw[raw.rindex(")") + 2:].split()[16])


@pytest.mark.parametrize("policy", POLICIES)
def test_setsockopt_cannot_raise_a_buffer_through_the_high_bits(policy):
    """``level = SOL_SOCKET | 1 << 32``: the kernel reads SOL_SOCKET (an ``int``); the old ``ne`` rule let it pass and
    SO_SNDBUF went from 212,992 to 8,388,608. Every spelling of the buffer options is denied; ordinary ones pass."""
    out = under_filter(policy, """
SOL, SNDBUF, RCVBUF, SNDBUFFORCE, RCVBUFFORCE = 1, 7, 8, 32, 33
before = a.getsockopt(SOL, SNDBUF)
for name, level, opt in (("high level", SOL | 1 << 32, SNDBUF), ("high level rcv", SOL | 1 << 32, RCVBUF),
                         ("high level force", SOL | 1 << 32, SNDBUFFORCE), ("high optname", SOL, SNDBUF | 1 << 32),
                         ("plain", SOL, SNDBUF), ("force", SOL, RCVBUFFORCE)):
    out[name] = call(54, a.fileno(), level, opt, int_p, 4)
out["grew"] = a.getsockopt(SOL, SNDBUF) != before or a.getsockopt(SOL, RCVBUF) > 2 * 212992 * 4
out["reuseaddr"] = call(54, a.fileno(), SOL, 2, int_p, 4)
out["tcp level"] = call(54, a.fileno(), 6, 1, int_p, 4)  # TCP_NODELAY on a unix socket: the kernel's answer
""")
    assert out.pop("grew") is False, out
    assert out.pop("reuseaddr") == "ok" and out.pop("tcp level") in ("EOPNOTSUPP", "ENOTSUP"), out
    assert set(out.values()) == {"ENOSYS"}, out


@pytest.mark.parametrize("policy", POLICIES)
def test_setpriority_reaches_the_caller_only(policy, victim):
    """``setpriority(PRIO_USER, 0, 19)`` passed the old "self only" check (it tested ``who`` alone) and reniced every
    process of the uid; ``PRIO_PROCESS`` with another pid must not pass either (the check on the right argument)."""
    out = under_filter(policy, f"""
out["user"] = call(141, 2, 0, 19)  # PRIO_USER, this uid
out["pgrp"] = call(141, 1, 0, 19)  # PRIO_PGRP, this process group
out["user by uid"] = call(141, 2, 4242, 19)
out["other pid"] = call(141, 0, {victim}, 19)
out["other pid high bits"] = call(141, 0, 1 << 32, 19)
out["read user"] = call(140, 2, 0)
out["read other"] = call(140, 0, {victim})
out["self"] = call(141, 0, 0, 5)
out["read self"] = call(140, 0, 0)
""")
    assert nice(victim) == 0, out
    assert out.pop("self") == "ok" and out.pop("read self") == "ok", out
    assert set(out.values()) == {"ENOSYS"}, out


@pytest.mark.parametrize("policy", POLICIES)
def test_no_scheduling_class_is_ever_set(policy):
    """SCHED_FIFO priority 50 succeeded as root under the landlock sandbox: sched_setscheduler, sched_setparam and
    sched_setattr are denied by the filter (ENOSYS), whatever the uid (not left to EPERM)."""
    out = under_filter(policy, """
param = ctypes.c_int(50)
p = ctypes.cast(ctypes.pointer(param), ctypes.c_void_p)
out["setscheduler fifo"] = call(144, 0, 1, p)
out["setscheduler batch"] = call(144, 0, 3, p)
out["setparam"] = call(142, 0, p)
attr = (ctypes.c_uint32 * 14)(56, 1, 0, 0, 0, 50)
out["setattr"] = call(314, 0, ctypes.cast(attr, ctypes.c_void_p), 0)
""")
    assert set(out.values()) == {"ENOSYS"}, out


@pytest.mark.parametrize("policy", POLICIES)
def test_fallocate_only_where_a_mount_caps_the_scratch(policy, shared_dir):
    """The landlock sandbox's scratch may lie on the host's disk: ``fallocate`` took 3 GiB in 21-50 ms before the
    0.1 s watch saw it. There it answers EOPNOTSUPP (glibc's posix_fallocate then writes, bounded by RLIMIT_FSIZE);
    bubblewrap's scratch is a size-capped tmpfs, which the kernel bounds."""
    out = under_filter(policy, f"""
fd = os.open({os.path.join(shared_dir, 'f')!r}, os.O_CREAT | os.O_WRONLY, 0o600)
out["keep size"] = call(285, fd, 1, 0, 1 << 20)  # FALLOC_FL_KEEP_SIZE: beyond RLIMIT_FSIZE's reach
out["plain"] = call(285, fd, 0, 0, 1 << 20)
""")
    want = "ok" if policy == "bubblewrap" else "ENOTSUP"  # errno's name for EOPNOTSUPP on Linux
    assert out == {"keep size": want, "plain": want}, out
