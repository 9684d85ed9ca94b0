"""Step envs in lockstep and first-ready, and print the throughput of each.

Run: python examples/quickstart.py [--seconds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import numpy as np

import aiovec


def lockstep_cartpole(num_envs: int, seconds: float, backend: str) -> float:
    """Synchronous Gymnasium-style loop; returns env steps per second."""
    with aiovec.make("CartPole-v1", num_envs, backend=backend) as envs:
        envs.reset(seed=0)
        actions = np.zeros(num_envs, dtype=np.int64)
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            envs.step(actions)
            steps += num_envs
        return steps / (time.perf_counter() - start)


async def variable_latency(num_envs: int, seconds: float, first_ready: bool) -> float:
    """Envs whose steps sleep a lognormal time (mean 2 ms); returns env steps per second."""
    async with aiovec.make("aiovec/VariableLatency-v0", num_envs, num_workers=num_envs) as envs:
        await envs.areset(seed=0)
        steps, start = 0, time.perf_counter()
        if not first_ready:
            actions = np.zeros(num_envs, dtype=np.int64)
            while time.perf_counter() - start < seconds:
                await envs.astep(actions)
                steps += num_envs
        else:
            envs.send(np.zeros(num_envs, dtype=np.int64))
            while time.perf_counter() - start < seconds:
                batch = await envs.recv(max_envs=num_envs // 2)  # whoever finished first
                steps += len(batch.env_ids)
                envs.send(np.zeros(len(batch.env_ids), dtype=np.int64), batch.env_ids)
            while True:  # collect what is still in flight before closing
                try:
                    await envs.recv()
                except aiovec.NothingInFlightError:
                    break
        return steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0, help="duration of each run")
    args = parser.parse_args()
    print("CartPole-v1, 8 envs, lockstep (steps/s)")
    for backend in ("inline", "process"):
        rate = lockstep_cartpole(8, args.seconds, backend)
        print(f"  backend={backend:8s} {rate:12,.0f}")
    print("VariableLatency (sleep, mean 2 ms), 16 envs (ideal 8,000 steps/s)")
    for first_ready in (False, True):
        rate = asyncio.run(variable_latency(16, args.seconds, first_ready))
        mode = "first-ready" if first_ready else "lockstep"
        print(f"  {mode:16s} {rate:12,.0f}  ({rate / 8000:.2f} of ideal)")


if __name__ == "__main__":
    main()
