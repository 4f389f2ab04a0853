"""vLLM general plugin (entry point ``vllm.general_plugins``): the recipe's methods on every vLLM worker, which the
trainer calls by name through ``collective_rpc`` (:mod:`recipe.adapter.engine_rpc`).

By name because a function object does not reach the workers under verl's engine settings: vLLM's engine client
refuses to serialise one without ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``, and bytes are pickled again by the
multiprocessing executor (``MultiprocExecutor.collective_rpc``), so the worker would receive bytes, not a function.
A method name is plain msgpack; ``WorkerWrapperBase`` hands the lookup to the worker (``serial_utils.run_method``).
"""
from __future__ import annotations


def _capture_install(self, max_tokens: int) -> bool:
    from .head_capture import install

    return install(self, max_tokens)


def _capture_harvest(self) -> dict:
    from .head_capture import harvest

    return harvest(self)


def _head_load(self, packed: dict) -> None:
    from .head_sync import load_head

    load_head(self, packed)


def _head_digest(self) -> dict:
    from .head_sync import head_digest

    return head_digest(self)


METHODS = {"recipe_head_capture_install": _capture_install, "recipe_head_capture_harvest": _capture_harvest,
           "recipe_head_load": _head_load, "recipe_head_digest": _head_digest}


def register() -> None:
    """Add :data:`METHODS` to vLLM's worker base class (every platform's worker inherits it)."""
    from vllm.v1.worker.worker_base import WorkerBase

    for name, fn in METHODS.items():
        setattr(WorkerBase, name, fn)
