"""Run a worker method in every vLLM worker of every rollout replica and get its results back.

verl 0.9.1's ``vLLMHttpServer.collective_rpc`` awaits vLLM's ``AsyncLLM.collective_rpc`` but drops its result, so
the recipe reaches the engine itself: Ray's ``__ray_call__`` runs a function inside the server actor, off its event
loop (Ray runs a synchronous method of an async actor in a thread), and that function submits
``engine.collective_rpc(method, args)`` to the actor's loop (the loop of the task that serves the OpenAI app,
``_server_task``) and waits for it. The method is one of :data:`recipe.drafting.worker_methods.METHODS`, by name
(see there why not a function object); numpy arrays and plain Python cross both hops.
"""
from __future__ import annotations

import asyncio
from typing import Any

TIMEOUT_S = 600.0


def replica_servers(checkpoint_manager) -> list:
    """The server actor of node rank 0 of each replica (the one that owns the engine)."""
    return [r.servers[0] for r in getattr(checkpoint_manager, "replicas", None) or [] if getattr(r, "servers", None)]


def _actor_loop(server) -> asyncio.AbstractEventLoop:
    for task in (getattr(server, "_server_task", None), getattr(server.engine, "output_handler", None)):
        if task is not None:
            return task.get_loop()
    raise RuntimeError("recipe.adapter.engine_rpc: verl's vLLM server holds no running task to find its event "
                       "loop by (_server_task); this verl is not the one the recipe pins")


async def each_core(async_llm, method: str, *args: Any, timeout: float | None = None) -> list:
    """``worker.<method>(*args)`` on every worker of every engine core behind ``async_llm``, their answers in one
    list. Each core is asked itself: under data parallelism ``AsyncLLM.collective_rpc`` answers with the first
    core's workers only (vLLM 0.24's DP client), and a head pushed to one core would leave the others stale."""
    client = async_llm.engine_core
    answers = await asyncio.gather(*(client._call_utility_async("collective_rpc", method, timeout, args, None, engine=e)
                                     for e in client.core_engines))
    return [a for core in answers for a in core]


def _in_server(server, method: str, args: tuple, timeout: float) -> list:
    coro = each_core(server.engine, method, *args, timeout=timeout)
    return asyncio.run_coroutine_threadsafe(coro, _actor_loop(server)).result(timeout + 30)


def call_engines(servers: list, method: str, *args: Any, timeout: float = TIMEOUT_S) -> list[list]:
    """``worker.<method>(*args)`` in every worker of each server's engine, all servers at once: one list of worker
    results per server, in the order of ``servers``."""
    import ray

    return ray.get([s.__ray_call__.remote(_in_server, method, args, timeout) for s in servers])
