"""The protocol for native async environments: ``async def reset`` / ``async def step``.

For simulators that mostly wait (a physics server behind a socket, a game client, a
web or tool environment for a language-model agent): thousands of them can run as
coroutines on one event loop with ``backend="coroutine"``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.utils import seeding


class AsyncEnv:
    """Base class of async environments; Gymnasium-like in everything but ``await``.

    Subclasses set :attr:`observation_space` and :attr:`action_space` and implement
    :meth:`step` (and usually :meth:`reset`, calling ``await super().reset(seed=seed)``
    first to seed :attr:`np_random`). :meth:`close` is optional.

    Example:
        >>> import asyncio
        >>> class Echo(AsyncEnv):
        ...     observation_space = spaces.Discrete(10)
        ...     action_space = spaces.Discrete(10)
        ...     async def reset(self, *, seed=None, options=None):
        ...         await super().reset(seed=seed)
        ...         return 0, {}
        ...     async def step(self, action):
        ...         await asyncio.sleep(0.01)  # e.g. a request to a simulator
        ...         return int(action), 1.0, False, False, {}
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}
    render_mode: str | None = None
    spec: Any = None
    observation_space: spaces.Space[Any]
    action_space: spaces.Space[Any]
    _np_random: np.random.Generator | None = None

    async def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Start an episode; the base implementation only seeds :attr:`np_random`."""
        if seed is not None:
            self._np_random, _ = seeding.np_random(seed)
        return None, {}

    async def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        """Apply ``action``: ``(observation, reward, terminated, truncated, info)``."""
        raise NotImplementedError(f"{type(self).__name__} must implement async step()")

    async def close(self) -> None:
        """Release what the env holds (connections, ...)."""

    def render(self) -> Any:
        return None

    @property
    def np_random(self) -> np.random.Generator:
        """The env's random generator, seeded by ``reset(seed=...)``."""
        if self._np_random is None:
            self._np_random, _ = seeding.np_random()
        return self._np_random

    @property
    def unwrapped(self) -> AsyncEnv:
        return self

    def get_wrapper_attr(self, name: str) -> Any:
        """Attribute ``name`` (what ``VecEnv.call``/``get_attr`` read)."""
        return getattr(self, name)

    def set_wrapper_attr(self, name: str, value: Any) -> None:
        """Set attribute ``name`` (what ``VecEnv.set_attr`` does)."""
        setattr(self, name, value)


class SyncEnvAdapter(gym.Env):
    """A blocking ``gymnasium.Env`` running an :class:`AsyncEnv` on a private event loop.

    Lets the same async env logic run where blocking envs are expected (the process or
    inline backends, any Gymnasium code), e.g. ``VecEnv([lambda: SyncEnvAdapter(MyAsyncEnv())])``.
    """

    def __init__(self, env: AsyncEnv) -> None:
        self.env = env
        self.observation_space = env.observation_space
        self.action_space = env.action_space
        self.metadata = dict(env.metadata)
        self.render_mode = env.render_mode
        self._loop = asyncio.new_event_loop()

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        return self._loop.run_until_complete(self.env.reset(seed=seed, options=options))

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        return self._loop.run_until_complete(self.env.step(action))

    def render(self) -> Any:
        return self.env.render()

    def close(self) -> None:
        if not self._loop.is_closed():
            self._loop.run_until_complete(self.env.close())
            self._loop.close()

    def __getattr__(self, name: str) -> Any:  # attributes of the async env, for call/get_attr
        if name.startswith("_") or name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)

    @classmethod
    def factory(cls, async_env_fn: Callable[[], AsyncEnv]) -> Callable[[], SyncEnvAdapter]:
        """A picklable factory of adapters around ``async_env_fn()``."""
        return _AdapterFactory(cls, async_env_fn)


class _AdapterFactory:
    def __init__(self, adapter: type[SyncEnvAdapter], async_env_fn: Callable[[], AsyncEnv]):
        self.adapter, self.async_env_fn = adapter, async_env_fn

    def __call__(self) -> SyncEnvAdapter:
        return self.adapter(self.async_env_fn())
