"""DQN on CartPole-v1 with envs stepped first-ready, learning from a prioritized replay
buffer fed straight from each ``recv`` batch.

The agent acts on whichever envs finish first (``send``/``recv``), so a slow env never
stalls the others; ``aiovec.PrioritizedReplayBuffer`` rebuilds each env's transitions
from the batches (any order, no transition across an autoreset) and samples with
3-step double-DQN targets. Training stops once a greedy evaluation averages the target
return over 10 episodes.

Run: python examples/dqn_first_ready.py [--total-timesteps 300000] [--num-envs 8]
Needs the examples extra (torch).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from torch import nn

import aiovec


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--env-id", default="CartPole-v1")
    parser.add_argument("--total-timesteps", type=int, default=300_000)
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--recv-envs", type=int, default=4, help="envs taken per recv")
    parser.add_argument("--buffer-size", type=int, default=100_000)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--learning-rate", type=float, default=5e-4)
    parser.add_argument("--gamma", type=float, default=0.99)
    parser.add_argument("--n-step", type=int, default=3)
    parser.add_argument("--learning-starts", type=int, default=2_000)
    parser.add_argument("--train-every", type=int, default=4, help="env-steps per update")
    parser.add_argument("--target-every", type=int, default=1_000, help="env-steps")
    parser.add_argument("--exploration-steps", type=int, default=30_000)
    parser.add_argument("--eval-every", type=int, default=10_000, help="env-steps")
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--target-return", type=float, default=475.0)
    parser.add_argument("--seed", type=int, default=1)
    return parser.parse_args(argv)


class QNetwork(nn.Module):
    def __init__(self, observation_size: int, num_actions: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(observation_size, 128),
            nn.ReLU(),
            nn.Linear(128, 128),
            nn.ReLU(),
            nn.Linear(128, num_actions),
        )

    def forward(self, observations: torch.Tensor) -> torch.Tensor:
        return self.layers(observations)


def greedy(network: QNetwork, observations: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return network(torch.as_tensor(observations)).argmax(dim=1).numpy()


async def evaluate(network: QNetwork, env_id: str, episodes: int, seed: int) -> float:
    """Mean return of the greedy policy over ``episodes`` episodes (lockstep, inline)."""
    async with aiovec.make(env_id, episodes, backend="inline", autoreset_mode="Disabled") as envs:
        observations, _ = await envs.areset(seed=seed)
        returns = np.zeros(episodes)
        running = np.ones(episodes, dtype=bool)
        while running.any():
            observations, rewards, terminated, truncated, _ = await envs.astep(
                greedy(network, observations)
            )
            returns += rewards * running
            ended = terminated | truncated
            running &= ~ended
            if running.any() and ended.any():
                # Finished envs are reset (DISABLED mode) and ignored from then on.
                observations, _ = await envs.areset(options={"reset_mask": ended})
    return float(returns.mean())


async def train(args: argparse.Namespace) -> dict:
    rng = np.random.default_rng(args.seed)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    async with aiovec.make(args.env_id, args.num_envs) as envs:
        q_network = QNetwork(envs.single_observation_space.shape[0], envs.single_action_space.n)
        target_network = QNetwork(
            envs.single_observation_space.shape[0], envs.single_action_space.n
        )
        target_network.load_state_dict(q_network.state_dict())
        optimizer = torch.optim.Adam(q_network.parameters(), lr=args.learning_rate)
        buffer = aiovec.PrioritizedReplayBuffer.for_env(
            envs,
            args.buffer_size,
            n_step=args.n_step,
            gamma=args.gamma,
            beta_steps=args.total_timesteps // args.train_every,
        )
        observations, _ = await envs.areset(seed=args.seed)
        buffer.reset(observations)

        def act(observations: np.ndarray, steps: int) -> np.ndarray:
            epsilon = max(0.05, 1.0 - 0.95 * steps / args.exploration_steps)
            actions = greedy(q_network, observations)
            explore = rng.random(len(actions)) < epsilon
            actions[explore] = rng.integers(0, envs.single_action_space.n, explore.sum())
            return actions

        actions = act(observations, 0)
        buffer.sent(actions)
        envs.send(actions)
        steps = updates = 0
        started = time.perf_counter()
        last_eval = evaluation = 0.0
        best = {"return": -np.inf, "steps": 0}
        while steps < args.total_timesteps:
            batch = await envs.recv(max_envs=args.recv_envs)
            buffer.received(batch)
            steps += len(batch.env_ids)
            actions = act(batch.observations, steps)
            buffer.sent(actions, batch.env_ids)
            envs.send(actions, batch.env_ids)  # these envs step while we learn

            if steps >= args.learning_starts:
                for _ in range(max(1, len(batch.env_ids) // args.train_every)):
                    updates += 1
                    sample = buffer.sample(args.batch_size, rng=rng)
                    loss, errors = td_loss(q_network, target_network, sample)
                    optimizer.zero_grad()
                    loss.backward()
                    nn.utils.clip_grad_norm_(q_network.parameters(), 10.0)
                    optimizer.step()
                    buffer.update_priorities(sample.indices, errors)
                if steps // args.target_every != (steps - len(batch.env_ids)) // args.target_every:
                    target_network.load_state_dict(q_network.state_dict())
            if steps - last_eval >= args.eval_every:
                last_eval = steps
                evaluation = await evaluate(q_network, args.env_id, args.eval_episodes, seed=steps)
                print(
                    f"steps {steps:>7}  updates {updates:>6}  eval return {evaluation:6.1f}  "
                    f"{time.perf_counter() - started:6.1f} s",
                    flush=True,
                )
                if evaluation > best["return"]:
                    best = {"return": evaluation, "steps": steps}
                if evaluation >= args.target_return:
                    break
        # Collect what is still in flight, so nothing is left behind when closing.
        while True:
            try:
                buffer.received(await envs.recv())
            except aiovec.NothingInFlightError:
                break
    return {
        "steps": steps,
        "seconds": time.perf_counter() - started,
        "final_eval": evaluation,
        "best_eval": best["return"],
        "best_at": best["steps"],
        "solved": evaluation >= args.target_return,
    }


def td_loss(
    q_network: QNetwork, target_network: QNetwork, sample: aiovec.Sample
) -> tuple[torch.Tensor, np.ndarray]:
    """Double-DQN n-step TD loss, weighted for prioritized sampling; and |TD errors|."""
    observations = torch.as_tensor(sample.observations)
    next_observations = torch.as_tensor(sample.next_observations)
    actions = torch.as_tensor(sample.actions, dtype=torch.int64)
    with torch.no_grad():
        best_next = q_network(next_observations).argmax(dim=1, keepdim=True)
        next_values = target_network(next_observations).gather(1, best_next).squeeze(1)
        targets = torch.as_tensor(sample.rewards) + torch.as_tensor(sample.discounts) * next_values
    values = q_network(observations).gather(1, actions.unsqueeze(1)).squeeze(1)
    errors = targets - values
    weights = torch.as_tensor(sample.weights)
    loss = (weights * nn.functional.smooth_l1_loss(values, targets, reduction="none")).mean()
    return loss, errors.detach().abs().numpy()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    result = aiovec.run(train(args))
    verdict = "solved" if result["solved"] else "not solved"
    print(
        f"done: {verdict}: eval return {result['final_eval']:.1f} (best {result['best_eval']:.1f} "
        f"at {result['best_at']} steps) after {result['steps']} env-steps in "
        f"{result['seconds']:.0f} s"
    )


if __name__ == "__main__":
    main()
