"""Domain randomization and a curriculum: per-env CartPole physics, changed at run time.

Each env gets its own pole length and mass at construction (``env_kwargs`` as a
function of the env index). A curriculum then lengthens (eases) the poles of the envs
where the agent struggles, with ``call(..., env_ids=...)``, while the others keep theirs.
Run: python examples/domain_randomization.py [--num-envs 8] [--rounds 5]
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import numpy as np

import aiovec


class RandomizedCartPole(gym.Wrapper):
    """CartPole with settable pole length and mass (keeps the derived quantities right)."""

    def __init__(self, length: float = 0.5, masspole: float = 0.1) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.set_physics(length, masspole)

    def set_physics(self, length: float, masspole: float) -> None:
        cartpole = self.env.unwrapped
        cartpole.length, cartpole.masspole = length, masspole
        cartpole.total_mass = cartpole.masspole + cartpole.masscart
        cartpole.polemass_length = cartpole.masspole * cartpole.length

    def physics(self) -> tuple[float, float]:
        return self.env.unwrapped.length, self.env.unwrapped.masspole


def physics_for(index: int) -> dict:
    rng = np.random.default_rng(index)
    return {"length": float(rng.uniform(0.3, 0.7)), "masspole": float(rng.uniform(0.05, 0.2))}


def balance_policy(observations: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Push towards where the pole leans, with 25% random pushes: a shaky controller
    that keeps long poles up more easily than short ones."""
    angle, angular_velocity = observations[:, 2], observations[:, 3]
    actions = (angle + 0.5 * angular_velocity > 0).astype(np.int64)
    shaky = rng.random(len(actions)) < 0.25
    actions[shaky] = rng.integers(0, 2, shaky.sum())
    return actions


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=500, help="steps per round")
    args = parser.parse_args(argv)

    with aiovec.make(RandomizedCartPole, args.num_envs, env_kwargs=physics_for) as envs:
        stats = aiovec.EpisodeStatistics(envs.num_envs)
        observations, _ = envs.reset(seed=0)
        rng = np.random.default_rng(0)
        for round_index in range(args.rounds):
            stats.reset()
            for _ in range(args.steps):
                observations, *result = envs.step(balance_policy(observations, rng))
                stats.update(aiovec.Batch(observations, *result, np.arange(envs.num_envs)))
            lengths = np.zeros(envs.num_envs)
            for episode in stats.finished:
                lengths[episode.env_id] = max(lengths[episode.env_id], episode.length)
            stats.finished.clear()
            # Curriculum: envs that never kept the pole up for 100 steps get a 20% longer
            # (easier) pole; the others keep theirs.
            promoted = [i for i in range(envs.num_envs) if 0 < lengths[i] < 100]
            if promoted:
                physics = envs.call("physics", env_ids=promoted)
                for env_id, (length, masspole) in zip(promoted, physics):
                    envs.call("set_physics", length * 1.2, masspole, env_ids=[env_id])
            lengths_now = [round(length, 2) for length, _ in envs.call("physics")]
            print(f"round {round_index}: eased envs {promoted}; pole lengths {lengths_now}")


if __name__ == "__main__":
    main()
