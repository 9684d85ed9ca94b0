"""In-process backend: every env runs in the agent's process, with zero IPC.

The fastest choice for very cheap envs (a CartPole step costs less than one cross-process
wake-up) and the deterministic reference for the other backends. A command runs to
completion inside :meth:`submit`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import gymnasium as gym
from gymnasium.vector import AutoresetMode

from aiovec._transport.protocol import EnvCommand, Reply
from aiovec.backends._base import LocalBackend, WorkerEvent


class InlineBackend(LocalBackend):
    """All envs in one group, stepped by the calling thread."""

    completes_inline = True
    local_workers = frozenset({0})

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        autoreset_mode: AutoresetMode,
        max_restarts: int = 0,
        envs_per_block: int | None = None,
        isolated: bool = False,
    ) -> None:
        super().__init__(env_fns, autoreset_mode, max_restarts, envs_per_block, isolated=isolated)
        self.groups = [self._host.group]
        self._outbox: list[WorkerEvent] = []

    def submit(self, worker: int, command: EnvCommand) -> None:
        self._outbox.append((worker, self._host.execute(command)))

    def execute_now(self, command: EnvCommand) -> Reply:
        """Run ``command`` here and return the reply (the lockstep fast path)."""
        return self._host.execute(command)

    def poll(self) -> list[WorkerEvent]:
        messages, self._outbox = self._outbox, []
        return messages

    async def wait(self, timeout: float | None = None, *, spin: bool = True) -> list[WorkerEvent]:
        return self.poll()

    def wait_blocking(
        self, timeout: float | None = None, *, spin: bool = True
    ) -> list[WorkerEvent]:
        return self.poll()

    def close(self, timeout: float) -> None:
        self._host.close()
