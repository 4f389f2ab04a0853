"""cgroup v2 for the runs' groups, leaving the host's cgroups as they were found.

The no-internal-process rule: a cgroup may give its children controllers only while it holds no process (the real
root excepted), and no process may join a cgroup whose children have controllers (EBUSY). The recipe's cgroup C
holds the recipe, so while this process has runs, it waits in a leaf of its own below C (``recipe-self-<pid>``),
C's children get memory, pids and cpu, and each run's group is made in C beside that leaf. Only this process is
moved, never another: where C holds any other process, :func:`plan` refuses and names them (moving them would put a
container's PID 1, a ``docker exec`` or a systemd helper where the recipe chose, and close C to their successors).
When this process's last run group is removed (or at exit), the controllers enabled here are disabled again, the
leaf's processes (this one and what it started while there) move back into C and the leaf is removed: between runs
and afterwards any process may join C again. While runs exist a process joining C gets the kernel's EBUSY; a recipe
killed by SIGKILL in that window leaves C so (nothing runs at SIGKILL). :func:`plan` only reads.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

V2_CONTROLLERS = ("memory", "pids", "cpu")
LEAF_PREFIX = "recipe-self-"  # + pid: where this process waits while its runs' groups exist
MOVE_ROUNDS = 20  # processes this one starts while the leaf is emptied: tries before giving up
DELEGATE_HINT = (
    "start the process that runs the sandbox alone in a cgroup v2 it may write, so that it can step into a leaf "
    "of its own without moving anyone else: systemd-run --user --scope -p Delegate=yes <command> where <command> "
    "runs the tools itself, or a container with its own cgroup namespace and a writable /sys/fs/cgroup whose only "
    "process it is (docs/tools.md); a trainer whose Ray workers share its cgroup does not qualify"
)
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class V2Plan:
    """What a run needs done in cgroup ``d`` (read by :func:`plan`; done by :func:`acquire`)."""

    d: str
    controllers: tuple[str, ...]
    move_self: bool  # False: ``d`` is the real root, which may hold processes and give its children controllers


@dataclass
class _Held:
    plan: V2Plan
    owner: int  # the pid that did it (a forked child inherits this module's state, not the duty to undo it)
    runs: int
    enabled: tuple[str, ...]
    leaf: str | None


_HELD: dict[str, _Held] = {}
_LOCK = threading.RLock()


def _read(d: str, name: str) -> list[str]:
    return Path(d, name).read_text().split()


def _procs(d: str) -> list[int]:
    try:
        return [int(p) for p in _read(d, "cgroup.procs")]
    except (OSError, ValueError):
        return []


def plan(d: str, controllers: tuple[str, ...] = V2_CONTROLLERS) -> V2Plan | str:
    """What running in ``d`` needs, or the line saying why it cannot be done without moving another process (the
    caller adds :data:`DELEGATE_HINT`). Reads only."""
    root = not os.path.exists(os.path.join(d, "cgroup.type"))  # only the real root has none (a namespace's has)
    missing = [c for c in controllers if c not in _read(d, "cgroup.subtree_control")]
    if not missing:
        return V2Plan(d, controllers, move_self=False)
    others = [p for p in _procs(d) if p != os.getpid()]
    if others and not root:
        return (f"cgroup v2 at {d} holds {len(others)} process(es) besides this one (e.g. pid "
                f"{', '.join(map(str, others[:5]))}): its children can have {', '.join(missing)} only while it holds "
                f"none (the no-internal-process rule), and the recipe moves no process but its own")
    files = ["cgroup.subtree_control"] + ([] if root else ["cgroup.procs"])
    unwritable = [f for f in files if not os.access(os.path.join(d, f), os.W_OK)]
    if unwritable or not os.access(d, os.W_OK):
        return f"cgroup v2 at {d} is not writable by this process ({', '.join(unwritable) or d})"
    return V2Plan(d, controllers, move_self=not root)


def _write(d: str, name: str, text: str) -> None:
    Path(d, name).write_text(text)


def acquire(p: V2Plan) -> None:
    """Make ``p.d``'s children able to have ``p.controllers`` for one more run of this process; raises OSError
    naming the cgroup, having undone its own steps, where that fails (e.g. another process joined meanwhile)."""
    with _LOCK:
        held = _HELD.get(p.d)
        if held is not None and held.owner == os.getpid():
            held.runs += 1
            return
        missing = tuple(c for c in p.controllers if c not in _read(p.d, "cgroup.subtree_control"))
        leaf = os.path.join(p.d, f"{LEAF_PREFIX}{os.getpid()}") if p.move_self and missing else None
        held = _Held(p, os.getpid(), 1, (), leaf)
        try:
            if leaf is not None:
                os.mkdir(leaf)
                _write(leaf, "cgroup.procs", str(os.getpid()))
            if missing:
                _write(p.d, "cgroup.subtree_control", " ".join(f"+{c}" for c in missing))
                held.enabled = missing
        except OSError as e:
            others = [q for q in _procs(p.d) if q != os.getpid()]
            _restore(held)
            where = f" (this process stepping into {leaf})" if leaf else ""
            joined = (f" ({len(others)} other process(es) joined it, e.g. pid {others[0]}: the recipe moves no "
                      f"process but its own)" if others else "")
            raise OSError(e.errno, f"cannot give the children of cgroup v2 {p.d} {', '.join(missing)}{where}: "
                                   f"{e.strerror}{joined}") from e
        _HELD[p.d] = held


def release(p: V2Plan) -> None:
    """One run of this process is over; after its last, put ``p.d`` back as it was found."""
    with _LOCK:
        held = _HELD.get(p.d)
        if held is None or held.owner != os.getpid():
            return
        held.runs -= 1
        if held.runs <= 0:
            del _HELD[p.d]
            _restore(held)


def _restore(held: _Held) -> None:
    """Disable what was enabled, move the leaf's processes back, remove the leaf; logs what could not be undone
    (it never raises: it runs after each run's removal and at exit)."""
    d = held.plan.d
    try:
        if held.enabled:
            _write(d, "cgroup.subtree_control", " ".join(f"-{c}" for c in reversed(held.enabled)))
        if held.leaf is not None and os.path.isdir(held.leaf):
            for _ in range(MOVE_ROUNDS):
                left = _procs(held.leaf)
                if not left:
                    break
                for pid in left:  # this process and what it started there: each would be in d but for the leaf
                    try:
                        _write(d, "cgroup.procs", str(pid))
                    except ProcessLookupError:
                        pass  # it exited meanwhile
            os.rmdir(held.leaf)
    except OSError as e:
        log.warning("cgroup v2 %s not fully restored (controllers enabled here: %s; leaf %s): %s",
                    d, " ".join(held.enabled) or "none", held.leaf, e)


def release_all() -> None:
    """At exit: undo whatever this process still holds (runs whose groups could not be removed included)."""
    with _LOCK:
        for d, held in list(_HELD.items()):
            if held.owner == os.getpid():
                del _HELD[d]
                _restore(held)


atexit.register(release_all)
