"""The landlock sandbox's launcher: confine this process, then become the program (``python -m recipe.tools.confine
SPEC``, started by ``recipe/tools/landlock_sandbox.py`` in a session of its own).

Runs under the recipe's own interpreter (it needs ``pyseccomp`` and ``landlock``), in this order: the per-process
limits (RLIMIT_CPU, RLIMIT_AS, RLIMIT_FSIZE, RLIMIT_NOFILE, RLIMIT_CORE 0, RLIMIT_NICE and RLIMIT_RTPRIO 0, then every
other hard limit lowered to its soft one: the program can only lower a limit); started as root, a mount namespace of
its own with a size-capped tmpfs on the scratch directory (the kernel bounds it; it goes with the program's last
process); Landlock (read and execute only the interpreter's tree and the program, write only the scratch directory);
started as root, the drop to the sandbox's uid and gid with no supplementary groups, which clears every capability
(checked: none may survive); ``no_new_privs`` and the seccomp allowlist for one process (no fork, no threads, no
``socket()``, signals only to itself), then ``execve`` of the sandbox's python with a fixed environment. Nothing of
the trainer's environment or file descriptors reaches the program. A failure here exits 125 with one line on stderr
starting ``sandbox:``.
"""
from __future__ import annotations

import json
import os
import resource
import sys


CLONE_NEWNS, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 0x00020000, 2, 4, 8, 16384, 1 << 18
CAPS = ("CapPrm", "CapEff", "CapAmb")


def pin_limits(lim: dict) -> None:
    """The run's limits, then every other hard limit lowered to its soft one (RLIMIT_CPU keeps its extra second:
    SIGXCPU before SIGKILL names ``cpu_limit``)."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CPU, (lim["cpu"], lim["cpu"] + 1))
    resource.setrlimit(resource.RLIMIT_AS, (lim["memory"], lim["memory"]))
    resource.setrlimit(resource.RLIMIT_FSIZE, (lim["file"], lim["file"]))
    resource.setrlimit(resource.RLIMIT_NOFILE, (lim["files"], lim["files"]))
    resource.setrlimit(resource.RLIMIT_NICE, (0, 0))
    resource.setrlimit(resource.RLIMIT_RTPRIO, (0, 0))
    for name in dir(resource):
        if name.startswith("RLIMIT_") and name != "RLIMIT_CPU":
            which = getattr(resource, name)
            soft = resource.getrlimit(which)[0]
            resource.setrlimit(which, (soft, soft))


def mount_scratch(path: str, tmpfs: dict, uid: int) -> bool:
    """A tmpfs of ``tmpfs["bytes"]`` and ``tmpfs["inodes"]`` on ``path``, in a mount namespace of this process's own
    (nothing to unmount: it ends with the program). False where this root may not (no CAP_SYS_ADMIN: Docker's
    default root); the supervisor's watch then measures the directory on the host's disk."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNS) != 0:
        return False
    if libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        raise OSError(ctypes.get_errno(), "cannot make this mount namespace private")
    opts = f"size={tmpfs['bytes']},nr_inodes={tmpfs['inodes']},mode=0700,uid={uid},gid={uid}".encode()
    if libc.mount(b"tmpfs", path.encode(), b"tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, opts) != 0:
        raise OSError(ctypes.get_errno(), f"cannot mount the scratch tmpfs on {path}")
    return True


def drop_to(uid: int) -> None:
    """Become ``uid``/``uid`` with no supplementary groups: the kernel clears the permitted, effective and ambient
    capabilities on the change from root; refuse if any is left (a SECBIT_KEEP_CAPS/NO_SETUID_FIXUP parent)."""
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    with open("/proc/self/status") as f:
        left = [line.split(":")[0] for line in f if line.split(":")[0] in CAPS and int(line.split()[1], 16)]
    if left or os.geteuid() == 0:
        raise PermissionError(f"capabilities {left} survived the drop to uid {uid}")


def main(spec: dict) -> None:
    from recipe.tools import landlock, seccomp
    from recipe.tools.syscalls import Policy

    pin_limits(spec["limits"])
    uid = spec.get("uid")
    if spec.get("tmpfs") and uid is not None:
        mount_scratch(spec["scratch"], spec["tmpfs"], uid)
    os.chdir(spec["scratch"])  # after the mount: the tmpfs, not the directory beneath it
    pid = os.getpid()
    version = landlock.abi()
    if isinstance(version, str):
        raise OSError(version)
    # compiled before Landlock applies: libseccomp and its binding live outside what the program may read
    syscall_filter = seccomp.compile_filter(Policy(processes=False, sockets=False, signal_pid=pid,
                                                   path_truncate=version >= 3, fallocate=False))
    landlock.restrict(read=[*spec["read"], f"/proc/{pid}"], write=[spec["scratch"], "/dev/null"])
    if uid is not None:
        drop_to(uid)
    syscall_filter.load()  # sets no_new_privs first
    os.execve(spec["python"], [spec["python"], spec["code"]], spec["env"])


if __name__ == "__main__":
    try:
        main(json.loads(sys.argv[1]))
    except Exception as e:  # noqa: BLE001 - any failure to confine is the sandbox's, and nothing may run
        print(f"sandbox: cannot confine the program: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(125)
