"""The same first-ready agent loop on a Ray cluster: only the backend argument changes.

Connects to the cluster named by ``--address`` (or the ``RAY_ADDRESS`` variable), or
starts a local Ray when there is none. Envs sleep a lognormal time per step (mean 2 ms),
like simulators behind a socket; each actor hosts a group of them and steps them
concurrently, and the agent takes whichever envs finish first across all actors.

    ray start --head                                   # a cluster, or leave it out
    python examples/ray_cluster.py --address auto --num-envs 64 --actors 4
"""

from __future__ import annotations

import argparse
import collections
import os
import time

import numpy as np
import ray

import aiovec


def node_of(env) -> str:
    """Which Ray node hosts ``env`` (runs inside its actor)."""
    return ray.get_runtime_context().get_node_id()[:8]


async def first_ready(envs: aiovec.VecEnv, seconds: float) -> float:
    """Steps per second over ``seconds``, re-sending whichever envs finished first."""
    await envs.areset(seed=0)
    envs.send(np.zeros(envs.num_envs, dtype=np.int64))
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        batch = await envs.recv()  # whichever envs finished, on whatever node
        steps += len(batch.env_ids)
        # a policy would compute actions from batch.observations here
        envs.send(np.zeros(len(batch.env_ids), dtype=np.int64), batch.env_ids)
    return steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--address", default=os.environ.get("RAY_ADDRESS"))
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    if not 1 <= args.actors <= args.num_envs:
        parser.error("--actors must be between 1 and --num-envs (each actor hosts an env)")

    if args.address:
        ray.init(address=args.address)
    else:
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    # Envs that sleep need no CPU reservation; CPU-bound envs would keep num_cpus=1.
    envs = aiovec.make(
        "aiovec/VariableLatency-v0",
        args.num_envs,
        backend="ray",
        num_workers=args.actors,
        ray_options={"num_cpus": 0},
    )
    nodes = collections.Counter(envs.apply(node_of))
    print(f"{args.num_envs} envs in {envs.num_workers} Ray actors, envs per node: {dict(nodes)}")
    rate = aiovec.run(first_ready(envs, args.seconds))
    envs.close()
    ray.shutdown()
    print(f"first-ready on backend='ray': {rate:,.0f} steps/s")


if __name__ == "__main__":
    main()
