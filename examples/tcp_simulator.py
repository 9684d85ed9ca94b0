"""Async envs talking to a simulator over TCP: many connections, one event loop.

The example starts a small simulator server (its own process, an asyncio TCP server on
localhost whose replies take a random, heavy-tailed time) and runs ``--num-envs`` async
env clients against it with ``backend="coroutine"``; the agent awaits first-ready
batches. Run: python examples/tcp_simulator.py [--num-envs 200] [--seconds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import random
import socket
import time

import numpy as np
from gymnasium import spaces

import aiovec

EPISODE_LENGTH = 50


# --- the simulator: one "particle on a line" per connection, replies after a delay ---------


async def _serve_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    rng = random.Random()
    position, steps = 0.0, 0
    try:
        while line := await reader.readline():
            command, *argument = line.decode().split()
            await asyncio.sleep(min(rng.lognormvariate(-5.0, 1.0), 0.2))  # ~10 ms, heavy tail
            if command == "reset":
                position, steps = rng.uniform(-1, 1), 0
            else:
                steps += 1
                position += 0.1 if argument[0] == "1" else -0.1
            done = int(steps >= EPISODE_LENGTH)
            writer.write(f"{position:.4f} {-abs(position):.4f} {done}\n".encode())
            await writer.drain()
    finally:
        writer.close()


def run_simulator(port: int, ready: multiprocessing.Event) -> None:
    async def main() -> None:
        server = await asyncio.start_server(_serve_connection, "127.0.0.1", port)
        ready.set()
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# --- the env: an async client of the simulator ------------------------------------------------


class SimulatorClient(aiovec.AsyncEnv):
    """Each env holds one TCP connection to the simulator; every step is a request."""

    observation_space = spaces.Box(-np.inf, np.inf, (1,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, port: int) -> None:
        self.port = port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def _request(self, line: str) -> tuple[np.ndarray, float, bool]:
        if self._writer is None:  # connect lazily, on the loop that runs the env
            self._reader, self._writer = await asyncio.open_connection("127.0.0.1", self.port)
        self._writer.write(line.encode())
        await self._writer.drain()
        position, reward, done = (await self._reader.readline()).decode().split()
        return np.array([float(position)], dtype=np.float32), float(reward), done == "1"

    async def reset(self, *, seed=None, options=None):
        await super().reset(seed=seed)
        observation, _, _ = await self._request("reset\n")
        return observation, {}

    async def step(self, action):
        observation, reward, done = await self._request(f"step {int(action)}\n")
        return observation, reward, False, done, {}

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


# --- the agent ------------------------------------------------------------------------------


async def agent(port: int, num_envs: int, seconds: float) -> None:
    async with aiovec.make(SimulatorClient, num_envs, env_kwargs={"port": port}) as envs:
        observations, _ = await envs.areset(seed=0)
        stats = aiovec.EpisodeStatistics(num_envs)
        policy = lambda obs: (obs[:, 0] < 0).astype(np.int64)  # noqa: E731 - push to centre
        envs.send(policy(observations))
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            batch = await envs.recv()  # whichever clients got their answer first
            stats.update(batch)
            steps += len(batch.env_ids)
            envs.send(policy(batch.observations), batch.env_ids)
        elapsed = time.perf_counter() - start
        while True:
            try:
                await envs.recv()
            except aiovec.NothingInFlightError:
                break
    returns = [episode.episode_return for episode in stats.finished]
    print(
        f"{num_envs} TCP envs on backend={envs.backend!r}: {steps / elapsed:,.0f} steps/s, "
        f"{len(returns)} episodes, mean return {np.mean(returns) if returns else 0:.2f}"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--num-envs", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args(argv)
    port = free_port()
    ready = multiprocessing.Event()
    server = multiprocessing.Process(target=run_simulator, args=(port, ready), daemon=True)
    server.start()
    try:
        if not ready.wait(30):
            raise RuntimeError("the simulator did not start")
        aiovec.run(agent(port, args.num_envs, args.seconds))
    finally:
        server.terminate()
        server.join()


if __name__ == "__main__":
    main()
