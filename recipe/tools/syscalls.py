"""The sandboxes' system-call allowlist: every call a sandboxed program may make, in groups, each with its reason
(pure data; ``recipe/tools/seccomp.py`` compiles it with libseccomp).

Derived by running the programs of ``tests/support/harness/syscall_corpus.py`` (CPython's standard library, numpy, sympy,
files, threads, subprocesses, multiprocessing, asyncio) under strace with Debian 12's python3 and the recipe's venv
python (``python scripts/derive_sandbox_syscalls.py`` prints what a corpus program calls that is not here), plus the
variants other glibc versions use for the same thing (``statx`` for ``newfstatat``, ``faccessat2``, ``clone3``...).
``tests/tools/test_syscall_allowlist.py`` runs the corpus through the sandboxes under this list.

Everything else gets ENOSYS, the kernel's answer for a call it does not have: glibc then falls back to an older call
where it has one (``clone3`` -> ``clone``), and a call a future kernel adds is denied until it is listed here. Never
allowed, so: new namespaces, mounts, tracing or reading other processes, the keyring, eBPF, perf, io_uring,
userfaultfd, ``memfd_create``, SysV IPC and POSIX message queues (memory outside a process's address space, which
RLIMIT_AS does not count), ``personality``, ``modify_ldt``, kernel modules, kexec, clocks, swap, reboot.
"""
from __future__ import annotations

import errno
from dataclasses import dataclass

# (reason, names): the unconditional part of the allowlist.
GROUPS: dict[str, tuple[str, tuple[str, ...]]] = {
    "start": ("exec the interpreter, load its shared libraries, set up its thread area (glibc's start-up)", (
        "execve", "execveat", "brk", "arch_prctl", "set_tid_address", "set_robust_list", "rseq", "prctl",
        "getrandom", "uname", "sysinfo", "getcpu",
    )),
    "memory": ("the allocator, mmap'd files and numpy's huge-page and NUMA hints; all counted by RLIMIT_AS/the cgroup", (
        "mmap", "munmap", "mprotect", "mremap", "madvise", "msync", "mincore", "mbind", "get_mempolicy",
        "set_mempolicy", "membarrier",
    )),
    "files": ("read the interpreter's tree and the program; read and write the scratch directory (the filesystem "
              "rules, bwrap's mounts or Landlock, say where)", (
        "read", "write", "pread64", "pwrite64", "readv", "writev", "preadv", "pwritev", "preadv2", "pwritev2",
        "open", "openat", "creat", "close", "close_range", "lseek", "dup", "dup2", "dup3", "fcntl", "flock",
        "fsync", "fdatasync", "ftruncate", "fadvise64", "sendfile", "copy_file_range",
        "stat", "fstat", "lstat", "newfstatat", "statx", "statfs", "fstatfs", "access", "faccessat", "faccessat2",
        "readlink", "readlinkat", "getdents", "getdents64", "getcwd", "chdir", "fchdir", "umask",
        "mkdir", "mkdirat", "rmdir", "unlink", "unlinkat", "rename", "renameat", "renameat2", "link", "linkat",
        "symlink", "symlinkat", "chmod", "fchmod", "fchmodat", "utime", "utimes", "utimensat", "futimesat",
        "mknod", "mknodat", "getxattr", "lgetxattr", "fgetxattr", "listxattr", "llistxattr", "flistxattr",
    )),
    "path_truncate": ("truncate a file by name (os.truncate); Landlock controls it only from its ABI 3 on, so the "
                      "landlock sandbox allows it only there", ("truncate",)),
    "processes": ("fork, wait and exec children (subprocess, multiprocessing), threads (clone is allowed only "
                  "without a CLONE_NEW* flag: below)", ("fork", "vfork", "wait4", "waitid", "setsid", "setpgid")),
    "identity": ("who am I: getpid, uids and groups, process group and session (never set)", (
        "getpid", "getppid", "gettid", "getpgrp", "getpgid", "getsid", "getuid", "geteuid", "getgid", "getegid",
        "getgroups", "getresuid", "getresgid",
    )),
    "exit": ("end a thread or the process", ("exit", "exit_group")),
    "signals": ("signal handlers, masks, alarms and faulthandler's alternate stack", (
        "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "rt_sigpending", "rt_sigsuspend", "rt_sigtimedwait",
        "sigaltstack", "pause", "restart_syscall", "signalfd4", "alarm", "getitimer", "setitimer",
    )),
    "time": ("clocks, sleeps and timers (reading; setting a clock is never allowed)", (
        "clock_gettime", "clock_getres", "clock_nanosleep", "gettimeofday", "time", "nanosleep", "timer_create",
        "timer_settime", "timer_gettime", "timer_getoverrun", "timer_delete", "timerfd_create", "timerfd_settime",
        "timerfd_gettime", "times", "getrusage",
    )),
    "scheduling": ("thread synchronisation, yielding, CPU affinity and scheduling, read (affinity and nice are "
                   "set for this process only, a scheduling class never: below)", (
        "futex", "futex_waitv", "sched_yield", "sched_getaffinity", "sched_getparam", "sched_getscheduler",
        "sched_get_priority_max", "sched_get_priority_min", "getrlimit",
    )),
    "events": ("pipes, select/poll/epoll and eventfd (subprocess, asyncio, multiprocessing)", (
        "pipe", "pipe2", "select", "pselect6", "poll", "ppoll", "epoll_create", "epoll_create1", "epoll_ctl",
        "epoll_wait", "epoll_pwait", "epoll_pwait2", "eventfd", "eventfd2",
    )),
    "socketpair": ("a connected pair of unix sockets (asyncio's self-pipe, multiprocessing.Pipe): reaches no other "
                   "process", ("socketpair", "sendto", "recvfrom", "sendmsg", "recvmsg", "sendmmsg", "recvmmsg",
                               "shutdown", "getsockopt", "getsockname", "getpeername")),
    "sockets": ("sockets of the sandbox's own network namespace (bwrap's --unshare-net: a loopback and nothing "
                "else), for programs that try the network and get 'Network is unreachable'", (
        "connect", "bind", "listen", "accept", "accept4",
    )),
}

# Conditional rules: the call is allowed only with these arguments.
CLONE_NEW_FLAGS = {
    "CLONE_NEWNS": 0x00020000, "CLONE_NEWCGROUP": 0x02000000, "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000, "CLONE_NEWUSER": 0x10000000, "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000, "CLONE_NEWTIME": 0x00000080,
}
CLONE_NEW_MASK = sum(CLONE_NEW_FLAGS.values())
# isatty (TCGETS), the window size, bytes ready, non-blocking and close-on-exec flags: what CPython and bash ask.
IOCTLS = {"TCGETS": 0x5401, "TIOCGPGRP": 0x540F, "TIOCGWINSZ": 0x5413, "FIONREAD": 0x541B, "FIONBIO": 0x5421,
          "FIONCLEX": 0x5450, "FIOCLEX": 0x5451}
AF_UNIX, AF_INET, AF_INET6, AF_MAX = 1, 2, 10, 46
# Every rule below that allows a call compares an argument with ``eq``: libseccomp compares all 64 bits of the
# register, so a value with bits above what the kernel reads (an ``int``: 32) never equals an allowed one and is
# denied. Never ``ne``/``ge`` on an ``int`` argument in an allow rule: ``level = SOL_SOCKET | 1 << 32`` is "not
# SOL_SOCKET" to the filter and SOL_SOCKET to the kernel (tests/tools/test_syscall_allowlist.py and
# test_syscall_holes.py check both).
# setsockopt: the levels a Python program uses, by exact value; at SOL_SOCKET nothing that raises a socket's buffers
# (SO_SNDBUF, SO_RCVBUF and their FORCE forms): kernel memory outside the address space (up to net.core.wmem_max each,
# any size with FORCE and CAP_NET_ADMIN), which a cgroup v1 may not charge and RLIMIT_AS never does.
SOL_SOCKET = 1
SOCKET_LEVELS = {"SOL_IP": 0, "SOL_TCP": 6, "SOL_UDP": 17, "SOL_IPV6": 41}
SOCKET_OPTIONS = {"SO_DEBUG": 1, "SO_REUSEADDR": 2, "SO_DONTROUTE": 5, "SO_BROADCAST": 6, "SO_KEEPALIVE": 9,
                  "SO_OOBINLINE": 10, "SO_PRIORITY": 12, "SO_LINGER": 13, "SO_REUSEPORT": 15, "SO_PASSCRED": 16,
                  "SO_RCVLOWAT": 18, "SO_SNDLOWAT": 19, "SO_RCVTIMEO_OLD": 20, "SO_SNDTIMEO_OLD": 21,
                  "SO_TIMESTAMP": 29, "SO_RCVTIMEO_NEW": 66, "SO_SNDTIMEO_NEW": 67}
# Calls that take a pid and change that process: allowed for the caller itself (pid 0) only. setrlimit/prlimit64
# carry their values in memory, which a filter cannot read: each sandbox's launcher sets every hard limit to its
# soft one and the program runs without CAP_SYS_RESOURCE, so the kernel lets it only lower a limit.
SELF_ONLY = {"prlimit64": 0, "setrlimit": None, "sched_setaffinity": 0}  # the argument holding the pid (None: none)
# getpriority/setpriority(which, who, nice): PRIO_PROCESS and the caller only (PRIO_USER or PRIO_PGRP would reach
# every process of the uid: the trainer's, Ray's and vLLM's under the landlock sandbox). Raising the priority needs
# RLIMIT_NICE, which the launchers set to 0. A scheduling class or real-time priority (sched_setscheduler,
# sched_setparam, sched_setattr: SCHED_FIFO...) is never set.
PRIO_PROCESS = 0
PRIORITY = ("getpriority", "setpriority")
# Denied with ENOSYS on purpose, though glibc calls them: it then falls back to a call the filter can check.
FALLBACK = {"clone3": "its flags sit in memory a seccomp filter cannot read; glibc falls back to clone, checked above"}
SIGNALS = ("kill", "tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo")
SPAWN = ("clone", "clone3", "fork", "vfork")


@dataclass(frozen=True)
class Policy:
    """What differs between the sandboxes. bwrap's: processes, and sockets inside its own network namespace.
    The landlock sandbox (no namespaces): one process, one thread (nothing else can count them per sandbox), no
    ``socket()`` at all, signals only to itself."""

    processes: bool = True  # fork/clone/threads; False: they fail with EAGAIN (named ``process_limit``)
    sockets: bool = True  # socket() for AF_UNIX/AF_INET/AF_INET6; only inside a private network namespace
    signal_pid: int | None = None  # signals only to this pid (and 0: its own process group); None: any
    path_truncate: bool = True  # truncate(path): where the filesystem rules govern it
    fallocate: bool = True  # False: EOPNOTSUPP (glibc's posix_fallocate then writes), where no mount caps the scratch


@dataclass(frozen=True)
class Rule:
    action: str  # "allow" or an errno name
    name: str
    args: tuple[tuple[int, str, int, int], ...] = ()  # (argument, "eq" | "ne" | "masked_eq" | "ge", value, mask)


def rules(policy: Policy) -> list[Rule]:
    """The allowlist for ``policy``, as rules; the default for every other call is ENOSYS."""
    out = []
    for group, (_, names) in GROUPS.items():
        if group == "path_truncate" and not policy.path_truncate:
            continue
        if group == "processes" and not policy.processes:
            out += [Rule("allow", n) for n in names if n not in SPAWN and n not in ("setsid", "setpgid")]
            continue
        if group == "sockets" and not policy.sockets:
            continue
        out += [Rule("allow", n) for n in names]
    if policy.processes:
        out.append(Rule("allow", "clone", ((0, "masked_eq", 0, CLONE_NEW_MASK),)))
    else:
        out += [Rule("EAGAIN", n) for n in SPAWN]
    out += [Rule("allow", "ioctl", ((1, "eq", v, 0),)) for v in IOCTLS.values()]
    if policy.sockets:
        allowed = (AF_UNIX, AF_INET, AF_INET6)
        out += [Rule("allow", "socket", ((0, "eq", f, 0),)) for f in allowed]
        out += [Rule("EAFNOSUPPORT", "socket", ((0, "eq", f, 0),)) for f in range(AF_MAX) if f not in allowed]
        out.append(Rule("EAFNOSUPPORT", "socket", ((0, "ge", AF_MAX, 0),)))
    else:
        out.append(Rule("EAFNOSUPPORT", "socket"))
    out += [Rule("allow", "socketpair", ((0, "eq", AF_UNIX, 0),))]
    out += [Rule("allow", "setsockopt", ((1, "eq", v, 0),)) for v in SOCKET_LEVELS.values()]
    out += [Rule("allow", "setsockopt", ((1, "eq", SOL_SOCKET, 0), (2, "eq", v, 0))) for v in SOCKET_OPTIONS.values()]
    for name, arg in SELF_ONLY.items():
        out.append(Rule("allow", name, () if arg is None else ((arg, "eq", 0, 0),)))
    for who in dict.fromkeys((0, policy.signal_pid if policy.signal_pid is not None else 0)):
        out += [Rule("allow", n, ((0, "eq", PRIO_PROCESS, 0), (1, "eq", who, 0))) for n in PRIORITY]
    out += [Rule("allow" if policy.fallocate else "EOPNOTSUPP", "fallocate")]
    if policy.signal_pid is None:
        out += [Rule("allow", n) for n in SIGNALS]
    else:
        pid = policy.signal_pid
        out += [Rule("allow", "kill", ((0, "eq", pid, 0),)), Rule("allow", "kill", ((0, "eq", 0, 0),)),
                Rule("allow", "tkill", ((0, "eq", pid, 0),)), Rule("allow", "tgkill", ((0, "eq", pid, 0),)),
                Rule("allow", "rt_sigqueueinfo", ((0, "eq", pid, 0),)),
                Rule("allow", "rt_tgsigqueueinfo", ((0, "eq", pid, 0),))]
    return out


def allowed_names(policy: Policy = Policy()) -> set[str]:
    """Every call ``policy`` allows in some form (for the derivation script's report)."""
    return {r.name for r in rules(policy) if r.action == "allow"}


ERRNOS = {"EAGAIN": errno.EAGAIN, "EAFNOSUPPORT": errno.EAFNOSUPPORT, "EOPNOTSUPP": errno.EOPNOTSUPP}
