"""``VecEnv.stats()``: where the time went, counted on every backend and in every mode."""

from __future__ import annotations

import asyncio
import time
from functools import partial

import numpy as np
import pytest

import aiovec
from tests.async_envs import AsyncCounterEnv
from tests.envs import CounterEnv
from tests.faulty import FaultyEnv

DELAY = 0.005


def test_lockstep_inline_counts_every_env_step_and_its_time():
    with aiovec.VecEnv([partial(CounterEnv, i, DELAY) for i in range(3)], backend="inline") as venv:
        venv.reset(seed=0)
        before = venv.stats()
        for _ in range(10):
            venv.step(np.zeros(3, dtype=np.int64))
        window = venv.stats() - before
    assert window.env_steps == 30
    assert window.commands == 10
    # Each env step sleeps DELAY: the envs' time is at least that, all of it here.
    assert window.env_time >= 30 * DELAY
    assert window.local_env_time == pytest.approx(window.env_time)
    assert 0 < window.agent_time < window.elapsed
    assert set(window.step_latency) == {"p50", "p90", "p99", "max"}
    assert window.step_latency["p50"] >= 3 * DELAY  # a lockstep step waits for all three
    per_step = window.per_env_step()
    assert per_step["env"] >= 1e6 * DELAY
    assert window.loop_lag == {}  # only the synchronous API was used


def test_first_ready_in_workers_counts_results_latency_and_queue(no_leaks):
    env_fns = [partial(CounterEnv, i, DELAY) for i in range(4)]
    with aiovec.VecEnv(env_fns, backend="process", num_workers=2) as venv:

        async def main() -> int:
            await venv.areset(seed=0)
            venv.send(np.zeros(4, dtype=np.int64))
            results = 0
            while results < 40:
                batch = await venv.recv(max_envs=2)
                results += len(batch.env_ids)
                venv.send(np.zeros(len(batch.env_ids), dtype=np.int64), batch.env_ids)
            while True:  # collect what is still in flight
                try:
                    results += len((await venv.recv()).env_ids)
                except aiovec.NothingInFlightError:
                    return results

        results = aiovec.run(main())
        stats = venv.stats()
    assert stats.env_steps == results
    assert stats.env_time >= results * DELAY
    assert stats.local_env_time == 0  # every env is in a worker
    assert stats.wait_time > 0
    latency = stats.step_latency
    assert DELAY <= latency["p50"] <= latency["p90"] <= latency["p99"] <= latency["max"]
    assert stats.mean_queue_depth >= 1 and stats.max_queue_depth >= 1
    assert stats.loop_lag["max"] >= stats.loop_lag["mean"] >= 0


def test_local_share_of_the_process_backend_is_local_env_time():
    env_fns = [partial(CounterEnv, i, DELAY) for i in range(4)]
    with aiovec.VecEnv(env_fns, backend="process", num_workers=1, inline_envs=2) as venv:
        venv.reset(seed=0)
        for _ in range(5):
            venv.step(np.zeros(4, dtype=np.int64))
        stats = venv.stats()
    assert stats.env_steps == 20
    assert stats.local_env_time >= 10 * DELAY  # the two envs stepped here
    assert stats.env_time >= stats.local_env_time + 10 * DELAY  # and the worker's two


def test_async_envs_on_the_coroutine_backend():
    async def main() -> aiovec.Stats:
        env_fns = [partial(AsyncCounterEnv, i, DELAY, episode_length=100) for i in range(8)]
        async with aiovec.VecEnv(env_fns, backend="coroutine") as venv:
            await venv.areset(seed=0)
            for _ in range(5):
                await venv.astep(np.zeros(8, dtype=np.int64))
            return venv.stats()

    stats = aiovec.run(main())
    assert stats.env_steps == 40
    assert stats.env_time >= 40 * DELAY  # summed over envs that waited at the same time
    assert stats.loop_lag


def test_restarts_are_counted():
    env_fns = [partial(FaultyEnv, 0, "raise", at_step=2), partial(CounterEnv, 1)]
    with aiovec.VecEnv(env_fns, backend="process", on_failure="restart") as venv:
        venv.reset(seed=0)
        for _ in range(4):
            venv.step(np.zeros(2, dtype=np.int64))
        stats = venv.stats()
    assert stats.env_restarts == 1
    assert stats.worker_restarts == 0


def test_stats_after_close_are_the_final_counts():
    venv = aiovec.VecEnv([CounterEnv] * 2, backend="inline")
    venv.reset(seed=0)
    venv.step(np.zeros(2, dtype=np.int64))
    venv.close()
    assert venv.stats().env_steps == 2


def test_subtracting_snapshots_gives_the_interval():
    with aiovec.VecEnv([CounterEnv] * 2, backend="inline") as venv:
        venv.reset(seed=0)
        venv.step(np.zeros(2, dtype=np.int64))
        first = venv.stats()
        for _ in range(3):
            venv.step(np.zeros(2, dtype=np.int64))
        second = venv.stats()
    window = second - first
    assert window.env_steps == 6 and window.commands == 3
    assert window.elapsed == pytest.approx(second.elapsed - first.elapsed)
    assert window.steps_per_second == pytest.approx(6 / window.elapsed)
    with pytest.raises(TypeError):
        second - 1  # noqa: B018


def test_a_cancelled_wait_still_counts_its_time():
    async def main() -> aiovec.Stats:
        env_fns = [partial(AsyncCounterEnv, i, 0.2, episode_length=100) for i in range(2)]
        async with aiovec.VecEnv(env_fns, backend="coroutine") as venv:
            await venv.areset(seed=0)
            venv.send(np.zeros(2, dtype=np.int64))
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(venv.recv(), 0.01)
            return venv.stats()

    assert aiovec.run(main()).wait_time > 0


def test_several_tasks_waiting_at_once_count_their_wait_once():
    async def main() -> tuple[aiovec.Stats, aiovec.Stats]:
        env_fns = [partial(AsyncCounterEnv, i, DELAY, episode_length=100) for i in range(4)]
        async with aiovec.VecEnv(env_fns, backend="coroutine") as venv:
            await venv.areset(seed=0)
            before = venv.stats()
            venv.send(np.zeros(4, dtype=np.int64))
            await asyncio.gather(*(venv.recv(max_envs=1) for _ in range(4)))
            return before, venv.stats()

    before, after = aiovec.run(main())
    window = after - before
    assert window.env_steps == 4
    assert 0 < window.wait_time <= window.elapsed
    assert window.agent_time >= 0


def test_interval_latencies_cover_only_the_interval():
    """A slow step before a snapshot shows in the running quantiles, not in those of a
    later interval made of fast steps."""
    slow = 0.05

    class Slowed(CounterEnv):
        def step(self, action):
            if self.count == 0:
                time.sleep(slow)
            return super().step(action)

    with aiovec.VecEnv([Slowed], backend="inline") as venv:
        venv.reset(seed=0)
        venv.step(np.zeros(1, dtype=np.int64))  # the slow one
        before = venv.stats()
        for _ in range(20):
            venv.step(np.zeros(1, dtype=np.int64))
        after = venv.stats()
    assert after.step_latency["max"] >= slow  # still among the latest records
    window = after - before
    assert window.env_steps == 20
    assert window.step_latency["max"] < slow  # the interval holds only fast steps
    assert (after - after).step_latency == {}  # an empty interval has none
