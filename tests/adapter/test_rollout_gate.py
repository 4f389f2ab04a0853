"""The rollout gate's state, a worker's watch of it and the worker's lookup of the actor (pure asyncio), and the
driver's gate on a real Ray actor.

Orderings are stepped by hand, never by sleeping: ``Polls`` counts the watch's polls (its n-th poll starts only after
it has applied every reply before it), the reconnect backoff's ``_sleep`` blocks until the test releases it, and the
lookup's clock is moved by the test."""
import asyncio

import pytest

import recipe.adapter.rollout_gate as rg
from recipe.adapter.rollout_gate import GATE_ACTOR_NAME, DriverGate, GateState, GateWatch, RolloutGateActor, gate_watch

GUARD_S = 30  # a failing test ends instead of hanging; no ordering depends on it


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, GUARD_S))


async def no_actor():
    return None


class Polls:
    """A gate source that counts the polls made on it; with ``fail_after``, the poll after that many replies raises
    once the test calls ``die()`` (the actor died under a pending poll)."""

    def __init__(self, state, fail_after=None):
        self.state, self.fail_after, self.polls = state, fail_after, 0
        self._cv, self._died = asyncio.Condition(), asyncio.Event()

    async def wait_change(self, version):
        async with self._cv:
            self.polls += 1
            self._cv.notify_all()
        if self.fail_after is not None and self.polls > self.fail_after:
            await self._died.wait()
            raise RuntimeError("actor died")
        return await self.state.wait_change(version)

    def die(self):
        self._died.set()

    async def polled(self, n):
        """Until the n-th poll has started: the watch has applied the n-1 replies before it."""
        async with self._cv:
            await self._cv.wait_for(lambda: self.polls >= n)


class SteppedSleep:
    """Stands in for the reconnect backoff's sleep: records each delay and returns when the test releases it."""

    def __init__(self):
        self.delays, self._go, self._cv = [], asyncio.Semaphore(0), asyncio.Condition()

    async def __call__(self, delay):
        async with self._cv:
            self.delays.append(delay)
            self._cv.notify_all()
        await self._go.acquire()

    async def called(self, n):
        async with self._cv:
            await self._cv.wait_for(lambda: len(self.delays) >= n)

    def release(self):
        self._go.release()


def test_wait_change_returns_at_each_flip_with_the_closed_step():
    async def scenario():
        state = GateState()
        assert state.open() == 0  # no flip, no new version
        waiter = asyncio.ensure_future(state.wait_change(0))
        await asyncio.sleep(0)
        assert not waiter.done()
        state.close(5)
        assert await waiter == (1, 5)
        assert await state.wait_change(0) == (1, 5)  # an old version returns at once
        assert state.close(5) == 1  # closing the closed step again is no flip
        state.open()
        return await state.wait_change(1)

    assert run(scenario()) == (2, None)


def test_the_watch_cuts_only_the_step_the_gate_closes_for():
    async def scenario():
        state = GateState()
        source = Polls(state)
        watch = GateWatch(source, no_actor)
        await source.polled(2)
        assert watch.step is None and not watch.cuts(5)
        cut5, cut6, never = (asyncio.ensure_future(watch.wait_cut(s)) for s in (5, 6, None))
        state.close(5)
        await cut5
        await source.polled(3)
        assert watch.cuts(5) and not watch.cuts(6) and not watch.cuts(None)  # None: a validation row
        assert not cut6.done() and not never.done()
        state.open()
        await source.polled(4)
        assert watch.step is None and not watch.cuts(5)
        late = asyncio.ensure_future(watch.wait_cut(5))
        state.close(6)  # the next step's abort
        await cut6
        await source.polled(5)
        assert not late.done() and not never.done()
        for task in (late, never):
            task.cancel()
        watch.stop()

    run(scenario())


@pytest.mark.parametrize("now", ["closed for step 6", "open"])
def test_a_watch_whose_source_dies_after_closed_is_open_meanwhile_then_reconnects_to_the_current_state(
        monkeypatch, now):
    """The actor dies after telling the watch "closed for 5": the watch shows open (nothing known, never stuck
    closed), looks the actor up again with a growing backoff (none found at first), and once found shows the gate as
    it is then. Fails on the watch without reconnects (it ended at the failure and stayed open)."""
    sleep = SteppedSleep()
    monkeypatch.setattr(rg, "_sleep", sleep)

    async def scenario():
        old, current = GateState(), GateState()
        old.close(5)
        if now != "open":
            current.close(6)
        new_source = Polls(current)
        found = [None, new_source]  # the first lookup after the failure finds no actor

        async def connect():
            return found.pop(0)

        dying = Polls(old, fail_after=1)
        watch = GateWatch(dying, connect)
        await dying.polled(2)
        assert watch.cuts(5)
        dying.die()
        await sleep.called(1)  # the pending poll failed: waiting to reconnect
        assert watch.step is None and not watch.cuts(5)
        sleep.release()
        await sleep.called(2)  # the lookup found nothing: waiting longer
        assert watch.source is None and watch.step is None
        sleep.release()
        await new_source.polled(2)  # connected: the first reply (the gate now) is applied
        view = watch.step
        watch.stop()
        return view

    assert run(scenario()) == (6 if now != "open" else None)
    assert sleep.delays == [rg.RECONNECT_BACKOFF_S[0], 2 * rg.RECONNECT_BACKOFF_S[0]]


def test_a_worker_that_looked_before_the_actor_existed_finds_it_later(monkeypatch):
    """The first trajectories of a worker may look for the gate before the driver created it: the miss is not kept
    for the process's life, only for ``LOOKUP_INTERVAL_S`` (one lookup per interval, shared by concurrent
    trajectories). Fails on the lookup that cached "no gate" forever."""
    clock = [1000.0]
    monkeypatch.setattr(rg, "_now", lambda: clock[0])
    state = GateState()
    state.close(3)
    handle = [None]
    lookups = []

    def find():
        lookups.append(clock[0])
        return handle[0]

    monkeypatch.setattr(rg, "_find_actor", find)

    class Handle:  # a Ray actor handle's shape: ``wait_change.remote(version)`` is awaitable
        class wait_change:  # noqa: N801
            @staticmethod
            def remote(version):
                return state.wait_change(version)

    async def scenario():
        first = await asyncio.gather(*(gate_watch() for _ in range(3)))  # three trajectories start at once
        assert first == [None] * 3 and len(lookups) == 1
        handle[0] = Handle()  # the driver creates the actor
        clock[0] += rg.LOOKUP_INTERVAL_S / 2
        assert await gate_watch() is None and len(lookups) == 1  # not looked up again yet
        clock[0] += rg.LOOKUP_INTERVAL_S / 2
        watch = await gate_watch()
        assert watch is not None and len(lookups) == 2
        assert await gate_watch() is watch  # one watch per event loop
        await watch.wait_cut(3)
        watch.stop()

    run(scenario())


def test_no_gate_without_the_runs_actor():
    """Outside Ray, or in a Ray session without the gate actor (another test may have started Ray in this
    process): no watch, tools are never cancelled."""
    assert run(gate_watch()) is None


class QueuedHandle:
    """A Ray actor handle on a real ``RolloutGateActor`` in which ``method.remote()`` only queues the call: it runs
    when ``ray.get`` asks for its reply (``queued_get``), the latest moment Ray may run it."""

    def __init__(self):
        self.actor, self.queue = RolloutGateActor(), []

    def __getattr__(self, name):
        method, queue = getattr(self.actor, name), self.queue

        class Method:
            @staticmethod
            def remote(*args):
                queue.append((ref := object(), method, args))
                return ref

        return Method


def queued_get(handle):
    def get(ref):
        while handle.queue:
            queued, method, args = handle.queue.pop(0)
            result = asyncio.run(method(*args))
            if queued is ref:
                return result
        raise AssertionError("ray.get of a call never made")

    return get


def test_driver_close_and_open_return_once_the_actor_has_flipped(monkeypatch):
    """The driver aborts right after ``close()``: by then the actor must be closed for the step (a worker polling it
    then sees it), not merely asked to close."""
    import ray

    handle = QueuedHandle()
    monkeypatch.setattr(ray, "get", queued_get(handle))
    gate = DriverGate(handle)
    gate.close(5)
    assert (handle.actor.state.version, handle.actor.state.step) == (1, 5)
    gate.open()
    assert (handle.actor.state.version, handle.actor.state.step) == (2, None)


@pytest.fixture
def gate_actor(tq_session):
    """The run's gate actor in the tests' local Ray cluster, killed after the test (later tests have none)."""
    import ray

    gate = rg.create_gate()
    yield gate
    ray.kill(ray.get_actor(GATE_ACTOR_NAME))


def test_the_actor_is_closed_for_the_step_when_driver_close_returns_and_a_worker_sees_it(gate_actor):
    import ray

    gate_actor.close(5)
    assert ray.get(gate_actor.handle.wait_change.remote(-1)) == (1, 5)  # no wait: flipped before close returned
    gate_actor.open()
    assert ray.get(gate_actor.handle.wait_change.remote(-1)) == (2, None)

    async def worker():
        watch = await gate_watch()  # found through Ray, as an agent-loop worker finds it
        assert watch is not None
        gate_actor.handle.close.remote(9)  # the driver's close, seen through the watch's long poll
        await watch.wait_cut(9)
        watch.stop()

    run(worker())


def test_a_watch_reconnects_to_a_replaced_actor(gate_actor):
    """The actor is killed under a watch's pending poll and a new one is created under the same name: Ray's error
    ends the poll, and the watch (real backoff) finds the new actor by name and follows it."""
    import ray

    def gone():  # Ray has released the name (ray.kill returns before it has)
        try:
            ray.get_actor(GATE_ACTOR_NAME)
            return False
        except ValueError:
            return True

    async def scenario():
        watch = await gate_watch()
        gate_actor.close(4)
        await watch.wait_cut(4)
        ray.kill(gate_actor.handle)
        while not await asyncio.to_thread(gone):
            await asyncio.sleep(0.05)
        replacement = await asyncio.to_thread(rg.create_gate)
        await asyncio.to_thread(replacement.close, 8)
        await watch.wait_cut(8)
        watch.stop()

    run(scenario())
