"""Hostile programs every sandbox must hold: each is denied (it prints ``DENIED <errno>`` and goes on) or ends in a
named limit; none may print ``ESCAPED``. Raw system call numbers are x86_64's. Shared by tests/tools/test_bwrap_sandbox.py, test_landlock_sandbox.py and
test_docker_nonroot.py (the non-root, no-user-namespace, read-only-cgroup setting).

Each program is written for the test limits those files use (256 MiB, 16 processes, 8 MiB of scratch); ``outcomes``
are the statuses it may end in besides ``ok`` with ``DENIED`` printed, per sandbox kind.
"""
from __future__ import annotations

from dataclasses import dataclass, field

_PRELUDE = """
import ctypes, errno, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def denied(what):
    print('DENIED', what, errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno()), flush=True)
def escaped(what):
    print('ESCAPED', what, flush=True)
"""


@dataclass(frozen=True)
class Hostile:
    name: str
    code: str
    outcomes: dict  # sandbox kind ("bubblewrap" | "landlock") -> statuses it may end in other than denied
    limits: dict = field(default_factory=dict)  # overrides of the test limits (8 x 900 MiB needs 1 GiB to mean it)


def _p(body: str) -> str:
    return _PRELUDE + body


HOSTILE = (
    Hostile("memfd_create_and_write", _p("""
held = 0
for i in range(8):
    try:
        fd = os.memfd_create("m")  # memory outside RLIMIT_AS
    except OSError as e:
        ctypes.set_errno(e.errno); denied('memfd_create'); break
    os.write(fd, b"x" * (64 << 20)); held += 64
else:
    escaped(f'{held} MiB in memfds')
"""), {"bubblewrap": {"memory_limit"}, "landlock": set()}),
    Hostile("sysv_shm", _p("""
libc.shmat.restype = ctypes.c_void_p
sid = libc.shmget(0, 64 << 20, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
if sid < 0:
    denied('shmget')
else:
    addr = libc.shmat(sid, None, 0); ctypes.memset(addr, 1, 64 << 20); escaped('64 MiB of SysV shm')
"""), {"bubblewrap": set(), "landlock": set()}),
    Hostile("sysv_msg_and_posix_mq", _p("""
if libc.msgget(0, 0o1600) < 0: denied('msgget')
else: escaped('a SysV message queue')
if libc.syscall(240, b"/q", 0o100 | 0o2, 0o600, None) < 0: denied('mq_open')
else: escaped('a POSIX message queue')
"""), {"bubblewrap": set(), "landlock": set()}),
    Hostile("io_uring_setup", _p("""
params = (ctypes.c_char * 120)()
fd = libc.syscall(425, 8, params)
denied('io_uring_setup') if fd < 0 else escaped('an io_uring')
"""), {"bubblewrap": set(), "landlock": set()}),
    Hostile("af_vsock", _p("""
import socket
try:
    s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
    escaped('an AF_VSOCK socket')
except OSError as e:
    ctypes.set_errno(e.errno); denied('socket(AF_VSOCK)')
"""), {"bubblewrap": set(), "landlock": set()}),
    Hostile("userfaultfd", _p("""
denied('userfaultfd') if libc.syscall(323, 0) < 0 else escaped('a userfaultfd')
"""), {"bubblewrap": set(), "landlock": set()}),
    Hostile("user_namespaces", _p("""
denied('unshare(CLONE_NEWUSER)') if libc.unshare(0x10000000) < 0 else escaped('a user namespace (unshare)')
pid = libc.syscall(56, 0x10000000 | 17, None, None, None, None)  # raw clone(CLONE_NEWUSER | SIGCHLD)
if pid == 0:
    os._exit(0)
if pid < 0:
    denied('clone(CLONE_NEWUSER)')
else:
    os.waitpid(pid, 0); escaped('a user namespace (clone)')
args = (ctypes.c_uint64 * 11)(0x10000000, 0, 0, 0, 17)  # struct clone_args: flags, pidfd, child_tid, parent_tid, exit_signal
pid = libc.syscall(435, args, ctypes.sizeof(args))  # clone3: its flags are in memory, out of a filter's sight
if pid == 0:
    os._exit(0)
if pid < 0:
    denied('clone3(CLONE_NEWUSER)')
else:
    os.waitpid(pid, 0); escaped('a user namespace (clone3)')
"""), {"bubblewrap": set(), "landlock": set()}),
    Hostile("personality_and_ldt", _p("""
denied('personality') if libc.personality(0x0040000) < 0 else escaped('personality(ADDR_NO_RANDOMIZE)')
buf = (ctypes.c_char * 16)()
denied('modify_ldt') if libc.syscall(154, 1, buf, 16) < 0 else escaped('modify_ldt')
"""), {"bubblewrap": set(), "landlock": set()}),
    Hostile("ptrace_parent", _p("""
denied('ptrace(ATTACH, parent)') if libc.ptrace(16, os.getppid(), None, None) < 0 else escaped('ptrace attach')
"""), {"bubblewrap": set(), "landlock": set()}),
    Hostile("socket_buffers", _p("""
import socket
pairs, held = [], 0
for i in range(120):  # 120 pairs x up to net.core.wmem_max (4 MiB here): kernel memory outside RLIMIT_AS
    a, b = socket.socketpair()
    a.setblocking(False)
    try:
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    except OSError as e:
        ctypes.set_errno(e.errno); denied('setsockopt(SO_SNDBUF)'); break
    try:
        while True:
            held += a.send(b"x" * 65536)
    except BlockingIOError:
        pass
    pairs.append((a, b))
else:
    escaped(f'{held >> 20} MiB in socket buffers') if held > (256 << 20) else print('held', held >> 20)
"""), {"bubblewrap": {"memory_limit"}, "landlock": set()}),
    Hostile("children_900mib", """
import os, time
pids = []
for _ in range(8):
    pid = os.fork()
    if pid == 0:
        x = b'x' * (900 * 1024 * 1024)
        time.sleep(1)
        os._exit(0)
    pids.append(pid)
if all(os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) == 0 for p in pids):
    print('ESCAPED 8 x 900 MiB')
""", {"bubblewrap": {"memory_limit"}, "landlock": {"process_limit"}}, {"memory_bytes": 1 << 30, "cpu_time_s": 30}),
    Hostile("fork_bomb", "import os\nwhile True:\n    os.fork()\n",
            {"bubblewrap": {"process_limit"}, "landlock": {"process_limit"}}),
    Hostile("thread_bomb", "import threading, time\nfor _ in range(1000):\n"
            "    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\nprint('ESCAPED 1000 threads')\n",
            {"bubblewrap": {"process_limit"}, "landlock": {"process_limit"}}),
    Hostile("tmpfs_inodes", """
import os
n = 0
while True:  # empty files: no blocks, only inodes (the scratch's size cap alone does not stop it)
    os.close(os.open(f'{n}', os.O_CREAT | os.O_WRONLY, 0o600))
    n += 1
""", {"bubblewrap": {"memory_limit", "disk_limit"}, "landlock": {"disk_limit"}}, {"cpu_time_s": 60}),
)

BY_NAME = {h.name: h for h in HOSTILE}
# What the seccomp allowlist answers (recipe/tools/syscalls.py): a DENIED line with another errno was refused by
# something else, which a sandbox must not rely on.
FILTER_ERRNOS = {"ENOSYS", "EAFNOSUPPORT", "EAGAIN"}

# Tries to raise every resource limit and its own priority, printing RAISED or held for each: setrlimit's values sit
# in memory, where a seccomp filter cannot look, so the launchers must leave nothing to raise (hard = soft, no
# CAP_SYS_RESOURCE, RLIMIT_NICE 0).
RAISE_LIMITS = (
        "import os, resource as r\n"
        "for name in ('RLIMIT_AS', 'RLIMIT_STACK', 'RLIMIT_FSIZE', 'RLIMIT_NOFILE', 'RLIMIT_MEMLOCK', 'RLIMIT_NICE'):\n"
        "    k = getattr(r, name); soft, hard = r.getrlimit(k)\n"
        "    for new in ((hard, hard + 1), (soft + 1, hard)) if hard != r.RLIM_INFINITY else ((hard, hard),):\n"
        "        try:\n"
        "            r.setrlimit(k, new); print('RAISED', name, (soft, hard), new)\n"
        "        except (ValueError, OSError):\n"
        "            print('held', name)\n"
        "try:\n"
        "    os.setpriority(os.PRIO_PROCESS, 0, -1); print('RAISED priority')\n"
        "except OSError:\n"
        "    print('held priority')\n"
)
