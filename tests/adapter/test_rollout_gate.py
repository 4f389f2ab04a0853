"""The rollout gate's state and a worker's watch of it (pure asyncio; the Ray actor only wraps GateState)."""
import asyncio

from recipe.adapter.rollout_gate import GateState, GateWatch, gate_watch


def test_wait_change_returns_at_each_flip_and_only_then():
    async def scenario():
        state = GateState()
        assert state.set(False) == 0  # no flip, no new version
        waiter = asyncio.ensure_future(state.wait_change(0))
        await asyncio.sleep(0.01)
        assert not waiter.done()
        state.set(True)
        assert await asyncio.wait_for(waiter, 1) == (1, True)
        assert await state.wait_change(0) == (1, True)  # an old version returns at once
        state.set(False)
        return await state.wait_change(1)

    assert asyncio.run(scenario()) == (2, False)


def test_the_watch_follows_the_gate_and_wait_closed_wakes_on_close():
    async def scenario():
        state = GateState()
        watch = GateWatch(state)
        await asyncio.sleep(0.01)
        assert not watch.closed
        closed = asyncio.ensure_future(watch.wait_closed())
        await asyncio.sleep(0.01)
        assert not closed.done()
        state.set(True)
        await asyncio.wait_for(closed, 1)
        assert watch.closed
        state.set(False)
        await asyncio.sleep(0.01)
        assert not watch.closed
        late = asyncio.ensure_future(watch.wait_closed())
        await asyncio.sleep(0.01)
        assert not late.done()  # reopened: waiting again
        late.cancel()
        watch.stop()

    asyncio.run(scenario())


def test_a_watch_whose_actor_is_gone_behaves_as_an_open_gate():
    class Gone:
        async def wait_change(self, version):
            raise RuntimeError("actor died")

    async def scenario():
        watch = GateWatch(Gone())
        await asyncio.sleep(0.01)
        return watch.closed, watch._task.done()

    assert asyncio.run(scenario()) == (False, True)


def test_no_gate_without_the_runs_actor():
    """Outside Ray, or in a Ray session without the gate actor (another test may have started Ray in this
    process): no watch, tools are never cancelled."""
    assert asyncio.run(gate_watch()) is None
