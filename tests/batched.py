"""A batched (numpy-vectorized) test env, ``gymnasium.vector.VectorEnv`` of ``num_envs``
point masses, with Gymnasium's three autoreset modes, ``reset_mask``, per-step infos and
injectable slowness, exceptions and crashes."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space


class PointMassVectorEnv(VectorEnv):
    """Point masses on a line pushed by ``action * gain``; an episode ends when a mass
    leaves [-1, 1] (terminated) or after ``max_steps`` (truncated).

    ``fail_at=n`` raises ``fail_with`` (a RuntimeError by default) from the block's n-th
    step on (counted since construction),
    ``crash_at=n`` kills the process there; ``step_sleep`` seconds per step;
    ``reset_ledger=path``: a reset with ``options={"fail": True}`` raises, once for all
    blocks sharing that file (``reset_failures`` times: files ``path``, ``path.1``, ...).
    """

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(
        self,
        num_envs: int = 1,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        max_steps: int = 12,
        gain: float = 1.0,
        step_sleep: float = 0.0,
        fail_at: int | None = None,
        fail_with: type[BaseException] = RuntimeError,
        crash_at: int | None = None,
        dict_obs: bool = False,
        render_mode: str | None = None,
        reset_ledger: str | None = None,
        reset_failures: int = 1,
    ) -> None:
        self.reset_failures = reset_failures
        self.fail_with, self.reset_ledger = fail_with, reset_ledger
        self.num_envs = num_envs
        self.render_mode = render_mode
        self.autoreset_mode = AutoresetMode(autoreset_mode)
        self.metadata = {"autoreset_mode": self.autoreset_mode, "render_modes": ["rgb_array"]}
        self.max_steps, self.gain, self.step_sleep = max_steps, gain, step_sleep
        self.fail_at, self.crash_at, self.dict_obs = fail_at, crash_at, dict_obs
        self.single_action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)
        state = spaces.Box(-10.0, 10.0, (2,), np.float32)
        if dict_obs:
            self.single_observation_space = spaces.Dict(
                {"state": state, "steps": spaces.Discrete(max_steps + 1)}
            )
        else:
            self.single_observation_space = state
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.state = np.zeros((num_envs, 2), np.float32)
        self.steps = np.zeros(num_envs, np.int64)
        self.done = np.zeros(num_envs, np.bool_)
        self.calls = 0

    def _observations(self) -> Any:
        state = self.state.copy()
        if self.dict_obs:
            return {"state": state, "steps": self.steps.copy()}
        return state

    def _reset_rows(self, rows: np.ndarray) -> None:
        self.state[rows] = self.np_random.uniform(-0.5, 0.5, (int(rows.sum()), 2))
        self.steps[rows] = 0
        self.done[rows] = False

    def reset(self, *, seed: Any = None, options: dict | None = None) -> tuple[Any, dict]:
        if (options or {}).get("fail") and self.reset_ledger is not None:
            for index in range(self.reset_failures):
                path = f"{self.reset_ledger}.{index}" if index else self.reset_ledger
                try:  # created at most once, whichever process of the blocks comes first
                    os.close(os.open(path, os.O_CREAT | os.O_EXCL))
                except FileExistsError:
                    continue
                raise ConnectionError("the simulator's server went away")
        if seed is not None:
            super().reset(seed=seed if isinstance(seed, int) else seed[0])
        mask = (options or {}).get("reset_mask")
        rows = np.ones(self.num_envs, np.bool_) if mask is None else np.asarray(mask)
        self._reset_rows(rows)
        return self._observations(), {}

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict]:
        self.calls += 1
        if self.fail_at is not None and self.calls >= self.fail_at:
            raise self.fail_with(f"block failed on step {self.calls}")
        if self.crash_at is not None and self.calls == self.crash_at:
            os._exit(3)
        if self.step_sleep:
            time.sleep(self.step_sleep)
        actions = np.asarray(actions, np.float32).reshape(self.num_envs)
        resetting = self.done.copy() if self.autoreset_mode is AutoresetMode.NEXT_STEP else None
        self.state[:, 1] += 0.3 * self.gain * actions
        self.state[:, 0] += self.state[:, 1]
        self.steps += 1
        terminated = np.abs(self.state[:, 0]) > 1.0
        truncated = (self.steps >= self.max_steps) & ~terminated
        rewards = -np.abs(self.state[:, 0]).astype(np.float64)
        if resetting is not None and resetting.any():
            self._reset_rows(resetting)
            rewards[resetting] = 0.0
            terminated[resetting] = truncated[resetting] = False
        self.done = terminated | truncated
        infos: dict = {}
        observations = self._observations()
        for row in range(self.num_envs):
            if resetting is not None and resetting[row]:
                continue
            info = {"steps": self.steps[row]}
            if self.autoreset_mode is AutoresetMode.SAME_STEP and self.done[row]:
                final_obs = _row(observations, row)
                mask = np.zeros(self.num_envs, np.bool_)
                mask[row] = True
                self._reset_rows(mask)
                observations = self._observations()
                info = {"final_obs": final_obs, "final_info": info}
            infos = self._add_info(infos, info, row)
        return observations, rewards, terminated, truncated, infos

    def render(self) -> tuple[np.ndarray, ...]:
        """One 8x8 RGB frame per env, its brightness the mass's position."""
        level = np.clip((self.state[:, 0] + 1) * 127, 0, 255).astype(np.uint8)
        return tuple(np.full((8, 8, 3), value, np.uint8) for value in level)


def _row(observations: Any, row: int) -> Any:
    if isinstance(observations, dict):
        return {key: value[row] for key, value in observations.items()}
    return observations[row].copy()


def point_masses(num_envs: int, **kwargs: Any) -> PointMassVectorEnv:
    """The factory form ``aiovec.make`` calls: ``factory(num_envs=k, **env_kwargs)``."""
    return PointMassVectorEnv(num_envs, **kwargs)


class AsyncPointMassVectorEnv(PointMassVectorEnv):
    """The same point masses as an async batched env: ``reset`` and ``step`` are
    coroutines, each step awaiting ``await_time`` seconds (a simulator over a socket,
    a model on an accelerator queue)."""

    def __init__(self, num_envs: int = 1, await_time: float = 0.0, **kwargs: Any) -> None:
        super().__init__(num_envs, **kwargs)
        self.await_time = await_time

    async def reset(self, *, seed: Any = None, options: dict | None = None) -> tuple[Any, dict]:
        await asyncio.sleep(0)
        return super().reset(seed=seed, options=options)

    async def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict]:
        await asyncio.sleep(self.await_time)
        return super().step(actions)


def async_point_masses(num_envs: int, **kwargs: Any) -> AsyncPointMassVectorEnv:
    return AsyncPointMassVectorEnv(num_envs, **kwargs)
