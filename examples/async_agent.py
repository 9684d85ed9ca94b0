"""An ``async def`` agent loop over envs with variable latency: first-ready vs lockstep.

Each env step sleeps a lognormal time (mean 2 ms, heavy tail), like a simulator behind a
socket. Lockstep waits for the slowest env every step; first-ready re-sends whichever
envs finished first. Run: python examples/async_agent.py [--seconds 3] [--num-envs 16]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import aiovec


async def lockstep(envs: aiovec.VecEnv, seconds: float) -> float:
    actions = np.zeros(envs.num_envs, dtype=np.int64)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        await envs.astep(actions)
        steps += envs.num_envs
    return steps / (time.perf_counter() - start)


async def first_ready(envs: aiovec.VecEnv, seconds: float, batch_size: int) -> float:
    stats = aiovec.EpisodeStatistics(envs.num_envs)
    envs.send(np.zeros(envs.num_envs, dtype=np.int64))  # every env starts stepping
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        batch = await envs.recv(max_envs=batch_size)  # the envs that finished first
        stats.update(batch)
        steps += len(batch.env_ids)
        # a policy would compute actions from batch.observations here
        envs.send(np.zeros(len(batch.env_ids), dtype=np.int64), batch.env_ids)
    rate = steps / (time.perf_counter() - start)
    while True:  # collect what is still in flight
        try:
            await envs.recv()
        except aiovec.NothingInFlightError:
            return rate


async def main(args: argparse.Namespace) -> None:
    ideal = args.num_envs / 0.002
    async with aiovec.make(
        "aiovec/VariableLatency-v0", args.num_envs, num_workers=args.num_envs
    ) as envs:
        await envs.areset(seed=0)
        rate = await lockstep(envs, args.seconds)
        print(f"lockstep            {rate:8,.0f} steps/s  ({rate / ideal:.2f} of ideal)")
        for batch_size in sorted({max(args.num_envs // 2, 1), 1}, reverse=True):
            rate = await first_ready(envs, args.seconds, batch_size)
            label = f"first-ready (<= {batch_size})"
            print(f"{label:19s} {rate:8,.0f} steps/s  ({rate / ideal:.2f} of ideal)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--num-envs", type=int, default=16)
    args = parser.parse_args()
    if args.num_envs < 1 or args.seconds <= 0:
        parser.error("--num-envs must be at least 1 and --seconds positive")
    aiovec.run(main(args))
