"""The spin policy keeps whichever way of waiting (spin first, or sleep at once) has
been faster, and keeps measuring the other; an awaited wait that spins keeps the event
loop turning and loses no wake-up."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from functools import partial

import numpy as np
import pytest

import aiovec
from aiovec._transport.spin import EXPLORE_EVERY, LONG_WAITS, SpinPolicy
from aiovec.backends._base import SPIN_SLICE, Wakeup
from tests.envs import CounterEnv


def _wait(policy: SpinPolicy, spun_cost: float, slept_cost: float) -> bool:
    """One simulated wait; returns whether it spun."""
    spin = policy.begin()
    time.sleep(spun_cost if spin else slept_cost)
    policy.end()
    return bool(spin)


def test_spinning_stops_when_it_costs_more_than_sleeping():
    policy = SpinPolicy(200e-6)
    ways = [_wait(policy, spun_cost=0.004, slept_cost=0.0005) for _ in range(5 * EXPLORE_EVERY)]
    settled = ways[2 * EXPLORE_EVERY :]
    # Only the exploring waits still spin once sleeping has proved faster.
    assert sum(settled) <= len(settled) // EXPLORE_EVERY + 1


def test_spinning_stays_on_while_it_pays():
    # a window the spun waits stay well within, however late a loaded machine's sleeps end
    policy = SpinPolicy(2e-3)
    ways = [_wait(policy, spun_cost=0.0005, slept_cost=0.004) for _ in range(5 * EXPLORE_EVERY)]
    settled = ways[2 * EXPLORE_EVERY :]
    assert len(settled) - sum(settled) <= len(settled) // EXPLORE_EVERY + 1


def test_waits_far_longer_than_the_window_are_not_spun():
    """Spinning cannot shorten a wait that nearly always outlasts the spin (it ends in
    a sleep anyway): such waits sleep at once, but for the exploring ones, whichever
    way looked faster."""
    policy = SpinPolicy(200e-6)
    long_wait = (LONG_WAITS + 2) * 200e-6
    ways = [_wait(policy, spun_cost=long_wait, slept_cost=long_wait * 1.5) for _ in range(80)]
    settled = ways[EXPLORE_EVERY:]
    assert sum(settled) <= len(settled) // EXPLORE_EVERY + 1


def test_a_zero_window_never_spins():
    policy = SpinPolicy(0.0)
    assert all(policy.begin() == 0.0 for _ in range(50))


# --- the event loop while a wait spins ---------------------------------------------------


async def test_a_spinning_wait_gives_the_loop_turns_and_ends_when_woken():
    """A spin holds the loop only a slice at a time (other tasks keep running), and a
    wake() during it (a message's reader callback, an interrupt) ends it at once: none
    is lost."""
    wakeup = Wakeup()
    polls = []
    turns = 0

    def poll(seconds: float) -> bool:
        polls.append(seconds)
        return False

    async def other_task() -> None:
        nonlocal turns
        while True:
            turns += 1
            if turns == 20:
                wakeup.wake()
            await asyncio.sleep(0)

    other = asyncio.create_task(other_task())
    try:
        # a 60 s spin: only the wake-up ends it within the test's time limit
        await asyncio.wait_for(wakeup.wait(asyncio.get_running_loop(), None, 60.0, poll), 30)
    finally:
        other.cancel()
    assert turns >= 20 and len(polls) >= 18  # a slice between two turns of the other task
    assert max(polls) <= SPIN_SLICE


async def test_a_spin_ends_when_its_poll_finds_something_and_at_its_timeout():
    wakeup = Wakeup()
    loop = asyncio.get_running_loop()
    found = iter([False, False, True])
    await asyncio.wait_for(wakeup.wait(loop, None, 60.0, lambda seconds: next(found)), 30)
    assert next(found, "spent") == "spent"
    polls = []

    def nothing(seconds: float) -> bool:
        polls.append(seconds)
        return False

    # a timeout inside the spin window: nothing came, so it ends after the timeout
    await asyncio.wait_for(wakeup.wait(loop, 0.01, 60.0, nothing), 30)
    assert polls


async def test_a_nudge_during_a_spin_ends_it():
    """A signal handler's or another thread's nudge (see Wakeup.nudge) is not lost
    while the wait spins instead of awaiting its future."""
    wakeup = Wakeup()
    loop = asyncio.get_running_loop()
    threading.Timer(0.05, wakeup.nudge).start()
    await asyncio.wait_for(wakeup.wait(loop, None, 60.0, lambda seconds: False), 30)
    assert wakeup.take_lag() is None  # no wake() was waited for: no loop lag to report


@pytest.mark.parametrize("concurrent_envs", [True, False])
def test_the_agent_spins_by_default_while_workers_that_need_a_core_are_fewer_than_cores(
    concurrent_envs,
):
    """Workers stepping waiting envs in threads mostly sleep: with only those, the agent
    may spin (the policy then decides); with as many workers stepping in turn as
    cores, it never does. An explicit spin=0 never spins."""
    cores = os.cpu_count() or 1
    env_fns = [CounterEnv] * cores
    with aiovec.VecEnv(env_fns, num_workers=cores, concurrent_envs=concurrent_envs) as venv:
        venv.reset()
        assert (venv._backend._spin_begin() is not None) == concurrent_envs
    with aiovec.VecEnv(env_fns, num_workers=cores, concurrent_envs=True, spin=0.0) as venv:
        venv.reset()
        assert not venv._backend._spin_begin()


async def test_first_ready_with_a_spinning_agent_loses_nothing_and_lets_other_tasks_run():
    """The agent spins while its envs' threads sleep (a long window, so that every wait
    spins): each result arrives once, in each env's order, and a task beside it keeps
    getting turns."""
    env_fns = [partial(CounterEnv, i, delay_range=(0.0, 0.003)) for i in range(4)]
    turns = 0

    async def ticker() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    async with aiovec.VecEnv(env_fns, num_workers=2, concurrent_envs=True, spin=0.05) as venv:
        await venv.areset()
        task = asyncio.create_task(ticker())
        venv.send(np.zeros(4, dtype=np.int64))
        expected = [1] * 4
        received = 0
        try:
            while received < 200:
                before = turns
                batch = await venv.recv(1)
                assert turns > before  # a turn for the other task on every recv
                (env_id,) = batch.env_ids.tolist()
                assert batch.observations[0].tolist() == [env_id, expected[env_id]]
                expected[env_id] += 1
                received += 1
                venv.send(np.zeros(1, dtype=np.int64), batch.env_ids)
            await venv.recv(min_envs=4)
        finally:
            task.cancel()
        assert turns > received


def test_a_lockstep_step_spins_only_for_its_last_reply():
    """Envs stepped at once answer one by one, and the step waits for the last of them:
    only that reply's wake-up delays it, so only the wait for it may spin (a spin for
    each reply burnt the agent's CPU for nothing)."""
    cores = os.cpu_count() or 1
    env_fns = [partial(CounterEnv, i, delay=0.004 * i) for i in range(4)]
    with aiovec.VecEnv(env_fns, num_workers=min(cores, 4), concurrent_envs=True) as venv:
        venv.reset()
        policy = venv._backend._spin_policy
        for _ in range(2):  # every worker steps its envs in threads by now
            venv.step(np.zeros(4, dtype=np.int64))
        before = policy._count
        steps = 10
        for _ in range(steps):
            venv.step(np.zeros(4, dtype=np.int64))
        # one wait each step at most may spin (or sleep, measured): the one for its last
        # reply; the earlier replies are waited for without the policy (3 per step)
        assert policy._count - before <= steps


def test_a_blocking_wait_spins_no_longer_than_its_timeout():
    """An explicit spin window longer than a step timeout: the hanging env's
    StepTimeoutError comes at its timeout, not after the spin."""
    from tests.faulty import FaultyEnv

    class AlwaysSpin(SpinPolicy):  # whatever the waits measured so far
        __slots__ = ()

        def begin(self) -> float:
            super().begin()
            return self.window

    env_fns = [partial(FaultyEnv, 0, "hang", at_step=1)]
    with aiovec.VecEnv(env_fns, num_workers=1, spin=5.0, step_timeout=0.2) as venv:
        venv.reset()
        venv._backend._spin_policy = AlwaysSpin(5.0)
        started = time.monotonic()
        with pytest.raises(aiovec.StepTimeoutError):
            venv.step(np.zeros(1, dtype=np.int64))
        assert time.monotonic() - started < 4.0  # the 5 s spin window ran whole before
