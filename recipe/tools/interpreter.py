"""Which directories the sandboxed interpreter needs, as the interpreter itself reports them.

``SANDBOX_PYTHON`` may be a venv's python or one outside ``/usr``; the sandbox must then see its tree read-only. The
path's ``parent.parent`` is not that tree: ``~/.local/bin/python3`` would give all of ``~/.local`` and
``~/bin/python3`` the whole home, and a non-root trainer's sandbox runs as the same uid (its HF, wandb and ssh
tokens readable, printable into rollout logs). So the interpreter is asked (``sys.prefix``, ``sys.base_prefix`` and
the exec prefixes: a venv and the installation it was made from), and a prefix that is ``/``, a home directory or
holds one is refused by name.
"""
from __future__ import annotations

import functools
import json
import os
import pwd
import subprocess

ASK = "import sys, json; print(json.dumps([sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]))"
SYSTEM = ("/usr",)  # bound by the sandboxes anyway


def homes() -> set[str]:
    """Home directories of this process's user and of every account with a home under /home or /root."""
    out = {os.path.realpath(os.path.expanduser("~"))}
    try:
        out.add(os.path.realpath(pwd.getpwuid(os.geteuid()).pw_dir))
    except KeyError:
        pass
    for entry in pwd.getpwall():
        d = os.path.realpath(entry.pw_dir)
        if d == "/root" or d.startswith("/home/"):
            out.add(d)
    return {d for d in out if d != "/"}


def _holds(prefix: str, path: str) -> bool:
    return path == prefix or path.startswith(prefix.rstrip("/") + "/")


@functools.lru_cache(maxsize=16)
def interpreter_tree(python: str) -> tuple[str, ...] | str:
    """The interpreter's own directories outside /usr (none for Debian's python3), or the line saying why this
    interpreter is refused."""
    try:
        r = subprocess.run([python, "-I", "-c", ASK], capture_output=True, text=True, timeout=60,
                           env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})
        prefixes = json.loads(r.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        return f"cannot ask the sandbox's python {python} for its prefix ({type(e).__name__}: {e}): set " \
               f"SANDBOX_PYTHON to a python3, e.g. /usr/bin/python3"
    tree: list[str] = []
    for p in dict.fromkeys(os.path.realpath(p) for p in prefixes):
        if any(_holds(s, p) for s in SYSTEM):
            continue
        home = next((h for h in homes() if _holds(p, h)), None)
        if p == "/" or home is not None:
            what = "/" if p == "/" else f"the home directory {home}"
            return (f"the sandbox's python {python} has its prefix at {p}, which holds {what}: the sandbox would "
                    f"show it to the program (tokens, keys). Set SANDBOX_PYTHON to an interpreter in a tree of its "
                    f"own (/usr/bin/python3, or a venv such as /opt/sandbox-venv/bin/python)")
        if not any(_holds(t, p) for t in tree):
            tree = [t for t in tree if not _holds(p, t)] + [p]
    return tuple(tree)
