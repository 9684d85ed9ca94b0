"""Model-based RL imagination: a torch dynamics model, trained on real CartPole
transitions collected with aiovec, stepped as batched envs across worker processes.

1. Collect real transitions from 16 CartPoles (SAME_STEP autoreset, so each episode's
   true last observation is in ``infos["final_obs"]``).
2. Train a small MLP (observation, action -> next observation, reward, termination)
   for a few seconds, and report its one-step error on held-out real transitions.
3. Wrap it as a batched env (``aiovec.imagination.ModelVectorEnv``: observation =
   imagined state, reward and termination predicted) and imagine thousands of
   rollouts of horizon 16, in blocks over worker processes, against the same model
   stepped in this process.

Run: python examples/imagination.py [--rollouts 4096] [--train-seconds 5] [--seconds 3]
Needs torch.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

import aiovec
from aiovec.imagination import DynamicsModel, ModelVectorEnv, fit_dynamics, model_weights


def collect(steps: int, num_envs: int = 16) -> dict[str, np.ndarray]:
    """Real transitions under random actions, with true next observations."""
    rng = np.random.default_rng(0)
    columns: dict[str, list] = {key: [] for key in ("obs", "act", "rew", "next", "term")}
    with aiovec.make("CartPole-v1", num_envs, autoreset_mode="SameStep") as envs:
        obs, _ = envs.reset(seed=0)
        for _ in range(steps):
            actions = rng.integers(0, 2, num_envs)
            next_obs, rewards, terminated, truncated, infos = envs.step(actions)
            true_next = next_obs.copy()
            for row in np.flatnonzero(infos.get("_final_obs", np.zeros(num_envs, bool))):
                true_next[row] = infos["final_obs"][row]  # not the autoreset's start
            for key, value in zip(
                columns, (obs, actions, rewards, true_next, terminated.astype(np.float32))
            ):
                columns[key].append(value)
            obs = next_obs
    return {key: np.concatenate(value) for key, value in columns.items()}


def one_step_error(model: DynamicsModel, data: dict[str, np.ndarray]) -> tuple[float, float]:
    """``(mean squared error of the next observation, termination accuracy)``."""
    with torch.no_grad():
        predicted, _, logits = model(torch.as_tensor(data["obs"]), torch.as_tensor(data["act"]))
    error = float(((predicted.numpy() - data["next"]) ** 2).mean())
    accuracy = float(((logits.numpy() > 0) == (data["term"] > 0.5)).mean())
    return error, accuracy


def imagined_steps_per_second(envs, seconds: float) -> float:
    """Imagined env-steps per second of ``envs`` under random actions."""
    rng = np.random.default_rng(1)
    actions = rng.integers(0, 2, (8, envs.num_envs))
    envs.reset(seed=0)
    for index in range(3):  # warm up
        envs.step(actions[index])
    calls, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        envs.step(actions[calls % 8])
        calls += 1
    return calls * envs.num_envs / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--real-steps", type=int, default=1500, help="vector steps of 16 envs")
    parser.add_argument("--train-seconds", type=float, default=5.0)
    parser.add_argument("--rollouts", type=int, default=4096)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--horizon", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    if args.workers < 1 or args.rollouts < args.workers or args.rollouts % args.workers:
        parser.error("--rollouts must be a positive multiple of --workers (a block each)")
    torch.manual_seed(0)
    torch.set_num_threads(1)  # one core per process, for a fair comparison

    data = collect(args.real_steps)
    split = int(0.9 * len(data["obs"]))
    train = {key: value[:split] for key, value in data.items()}
    held_out = {key: value[split:] for key, value in data.items()}
    print(f"collected {len(data['obs'])} real transitions with aiovec")

    model = DynamicsModel(obs_dim=4, num_actions=2)
    before, _ = one_step_error(model, held_out)
    loss = fit_dynamics(
        model, train["obs"], train["act"], train["rew"], train["next"], train["term"],
        seconds=args.train_seconds,
    )  # fmt: skip
    error, accuracy = one_step_error(model, held_out)
    print(
        f"model trained {args.train_seconds:.0f} s (loss {loss:.4f}): one-step error "
        f"(MSE on held-out real transitions) {before:.4f} -> {error:.5f}, "
        f"termination accuracy {accuracy:.3f}"
    )

    env_kwargs = {
        "weights": model_weights(model),
        "start_states": data["obs"][:2000],
        "horizon": args.horizon,
    }
    in_process = ModelVectorEnv(args.rollouts, **env_kwargs)
    local_rate = imagined_steps_per_second(in_process, args.seconds)
    with aiovec.make(
        ModelVectorEnv.factory,
        args.rollouts,
        envs_per_block=args.rollouts // args.workers,
        backend="process",
        num_workers=args.workers,
        env_kwargs=env_kwargs,
    ) as envs:
        aiovec_rate = imagined_steps_per_second(envs, args.seconds)
    print(f"imagined steps/s, model in this process: {local_rate / 1e6:.2f} M")
    print(
        f"imagined steps/s, aiovec blocks on {args.workers} workers: {aiovec_rate / 1e6:.2f} M "
        f"({aiovec_rate / local_rate:.2f}x)"
    )


if __name__ == "__main__":
    main()
