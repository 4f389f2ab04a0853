"""The Megatron dist checkpoint(s) that actor and ref load: complete, or how to create them."""
from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from pathlib import Path

from ..settings import select
from .knobs import ARR, REPO_ROOT

CONVERT_SCRIPT = REPO_ROOT / "scripts" / "convert_hf_to_distcp.sh"


def _convert_command(model_path: str, distcp_path: str) -> str:
    return (f"MODEL_PATH={shlex.quote(model_path)} DISTCP_PATH={shlex.quote(distcp_path)} "
            f"bash {shlex.quote(str(CONVERT_SCRIPT))}")


def distcp_problem(path: str) -> str | None:
    """Why ``path`` is not a complete Megatron dist checkpoint, or None.

    megatron-core's ``dist_checkpointing.save`` writes ``common.pt`` and the shards first and ``metadata.json``
    (``{"sharded_backend": ...}``) last, so a missing ``metadata.json`` also means an interrupted conversion;
    the ``torch_dist`` backend keeps its shard index in ``.metadata``.
    """
    p = Path(path)
    if not p.is_dir():
        return "does not exist" if not p.exists() else "is not a directory"
    if not any(p.iterdir()):
        return "is empty"
    meta = p / "metadata.json"
    if not meta.is_file():
        return "has no metadata.json (not a Megatron dist checkpoint, or an interrupted conversion: delete it)"
    try:
        backend = json.loads(meta.read_text()).get("sharded_backend")
    except (OSError, ValueError, AttributeError):
        backend = None
    if not backend:
        return "has a metadata.json without 'sharded_backend' (not a Megatron dist checkpoint)"
    if not (p / "common.pt").is_file():
        return "has no common.pt (incomplete dist checkpoint: delete it and convert again)"
    if backend == "torch_dist" and not (p / ".metadata").is_file():
        return "has no .metadata (incomplete torch_dist checkpoint: delete it and convert again)"
    return None


def check_distcp(cfg: Mapping, smoke: bool, errors: list[str], notes: list[str]) -> bool:
    """The dist checkpoint(s) of actor and ref; True when the smoke preset must create the checkpoint at launch
    (the conversion needs a GPU, so a missing one is expected on a CPU)."""
    model = select(cfg, f"{ARR}.model.path")
    roles: dict[str, list[str]] = {}
    for role in ("actor", "ref"):
        m = select(cfg, f"{ARR}.{role}.megatron")
        if m.get("use_dist_checkpointing"):
            roles.setdefault(m.get("dist_checkpointing_path") or "", []).append(f"{ARR}.{role}.megatron")
    if not roles:
        notes.append("DISTCP_PATH=none: no dist checkpoint; Megatron-Bridge loads the Hugging Face weights of "
                     "MODEL_PATH for actor and ref at every start (converting once makes starts faster)")
    create = False
    for path, keys in roles.items():
        problem = distcp_problem(path) if path else "is not set"
        where = f"DISTCP_PATH={path} ({' and '.join(k + '.dist_checkpointing_path' for k in keys)})"
        if problem is None:
            continue
        if smoke and problem in ("does not exist", "is empty"):
            notes.append(f"{where} {problem}: the smoke preset converts the tiny model into it at launch (GPU); "
                         "missing on a CPU machine is expected")
            create = True
        else:
            errors.append(f"{where} {problem}; create it on a GPU node with: {_convert_command(model, path)}")
    return create
