"""A curriculum run by a second task while the first keeps stepping, first-ready.

Task one steps every env first-ready with a fixed controller and records episodes.
Task two, concurrently, watches each env's recent returns and makes the envs that do
well harder (a weaker cart push, ``set_attr`` on those env ids only), while the others
keep their level. Both tasks await the same vector env at once: the stepping never
pauses for the curriculum, and the log counts the env-steps that completed while each
change was being made.

Run: python examples/curriculum.py [--num-envs 8] [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import gymnasium as gym
import numpy as np

import aiovec

LEVELS = [10.0, 5.0, 2.5, 1.2, 0.6, 0.3, 0.15]  # CartPole force_mag: lower is harder


class LeveledCartPole(gym.Wrapper):
    """CartPole with a ``level``: setting it changes how hard the cart can be pushed."""

    def __init__(self) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self._level = 0

    @property
    def level(self) -> int:
        return self._level

    @level.setter
    def level(self, value: int) -> None:
        self._level = int(value)
        self.env.unwrapped.force_mag = LEVELS[self._level]


def controller(observations: np.ndarray) -> np.ndarray:
    """Push towards where the pole falls (angle plus angular velocity)."""
    return (observations[:, 2] + 0.5 * observations[:, 3] > 0).astype(np.int64)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--check-every", type=float, default=0.5, help="seconds")
    parser.add_argument("--promote-at", type=float, default=450.0, help="mean return")
    return parser.parse_args(argv)


async def main(args: argparse.Namespace) -> None:
    async with aiovec.VecEnv([LeveledCartPole] * args.num_envs) as envs:
        statistics = aiovec.EpisodeStatistics(envs.num_envs)
        levels = np.zeros(envs.num_envs, dtype=np.int64)
        steps = 0
        deadline = time.perf_counter() + args.seconds

        async def step_first_ready() -> None:
            nonlocal steps
            observations, _ = await envs.areset(seed=0)
            envs.send(controller(observations))
            while time.perf_counter() < deadline:
                batch = await envs.recv()
                statistics.update(batch)
                steps += len(batch.env_ids)
                envs.send(controller(batch.observations), batch.env_ids)
            while True:  # collect what is in flight
                try:
                    await envs.recv()
                except aiovec.NothingInFlightError:
                    return

        async def run_curriculum() -> None:
            while time.perf_counter() < deadline:
                await asyncio.sleep(args.check_every)
                recent: dict[int, list[float]] = {}
                for episode in statistics.finished:
                    recent.setdefault(episode.env_id, []).append(episode.episode_return)
                ready = [
                    env_id
                    for env_id, returns in recent.items()
                    if len(returns) >= 2
                    and np.mean(returns[-3:]) >= args.promote_at
                    and levels[env_id] < len(LEVELS) - 1
                ]
                if not ready:
                    continue
                steps_before = steps
                levels[ready] += 1
                # One value per env: each moves up from its own level.
                await envs.aset_attr("level", levels[ready].tolist(), env_ids=ready)
                confirmed = await envs.acall("level", env_ids=ready)
                statistics.finished.clear()  # judge the new levels on new episodes
                print(
                    f"{time.perf_counter() - deadline + args.seconds:5.1f} s  harder: envs "
                    f"{ready} -> levels {list(confirmed)}  ({steps - steps_before} env-steps "
                    f"completed meanwhile)  levels now {levels.tolist()}",
                    flush=True,
                )

        await asyncio.gather(step_first_ready(), run_curriculum())
        final = await envs.acall("level")
    print(f"done: {steps} env-steps; final levels {list(final)}")


if __name__ == "__main__":
    aiovec.run(main(parse_args()))
