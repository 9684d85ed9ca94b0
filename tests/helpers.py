"""Drivers shared by several test modules."""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import aiovec


async def random_traffic(
    venv: aiovec.VecEnv,
    rounds: int,
    seed: int,
    check: Callable[[aiovec.Batch, int, int, int], None] | None = None,
    seconds: float | None = None,
) -> tuple[list[int], list[int]]:
    """Random first-ready traffic: send to random idle envs (action = how many actions
    that env was sent before, mod 2), recv random batch sizes; then drain. Calls
    ``check(batch, row, env_id, results_so_far)`` on each result and returns the
    per-env counts ``(sent, received)``. Fails if an env answers twice."""
    num_envs = venv.num_envs
    rng = random.Random(seed)
    idle, sent, received = set(range(num_envs)), [0] * num_envs, [0] * num_envs
    deadline = None if seconds is None else time.monotonic() + seconds

    def account(batch: aiovec.Batch) -> None:
        assert len(set(batch.env_ids.tolist())) == len(batch.env_ids) >= 1
        for row, env_id in enumerate(batch.env_ids.tolist()):
            assert env_id not in idle, f"env {env_id} returned a result twice"
            received[env_id] += 1
            if check is not None:
                check(batch, row, env_id, received[env_id])
            idle.add(env_id)

    for _ in range(rounds):
        if deadline is not None and time.monotonic() > deadline:
            break
        if idle and (rng.random() < 0.6 or len(idle) == num_envs):
            chosen = rng.sample(sorted(idle), rng.randint(1, len(idle)))
            venv.send(np.array([sent[i] % 2 for i in chosen]), env_ids=chosen)
            for env_id in chosen:
                sent[env_id] += 1
            idle -= set(chosen)
        else:
            account(await venv.recv(max_envs=rng.randint(1, num_envs)))
    while len(idle) < num_envs:
        account(await venv.recv())
    return sent, received


async def assert_cancelled_recv_loses_nothing(venv: aiovec.VecEnv) -> None:
    """With two slow envs in flight: a timed-out and a cancelled recv lose no result."""
    venv.send([0, 1])
    with pytest.raises(TimeoutError):
        await venv.recv(timeout=0.01)
    task = asyncio.ensure_future(venv.recv(min_envs=2))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    batch = await venv.recv(min_envs=2)
    assert sorted(batch.env_ids.tolist()) == [0, 1]


class Heartbeat:
    """A task that counts its turns on the running loop: a count that stays low means
    something blocked the loop or starved its other tasks."""

    def __init__(self, interval: float = 0.01) -> None:
        self.beats = 0
        self._interval = interval
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while True:
            self.beats += 1
            await asyncio.sleep(self._interval)

    def stop(self) -> None:
        self._task.cancel()


#: The opening of a script that defines its env in ``__main__`` and registers it twice
#: (by class, and by a ``"__main__:Walker"`` name no worker can import), as a quick
#: script or a notebook does.
MAIN_MODULE_WALKER = textwrap.dedent(
    """
    import gymnasium as gym
    import numpy as np
    import aiovec

    class Walker(gym.Env):  # defined in __main__, as in a notebook or a quick script
        observation_space = gym.spaces.Box(-10, 10, (1,))
        action_space = gym.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.x = 0.0
            return np.array([self.x], dtype=np.float32), {}

        def step(self, action):
            self.x += 1.0 if action else -1.0
            return np.array([self.x], dtype=np.float32), 1.0, abs(self.x) >= 5, False, {}

    gym.register("MainModuleWalker-v0", entry_point=Walker)
    gym.register("MainModuleWalkerByName-v0", entry_point="__main__:Walker")
    """
)


def voluntary_switches(pid: int, thread: int) -> int:
    """How many times thread ``thread`` of process ``pid`` blocked of its own accord
    (Linux's ``voluntary_ctxt_switches``): each time it waited and was woken."""
    with open(f"/proc/{pid}/task/{thread}/status") as status:
        for line in status:
            if line.startswith("voluntary_ctxt_switches"):
                return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches line")


def run_python(source: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``source`` with ``python -c`` from the repository root (so that it can import
    ``tests``), with its output captured."""
    return subprocess.run(
        [sys.executable, "-c", source],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=Path(__file__).parent.parent,
    )


def start_agent(tmp_path: Path, source: str) -> tuple[subprocess.Popen, list[int]]:
    """Run ``source`` as a script that prints its worker pids on its first line; return
    the process and those pids."""
    script = tmp_path / "agent.py"
    script.write_text(textwrap.dedent(source))
    agent = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    return agent, [int(pid) for pid in agent.stdout.readline().split()]


def workers(backend: str, count: int) -> dict[str, int]:
    """``num_workers=count`` for a backend with workers, nothing for one without (which
    refuses the option rather than ignore it)."""
    return {"num_workers": count} if backend in ("process", "ray") else {}
