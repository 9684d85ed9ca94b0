"""Blocking envs that mostly wait are stepped concurrently inside a worker process;
CPU-bound ones one after the other."""

from __future__ import annotations

import sys
import threading
import time
from functools import partial

import numpy as np
import pytest

import aiovec
from tests.envs import CounterEnv

_barrier = None


class BarrierEnv(CounterEnv):
    """Each step waits until ``parties`` envs of its process are inside a step at once:
    it can only succeed when they are stepped concurrently."""

    def __init__(self, env_index: int = 0, parties: int = 4) -> None:
        super().__init__(env_index)
        global _barrier
        if _barrier is None:
            _barrier = threading.Barrier(parties, timeout=10)

    def step(self, action):
        _barrier.wait()
        return super().step(action)


class BusyEnv(CounterEnv):
    def step(self, action):
        deadline = time.thread_time() + 0.002
        while time.thread_time() < deadline:
            pass
        return super().step(action)


class WarmingUpEnv(CounterEnv):
    """Computes for its first ``busy_steps`` steps (a warm-up: Gymnasium's checker on the
    first step, a JIT, a cache being filled), then waits ``delay`` seconds per step."""

    def __init__(self, env_index: int = 0, busy_steps: int = 1, busy: float = 0.025) -> None:
        super().__init__(env_index, delay=0.002)
        self.busy_steps, self.busy, self.steps_taken = busy_steps, busy, 0

    def step(self, action):
        self.steps_taken += 1
        if self.steps_taken <= self.busy_steps:
            deadline = time.thread_time() + self.busy
            while time.thread_time() < deadline:
                pass
            self.count += 1
            return np.array([self.env_index, self.count], dtype=np.float64), 0.0, False, False, {}
        return super().step(action)


def _step_until_threaded(venv, max_steps: int) -> tuple[str, ...]:
    names: tuple[str, ...] = ()
    for step in range(max_steps):
        venv.step(np.zeros(venv.num_envs, dtype=np.int64))
        if step % 10 == 9:
            names = venv.apply(_thread_name)
            if all(name.startswith("aiovec-env") for name in names):
                break
    return names


def _thread_name(env) -> str:
    return threading.current_thread().name


def test_waiting_envs_of_one_worker_step_concurrently():
    env_fns = [partial(BarrierEnv, i) for i in range(4)]
    with aiovec.VecEnv(env_fns, num_workers=1, concurrent_envs=True) as venv:
        venv.reset()
        for step in range(1, 4):
            observations, *_ = venv.step(np.zeros(4, dtype=np.int64))
            assert observations[:, 1].tolist() == [step] * 4


def test_a_worker_finds_out_that_its_envs_mostly_wait():
    env_fns = [partial(CounterEnv, i, delay=0.005) for i in range(4)]
    with aiovec.VecEnv(env_fns, num_workers=1) as venv:
        venv.reset()
        for _ in range(3):
            venv.step(np.zeros(4, dtype=np.int64))
        assert all(name.startswith("aiovec-env") for name in venv.apply(_thread_name))


def test_an_expensive_first_step_does_not_hide_that_the_envs_wait():
    # Each env's first step after it is built is left out of the measurement.
    env_fns = [partial(WarmingUpEnv, i) for i in range(4)]
    with aiovec.VecEnv(env_fns, num_workers=1) as venv:
        venv.reset()
        names = _step_until_threaded(venv, 30)
        assert all(name.startswith("aiovec-env") for name in names), names


def test_envs_found_computing_are_measured_again_later():
    # A verdict of "computing" is not final: an env that starts waiting later (or was
    # measured on a busy moment) gets its threads at a later measurement.
    env_fns = [partial(WarmingUpEnv, i, busy_steps=8, busy=0.004) for i in range(4)]
    with aiovec.VecEnv(env_fns, num_workers=1) as venv:
        venv.reset()
        names = _step_until_threaded(venv, 300)
        assert all(name.startswith("aiovec-env") for name in names), names


class FlakyBusyEnv(BusyEnv):
    """Computes; with ``fail_every``, raises every that many steps. Its constructor
    waits (a simulator polled until it is up): a rebuild waits, its steps never do."""

    def __init__(self, env_index: int = 0, fail_every: int = 0) -> None:
        for _ in range(10):
            time.sleep(0.005)
        super().__init__(env_index)
        self.fail_every = fail_every

    def step(self, action):
        if self.fail_every and self.count % self.fail_every == self.fail_every - 1:
            self.count += 1
            raise RuntimeError("flaky")
        return super().step(action)


def test_rebuilding_an_env_inside_a_step_is_not_timed_as_waiting():
    # on_failure="restart" rebuilds a failed env inside the step that failed: its
    # constructor's waiting is not the envs' stepping.
    env_fns = [partial(FlakyBusyEnv, 0, fail_every=3), partial(FlakyBusyEnv, 1)]
    with aiovec.VecEnv(env_fns, num_workers=1, on_failure="restart", max_restarts=10**6) as venv:
        venv.reset()
        for _ in range(60):
            venv.step(np.zeros(2, dtype=np.int64))
        assert venv.restart_counts[0] >= 15
        assert venv.apply(_thread_name) == ("MainThread",) * 2


def test_cpu_bound_envs_stay_one_after_the_other(machine):
    # On a loaded machine too: preempted is not waiting (see aiovec._worker.thread_clock).
    env_fns = [partial(BusyEnv, i) for i in range(4)]
    with aiovec.VecEnv(env_fns, num_workers=1) as venv:
        venv.reset()
        for _ in range(10):
            venv.step(np.zeros(4, dtype=np.int64))
        assert venv.apply(_thread_name) == ("MainThread",) * 4


def _timer_slack(env) -> int | None:
    from aiovec._worker.timer_slack import timer_slack

    return timer_slack()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timer slack is Linux's")
@pytest.mark.parametrize("concurrent_envs", [False, True], ids=["in-turn", "threads"])
def test_envs_in_workers_wait_with_a_tight_timer_slack(concurrent_envs):
    # An env's sleep ends when it asked, not up to the kernel's default 50 us later.
    from aiovec._worker.timer_slack import ENV_TIMER_SLACK_NS, timer_slack

    agents = timer_slack()
    env_fns = [partial(CounterEnv, i) for i in range(2)]
    with aiovec.VecEnv(env_fns, num_workers=1, concurrent_envs=concurrent_envs) as venv:
        venv.reset()
        venv.step(np.zeros(2, dtype=np.int64))
        assert venv.apply(_timer_slack) == (ENV_TIMER_SLACK_NS,) * 2
    assert timer_slack() == agents  # the agent's own threads are left as they are
