"""The rollout gate: tells the agent loops that the driver is aborting the step's rollout, so tool calls stop too.

vLLM's abort (``abort_replicas``) stops generation only. A multi-turn trajectory that is running a tool when its
group is aborted (over-sample ``settle``, the tail cut) would finish the tool, however long it takes, and only then
meet the closed server; the tool's process would run on after the step had moved on. The driver closes this gate
just before it aborts and opens it when it resumes generation; ``CappedToolAgentLoop`` races each tool stage against
the gate and cancels it (the sandbox's process group is killed on cancel, ``recipe.tools.sandbox``) when it closes.

One named Ray actor per run (:func:`create_gate`, by the trainer when over-sampling or the tail cut is on; verl's
``ray.init`` sets no namespace, so each job has its own and two runs on one cluster never share a gate). Each
agent-loop worker process holds one long poll on it (:class:`GateWatch`), however many trajectories it runs: the
actor sees one pending call per worker, not one per tool call. Without the actor (both features off, verl's own
tests) :func:`gate_watch` returns None and tools are never cancelled.
"""
from __future__ import annotations

import asyncio
import logging
import weakref

logger = logging.getLogger(__name__)

GATE_ACTOR_NAME = "recipe_rollout_gate"


class GateState:
    """Closed/open with a version that changes on every flip; ``wait_change`` returns once it differs."""

    def __init__(self):
        self.version, self.closed = 0, False
        self._changed = asyncio.Event()

    def set(self, closed: bool) -> int:
        if bool(closed) != self.closed:
            self.closed, self.version = bool(closed), self.version + 1
            changed, self._changed = self._changed, asyncio.Event()
            changed.set()
        return self.version

    async def wait_change(self, version: int) -> tuple[int, bool]:
        while self.version == version:
            await self._changed.wait()
        return self.version, self.closed


class RolloutGateActor:
    """The Ray actor around :class:`GateState` (async methods: it serves every worker's long poll concurrently)."""

    def __init__(self):
        self.state = GateState()

    async def set(self, closed: bool) -> int:
        return self.state.set(closed)

    async def wait_change(self, version: int) -> tuple[int, bool]:
        return await self.state.wait_change(version)


def create_gate():
    """The run's gate actor (driver side; an existing one is reused). Returns a :class:`DriverGate`."""
    import ray

    handle = ray.remote(RolloutGateActor).options(name=GATE_ACTOR_NAME, get_if_exists=True, num_cpus=0,
                                                  max_concurrency=4096).remote()
    return DriverGate(handle)


class DriverGate:
    """What the driver calls around its aborts: ``close()`` before ``abort_replicas``, ``open()`` at the resume."""

    def __init__(self, handle):
        self.handle = handle

    def close(self) -> None:
        import ray

        ray.get(self.handle.set.remote(True))

    def open(self) -> None:
        import ray

        ray.get(self.handle.set.remote(False))


class GateWatch:
    """A worker process's view of the gate, kept current by one long poll (``source.wait_change``)."""

    def __init__(self, source):
        self.source = source
        self.closed = False
        self._closed_event = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._poll())

    async def _poll(self) -> None:
        version = -1
        try:
            while True:
                version, closed = await self.source.wait_change(version)
                self.closed = closed
                (self._closed_event.set if closed else self._closed_event.clear)()
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - the actor is gone (run ending): behave as an open gate from now on
            logger.warning("rollout gate: the watch ended; tool calls are no longer cancelled on abort", exc_info=True)
            self.closed = False
            self._closed_event.clear()

    async def wait_closed(self) -> None:
        await self._closed_event.wait()

    def stop(self) -> None:
        self._task.cancel()


class _ActorSource:
    """``wait_change`` through the Ray actor handle (awaitable ObjectRefs in the worker's event loop)."""

    def __init__(self, handle):
        self.handle = handle

    async def wait_change(self, version: int) -> tuple[int, bool]:
        return tuple(await self.handle.wait_change.remote(version))


_watches: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, GateWatch | None]" = weakref.WeakKeyDictionary()


async def gate_watch() -> GateWatch | None:
    """This process's watch (one per event loop), or None when the run has no gate actor."""
    loop = asyncio.get_running_loop()
    if loop not in _watches:
        handle = await asyncio.to_thread(_find_actor)
        if loop not in _watches:  # another trajectory of this loop may have created it meanwhile
            _watches[loop] = GateWatch(_ActorSource(handle)) if handle is not None else None
    return _watches[loop]


def _find_actor():
    import ray

    if not ray.is_initialized():  # not inside a Ray worker (unit tests): no run, no gate
        return None
    try:
        return ray.get_actor(GATE_ACTOR_NAME)
    except ValueError:
        return None
