"""Population-based training in miniature: several configurations learn in one run,
over one vector env, stepped first-ready.

Each member owns a slice of the env ids, its own learning rate and its own env physics
(the pole length of its CartPoles, set per env at construction with ``env_kwargs`` and
changed later with ``call(..., env_ids=...)``). Members learn with REINFORCE from
their own envs' episodes. Every few iterations the worst member is replaced by a copy
of the best (exploit) with a perturbed learning rate and pole length (explore).

Run: python examples/population.py [--members 4] [--envs-per-member 4] [--iterations 40]
Needs the examples extra (torch).
"""

from __future__ import annotations

import argparse
import copy
import time

import gymnasium as gym
import numpy as np
import torch
from torch import nn

import aiovec


class AdjustableCartPole(gym.Wrapper):
    """CartPole whose pole length can be set (the derived quantities follow)."""

    def __init__(self, length: float = 0.5) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.set_length(length)

    def set_length(self, length: float) -> None:
        cartpole = self.env.unwrapped
        cartpole.length = length
        cartpole.polemass_length = cartpole.masspole * length


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--members", type=int, default=4)
    parser.add_argument("--envs-per-member", type=int, default=4)
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--episodes-per-iteration", type=int, default=8, help="per member")
    parser.add_argument("--exploit-every", type=int, default=5, help="iterations")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


class Member:
    """One configuration: a policy, its optimizer's learning rate, its envs' physics."""

    def __init__(self, index: int, env_ids: np.ndarray, learning_rate: float, length: float):
        self.index, self.env_ids = index, env_ids
        self.learning_rate, self.length = learning_rate, length
        self.policy = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 2))
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=learning_rate)
        self.recent: list[float] = []  # returns of the latest episodes
        self.pending: list[tuple[torch.Tensor, float]] = []  # finished episodes to learn

    def act(self, observations: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            logits = self.policy(torch.as_tensor(observations))
        return torch.distributions.Categorical(logits=logits).sample().numpy()

    def learn(self, episodes: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> None:
        """One REINFORCE update from whole episodes (normalized returns-to-go)."""
        observations, actions, returns = [], [], []
        for episode_obs, episode_actions, rewards in episodes:
            to_go = np.cumsum(rewards[::-1])[::-1].astype(np.float32)
            observations.append(episode_obs)
            actions.append(episode_actions)
            returns.append(to_go)
        returns_t = torch.as_tensor(np.concatenate(returns))
        returns_t = (returns_t - returns_t.mean()) / (returns_t.std() + 1e-8)
        logits = self.policy(torch.as_tensor(np.concatenate(observations)))
        log_probs = torch.distributions.Categorical(logits=logits).log_prob(
            torch.as_tensor(np.concatenate(actions))
        )
        loss = -(log_probs * returns_t).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()

    def fitness(self) -> float:
        return float(np.mean(self.recent[-10:])) if self.recent else 0.0

    def copy_from(self, other: Member, rng: np.random.Generator) -> None:
        """Exploit ``other`` (its weights) and explore (perturb its hyperparameters)."""
        self.policy.load_state_dict(copy.deepcopy(other.policy.state_dict()))
        self.learning_rate = float(other.learning_rate * rng.choice([0.8, 1.25]))
        self.length = float(np.clip(other.length * rng.choice([0.9, 1.1]), 0.3, 0.8))
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=self.learning_rate)
        self.recent = list(other.recent)


async def train(args: argparse.Namespace) -> list[float]:
    rng = np.random.default_rng(args.seed)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    per = args.envs_per_member
    num_envs = args.members * per
    learning_rates = np.geomspace(3e-4, 3e-2, args.members)
    lengths = np.linspace(0.4, 0.6, args.members)
    owner = np.repeat(np.arange(args.members), per)  # member of each env id
    async with aiovec.VecEnv(
        [
            (lambda length=float(lengths[owner[i]]): AdjustableCartPole(length))
            for i in range(num_envs)
        ],
        autoreset_mode="SameStep",
    ) as envs:
        members = [
            Member(m, np.flatnonzero(owner == m), float(learning_rates[m]), float(lengths[m]))
            for m in range(args.members)
        ]
        observations, _ = await envs.areset(seed=args.seed)
        trajectories: list[list[tuple]] = [[] for _ in range(num_envs)]
        episode_returns = np.zeros(num_envs)

        def send(env_ids: np.ndarray, observations: np.ndarray) -> None:
            actions = np.empty(len(env_ids), dtype=np.int64)
            for member in members:
                mine = np.flatnonzero(owner[env_ids] == member.index)
                if mine.size:
                    actions[mine] = member.act(observations[mine])
            for row, env_id in enumerate(env_ids):
                trajectories[env_id].append((observations[row], actions[row]))
            envs.send(actions, env_ids)

        send(np.arange(num_envs), observations)
        history = []
        started = time.perf_counter()
        for iteration in range(1, args.iterations + 1):
            finished: list[list] = [[] for _ in members]
            while min(len(f) for f in finished) < args.episodes_per_iteration:
                batch = await envs.recv()
                for row, env_id in enumerate(batch.env_ids.tolist()):
                    episode_returns[env_id] += batch.rewards[row]
                    last_obs, last_action = trajectories[env_id][-1]
                    trajectories[env_id][-1] = (last_obs, last_action, batch.rewards[row])
                    if batch.terminations[row] or batch.truncations[row]:
                        steps = trajectories[env_id]
                        member = members[owner[env_id]]
                        finished[member.index].append(
                            (
                                np.stack([s[0] for s in steps]),
                                np.array([s[1] for s in steps]),
                                np.array([s[2] for s in steps]),
                            )
                        )
                        member.recent.append(episode_returns[env_id])
                        trajectories[env_id], episode_returns[env_id] = [], 0.0
                send(batch.env_ids, batch.observations)
            for member, episodes in zip(members, finished):
                member.learn(episodes)
            population = np.mean([member.fitness() for member in members])
            history.append(population)
            line = "  ".join(
                f"m{m.index}: {m.fitness():6.1f} (lr {m.learning_rate:.1e}, pole {m.length:.2f})"
                for m in members
            )
            print(f"iteration {iteration:3d}  population {population:6.1f}  {line}", flush=True)
            if iteration % args.exploit_every == 0:
                ranked = sorted(members, key=Member.fitness)
                worst, best = ranked[0], ranked[-1]
                worst.copy_from(best, rng)
                # The new configuration's physics, on its envs only, while nothing waits
                # for the others: they have steps in flight and keep them.
                ids = worst.env_ids.tolist()
                await envs.acall("set_length", worst.length, env_ids=ids)
                poles = await envs.aapply(lambda env: env.unwrapped.length, env_ids=ids)
                print(
                    f"  exploit: member {worst.index} <- member {best.index} "
                    f"(fitness {best.fitness():.1f}); explore: lr {worst.learning_rate:.1e}, "
                    f"pole {worst.length:.2f} (its envs now: "
                    f"{', '.join(f'{pole:.2f}' for pole in poles)})",
                    flush=True,
                )
        while True:  # collect what is in flight before closing
            try:
                await envs.recv()
            except aiovec.NothingInFlightError:
                break
    print(
        f"done: population fitness {history[0]:.1f} -> {history[-1]:.1f} "
        f"in {time.perf_counter() - started:.0f} s"
    )
    return history


def main(argv: list[str] | None = None) -> None:
    aiovec.run(train(parse_args(argv)))


if __name__ == "__main__":
    main()
