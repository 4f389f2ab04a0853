"""The sandboxes' seccomp filter, compiled by libseccomp (PyPI's ``pyseccomp``, a ctypes binding to Debian's
``libseccomp2``), never hand-written BPF.

Deny by default: the allowlist is ``recipe/tools/syscalls.py`` (groups, each with its reason); every other call gets
ENOSYS. bwrap loads the filter with ``--seccomp FD`` right before it runs the program (``filter_fd``); the landlock
sandbox's launcher loads it itself, after ``no_new_privs`` (``load``).
"""

from __future__ import annotations

import errno
import functools
import os

from recipe.tools.syscalls import ERRNOS, Policy, Rule, rules

PIN = "pyseccomp==0.1.2"
DEFAULT_ERRNO = errno.ENOSYS


class SeccompUnavailable(RuntimeError):
    """libseccomp or its binding is missing: the sandbox refuses to run without the filter."""


def _binding():
    try:
        import pyseccomp as sc
    except (ImportError, OSError) as e:  # OSError: the binding loads libseccomp.so.2 at import
        raise SeccompUnavailable(
            f"the sandbox's seccomp filter needs libseccomp: pip install {PIN} and apt-get install libseccomp2 ({e})"
        ) from e
    return sc


def known(name: str) -> bool:
    """Whether this libseccomp knows ``name`` for this machine's architecture (an old one lacks the newest calls)."""
    sc = _binding()
    try:
        return sc.resolve_syscall(sc.Arch.NATIVE, name) >= 0
    except (ValueError, OSError):
        return False


def compile_filter(policy: Policy = Policy()):
    """A ``pyseccomp.SyscallFilter`` for ``policy``: the allowlist's rules, ENOSYS for everything else. A call this
    libseccomp or architecture does not know is left out (so denied)."""
    sc = _binding()
    ops = {"eq": sc.EQ, "ne": sc.NE, "masked_eq": sc.MASKED_EQ, "ge": sc.GE}
    f = sc.SyscallFilter(defaction=sc.ERRNO(DEFAULT_ERRNO))
    for r in rules(policy):
        if not known(r.name):
            continue
        action = sc.ALLOW if r.action == "allow" else sc.ERRNO(ERRNOS[r.action])
        args = [sc.Arg(i, ops[op], *((mask, value) if op == "masked_eq" else (value,))) for i, op, value, mask in r.args]
        f.add_rule(action, r.name, *args)
    return f


@functools.lru_cache(maxsize=4)
def filter_bpf(policy: Policy = Policy()) -> bytes:
    """The compiled filter (BPF program bytes) for this machine's architecture; built once per policy."""
    f = compile_filter(policy)
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


def filter_fd(policy: Policy = Policy()) -> int:
    """A fresh readable fd holding the filter, for bwrap's ``--seccomp FD`` (bwrap reads it once; caller closes)."""
    data = filter_bpf(policy)
    fd = os.memfd_create("sandbox-seccomp")
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def load(policy: Policy) -> None:
    """Install the filter on this process (it sets ``no_new_privs`` first: no privilege needed). For the landlock
    sandbox's launcher, right before it ``exec``s the program."""
    compile_filter(policy).load()


__all__ = ["PIN", "Policy", "Rule", "SeccompUnavailable", "compile_filter", "filter_bpf", "filter_fd", "known",
           "load"]
