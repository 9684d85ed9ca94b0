"""Whether a worker's blocking envs mostly wait, found from the steps it runs.

Why from real steps rather than a probe: a probe would build, reset and step an extra
env (a second simulator connection, construction's side effects twice, an env crashing
on its first steps failing construction), and an env's first steps are unlike the
others anyway.
"""

from __future__ import annotations

import time

from aiovec._transport.protocol import Step
from aiovec._worker import thread_clock
from aiovec._worker.blocks import BlockHost
from aiovec._worker.host import EnvHost

#: Step time measured before a worker decides whether its envs mostly wait.
MEASURE_SECONDS = 0.02
#: After finding its envs computing, a worker measures them again this long after (in
#: seconds, doubling each time up to ``REMEASURE_MAX``): the verdict may have come from a
#: busy moment of the machine, or the envs may start waiting later on.
REMEASURE_FIRST, REMEASURE_MAX = 0.25, 16.0


class WaitingMeter:
    """Finds out whether a worker's envs mostly wait, from the steps it times.

    Invariants: each env's first step after it is built is never timed (Gymnasium's
    checker, a JIT or a cache make it unlike the others), nor a step during which an
    env was rebuilt (a constructor's waiting is not stepping); a window closes once it holds
    ``MEASURE_SECONDS`` of steps; after a window of computing envs, no step is timed
    until the pause since that verdict has passed, and each such verdict doubles the
    pause (up to ``REMEASURE_MAX``)."""

    def __init__(self, host: EnvHost | BlockHost) -> None:
        self._envs = host.envs
        # env id -> the env object seen stepping: a rebuilt env steps "first" again
        self._stepped: dict[int, object] = {}
        self._pause = REMEASURE_FIRST
        self._resume_at = 0.0  # monotonic time from which steps are timed again
        self._start_window()

    def _start_window(self) -> None:
        self._wall = self._cpu = self._queued = 0.0
        self._blocks: int | None = 0
        self._env_steps = 0

    def wants(self, command: Step) -> bool:
        """Whether to time ``command`` (a step about to run)."""
        if time.monotonic() < self._resume_at:
            return False
        envs, stepped, first = self._envs, self._stepped, False
        for env_id in command.env_ids:
            env = envs[env_id]
            if stepped.get(env_id) is not env:
                stepped[env_id], first = env, True
        return not first

    def add(self, spent: thread_clock.Interval, command: Step) -> bool:
        """Count a timed step (``command``, just run); whether its envs are now found to
        mostly wait."""
        envs, stepped = self._envs, self._stepped
        if any(envs[env_id] is not stepped[env_id] for env_id in command.env_ids):
            return False  # an env was rebuilt meanwhile (restart policy): not a step's time
        self._wall += spent.wall
        self._cpu += spent.cpu
        self._queued += spent.queued
        blocks = self._blocks
        self._blocks = None if blocks is None or spent.blocks is None else blocks + spent.blocks
        self._env_steps += len(command.env_ids)
        if self._wall < MEASURE_SECONDS:
            return False
        window = thread_clock.Interval(self._wall, self._cpu, self._queued, self._blocks)
        per_step = None if self._blocks is None else self._blocks / self._env_steps
        if thread_clock.mostly_waits(window.cpu_share, per_step):
            return True
        self._resume_at = time.monotonic() + self._pause
        self._pause = min(2 * self._pause, REMEASURE_MAX)
        self._start_window()
        return False
