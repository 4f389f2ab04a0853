"""The rollout gate: tells the agent loops which training step's rollout the driver is aborting, so tool calls stop too.

vLLM's abort (``abort_replicas``) stops generation only. A multi-turn trajectory that is running a tool when its
group is aborted (over-sample ``settle``, the tail cut) would finish the tool, however long it takes, and only then
meet the closed server; the tool's process would run on after the step had moved on. The driver
(``recipe.adapter.step_abort.StepAbort``) closes this gate for the step it aborts just before the abort and opens it
when it resumes generation; ``CappedToolAgentLoop`` races each tool stage against the gate and cancels it (the
sandbox's process group is killed on cancel, ``recipe.tools.sandbox``) when it closes for the trajectory's step.

**Step identity.** Every training row carries the step it was launched for (``fields.ROLLOUT_STEP``) and the gate
carries the step it closes: a trajectory is cut only by its own step's closing. A worker learns of each flip through
its long poll, some time after the driver's ``open()`` has returned; so a stale "closed" view (an open that has not
arrived yet, or a close that arrives after the open) names an older step and cuts nothing of the next step, nor of
validation, whose rows carry no step and are never cut. No trajectory ends empty because a worker's view lagged.

One named Ray actor per run (:func:`create_gate`, by the trainer when over-sampling or the tail cut is on; verl's
``ray.init`` sets no namespace, so each job has its own and two runs on one cluster never share a gate). Each
agent-loop worker process holds one long poll on it (:class:`GateWatch`), however many trajectories it runs: the
actor sees one pending call per worker, not one per tool call. A poll that fails (the actor died or was replaced)
leaves the view open and the watch connects again, looking the actor up afresh, with backoff; its first poll returns
the gate as it is then. A worker that finds no actor (both features off, verl's own tests, or a lookup before the
actor existed) gets no watch (tools are never cancelled) and looks again at most every ``LOOKUP_INTERVAL_S``.
"""
from __future__ import annotations

import asyncio
import logging
import time
import weakref
from dataclasses import dataclass

logger = logging.getLogger(__name__)

GATE_ACTOR_NAME = "recipe_rollout_gate"
RECONNECT_BACKOFF_S = (0.5, 30.0)  # a lost watch connects again after 0.5 s, doubling up to 30 s between tries
LOOKUP_INTERVAL_S = 10.0  # a worker that found no gate actor looks it up again at most this often

_sleep = asyncio.sleep  # the reconnect backoff's wait (tests step it by hand)
_now = time.monotonic  # the lookup rate limit's clock (tests move it by hand)


class GateState:
    """Open, or closed for one training step (``step``), with a version that changes on every flip;
    ``wait_change`` returns once the version differs from the caller's."""

    def __init__(self):
        self.version, self.step = 0, None  # step: whose trajectories are cut; None = open
        self._changed = asyncio.Event()

    def close(self, step: int) -> int:
        return self._set(int(step))

    def open(self) -> int:
        return self._set(None)

    def _set(self, step: int | None) -> int:
        if step != self.step:
            self.step, self.version = step, self.version + 1
            changed, self._changed = self._changed, asyncio.Event()
            changed.set()
        return self.version

    async def wait_change(self, version: int) -> tuple[int, int | None]:
        while self.version == version:
            await self._changed.wait()
        return self.version, self.step


class RolloutGateActor:
    """The Ray actor around :class:`GateState` (async methods: it serves every worker's long poll concurrently)."""

    def __init__(self):
        self.state = GateState()

    async def close(self, step: int) -> int:
        return self.state.close(step)

    async def open(self) -> int:
        return self.state.open()

    async def wait_change(self, version: int) -> tuple[int, int | None]:
        return await self.state.wait_change(version)


def create_gate():
    """The run's gate actor (driver side; an existing one is reused). Returns a :class:`DriverGate`."""
    import ray

    handle = ray.remote(RolloutGateActor).options(name=GATE_ACTOR_NAME, get_if_exists=True, num_cpus=0,
                                                  max_concurrency=4096).remote()
    return DriverGate(handle)


class DriverGate:
    """What the driver calls around its aborts; each returns once the actor has flipped (the workers learn it
    later, through their watches: the step identity makes that lag harmless)."""

    def __init__(self, handle):
        self.handle = handle

    def close(self, step: int) -> None:
        """Cut the trajectories of training step ``step`` (before ``abort_replicas``)."""
        import ray

        ray.get(self.handle.close.remote(int(step)))

    def open(self) -> None:
        """After ``resume_generation_replicas``."""
        import ray

        ray.get(self.handle.open.remote())


class GateWatch:
    """A worker process's view of the gate (``step``: the step it closes, None = open), kept current by one long
    poll on ``source.wait_change``. When the poll fails the view is open (nothing is known) and ``connect()`` is
    awaited for a new source (None: not found yet), with backoff, until one answers."""

    def __init__(self, source, connect):
        self.source, self._connect = source, connect
        self.step: int | None = None
        self._changed = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run())

    def cuts(self, step: int | None) -> bool:
        """Whether a trajectory launched for ``step`` is being aborted (None: a validation row, never)."""
        return step is not None and self.step == step

    async def wait_cut(self, step: int | None) -> None:
        """Returns once the gate is closed for ``step`` (never for None)."""
        while not self.cuts(step):
            await self._changed.wait()

    def _show(self, step: int | None) -> None:
        if step != self.step:
            self.step = step
            changed, self._changed = self._changed, asyncio.Event()
            changed.set()

    async def _run(self) -> None:
        delay = RECONNECT_BACKOFF_S[0]
        while True:
            if self.source is not None:
                version = -1  # the first poll returns the gate as it is now
                try:
                    while True:
                        version, step = await self.source.wait_change(version)
                        self._show(step)
                        delay = RECONNECT_BACKOFF_S[0]
                except asyncio.CancelledError:
                    raise
                except Exception:  # noqa: BLE001 - the actor is gone or unreachable: connect again
                    logger.warning("rollout gate: the watch lost the gate actor; connecting again (tool calls are not "
                                   "cancelled meanwhile)", exc_info=True)
                    self.source = None
                    self._show(None)
            await _sleep(delay)
            delay = min(2 * delay, RECONNECT_BACKOFF_S[1])
            self.source = await self._connect()

    def stop(self) -> None:
        self._task.cancel()


class _ActorSource:
    """``wait_change`` through the Ray actor handle (awaitable ObjectRefs in the worker's event loop)."""

    def __init__(self, handle):
        self.handle = handle

    async def wait_change(self, version: int) -> tuple[int, int | None]:
        version, step = await self.handle.wait_change.remote(version)
        return version, step


async def _connect_actor() -> _ActorSource | None:
    handle = await asyncio.to_thread(_find_actor)
    return _ActorSource(handle) if handle is not None else None


def _find_actor():
    import ray

    if not ray.is_initialized():  # not inside a Ray worker (unit tests): no run, no gate
        return None
    try:
        return ray.get_actor(GATE_ACTOR_NAME)
    except ValueError:  # no such actor (yet)
        return None
    except Exception:  # noqa: BLE001 - Ray unreachable for now: treated as not found, looked up again later
        logger.warning("rollout gate: looking up the gate actor failed", exc_info=True)
        return None


@dataclass
class _Lookup:
    """One event loop's gate: its watch once found; else when the last lookup missed, and the lookup in flight."""

    watch: GateWatch | None = None
    missed_at: float | None = None
    pending: asyncio.Task | None = None


_lookups: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Lookup]" = weakref.WeakKeyDictionary()


async def gate_watch() -> GateWatch | None:
    """This process's watch (one per event loop), or None while the run has no gate actor (looked up again once
    ``LOOKUP_INTERVAL_S`` has passed since the last miss; concurrent trajectories share one lookup)."""
    lookup = _lookups.setdefault(asyncio.get_running_loop(), _Lookup())
    if lookup.watch is not None:
        return lookup.watch
    if lookup.missed_at is not None and _now() - lookup.missed_at < LOOKUP_INTERVAL_S:
        return None
    if lookup.pending is None:
        lookup.pending = asyncio.ensure_future(_connect_actor())
    task = lookup.pending
    source = await asyncio.shield(task)
    if lookup.pending is task:  # the first of the waiting trajectories to resume records the outcome
        lookup.pending = None
        if source is None:
            lookup.missed_at = _now()
        else:
            lookup.watch = GateWatch(source, _connect_actor)
    return lookup.watch
