"""Run a command as Docker runs a non-root container (a test harness, started as root by test_docker_nonroot.py):

    python tests/tools/docker_nonroot.py UID COMMAND...

In a private mount namespace every cgroup mount is remounted read-only (a container's /sys/fs/cgroup); then the
process drops to ``UID`` (no supplementary groups), sets ``no_new_privs`` and installs the part of Docker's default
seccomp profile that matters here: ``unshare`` and ``clone`` with CLONE_NEWUSER answer EPERM and ``clone3`` ENOSYS
(moby's profile, without CAP_SYS_ADMIN), so user namespaces, and with them bubblewrap, are denied. Then it ``exec``s
COMMAND. Needs root, util-linux-free: mount and unshare through libc.
"""
import ctypes
import errno
import os
import sys

CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18


def _check(ret, what):
    if ret != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


def main(uid: int, argv: list[str]) -> None:
    import pyseccomp as sc

    libc = ctypes.CDLL(None, use_errno=True)
    _check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
    mounts = [line.split()[4] for line in open("/proc/self/mountinfo")]
    for target in sorted(m for m in mounts if m == "/sys/fs/cgroup" or m.startswith("/sys/fs/cgroup/")):
        _check(libc.mount(None, target.encode(), None, MS_REMOUNT | MS_BIND | MS_RDONLY, None), f"ro {target}")
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    f = sc.SyscallFilter(defaction=sc.ALLOW)
    f.add_rule(sc.ERRNO(errno.EPERM), "unshare", sc.Arg(0, sc.MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER))
    f.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER))
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    f.load()  # sets no_new_privs first
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2:])
