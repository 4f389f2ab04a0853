"""The sandbox's seccomp filter, compiled by libseccomp (PyPI's ``pyseccomp``, a ctypes binding to Debian's
``libseccomp2``), never hand-written BPF; bwrap loads it with ``--seccomp FD`` right before it runs the program.

Denied with EPERM (the program gets a Python ``OSError``, not a crash): what a Python program for a math or code
task never needs and what widens the kernel's attack surface: new namespaces (``unshare``, ``setns``, ``clone``
with a ``CLONE_NEW*`` flag), mounts, tracing other processes and reading their memory, the kernel keyring, eBPF,
perf events, kernel modules and kexec, and a few more (:data:`DENIED`). ``clone3`` gets ENOSYS instead: its flags
sit in memory a filter cannot read, and ENOSYS makes glibc fall back to ``clone``, which is filtered.
"""

from __future__ import annotations

import errno
import functools
import os

PIN = "pyseccomp==0.1.2"
DENIED = (
    # namespaces
    "unshare", "setns",
    # mounts and the root
    "mount", "umount2", "pivot_root", "chroot", "fsopen", "fsconfig", "fsmount", "fspick", "move_mount",
    "open_tree", "mount_setattr",
    # other processes
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    # the kernel keyring
    "keyctl", "add_key", "request_key",
    # eBPF, perf, userfaultfd
    "bpf", "perf_event_open", "userfaultfd",
    # the kernel itself
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "reboot", "swapon", "swapoff",
    "acct", "quotactl", "syslog", "iopl", "ioperm", "open_by_handle_at", "name_to_handle_at", "lookup_dcookie",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
)
CLONE_NEW_FLAGS = {
    "CLONE_NEWNS": 0x00020000, "CLONE_NEWCGROUP": 0x02000000, "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000, "CLONE_NEWUSER": 0x10000000, "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000, "CLONE_NEWTIME": 0x00000080,
}


class SeccompUnavailable(RuntimeError):
    """libseccomp or its binding is missing: the sandbox refuses to run without the filter."""


@functools.lru_cache(maxsize=1)
def filter_bpf() -> bytes:
    """The compiled filter (BPF program bytes) for this machine's architecture; built once per process."""
    try:
        import pyseccomp as sc
    except (ImportError, OSError) as e:  # OSError: the binding loads libseccomp.so.2 at import
        raise SeccompUnavailable(
            f"the sandbox's seccomp filter needs libseccomp: pip install {PIN} and apt-get install libseccomp2 ({e})"
        ) from e
    f = sc.SyscallFilter(defaction=sc.ALLOW)
    deny = sc.ERRNO(errno.EPERM)
    for name in DENIED:  # libseccomp skips a syscall this architecture lacks (e.g. iopl on arm64)
        f.add_rule(deny, name)
    for flag in CLONE_NEW_FLAGS.values():
        f.add_rule(deny, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    fd = os.memfd_create("seccomp-bpf")
    try:
        with os.fdopen(os.dup(fd), "wb") as out:
            f.export_bpf(out)
        os.lseek(fd, 0, os.SEEK_SET)
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def filter_fd() -> int:
    """A fresh readable fd holding the filter, for bwrap's ``--seccomp FD`` (bwrap reads it once; caller closes)."""
    data = filter_bpf()
    fd = os.memfd_create("sandbox-seccomp")
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
