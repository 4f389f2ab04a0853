"""The host's processes as /proc shows them, for tests that must look only at their own process tree: the e2e
launches running beside the suite start bwrap sandboxes and vLLM workers of their own."""
import os
from pathlib import Path


def stat(pid: int) -> dict | None:
    """``comm``, ``state``, ``ppid`` and ``pgid`` of ``pid``; None once it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    comm = raw[raw.index("(") + 1 : raw.rindex(")")]
    fields = raw[raw.rindex(")") + 2 :].split()
    return {"comm": comm, "state": fields[0], "ppid": int(fields[1]), "pgid": int(fields[2])}


def all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _below(root: int) -> list[tuple[int, str]]:
    """``(pid, comm)`` of every process below ``root``, from one scan of /proc; ``root``'s children come first."""
    kids: dict[int, list[tuple[int, str]]] = {}
    for pid in all_pids():
        st = stat(pid)
        if st:
            kids.setdefault(st["ppid"], []).append((pid, st["comm"]))
    out, todo = [], [root]
    while todo:
        for child in kids.get(todo.pop(), []):
            out.append(child)
            todo.append(child[0])
    return out


def descendants(root: int) -> list[int]:
    """Every process below ``root``; its children come first."""
    return [pid for pid, _ in _below(root)]


def named_below(root: int, comm: str) -> list[int]:
    """The processes below ``root`` named ``comm``; its children come first."""
    return [pid for pid, name in _below(root) if name == comm]


def _in_an_e2e_launch(pid: int) -> bool:
    """Whether ``pid`` belongs to an e2e launch running beside the suite: the launcher marks every process it starts
    through the environment (``harness.cpu_runs.MARKER``), and their children inherit it."""
    from .cpu_runs import MARKER

    try:
        env = Path(f"/proc/{pid}/environ").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    return any(entry.startswith(MARKER.encode() + b"=") for entry in env.split(b"\0"))


def started_below(root: int, before) -> list[int]:
    """The processes below ``root`` that were not there in ``before`` (a :func:`descendants` snapshot), leaving out
    those of e2e launches started meanwhile: what a test's own work started and left."""
    before = set(before)
    return [pid for pid in descendants(root) if pid not in before and not _in_an_e2e_launch(pid)]
