"""Whose memory a host-memory figure is checked against: the rollout nodes', not the launcher's.

A launcher joining a cluster (``RAY_ADDRESS``, or a cluster ``ray start`` left running on this machine) is often a
login or CPU node: its ``/proc/meminfo`` says nothing of the GPU nodes where vLLM's engines keep their host memory.
There the figure is Ray's own view of the GPU nodes (``ray.nodes()``: each node's ``memory`` resource, the heap
Ray gives tasks and actors, its object store excluded), read in a child process with a time limit so that an
unreachable cluster cannot hang the preflight. Without a cluster the launcher starts Ray itself and is the rollout
node: its own memory is the right one.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

CLUSTER_FILE = Path("/tmp/ray/ray_current_cluster")  # written by `ray start`, removed by `ray stop`
_QUERY = ("import json, sys, ray; ray.init(address=sys.argv[1], logging_level='ERROR', log_to_driver=False); "
          "print(json.dumps([n['Resources'] for n in ray.nodes() if n['Alive']]))")


def ray_gpu_node_memory(address: str, timeout_s: float = 60.0) -> list[int]:
    """The ``memory`` resource of each live node with a GPU in the Ray cluster at ``address``."""
    try:
        r = subprocess.run([sys.executable, "-c", _QUERY, address], capture_output=True, text=True,
                           timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"no answer in {timeout_s:.0f} s") from None
    if r.returncode:
        raise RuntimeError((r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1])
    nodes = json.loads(r.stdout.strip().splitlines()[-1])
    return [int(n["memory"]) for n in nodes if n.get("GPU", 0) > 0 and "memory" in n]


def rollout_node_memory(launcher_memory: int | None, environ: Mapping[str, str] | None = None,
                        query: Callable[[str], list[int]] | None = None) -> tuple[int | None, str]:
    """(the smallest rollout node's memory in bytes, or None when it cannot be read; which memory that is)."""
    environ = os.environ if environ is None else environ
    address = environ.get("RAY_ADDRESS", "") or ("auto" if CLUSTER_FILE.exists() else "")
    if not address:
        return launcher_memory, ("this machine's memory (RAY_ADDRESS unset, no Ray cluster running here: the launch "
                                 "starts Ray on this machine, which is the rollout node)")
    where = f"the Ray cluster at {address}"
    try:
        nodes = (query or ray_gpu_node_memory)(address)
    except Exception as e:  # noqa: BLE001 (any failure to read the cluster is reported, not raised)
        return None, f"not checked: the rollout nodes' memory could not be read from {where} ({e})"
    if not nodes:
        return None, f"not checked: {where} has no live GPU node"
    return min(nodes), (f"the smallest rollout node's memory: Ray's 'memory' resource of the {len(nodes)} GPU "
                        f"node(s) in {where}")
