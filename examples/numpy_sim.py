"""A numpy-vectorized simulator of your own, in blocks over worker processes, stepped
first-ready: blocks whose step costs more (finer integration) never hold back the others.

``PendulumBatch`` is a user-written ``gymnasium.vector.VectorEnv``: ``k`` pendulums
integrated together with numpy. Each block gets its own ``substeps`` (a finer, dearer
integration; domain randomization per block through ``env_kwargs``), so blocks finish
at different times, and ``recv`` hands over whichever blocks are done.

Run: python examples/numpy_sim.py [--blocks 4] [--envs-per-block 1024] [--seconds 3]
"""

from __future__ import annotations

import argparse
import collections
import time
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

import aiovec


class PendulumBatch(VectorEnv):
    """``num_envs`` torque-controlled pendulums; reward -(angle^2 + 0.1 velocity^2);
    episodes are truncated after ``max_steps``. NEXT_STEP autoreset, like Gymnasium's
    own vector envs."""

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(self, num_envs: int, substeps: int = 1, max_steps: int = 200) -> None:
        self.num_envs, self.substeps, self.max_steps = num_envs, substeps, max_steps
        self.single_observation_space = spaces.Box(-np.inf, np.inf, (3,), np.float32)
        self.single_action_space = spaces.Box(-2.0, 2.0, (1,), np.float32)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.theta = np.zeros(num_envs)
        self.velocity = np.zeros(num_envs)
        self.steps = np.zeros(num_envs, np.int64)
        self.ended = np.zeros(num_envs, np.bool_)

    def _observe(self) -> np.ndarray:
        return np.stack([np.cos(self.theta), np.sin(self.theta), self.velocity], axis=1).astype(
            np.float32
        )

    def _restart(self, rows: np.ndarray) -> None:
        count = int(rows.sum())
        self.theta[rows] = self.np_random.uniform(-np.pi, np.pi, count)
        self.velocity[rows] = self.np_random.uniform(-1, 1, count)
        self.steps[rows] = 0
        self.ended[rows] = False

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self._restart(np.ones(self.num_envs, np.bool_))
        return self._observe(), {}

    def step(self, actions: np.ndarray) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict]:
        torque = np.clip(np.asarray(actions, np.float64).reshape(-1), -2.0, 2.0)
        resetting = self.ended.copy()
        dt = 0.05 / self.substeps
        for _ in range(self.substeps):  # finer integration: the same physics, dearer
            self.velocity += (3 * 10.0 / 2 * np.sin(self.theta) + 3.0 * torque) * dt
            self.velocity = np.clip(self.velocity, -8, 8)
            self.theta += self.velocity * dt
        angle = (self.theta + np.pi) % (2 * np.pi) - np.pi
        rewards = -(angle**2 + 0.1 * self.velocity**2)
        self.steps += 1
        truncated = self.steps >= self.max_steps
        if resetting.any():  # NEXT_STEP: the step after an episode end resets the row
            self._restart(resetting)
            rewards[resetting] = 0.0
            truncated[resetting] = False
        self.ended = truncated.copy()
        return self._observe(), rewards, np.zeros(self.num_envs, np.bool_), truncated, {}


def pendulums(num_envs: int, substeps: int = 1) -> PendulumBatch:
    """The factory aiovec calls for each block: ``factory(num_envs=k, **env_kwargs)``."""
    return PendulumBatch(num_envs, substeps=substeps)


async def run(envs: aiovec.VecEnv, seconds: float) -> collections.Counter:
    """Step first-ready for ``seconds``: act on each block as soon as it is back."""
    rng = np.random.default_rng(0)
    served: collections.Counter = collections.Counter()
    await envs.areset(seed=0)
    envs.send(rng.uniform(-2, 2, (envs.num_envs, 1)).astype(np.float32))
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        batch = await envs.recv()  # whole blocks, whichever finished first
        for first_row in batch.env_ids[:: envs.envs_per_block]:
            served[int(first_row) // envs.envs_per_block] += 1
        actions = -np.sign(batch.observations[:, 2:3]) * 2.0  # damp the swing
        envs.send(actions.astype(np.float32), env_ids=batch.env_ids)
    while True:  # collect what is still out
        try:
            await envs.recv()
        except aiovec.NothingInFlightError:
            return served


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--envs-per-block", type=int, default=1024)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    substeps = [1 + 3 * index for index in range(args.blocks)]  # block b: 3b+1 substeps
    with aiovec.make(
        pendulums,
        args.blocks * args.envs_per_block,
        envs_per_block=args.envs_per_block,
        backend="process",
        num_workers=args.blocks,
        env_kwargs=[{"substeps": s} for s in substeps],
    ) as envs:
        served = aiovec.run(run(envs, args.seconds))
    total = sum(served.values()) * args.envs_per_block
    print(f"{args.blocks} blocks of {args.envs_per_block} pendulums, first-ready:")
    for block in range(args.blocks):
        print(f"  block {block} ({substeps[block]} substeps): {served[block]} steps")
    print(f"first-ready: {total / args.seconds / 1e6:.2f} M env-steps/s in total")


if __name__ == "__main__":
    main()
