"""The landlock sandbox's launcher: confine this process, then become the program (``python -m recipe.tools.confine
SPEC``, started by ``recipe/tools/landlock_sandbox.py`` in a session of its own).

Runs under the recipe's own interpreter (it needs ``pyseccomp`` and ``landlock``), in this order: the per-process
limits (RLIMIT_CPU, RLIMIT_AS, RLIMIT_FSIZE, RLIMIT_NOFILE, RLIMIT_CORE 0), Landlock (read and execute only the
interpreter's tree and the program, write only the scratch directory), ``no_new_privs`` and the seccomp allowlist
for one process (no fork, no threads, no ``socket()``, signals only to itself), then ``execve`` of the sandbox's
python with a fixed environment. Nothing of the trainer's environment or file descriptors reaches the program.
A failure here exits 125 with one line on stderr starting ``sandbox:``.
"""
from __future__ import annotations

import json
import os
import resource
import sys


def main(spec: dict) -> None:
    from recipe.tools import landlock, seccomp
    from recipe.tools.syscalls import Policy

    lim = spec["limits"]
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CPU, (lim["cpu"], lim["cpu"] + 1))
    resource.setrlimit(resource.RLIMIT_AS, (lim["memory"], lim["memory"]))
    resource.setrlimit(resource.RLIMIT_FSIZE, (lim["file"], lim["file"]))
    resource.setrlimit(resource.RLIMIT_NOFILE, (lim["files"], lim["files"]))
    os.chdir(spec["scratch"])
    pid = os.getpid()
    version = landlock.abi()
    if isinstance(version, str):
        raise OSError(version)
    # compiled before Landlock applies: libseccomp and its binding live outside what the program may read
    syscall_filter = seccomp.compile_filter(Policy(processes=False, sockets=False, signal_pid=pid,
                                                   path_truncate=version >= 3))
    landlock.restrict(read=[*spec["read"], f"/proc/{pid}"], write=[spec["scratch"], "/dev/null"])
    syscall_filter.load()  # sets no_new_privs first
    os.execve(spec["python"], [spec["python"], spec["code"]], spec["env"])


if __name__ == "__main__":
    try:
        main(json.loads(sys.argv[1]))
    except Exception as e:  # noqa: BLE001 - any failure to confine is the sandbox's, and nothing may run
        print(f"sandbox: cannot confine the program: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(125)
