"""Workload environments shipped with aiovec, for benchmarks and for trying things out.

Registered with Gymnasium on ``import aiovec``:

- ``aiovec/NoOp-v0`` -- ``Box(4,)`` float32 observations, constant step: pure overhead.
- ``aiovec/VariableLatency-v0`` -- each step takes a lognormal time (sleeping like an
  IO-bound simulator, or busy-waiting like a CPU-bound one).
- ``aiovec/LargeObs-v0`` -- 84x84x4 uint8 image observations, no-op dynamics.

And, as an :class:`aiovec.AsyncEnv` (not registered: Gymnasium's registry makes
blocking envs), :class:`AsyncLatencyEnv`, whose steps await a lognormal time.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from aiovec.async_env import AsyncEnv


class NoOpEnv(gym.Env):
    """Does nothing, as fast as possible; truncates after ``max_episode_steps`` steps."""

    def __init__(self, max_episode_steps: int = 1000) -> None:
        self.observation_space = spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.max_episode_steps = max_episode_steps
        self._observation = np.zeros(4, dtype=np.float32)
        self._steps = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self._steps = 0
        return self._observation, {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        self._steps += 1
        return self._observation, 1.0, False, self._steps >= self.max_episode_steps, {}


class VariableLatencyEnv(NoOpEnv):
    """A step lasts a lognormal time: mean ``mean_step_time`` seconds, ``sigma`` in log
    space, capped at ``max_step_time``. ``mode="sleep"`` waits like an IO-bound env,
    ``mode="busy"`` burns CPU like a simulator."""

    def __init__(
        self,
        mean_step_time: float = 0.002,
        sigma: float = 1.0,
        max_step_time: float = 0.05,
        mode: str = "sleep",
        max_episode_steps: int = 1000,
    ) -> None:
        super().__init__(max_episode_steps)
        if mode not in ("sleep", "busy"):
            raise ValueError(f"mode must be 'sleep' or 'busy', got {mode!r}")
        self.mode = mode
        self.sigma = sigma
        self.max_step_time = max_step_time
        # E[lognormal(mu, sigma)] = exp(mu + sigma^2 / 2)
        self.mu = math.log(mean_step_time) - sigma**2 / 2
        self._latency_rng = np.random.default_rng()

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        if seed is not None:
            self._latency_rng = np.random.default_rng(seed)
        return super().reset(seed=seed, options=options)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        delay = min(self._latency_rng.lognormal(self.mu, self.sigma), self.max_step_time)
        if self.mode == "sleep":
            time.sleep(delay)
        else:
            end = time.perf_counter() + delay
            while time.perf_counter() < end:
                pass
        return super().step(action)


class LargeObsEnv(NoOpEnv):
    """84x84x4 uint8 observations (an Atari frame stack), no-op dynamics."""

    def __init__(self, shape: tuple[int, ...] = (84, 84, 4), max_episode_steps: int = 1000) -> None:
        super().__init__(max_episode_steps)
        self.observation_space = spaces.Box(0, 255, shape, np.uint8)
        self._observation = np.zeros(shape, dtype=np.uint8)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        self._observation.flat[0] = self._steps % 256  # a changing pixel, so copies are real
        return super().step(action)


class AsyncLatencyEnv(AsyncEnv):
    """An async env whose step awaits ``asyncio.sleep`` for a lognormal time (mean
    ``mean_step_time``, ``sigma`` in log space, capped at ``max_step_time``): the shape
    of network- and tool-bound environments."""

    observation_space = spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(
        self, mean_step_time: float = 0.05, sigma: float = 1.0, max_step_time: float = 1.0
    ) -> None:
        self.sigma, self.max_step_time = sigma, max_step_time
        self.mu = math.log(mean_step_time) - sigma**2 / 2
        self._observation = np.zeros(4, dtype=np.float32)

    async def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        await super().reset(seed=seed)
        return self._observation, {}

    async def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        delay = min(self.np_random.lognormal(self.mu, self.sigma), self.max_step_time)
        await asyncio.sleep(delay)
        return self._observation, 1.0, False, False, {}


def register_envs() -> None:
    """Register the workload envs with Gymnasium (idempotent)."""
    for env_id, entry_point in (
        ("aiovec/NoOp-v0", "aiovec.envs:NoOpEnv"),
        ("aiovec/VariableLatency-v0", "aiovec.envs:VariableLatencyEnv"),
        ("aiovec/LargeObs-v0", "aiovec.envs:LargeObsEnv"),
    ):
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=entry_point, disable_env_checker=True)
