"""The asyncio API: lockstep areset/astep and first-ready send/recv."""

from __future__ import annotations

import asyncio
import time
from functools import partial

import numpy as np
import pytest
from gymnasium.error import NoAsyncCallError

import aiovec
import aiovec._loop
from tests.envs import CounterEnv, SpacesEnv
from tests.helpers import assert_cancelled_recv_loses_nothing, random_traffic


def counter_envs(count: int, **kwargs) -> list:
    return [partial(CounterEnv, i, **kwargs) for i in range(count)]


async def test_astep_matches_step(backend):
    env_fns = [SpacesEnv for _ in range(4)]
    with aiovec.VecEnv(env_fns, backend="inline") as reference:
        expected_reset = await reference.areset(seed=3)
        expected_step = await reference.astep(np.array([0, 1, 2, 1]))
    async with aiovec.VecEnv(env_fns, backend=backend) as venv:
        observations, infos = await venv.areset(seed=3)
        np.testing.assert_array_equal(observations, expected_reset[0])
        result = await venv.astep(np.array([0, 1, 2, 1]))
    np.testing.assert_array_equal(result[0], expected_step[0])
    np.testing.assert_array_equal(result[1], expected_step[1])
    assert result[4].keys() == expected_step[4].keys()


async def test_first_ready_returns_fast_envs_first():
    delays = [0.3, 0.0, 0.3, 0.0]
    env_fns = [partial(CounterEnv, i, delay=d) for i, d in enumerate(delays)]
    async with aiovec.VecEnv(env_fns, num_workers=4) as venv:
        await venv.areset()
        venv.send(np.zeros(4, dtype=np.int64))
        first = await venv.recv(max_envs=2, min_envs=2)
        assert sorted(first.env_ids.tolist()) == [1, 3]
        np.testing.assert_array_equal(first.observations[:, 0], first.env_ids)
        assert venv.recv_nowait() is None  # the slow envs are still sleeping
        venv.send(np.ones(2, dtype=np.int64), env_ids=first.env_ids)  # fast envs go again
        second = await venv.recv(max_envs=2, min_envs=2)
        assert sorted(second.env_ids.tolist()) == [1, 3]
        np.testing.assert_array_equal(second.rewards, [2.0, 2.0])
        third = await venv.recv(min_envs=2)
        assert sorted(third.env_ids.tolist()) == [0, 2]
        np.testing.assert_array_equal(third.rewards, [1.0, 1.0])


@pytest.mark.parametrize(
    "backend, num_workers", [("inline", None), ("process", 1), ("process", 3), ("process", 6)]
)
async def test_every_action_gets_exactly_one_result(backend, num_workers):
    """Thousands of random send/recv rounds: nothing lost, duplicated or mixed up."""
    options = {"num_workers": num_workers} if backend == "process" else {}
    async with aiovec.VecEnv(counter_envs(6), backend=backend, **options) as venv:
        await venv.areset()

        def check(batch, row, env_id, count):
            # the result belongs to this env and to the latest action sent to it
            assert batch.observations[row].tolist() == [env_id, count]
            assert batch.rewards[row] == count
            assert batch.infos["action"][row] == (count - 1) % 2

        rounds = 2000 if backend == "process" else 4000
        sent, received = await random_traffic(venv, rounds, seed=num_workers or 0, check=check)
        assert received == sent
        assert venv.recv_nowait() is None


async def test_recv_timeout_and_cancellation_lose_nothing():
    async with aiovec.VecEnv(counter_envs(2, delay=0.3), num_workers=2) as venv:
        await venv.areset()
        await assert_cancelled_recv_loses_nothing(venv)


async def test_recv_with_nothing_in_flight_raises_at_once(backend):
    async with aiovec.VecEnv(counter_envs(2), backend=backend) as venv:
        await venv.areset()
        with pytest.raises(aiovec.NothingInFlightError, match="send"):
            await venv.recv()


async def test_send_to_busy_env_is_rejected_and_changes_nothing(backend):
    async with aiovec.VecEnv(counter_envs(3), backend=backend) as venv:
        await venv.areset()
        venv.send([1], env_ids=[1])
        with pytest.raises(aiovec.EnvBusyError, match=r"envs \[1\]"):
            venv.send([0, 0], env_ids=[0, 1])
        with pytest.raises(aiovec.EnvBusyError):
            await venv.astep([0, 0, 0])
        with pytest.raises(aiovec.EnvBusyError):
            await venv.areset()
        batch = await venv.recv()
        assert batch.env_ids.tolist() == [1]
        assert batch.rewards.tolist() == [1.0]
        # env 0 was never stepped: its first result is step 1
        result = await venv.astep([0, 0, 0])
        assert result[1].tolist() == [1.0, 2.0, 1.0]


@pytest.mark.parametrize(
    "env_ids, error",
    [
        ([0, 0], ValueError),
        ([3], ValueError),
        ([-1], ValueError),
        ([], ValueError),
        ([0.5], TypeError),
    ],
)
async def test_bad_env_ids_are_rejected(backend, env_ids, error):
    async with aiovec.VecEnv(counter_envs(3), backend=backend) as venv:
        await venv.areset()
        with pytest.raises(error, match="env_ids"):
            venv.send(np.zeros(len(env_ids), dtype=np.int64), env_ids=env_ids)
        assert venv._scheduler.num_busy == 0


async def test_sync_methods_inside_a_running_loop_block_as_gymnasium_does(backend, monkeypatch):
    """As in a notebook: the synchronous API works inside a running loop (blocking it),
    with one RuntimeWarning that names the await to use; tasks parked on the env are
    woken by what the blocking call applied."""
    monkeypatch.setattr(aiovec._loop, "_warned_about_blocking", False)
    async with aiovec.VecEnv(counter_envs(2), backend=backend) as venv:
        with pytest.warns(RuntimeWarning, match="await venv.areset"):
            observations, _ = venv.reset()
        assert observations.tolist() == [[0, 0], [1, 0]]
        observations, *_ = venv.step([0, 0])
        assert observations[:, 1].tolist() == [1, 1]
        venv.send([0], env_ids=[1])
        waiter = asyncio.ensure_future(venv.recv())
        await asyncio.sleep(0.05)
        assert venv.call("env_index", env_ids=[0]) == (0,)  # while the task waits
        batch = await asyncio.wait_for(waiter, 10)
        assert batch.env_ids.tolist() == [1]
        assert await venv.acall("env_index") == (0, 1)


async def test_sync_call_on_the_loop_of_async_envs_is_refused():
    from tests.async_envs import AsyncCounterEnv

    async with aiovec.VecEnv([AsyncCounterEnv] * 2, backend="coroutine") as venv:
        with pytest.raises(aiovec.SyncCallInEventLoopError, match="await venv.areset"):
            venv.reset()
        await venv.areset()


@pytest.mark.parametrize("call", ["reset", "step", "call", "step_wait", "render"])
async def test_a_sync_call_on_a_closed_env_inside_its_loop_says_it_is_closed(call):
    # Closed is what is wrong (the same call outside the loop says so), not the loop.
    from tests.async_envs import AsyncCounterEnv

    venv = aiovec.VecEnv([AsyncCounterEnv] * 2, backend="coroutine")
    await venv.areset()
    await venv.aclose()
    calls = {
        "reset": venv.reset,
        "step": lambda: venv.step([0, 0]),
        "call": lambda: venv.call("env_index"),
        "step_wait": venv.step_wait,
        "render": venv.render,
    }
    with pytest.raises(aiovec.ClosedError):
        calls[call]()


def test_sync_methods_inside_ipython_do_not_warn(monkeypatch):
    """In IPython/Jupyter every cell runs inside a loop: no warning there."""
    import sys
    import types
    import warnings

    fake = types.ModuleType("IPython")
    fake.get_ipython = lambda: object()
    monkeypatch.setitem(sys.modules, "IPython", fake)
    monkeypatch.setattr(aiovec._loop, "_warned_about_blocking", False)

    async def cell():
        with aiovec.VecEnv(counter_envs(2), backend="inline") as venv, warnings.catch_warnings():
            warnings.simplefilter("error")
            venv.reset()
            return venv.step([0, 0])[0].tolist()

    assert asyncio.run(cell()) == [[0, 1], [1, 1]]


async def test_subset_reset_in_first_ready_mode(backend):
    async with aiovec.VecEnv(counter_envs(3), backend=backend) as venv:
        await venv.areset()
        await venv.astep([0, 0, 0])
        venv.send([1], env_ids=[2])  # env 2 keeps running while 0 is reset
        observations, _ = await venv.areset(options={"reset_mask": np.array([True, False, False])})
        assert observations[0].tolist() == [0, 0]
        assert observations[1].tolist() == [1, 1]
        batch = await venv.recv()
        assert batch.env_ids.tolist() == [2]


def test_gymnasium_split_calls(backend):
    with aiovec.VecEnv(counter_envs(2), backend=backend) as venv:
        with pytest.raises(NoAsyncCallError):
            venv.step_wait()
        venv.reset_async(seed=1)
        with pytest.raises(aiovec.EnvBusyError, match="reset_wait"):
            venv.step_async([0, 0])
        observations, _ = venv.reset_wait()
        assert observations.tolist() == [[0, 0], [1, 0]]
        venv.step_async([1, 0])
        observations, rewards, *_ = venv.step_wait()
        assert rewards.tolist() == [1.0, 1.0]
        venv.call_async("env_index")
        assert venv.call_wait() == (0, 1)


def test_copy_false_returns_views_copy_true_returns_copies(backend):
    with aiovec.VecEnv(counter_envs(2), backend=backend, copy=False) as venv:
        first, _ = venv.reset()
        venv.step([0, 0])
        assert first[:, 1].tolist() == [1, 1]  # the view saw the step
    with aiovec.VecEnv(counter_envs(2), backend=backend, copy=True) as venv:
        first, _ = venv.reset()
        venv.step([0, 0])
        assert first[:, 1].tolist() == [0, 0]


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_same_env_driven_from_successive_event_loops(loop):
    """Each asyncio.run() brings a new loop; the env follows it, and the sync API still works."""
    venv = aiovec.VecEnv(counter_envs(2), num_workers=2)

    async def two_steps():
        await venv.areset()
        venv.send([0, 1])
        batch = await venv.recv(min_envs=2)
        return sorted(batch.rewards.tolist())

    assert aiovec.run(two_steps(), loop=loop) == [1.0, 1.0]
    assert aiovec.run(two_steps(), loop=loop) == [1.0, 1.0]
    _, rewards, *_ = venv.step([0, 0])
    assert rewards.tolist() == [2.0, 2.0]
    venv.close()


def test_unknown_loop_kind_is_rejected():
    async def nothing():
        return None

    coroutine = nothing()
    with pytest.raises(ValueError, match="loop must be one of"):
        aiovec.run(coroutine, loop="trio")
    coroutine.close()


@pytest.mark.parametrize("inline_envs", [1, 3])
async def test_main_process_share_behaves_like_workers(inline_envs):
    """With inline_envs, the agent's process steps the last envs itself: same results."""
    async with aiovec.VecEnv(counter_envs(5), num_workers=2, inline_envs=inline_envs) as venv:
        assert venv.num_workers == 2 and venv.inline_envs == inline_envs
        observations, _ = await venv.areset()
        assert observations[:, 0].tolist() == [0, 1, 2, 3, 4]
        result = await venv.astep(np.array([0, 1, 0, 1, 0]))
        assert result[1].tolist() == [1.0] * 5
        assert result[4]["action"].tolist() == [0, 1, 0, 1, 0]
        venv.send([1, 1], env_ids=[4, 0])  # a local env listed first still waits for no one
        batch = await venv.recv(min_envs=2)
        assert sorted(batch.env_ids.tolist()) == [0, 4]
        assert await venv.acall("env_index") == (0, 1, 2, 3, 4)


def test_bad_inline_envs_is_rejected():
    with pytest.raises(ValueError, match="inline_envs"):
        aiovec.VecEnv(counter_envs(2), inline_envs=2)


async def test_a_worker_streams_first_ready_results_env_by_env():
    """Envs sharing a worker step one after another; send() lets the fast one's result
    out before the slow one finishes, astep() answers once."""
    env_fns = [partial(CounterEnv, 0), partial(CounterEnv, 1, delay=0.5)]
    async with aiovec.VecEnv(env_fns, num_workers=1) as venv:
        await venv.areset()
        venv.send([0, 0])
        started = time.monotonic()
        first = await venv.recv()
        assert first.env_ids.tolist() == [0]
        assert time.monotonic() - started < 0.4
        venv.send([1], env_ids=[0])  # queued behind env 1 in the same worker
        rest = await venv.recv(min_envs=2)
        assert sorted(rest.env_ids.tolist()) == [0, 1]
        assert dict(zip(rest.env_ids.tolist(), rest.rewards.tolist())) == {0: 2.0, 1: 1.0}


def test_busy_error_message_stays_short():
    with aiovec.VecEnv([CounterEnv] * 50, backend="inline") as venv:
        venv.reset()
        venv.send(np.zeros(50, dtype=np.int64))
        with pytest.raises(aiovec.EnvBusyError, match=r"\(50 in all\)") as caught:
            venv.send(np.zeros(50, dtype=np.int64))
        assert len(str(caught.value)) < 300


@pytest.mark.parametrize("max_envs", [0, -1])
async def test_recv_rejects_a_batch_size_below_one(max_envs):
    async with aiovec.VecEnv(counter_envs(2), backend="inline") as venv:
        await venv.areset()
        venv.send([0, 0])
        with pytest.raises(ValueError, match="max_envs"):
            await venv.recv(max_envs)
        with pytest.raises(ValueError, match="max_envs"):
            venv.recv_nowait(max_envs)
        assert len((await venv.recv()).env_ids) == 2  # nothing was lost


def test_new_event_loop_kinds():
    import uvloop

    for kind, expected in (("asyncio", asyncio.AbstractEventLoop), ("uvloop", uvloop.Loop)):
        loop = aiovec.new_event_loop(kind)
        assert isinstance(loop, expected)
        loop.close()
    auto = aiovec.new_event_loop()
    assert isinstance(auto, uvloop.Loop)  # uvloop is installed here
    auto.close()
