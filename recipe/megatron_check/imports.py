"""The Megatron check's import environment: what Python 3.11, a CPU and the lent GPU lack, made up for in one place.

- ``typing.override`` (3.12): Megatron-Core 0.18 and Megatron-Bridge 0.5.1 publish for Python 3.12 only; on this
  3.11 CPU stack the one 3.12 name their import path uses comes from ``typing_extensions``.
- Transformer Engine: :mod:`.te_stand_in`, offered to Megatron-Bridge only, after Megatron-Core and modelopt have
  decided "no TE".
- ``stand_ins/`` (ray, pulp, datasets, scipy): import-time stand-ins, put on ``sys.path`` only for those that are not
  installed (the lent GPU carries at most 64 MiB, so not Ray's ~70 MB); verl and modelopt import them at module level
  on this path and call nothing in them. On the CPU test stack all four are real.
"""
from __future__ import annotations

import importlib.util
import sys
import typing
from pathlib import Path

STAND_INS = Path(__file__).resolve().parent / "stand_ins"
OPTIONAL = ("ray", "pulp", "datasets", "scipy")


def add_missing_stand_ins() -> list[str]:
    """Put ``stand_ins/`` on ``sys.path`` for the modules of :data:`OPTIONAL` that are not installed; return them."""
    missing = [name for name in OPTIONAL if importlib.util.find_spec(name) is None]
    if missing:
        sys.path.append(str(STAND_INS))  # after site-packages: an installed module always wins
    return missing


def prepare() -> dict[str, str]:
    """Make Megatron-Core, modelopt, Megatron-Bridge and verl's Megatron helpers importable; return the versions and
    what was stood in. Raises ``RuntimeError`` if the TE stand-in is visible outside Megatron-Bridge."""
    if not hasattr(typing, "override"):
        import typing_extensions

        typing.override = typing_extensions.override
    stood_in = add_missing_stand_ins()
    # Megatron-Core and modelopt decide at import time whether TE exists: import them before the stand-in is offered.
    import megatron.core
    import megatron.core.models.gpt.gpt_layer_specs  # noqa: F401
    import megatron.core.optimizer  # noqa: F401
    import megatron.core.transformer.moe.experts  # noqa: F401
    import modelopt.torch.quantization  # noqa: F401

    from . import te_stand_in

    with te_stand_in.scoped():
        import megatron.bridge  # noqa: F401
        from megatron.bridge import AutoBridge  # noqa: F401
        from megatron.bridge.models.gpt_provider import local_layer_spec  # noqa: F401
    leaked = te_stand_in.leaks()
    if leaked:
        raise RuntimeError(f"the Transformer Engine stand-in is visible outside Megatron-Bridge: {leaked[:5]}")
    import torch
    import transformers
    from importlib.metadata import version

    return {"python": sys.version.split()[0], "torch": torch.__version__, "megatron-core": version("megatron-core"),
            "megatron-bridge": version("megatron-bridge"), "transformers": transformers.__version__,
            "verl": version("verl"), "stand-ins": ",".join(["transformer_engine"] + stood_in)}
