"""Multi-turn tool calling (``MULTI_TURN=1``): the tool config loads, every sandbox it uses runs a program, and
the memory all local sandboxes of a node may hold at once fits the node.

verl loads the tool config in each agent-loop worker, minutes into a launch, and a sandbox that cannot start (no
bubblewrap, no user namespaces inside docker, an unreachable SandboxFusion server) would only show up as a tool
error in every trajectory. Here the tools are loaded with verl's own loader and each tool that holds a sandbox
backend (``recipe.tools.verl_tools.PythonTool``) runs ``print(1+1)`` through it before anything starts.

verl places its agent-loop workers round-robin over the nodes; each runs up to ``max_concurrency`` sandboxes of one
tool at once, each held to ``limits.memory_bytes`` in total (its cgroup; the landlock sandbox's one process, plus
its ``scratch_bytes`` tmpfs when started as root), or,
where per-process limits were accepted, to ``max_processes`` x (``memory_bytes`` + what ``max_open_files`` sockets
may buffer) + its two tmpfs (memfd, SysV and POSIX IPC are denied by the syscall allowlist). Beside vLLM and the trainer, that sum must stay under
:data:`SANDBOX_MEMORY_SHARE` of the node's memory (this node's ``MemTotal``: the launch's nodes are alike).
"""
from __future__ import annotations

import math
import os
from collections.abc import Mapping

from ..settings import select
from .knobs import ARR

SANDBOX_MEMORY_SHARE = 0.25
GiB = 1024**3


def node_memory_bytes(meminfo: str = "/proc/meminfo") -> int | None:
    """This node's memory (MemTotal), for the limits the preflight states against it; None where it cannot be read."""
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def socket_buffer_bytes(sysctl: str = "/proc/sys/net/core") -> int:
    """What one socket may hold in the kernel here: its default send and receive buffers (the syscall allowlist
    denies raising them, recipe/tools/syscalls.py)."""
    try:
        return sum(int(open(f"{sysctl}/{name}").read().split()[0]) for name in ("wmem_default", "rmem_default"))
    except (OSError, ValueError, IndexError):
        return 2 * 212992  # Linux's default for each


def sandbox_memory(cfg: Mapping, tools: list, path: str) -> tuple[int, str] | None:
    """(bytes, how they add up) for the local sandboxes one node may run at once; None when the tools hold none."""
    from ..tools.bwrap import BubblewrapBackend
    from ..tools.landlock_sandbox import LandlockBackend

    local = [t for t in tools if isinstance(getattr(t, "backend", None), (BubblewrapBackend, LandlockBackend))]
    if not local:
        return None
    workers = int(select(cfg, f"{ARR}.rollout.agent.num_workers") or 1)
    nnodes = int(select(cfg, "trainer.nnodes") or 1)
    per_node = math.ceil(workers / nnodes)
    total, parts = 0, []
    for tool in local:
        b = tool.backend
        lim, conc = b.limits, int(getattr(tool, "max_concurrency", 1))
        per_process = isinstance(b, BubblewrapBackend) and b.limits_mode()[0] is None  # landlock: one process
        if per_process:  # outside each address space: the two tmpfs (/tmp, /dev/shm) and socket buffers
            buffers = lim.max_open_files * socket_buffer_bytes()
            each = lim.max_processes * (lim.memory_bytes + buffers) + 2 * lim.scratch_bytes
            how = (f"(max_processes {lim.max_processes} x (memory_bytes {lim.memory_bytes / GiB:g} GiB + "
                   f"max_open_files {lim.max_open_files} x {socket_buffer_bytes() // 1024} KiB of socket buffer) "
                   f"+ 2 x scratch_bytes {lim.scratch_bytes / GiB:g} GiB) (per-process limits)")
        elif isinstance(b, LandlockBackend) and b.drop_uid() is not None:  # as root: its scratch is a tmpfs
            each = lim.memory_bytes + lim.scratch_bytes
            how = (f"(memory_bytes {lim.memory_bytes / GiB:g} GiB + scratch_bytes {lim.scratch_bytes / GiB:g} GiB of "
                   "tmpfs) per sandbox")
        else:
            each = lim.memory_bytes
            how = f"memory_bytes {lim.memory_bytes / GiB:g} GiB in total per sandbox"
        total += per_node * conc * each
        parts.append(f"tool {tool.name!r}: max_concurrency {conc} x {how}")
    where = (f"{per_node} agent-loop worker(s) per node ({ARR}.rollout.agent.num_workers={workers} over "
             f"trainer.nnodes={nnodes}) x ({'; '.join(parts)}) in TOOL_CONFIG={path}")
    return total, where


def check_sandbox_memory(cfg: Mapping, tools: list, path: str, errors: list[str], notes: list[str] | None,
                         mem_total: int | None) -> None:
    found = sandbox_memory(cfg, tools, path)
    if found is None:
        return
    total, where = found
    if mem_total is None:
        errors.append(f"cannot read this node's MemTotal (/proc/meminfo) to bound its sandboxes' memory: {where}")
        return
    line = (f"sandboxes may hold up to {total / GiB:.1f} GiB of a node's memory at once: {where}; this node has "
            f"{mem_total / GiB:.1f} GiB")
    if total > SANDBOX_MEMORY_SHARE * mem_total:
        errors.append(f"{line}, more than the {SANDBOX_MEMORY_SHARE:.0%} the sandboxes may take beside vLLM and the "
                      "trainer: lower max_concurrency or limits.memory_bytes in the tool config, or "
                      f"{ARR}.rollout.agent.num_workers")
    elif notes is not None:
        notes.append(f"{line} (at most {SANDBOX_MEMORY_SHARE:.0%} allowed)")


def check_tools(cfg: Mapping, errors: list[str], notes: list[str] | None = None) -> None:
    mt = select(cfg, f"{ARR}.rollout.multi_turn") or {}
    if not mt.get("enable"):
        return
    path = mt.get("tool_config_path")
    if not path:
        errors.append("MULTI_TURN=1 needs a tool config: export TOOL_CONFIG=recipe/tools/configs/calculator.yaml "
                      "(or python_tool.yaml)")
        return
    if not os.path.isfile(path):
        errors.append(f"TOOL_CONFIG={path} does not exist (sets {ARR}.rollout.multi_turn.tool_config_path); the "
                      "recipe's are in recipe/tools/configs/")
        return
    from verl.tools.tool_registry import load_all_tools

    try:
        tools = load_all_tools(tool_config_path=path, function_tool_path=mt.get("function_tool_path"))
    except Exception as e:  # noqa: BLE001 - any failure here is the config's, reported by name
        errors.append(f"TOOL_CONFIG={path} does not load with verl's tool loader: {type(e).__name__}: {e}")
        return
    if not tools:
        errors.append(f"TOOL_CONFIG={path} defines no tools: a multi-turn rollout would never call one")
    from ..tools.sandbox import sandbox_self_check

    for tool in tools:
        backend = getattr(tool, "backend", None)
        if backend is None:
            continue
        problem = sandbox_self_check(backend)
        if problem is not None:
            errors.append(f"TOOL_CONFIG={path}: tool {tool.name!r} cannot run a program in its sandbox: {problem}")
    check_sandbox_memory(cfg, tools, path, errors, notes, node_memory_bytes())
