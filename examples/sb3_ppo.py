"""Stable-Baselines3 PPO training on an aiovec vector env through the adapter.

Run: python examples/sb3_ppo.py [--total-timesteps 100000] [--num-envs 8]
Needs the examples (or sb3) extra.
"""

from __future__ import annotations

import argparse

from stable_baselines3 import PPO
from stable_baselines3.common.evaluation import evaluate_policy

from aiovec.integrations.sb3 import make_sb3_vec_env


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--env-id", default="CartPole-v1")
    parser.add_argument("--total-timesteps", type=int, default=100_000)
    parser.add_argument("--num-envs", type=int, default=8)
    args = parser.parse_args(argv)

    env = make_sb3_vec_env(args.env_id, args.num_envs)  # VecMonitor(SB3VecEnv(aiovec env))
    model = PPO("MlpPolicy", env, n_steps=128, batch_size=256, seed=0, device="cpu", verbose=0)
    model.learn(total_timesteps=args.total_timesteps)
    mean_return, std_return = evaluate_policy(model, env, n_eval_episodes=10)
    print(f"PPO on {args.env_id}: mean return {mean_return:.1f} +/- {std_return:.1f}")
    env.close()
    return mean_return


if __name__ == "__main__":
    main()
