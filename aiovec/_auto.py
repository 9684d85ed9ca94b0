"""``backend="auto"``: pick the backend and worker count from a short probe of the env.

One throwaway env is built in this process and stepped for a few milliseconds. From
its step time and the share of that time spent on the CPU:

- cheap envs, where the whole batch steps faster in this process than one
  cross-process round trip costs, run inline (IPC cannot pay for itself);
- envs that mostly wait (sleep, IO) get one worker per env, up to a cap, because
  waiting costs no core;
- async envs (:class:`aiovec.AsyncEnv`) run as coroutines on the event loop, or, by
  the thousands on a machine with several cores, on one event loop per core in
  worker processes (one loop saturates its core well before 10,000 envs);
- CPU-bound envs are split evenly between ``cores - 1`` workers and this process,
  which steps its share while the workers step theirs (no core sleeps through a
  wake-up).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym

from aiovec.async_env import AsyncEnv

#: Cost of one lockstep round trip through the process backend (seconds), a conservative
#: figure for a loaded 2-core machine; `aiovec bench` measures the real one.
IPC_ROUND_TRIP = 150e-6
#: From this many async envs on, one event loop per core beats one loop for all (W6).
MANY_ASYNC_ENVS = 2000
#: Below this CPU share of the step time, an env counts as waiting (IO-bound).
WAITING_CPU_SHARE = 0.25
MAX_WAITING_WORKERS = 64
PROBE_SECONDS = 0.02
PROBE_MAX_STEPS = 200


def probe_step_time(env_fn: Callable[[], gym.Env]) -> tuple[float, float]:
    """``(seconds per step, CPU share of that time)`` of one env built by ``env_fn``."""
    env = env_fn()
    if isinstance(env, AsyncEnv):  # nothing to time: async envs always run as coroutines
        raise _AsyncEnvFound
    try:
        env.reset(seed=0)
        env.action_space.seed(0)
        steps = 0
        wall_start, cpu_start = time.perf_counter(), time.thread_time()
        while steps < PROBE_MAX_STEPS and time.perf_counter() - wall_start < PROBE_SECONDS:
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            steps += 1
            if terminated or truncated:
                env.reset()
        wall = time.perf_counter() - wall_start
        cpu = time.thread_time() - cpu_start
    finally:
        env.close()
    return wall / max(steps, 1), min(cpu / wall, 1.0) if wall > 0 else 1.0


class _AsyncEnvFound(Exception):
    pass


def choose_backend(env_fn: Callable[[], gym.Env], num_envs: int) -> dict[str, Any]:
    """``VecEnv`` options (``backend``, ``num_workers``) suited to ``num_envs`` such envs.

    Falls back to the process backend when the probe itself fails, so that the real
    construction reports the error with the env's index.
    """
    cores = os.cpu_count() or 1
    try:
        step_time, cpu_share = probe_step_time(env_fn)
    except _AsyncEnvFound:
        if num_envs >= MANY_ASYNC_ENVS and cores > 1:
            return {"backend": "process", "num_workers": cores}
        return {"backend": "coroutine"}
    except Exception:
        return {"backend": "process"}
    if cpu_share < WAITING_CPU_SHARE:
        return {"backend": "process", "num_workers": min(num_envs, MAX_WAITING_WORKERS)}
    inline_time = num_envs * step_time
    parallel_time = inline_time / min(cores, num_envs) + IPC_ROUND_TRIP
    if cores == 1 or inline_time <= parallel_time:
        return {"backend": "inline"}
    processes = min(cores, num_envs)
    return {
        "backend": "process",
        "num_workers": processes - 1,
        "inline_envs": num_envs // processes,
    }
