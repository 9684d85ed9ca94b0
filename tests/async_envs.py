"""Async envs for the tests (importable by worker processes)."""

from __future__ import annotations

import asyncio
import time

import numpy as np
from gymnasium import spaces

from aiovec import AsyncEnv


class AsyncCounterEnv(AsyncEnv):
    """Observation ``[env_index, step]``, reward ``step``; each step awaits ``delay`` s
    (or a seeded lognormal time with mean ``mean_delay``). Ends episodes after
    ``episode_length`` steps (truncation), so autoreset is exercised."""

    observation_space = spaces.Box(0, np.inf, (2,), np.float64)
    action_space = spaces.Discrete(2)

    def __init__(
        self,
        env_index: int = 0,
        delay: float = 0.0,
        mean_delay: float | None = None,
        episode_length: int = 7,
        fail_at: int | None = None,
        hang_at: int | None = None,
        reset_delay: float = 0.0,
        yields: int = 0,
        block_at: int | None = None,
        cancel_at: int | None = None,
        interrupt_at: int | None = None,
        in_subtask: bool = False,
    ) -> None:
        self.env_index, self.delay, self.mean_delay = env_index, delay, mean_delay
        self.episode_length, self.fail_at, self.hang_at = episode_length, fail_at, hang_at
        self.count = 0
        self.reset_delay = reset_delay
        self.yields = yields  # loop iterations each step takes (orders envs finishing together)
        self.block_at = block_at  # a step that blocks the whole event loop (a badly written env)
        self.cancel_at = cancel_at  # a step whose own request is cancelled (not the task)
        self.interrupt_at = interrupt_at  # a step that raises KeyboardInterrupt itself
        self.in_subtask = in_subtask  # ... from a task of its own (asyncio.gather)
        self.steps_since_built = 0
        self.closed = False

    async def reset(self, *, seed=None, options=None):
        await super().reset(seed=seed)
        await asyncio.sleep(self.reset_delay)
        self.count = 0
        return np.array([self.env_index, 0.0]), {"start": self.env_index}

    async def _interrupt(self):
        raise KeyboardInterrupt(f"simulator {self.env_index} interrupted")

    async def step(self, action):
        self.steps_since_built += 1
        for _ in range(self.yields):
            await asyncio.sleep(0)
        if self.steps_since_built == self.fail_at:
            raise ConnectionError(f"simulator {self.env_index} dropped the connection")
        if self.steps_since_built == self.cancel_at:
            raise asyncio.CancelledError(f"simulator {self.env_index} cancelled the request")
        if self.steps_since_built == self.interrupt_at:
            if self.in_subtask:
                await asyncio.gather(self._interrupt())
            await self._interrupt()
        if self.steps_since_built == self.hang_at:
            await asyncio.Event().wait()  # never set
        if self.steps_since_built == self.block_at:
            time.sleep(3600)
        if self.mean_delay is not None:
            sigma = 1.0
            delay = self.np_random.lognormal(np.log(self.mean_delay) - sigma**2 / 2, sigma)
            await asyncio.sleep(min(delay, 20 * self.mean_delay))
        elif self.delay:
            await asyncio.sleep(self.delay)
        self.count += 1
        observation = np.array([self.env_index, float(self.count)])
        truncated = self.count >= self.episode_length
        return observation, float(self.count), False, truncated, {"action": int(action)}

    async def close(self):
        self.closed = True


class StubbornAsyncEnv(AsyncCounterEnv):
    """An async env whose ``stubborn_at``-th step (and ``close``) ignores cancellation
    for ``STUBBORN_SECONDS``: it swallows CancelledError and goes on waiting (a badly
    written env; it gives up in the end so that the test's loop can shut down)."""

    def __init__(self, env_index: int = 0, stubborn_at: int = 2, **kwargs) -> None:
        super().__init__(env_index, **kwargs)
        self.stubborn_at = stubborn_at

    async def step(self, action):
        if self.steps_since_built + 1 == self.stubborn_at:
            self.steps_since_built += 1
            await _ignore_cancellation(STUBBORN_SECONDS)
        return await super().step(action)

    async def close(self):
        StubbornAsyncEnv.closes_begun += 1
        await _ignore_cancellation(STUBBORN_SECONDS)
        StubbornAsyncEnv.closes_ended += 1

    #: How many closes (of any instance in this process) began and ended: a close that
    #: aiovec abandoned at its close_timeout has begun and not ended.
    closes_begun = 0
    closes_ended = 0


STUBBORN_SECONDS = 4.0


async def _ignore_cancellation(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            await asyncio.sleep(deadline - time.monotonic())
        except asyncio.CancelledError:
            continue


class RecoveryHangsEnv(AsyncCounterEnv):
    """Env 1 fails its second step; its recovery then hangs once: ``hang="reset"``, the
    first replacement's reset never returns; ``hang="close"``, the failed env's close
    never returns. Later builds work (builds counted per process)."""

    builds = 0

    def __init__(self, env_index: int = 0, hang: str = "reset") -> None:
        super().__init__(env_index)
        self.hang = hang
        if env_index == 1:
            RecoveryHangsEnv.builds += 1
        self.build = RecoveryHangsEnv.builds if env_index == 1 else 0

    async def reset(self, *, seed=None, options=None):
        if self.hang == "reset" and self.build == 2:
            await asyncio.sleep(3600)
        return await super().reset(seed=seed, options=options)

    async def step(self, action):
        if self.build == 1 and self.steps_since_built == 1:
            raise RuntimeError(f"simulator {self.env_index} diverged")
        return await super().step(action)

    async def close(self):
        if self.hang == "close" and self.build == 1:
            await asyncio.sleep(3600)
        await super().close()
