"""Filesystem confinement without namespaces or privilege: the Landlock LSM, through PyPI's ``landlock`` bindings.

A process restricts itself (after ``no_new_privs``), and every process it becomes or starts inherits the rules:
files and directories outside the rules cannot be opened, read, written, executed, created or removed, whatever
their permission bits say (the sandbox runs as the trainer's own uid). Kernel 5.13+ with Landlock enabled
(``lsm=``/``CONFIG_LSM`` lists it); ABI 3 (6.2) adds ``truncate``, which older ABIs leave to the seccomp filter.
"""
from __future__ import annotations

import ctypes
import errno
import os

PIN = "landlock==1.0.0.dev5"
MIN_ABI = 1


def abi() -> int | str:
    """This kernel's Landlock ABI version, or the line saying why there is none."""
    try:
        import landlock
        from landlock.plumbing import landlock_abi_version
    except ImportError as e:
        return f"the landlock sandbox needs PyPI's Landlock bindings: pip install {PIN} ({e})"
    ctypes.set_errno(0)  # the bindings read errno even after a call that succeeded
    landlock_abi_version.cache_clear()
    try:
        version = int(landlock_abi_version())
    except OSError as e:
        why = {errno.ENOSYS: "this kernel has no Landlock (5.13+ built with CONFIG_SECURITY_LANDLOCK)",
               errno.EOPNOTSUPP: "Landlock is disabled at boot (add landlock to the kernel's lsm= list)",
               errno.EPERM: "a seccomp profile denies the Landlock system calls (Docker before 23.0 does)"}
        return f"Landlock is not available here: {why.get(e.errno, os.strerror(e.errno or 0))}"
    except landlock.LandlockError as e:
        return f"Landlock is not available here: {e}"
    return version if version >= MIN_ABI else f"Landlock ABI {version} is older than {MIN_ABI}"


def restrict(read: list[str], write: list[str]) -> int:
    """Restrict this process (and all it becomes) to reading and executing below ``read`` and to reading and
    writing below ``write``; a path that does not exist is skipped. Returns the ABI used."""
    from landlock import FSAccess, Ruleset

    version = abi()
    if isinstance(version, str):
        raise OSError(errno.ENOSYS, version)
    ctypes.set_errno(0)
    everything = FSAccess.all()
    ruleset = Ruleset(restrict_rules=everything)
    file_read = FSAccess.READ_FILE | FSAccess.EXECUTE
    dir_read = file_read | FSAccess.READ_DIR
    for path in read:
        if os.path.exists(path):
            ctypes.set_errno(0)
            ruleset.allow(path, rules=dir_read if os.path.isdir(path) else file_read)
    for path in write:
        if os.path.exists(path):
            ctypes.set_errno(0)
            file_write = FSAccess.READ_FILE | FSAccess.WRITE_FILE | (FSAccess.TRUNCATE if version >= 3 else 0)
            rights = everything if os.path.isdir(path) else file_write
            if os.path.isdir(path):
                rights &= ~FSAccess.EXECUTE  # nothing written there is executed
                rights &= ~(FSAccess.MAKE_CHAR | FSAccess.MAKE_BLOCK | FSAccess.MAKE_SOCK)
            ruleset.allow(path, rules=rights)
    ctypes.set_errno(0)
    ruleset.apply()
    return version
