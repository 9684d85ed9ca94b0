"""In-process backend: every env runs in the agent's process, with zero IPC.

The fastest choice for very cheap envs (a CartPole step costs less than one cross-process
wake-up) and the deterministic reference for the other backends. A command runs to
completion inside :meth:`submit`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from aiovec._buffers import Buffers, build_buffers
from aiovec._host import EnvBuildError, EnvHost, build_envs, describe
from aiovec._protocol import Command
from aiovec.backends._base import Backend, Message


class InlineBackend(Backend):
    """All envs in one group, stepped by the calling thread."""

    completes_inline = True

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        autoreset_mode: AutoresetMode,
        max_restarts: int = 0,
    ) -> None:
        factories = dict(enumerate(env_fns))
        try:
            envs = build_envs(factories)
        except EnvBuildError as exc:
            raise exc.info.to_exception() from None
        self.groups = [list(envs)]
        self.descriptions = [describe(env) for env in envs.values()]
        self._host = EnvHost(
            envs, autoreset_mode, None, env_fns=factories, max_restarts=max_restarts
        )
        self._outbox: list[Message] = []

    def attach(self, observation_space: spaces.Space, action_space: spaces.Space) -> Buffers:
        self.buffers = build_buffers(
            observation_space, action_space, len(self.descriptions), np.zeros
        )
        self._host.attach(self.buffers)
        return self.buffers

    def submit(self, worker: int, command: Command) -> None:
        self._outbox.append((worker, self._host.execute(command)))

    def poll(self) -> list[Message]:
        messages, self._outbox = self._outbox, []
        return messages

    async def wait(self, timeout: float | None = None) -> list[Message]:
        return self.poll()

    def wait_blocking(self, timeout: float | None = None) -> list[Message]:
        return self.poll()

    def close(self, timeout: float) -> None:
        self._host.close()
