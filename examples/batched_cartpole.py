"""Batched envs: CartPole from Gymnasium's vector entry point, 4,096 envs spread over
worker processes in blocks, against one in-process Gymnasium vector env of 4,096.

Each block is one ``gymnasium.vector.VectorEnv`` (numpy-vectorized CartPole) stepped
in one call; aiovec places its rows in shared memory, so the agent still sees one
vector env of ``num_envs`` rows.

Run: python examples/batched_cartpole.py [--num-envs 4096] [--seconds 3]
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import numpy as np

import aiovec


def steps_per_second(step, num_envs: int, seconds: float) -> float:
    """Env-steps per second of ``step`` called with random actions for ``seconds``."""
    rng = np.random.default_rng(0)
    actions = rng.integers(0, 2, (16, num_envs))
    for index in range(5):  # warm up
        step(actions[index])
    calls, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        step(actions[calls % 16])
        calls += 1
    return calls * num_envs / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-envs", type=int, default=4096)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--envs-per-block", type=int, default=None)
    args = parser.parse_args()

    reference = gym.make_vec("CartPole-v1", args.num_envs, vectorization_mode="vector_entry_point")
    reference.reset(seed=0)
    in_process = steps_per_second(reference.step, args.num_envs, args.seconds)
    reference.close()

    with aiovec.make(
        "CartPole-v1",
        args.num_envs,
        vectorization_mode="vector_entry_point",
        envs_per_block=args.envs_per_block,
    ) as envs:
        envs.reset(seed=0)
        batched = steps_per_second(envs.step, args.num_envs, args.seconds)
        layout = (
            f"backend={envs.backend!r}, {envs.num_envs // envs.envs_per_block} blocks of "
            f"{envs.envs_per_block}, {envs.num_workers} workers"
        )
    print(f"one in-process Gymnasium vector env: {in_process / 1e6:6.2f} M env-steps/s")
    print(f"aiovec batched ({layout}): {batched / 1e6:6.2f} M env-steps/s")
    print(f"ratio: {batched / in_process:.2f}x")


if __name__ == "__main__":
    main()
