"""Several tasks (and threads) awaiting one vector env: nobody hangs, nothing is lost."""

from __future__ import annotations

import asyncio
import threading
import time
from functools import partial

import numpy as np
import pytest

import aiovec
from tests.envs import CounterEnv
from tests.helpers import Heartbeat

BOUND = 20  # seconds: any wait longer than this is a hang


def counter_envs(count: int, **kwargs) -> list:
    return [partial(CounterEnv, i, **kwargs) for i in range(count)]


async def test_a_call_from_a_second_task_while_stepping_first_ready(backend):
    """The curriculum pattern: one task loops recv/send, another awaits acall/aset_attr
    on one env; both go on."""
    async with aiovec.VecEnv(counter_envs(4, delay=0.002), backend=backend) as venv:
        await venv.areset()
        venv.send(np.zeros(4, dtype=np.int64))
        results = 0
        stop = False

        async def stepping() -> None:
            nonlocal results
            while not stop:
                batch = await venv.recv()
                results += len(batch.env_ids)
                venv.send(np.zeros(len(batch.env_ids), dtype=np.int64), batch.env_ids)

        stepper = asyncio.ensure_future(stepping())
        for level in range(5):
            await asyncio.wait_for(venv.aset_attr("level", level, env_ids=[0]), BOUND)
            assert await asyncio.wait_for(venv.acall("level", env_ids=[0]), BOUND) == (level,)
        before = results
        await asyncio.sleep(0.05)
        stop = True
        await asyncio.wait_for(stepper, BOUND)
        assert results > before  # the stepping task kept being woken


async def test_two_tasks_receiving_at_once_both_finish(backend):
    async with aiovec.VecEnv(counter_envs(4, delay=0.01), backend=backend) as venv:
        await venv.areset()
        venv.send(np.zeros(4, dtype=np.int64))

        async def receive() -> list[int]:
            taken = []
            while True:
                try:
                    batch = await venv.recv(max_envs=1)
                except aiovec.NothingInFlightError:  # the other task took the rest
                    return taken
                taken += batch.env_ids.tolist()

        first, second = await asyncio.wait_for(asyncio.gather(receive(), receive()), BOUND)
        assert sorted(first + second) == [0, 1, 2, 3]


@pytest.mark.parametrize("closing", ["close", "aclose"])
async def test_closing_wakes_every_waiting_task(closing):
    # Workers mid-step for 5 s: aclose() waits close_timeout for them, then kills them.
    venv = aiovec.VecEnv(counter_envs(2, delay=5), backend="process", close_timeout=0.5)
    await venv.areset()
    venv.send([0, 0])
    waiters = [asyncio.ensure_future(venv.recv()) for _ in range(3)]
    waiters.append(asyncio.ensure_future(venv.acall("env_index")))
    await asyncio.sleep(0.05)
    if closing == "close":
        venv.close(timeout=0)
    else:
        await venv.aclose()
    for waiter in waiters:
        with pytest.raises(aiovec.ClosedError, match="closed while"):
            await asyncio.wait_for(waiter, BOUND)


async def test_recv_does_not_wait_for_resets_or_calls(backend):
    async with aiovec.VecEnv(counter_envs(3, delay=0.01), backend=backend) as venv:
        await venv.areset()
        resetting = asyncio.ensure_future(venv.areset())
        await asyncio.sleep(0)
        with pytest.raises(aiovec.NothingInFlightError):
            await asyncio.wait_for(venv.recv(min_envs=3), BOUND)
        await asyncio.wait_for(resetting, BOUND)
        venv.send([0], env_ids=[1])
        batch = await asyncio.wait_for(venv.recv(min_envs=3), BOUND)  # 1 is all that can come
        assert batch.env_ids.tolist() == [1]


async def test_recv_after_a_cancelled_reset_does_not_hang(backend):
    async with aiovec.VecEnv(counter_envs(2, delay=0.01), backend=backend) as venv:
        task = asyncio.ensure_future(venv.areset())
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        with pytest.raises(aiovec.NothingInFlightError):
            await asyncio.wait_for(venv.recv(), BOUND)
        # The cancelled reset completes in the background; a new one queues behind it.
        observations, _ = await asyncio.wait_for(venv.areset(), BOUND)
        assert observations.shape == (2, 2)


async def test_every_await_gives_other_tasks_a_turn(backend):
    """A first-ready loop on fast envs (inline: results are ready at once) must not
    starve a heartbeat task."""
    async with aiovec.VecEnv(counter_envs(2), backend=backend) as venv:
        await venv.areset()
        heartbeat = Heartbeat(0)
        venv.send([0, 0])
        deadline = time.monotonic() + 0.3
        while time.monotonic() < deadline:
            batch = await venv.recv()
            venv.send(np.zeros(len(batch.env_ids), dtype=np.int64), batch.env_ids)
        await venv.recv(min_envs=2)
        heartbeat.stop()
    assert heartbeat.beats > 10


async def test_polling_recv_with_timeout_zero_gives_other_tasks_turns_and_gets_results(
    backend,
):
    """``recv(timeout=0)`` in a loop is a poll: each one gives the loop's other tasks a
    turn, and the results come."""
    async with aiovec.VecEnv(counter_envs(2, delay=0.01), backend=backend) as venv:
        await venv.areset()
        heartbeat = Heartbeat(0)
        venv.send([0, 0])
        taken, polls, deadline = [], 0, time.monotonic() + BOUND
        while len(taken) < 2 and time.monotonic() < deadline:
            polls += 1
            try:
                taken += (await venv.recv(timeout=0)).env_ids.tolist()
            except TimeoutError:
                pass
        heartbeat.stop()
    assert sorted(taken) == [0, 1]
    assert heartbeat.beats >= polls // 2  # a turn for the heartbeat at (nearly) every poll


async def test_recv_with_timeout_zero_returns_results_that_have_arrived(backend):
    async with aiovec.VecEnv(counter_envs(2), backend=backend) as venv:
        await venv.areset()
        venv.send([0, 0])
        time.sleep(0.3)  # blocking: the loop does not run, the replies wait unread
        batch = await venv.recv(min_envs=2, timeout=0)
        assert sorted(batch.env_ids.tolist()) == [0, 1]


async def test_a_blocking_call_from_another_thread_is_refused_while_tasks_wait():
    async with aiovec.VecEnv(counter_envs(2, delay=0.5), backend="process") as venv:
        await venv.areset()
        venv.send([0, 0])
        waiter = asyncio.ensure_future(venv.recv(min_envs=2))
        await asyncio.sleep(0.05)
        errors = []

        def other_thread() -> None:
            try:
                venv.call("env_index")
            except RuntimeError as error:
                errors.append(error)

        thread = threading.Thread(target=other_thread)
        thread.start()
        await asyncio.get_running_loop().run_in_executor(None, thread.join, BOUND)
        assert errors and "another thread" in str(errors[0])
        batch = await asyncio.wait_for(waiter, BOUND)
        assert sorted(batch.env_ids.tolist()) == [0, 1]


def test_blocking_calls_from_two_threads_at_once_are_refused():
    """Two threads stepping one vector env at once: one of them gets a clear
    RuntimeError at once, the other its results; nothing hangs or is lost."""
    with aiovec.VecEnv(counter_envs(2, delay=0.3), backend="process") as venv:
        venv.reset()
        outcomes: list[object] = []

        def stepping() -> None:
            try:
                outcomes.append(venv.step([0, 0])[0][:, 1].tolist())
            except RuntimeError as error:
                outcomes.append(error)

        threads = [threading.Thread(target=stepping) for _ in range(2)]
        for thread in threads:
            thread.start()
            time.sleep(0.05)
        for thread in threads:
            thread.join(BOUND)
        errors = [o for o in outcomes if isinstance(o, RuntimeError)]
        assert len(outcomes) == 2 and len(errors) == 1
        assert "another thread" in str(errors[0])
        assert [o for o in outcomes if not isinstance(o, RuntimeError)] == [[1, 1]]
        assert venv.step([0, 0])[0][:, 1].tolist() == [2, 2]


@pytest.mark.parametrize("first", ["acall", "step"])
def test_a_call_from_a_second_thread_while_one_runs_is_refused(first):
    """An awaited call in one thread and a blocking call in another never run env code
    at the same time: the second is refused with a RuntimeError, whichever comes first."""
    import threading
    import time

    import aiovec
    from tests.envs import CounterEnv

    class Slow(CounterEnv):
        def slow(self):
            time.sleep(0.3)
            return self.count

    outcome = {}
    with aiovec.VecEnv([Slow], backend="inline") as venv:
        venv.reset(seed=0)

        def awaited():
            async def main():
                return await venv.acall("slow")

            try:
                outcome["acall"] = aiovec.run(main())
            except RuntimeError as exc:
                outcome["acall"] = exc

        def blocking():
            try:
                outcome["step"] = venv.call("slow")
            except RuntimeError as exc:
                outcome["step"] = exc

        threads = {"acall": awaited, "step": blocking}
        second = "step" if first == "acall" else "acall"
        a, b = threading.Thread(target=threads[first]), threading.Thread(target=threads[second])
        a.start()
        time.sleep(0.1)
        b.start()
        a.join(10)
        b.join(10)
    assert not isinstance(outcome[first], Exception), outcome
    assert isinstance(outcome[second], RuntimeError), outcome
    assert "another thread" in str(outcome[second])


@pytest.mark.parametrize("backend", ["inline", "process", "coroutine"])
def test_close_from_a_second_thread_while_one_steps_is_refused_and_changes_nothing(backend):
    """close() is a call like the others: from a second thread while the owner's step
    runs, it raises RuntimeError before doing anything (envs stepped in this process
    would be closed under the step, an event loop run from two threads); the step
    returns its results and the owner closes the env afterwards."""
    from tests.async_envs import AsyncCounterEnv

    env_class = AsyncCounterEnv if backend == "coroutine" else CounterEnv
    venv = aiovec.VecEnv([partial(env_class, i, delay=0.6) for i in range(2)], backend=backend)
    venv.reset(seed=0)
    outcome: dict[str, object] = {}

    def stepping() -> None:
        try:
            outcome["step"] = venv.step(np.zeros(2, dtype=np.int64))[0][:, 1].tolist()
        except BaseException as exc:  # noqa: BLE001 - reported below
            outcome["step"] = exc

    stepper = threading.Thread(target=stepping)
    stepper.start()
    time.sleep(0.2)
    with pytest.raises(RuntimeError, match="another thread"):
        venv.close()
    assert not venv.closed
    stepper.join(BOUND)
    assert not stepper.is_alive()
    assert outcome["step"] == [1, 1], outcome
    assert venv.step(np.zeros(2, dtype=np.int64))[0][:, 1].tolist() == [2, 2]
    venv.close()
    assert venv.closed
