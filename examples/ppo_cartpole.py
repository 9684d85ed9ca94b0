"""Single-file PPO (CleanRL style) on CartPole-v1, collecting rollouts with aiovec's async API.

Run: python examples/ppo_cartpole.py [--total-timesteps 500000] [--num-envs 8]
Needs the examples extra (torch).
"""

from __future__ import annotations

import argparse
import time
from collections import deque

import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical

import aiovec


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--env-id", default="CartPole-v1")
    parser.add_argument("--total-timesteps", type=int, default=500_000)
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--num-steps", type=int, default=128, help="rollout length per env")
    parser.add_argument("--learning-rate", type=float, default=2.5e-4)
    parser.add_argument("--gamma", type=float, default=0.99)
    parser.add_argument("--gae-lambda", type=float, default=0.95)
    parser.add_argument("--num-minibatches", type=int, default=4)
    parser.add_argument("--update-epochs", type=int, default=4)
    parser.add_argument("--clip-coef", type=float, default=0.2)
    parser.add_argument("--ent-coef", type=float, default=0.01)
    parser.add_argument("--vf-coef", type=float, default=0.5)
    parser.add_argument("--max-grad-norm", type=float, default=0.5)
    parser.add_argument("--target-return", type=float, default=475.0)
    parser.add_argument("--seed", type=int, default=1)
    return parser.parse_args(argv)


def layer(in_features: int, out_features: int, std: float = np.sqrt(2)) -> nn.Linear:
    linear = nn.Linear(in_features, out_features)
    nn.init.orthogonal_(linear.weight, std)
    nn.init.constant_(linear.bias, 0.0)
    return linear


class Agent(nn.Module):
    def __init__(self, observation_size: int, num_actions: int) -> None:
        super().__init__()
        self.critic = nn.Sequential(
            layer(observation_size, 64), nn.Tanh(), layer(64, 64), nn.Tanh(), layer(64, 1, 1.0)
        )
        self.actor = nn.Sequential(
            layer(observation_size, 64),
            nn.Tanh(),
            layer(64, 64),
            nn.Tanh(),
            layer(64, num_actions, 0.01),
        )

    def value(self, observations: torch.Tensor) -> torch.Tensor:
        return self.critic(observations).squeeze(-1)

    def act(self, observations: torch.Tensor, actions: torch.Tensor | None = None):
        distribution = Categorical(logits=self.actor(observations))
        if actions is None:
            actions = distribution.sample()
        return actions, distribution.log_prob(actions), distribution.entropy()


async def train(args: argparse.Namespace) -> dict:
    """Train until the average return of the last 20 episodes reaches the target (or the
    budget runs out); returns the steps, seconds and final average return."""
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    async with aiovec.make(args.env_id, args.num_envs) as envs:
        obs_size = envs.single_observation_space.shape[0]
        agent = Agent(obs_size, envs.single_action_space.n)
        optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
        stats = aiovec.EpisodeStatistics(args.num_envs)
        recent = deque(maxlen=20)

        shape = (args.num_steps, args.num_envs)
        observations = torch.zeros((*shape, obs_size))
        actions, log_probs = torch.zeros(shape, dtype=torch.long), torch.zeros(shape)
        rewards, dones, values = torch.zeros(shape), torch.zeros(shape), torch.zeros(shape)

        next_obs, _ = await envs.areset(seed=args.seed)
        next_obs, next_done = torch.tensor(next_obs), torch.zeros(args.num_envs)
        batch_size = args.num_envs * args.num_steps
        steps, started = 0, time.perf_counter()
        while steps < args.total_timesteps:
            for t in range(args.num_steps):  # --- rollout, one async vector step at a time
                observations[t], dones[t] = next_obs, next_done
                with torch.no_grad():
                    action, log_prob, _ = agent.act(next_obs)
                    values[t] = agent.value(next_obs)
                actions[t], log_probs[t] = action, log_prob
                obs, reward, terminated, truncated, infos = await envs.astep(action.numpy())
                steps += args.num_envs
                done = terminated | truncated
                rewards[t] = torch.tensor(reward, dtype=torch.float32)
                next_obs, next_done = torch.tensor(obs), torch.tensor(done, dtype=torch.float32)
                batch = aiovec.Batch(
                    obs, reward, terminated, truncated, infos, np.arange(args.num_envs)
                )
                recent.extend(episode.episode_return for episode in stats.update(batch))

            with torch.no_grad():  # --- generalized advantage estimation
                next_value = agent.value(next_obs)
                advantages = torch.zeros(shape)
                last_gae = torch.zeros(args.num_envs)
                for t in reversed(range(args.num_steps)):
                    not_done = 1.0 - (next_done if t == args.num_steps - 1 else dones[t + 1])
                    following = next_value if t == args.num_steps - 1 else values[t + 1]
                    delta = rewards[t] + args.gamma * following * not_done - values[t]
                    last_gae = delta + args.gamma * args.gae_lambda * not_done * last_gae
                    advantages[t] = last_gae
                returns = advantages + values

            flat = {  # --- PPO update
                "obs": observations.reshape(-1, obs_size),
                "actions": actions.reshape(-1),
                "log_probs": log_probs.reshape(-1),
                "advantages": advantages.reshape(-1),
                "returns": returns.reshape(-1),
            }
            minibatch = batch_size // args.num_minibatches
            for _ in range(args.update_epochs):
                order = torch.randperm(batch_size)
                for start in range(0, batch_size, minibatch):
                    index = order[start : start + minibatch]
                    _, new_log_prob, entropy = agent.act(flat["obs"][index], flat["actions"][index])
                    ratio = (new_log_prob - flat["log_probs"][index]).exp()
                    advantage = flat["advantages"][index]
                    advantage = (advantage - advantage.mean()) / (advantage.std() + 1e-8)
                    policy_loss = torch.max(
                        -advantage * ratio,
                        -advantage * ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef),
                    ).mean()
                    value_loss = 0.5 * (agent.value(flat["obs"][index]) - flat["returns"][index])
                    value_loss = value_loss.pow(2).mean()
                    loss = policy_loss - args.ent_coef * entropy.mean() + args.vf_coef * value_loss
                    optimizer.zero_grad()
                    loss.backward()
                    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                    optimizer.step()

            average = float(np.mean(recent)) if recent else 0.0
            elapsed = time.perf_counter() - started
            print(f"steps {steps:8d}  avg return {average:6.1f}  {steps / elapsed:7.0f} steps/s")
            if len(recent) == recent.maxlen and average >= args.target_return:
                break
    return {"steps": steps, "seconds": time.perf_counter() - started, "average_return": average}


def main(argv: list[str] | None = None) -> dict:
    result = aiovec.run(train(parse_args(argv)))
    print(
        f"done: average return {result['average_return']:.1f} after {result['steps']} steps "
        f"in {result['seconds']:.0f} s"
    )
    return result


if __name__ == "__main__":
    main()
