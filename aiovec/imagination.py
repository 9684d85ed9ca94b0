"""Imagination rollouts: a learned dynamics model stepped as a batched env.

Model-based RL trains a model of the env on real transitions, then "imagines"
thousands of rollouts with it. :class:`ModelVectorEnv` is such a model behind the
``gymnasium.vector.VectorEnv`` API, so aiovec can spread blocks of imagined rollouts
over worker processes like any batched env::

    model = DynamicsModel(obs_dim=4, num_actions=2)
    fit_dynamics(model, obs, actions, rewards, next_obs, terminations, seconds=5)
    envs = aiovec.make(
        ModelVectorEnv.factory, 4096, envs_per_block=2048,
        env_kwargs={"weights": model_weights(model), "start_states": starts, ...},
    )

Needs torch (``pip install torch``); imported only when this module is.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space
from torch import nn

from aiovec._worker import in_worker_process


class DynamicsModel(nn.Module):
    """An MLP from (observation, one-hot action) to (observation change, reward,
    termination logit): what an env's ``step`` returns, learned."""

    def __init__(self, obs_dim: int, num_actions: int, hidden: int = 64) -> None:
        super().__init__()
        self.obs_dim, self.num_actions, self.hidden = obs_dim, num_actions, hidden
        self.net = nn.Sequential(
            nn.Linear(obs_dim + num_actions, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, obs_dim + 2),
        )

    def forward(
        self, observations: torch.Tensor, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(next observations, rewards, termination logits)`` for a batch."""
        one_hot = nn.functional.one_hot(actions.long(), self.num_actions).float()
        out = self.net(torch.cat([observations, one_hot], dim=1))
        return observations + out[:, : self.obs_dim], out[:, -2], out[:, -1]


def model_weights(model: DynamicsModel) -> dict[str, Any]:
    """The model as plain picklable data (sizes and numpy weights), for ``env_kwargs``."""
    return {
        "sizes": (model.obs_dim, model.num_actions, model.hidden),
        "state": {key: value.detach().cpu().numpy() for key, value in model.state_dict().items()},
    }


def load_model(weights: dict[str, Any]) -> DynamicsModel:
    """A :class:`DynamicsModel` from :func:`model_weights`."""
    model = DynamicsModel(*weights["sizes"])
    state = {key: torch.as_tensor(value) for key, value in weights["state"].items()}
    model.load_state_dict(state)
    return model.eval()


def fit_dynamics(
    model: DynamicsModel,
    observations: np.ndarray,
    actions: np.ndarray,
    rewards: np.ndarray,
    next_observations: np.ndarray,
    terminations: np.ndarray,
    seconds: float = 5.0,
    batch_size: int = 256,
    learning_rate: float = 1e-3,
    seed: int = 0,
) -> float:
    """Train ``model`` on real transitions for about ``seconds``; the last minibatch loss.

    ``next_observations[i]`` must follow ``observations[i]`` in the same episode (the
    true final observation where ``terminations[i]``), not an autoreset's start.
    """
    generator = torch.Generator().manual_seed(seed)
    data = [
        torch.as_tensor(np.asarray(array), dtype=torch.float32)
        for array in (observations, actions, rewards, next_observations, terminations)
    ]
    optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate)
    model.train()
    loss = torch.tensor(float("nan"))
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        index = torch.randint(len(data[0]), (batch_size,), generator=generator)
        obs, act, rew, next_obs, term = (array[index] for array in data)
        predicted, predicted_reward, logit = model(obs, act)
        loss = (
            nn.functional.mse_loss(predicted, next_obs)
            + nn.functional.mse_loss(predicted_reward, rew)
            + nn.functional.binary_cross_entropy_with_logits(logit, term)
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    return float(loss.detach())


class ModelVectorEnv(VectorEnv):
    """``num_envs`` imagined rollouts of a :class:`DynamicsModel`, one forward pass per
    step for all of them.

    Each rollout starts from a state drawn from ``start_states`` (real observations),
    follows the model, terminates where the model predicts it (termination probability
    above 0.5) and is truncated after ``horizon`` steps. NEXT_STEP autoreset, like
    Gymnasium's vector envs. Start states are drawn as Gymnasium's resets draw: from
    fresh entropy until ``reset(seed=...)``, then reproducibly (aiovec gives each block
    its own seed).

    ``threads`` sets ``torch.set_num_threads`` for the process that builds it; the
    default (``None``) sets 1 in aiovec's worker processes (a fair split of the cores
    between workers) and leaves the caller's process alone (the inline backend builds
    the blocks in the learner's process).
    """

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(
        self,
        num_envs: int,
        weights: dict[str, Any],
        start_states: np.ndarray,
        horizon: int = 16,
        threads: int | None = None,
    ) -> None:
        if threads is None and in_worker_process():
            threads = 1
        if threads is not None:
            torch.set_num_threads(threads)
        self.model = load_model(weights)
        self.num_envs, self.horizon = num_envs, horizon
        self.start_states = torch.as_tensor(np.asarray(start_states), dtype=torch.float32)
        obs_dim = self.model.obs_dim
        self.single_observation_space = spaces.Box(-np.inf, np.inf, (obs_dim,), np.float32)
        self.single_action_space = spaces.Discrete(self.model.num_actions)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.state = torch.zeros((num_envs, obs_dim))
        self.steps = torch.zeros(num_envs, dtype=torch.int64)
        self.ended = torch.zeros(num_envs, dtype=torch.bool)
        self._generator = torch.Generator()
        self._generator.seed()  # fresh entropy: unseeded blocks and runs differ

    @classmethod
    def factory(cls, num_envs: int, **kwargs: Any) -> ModelVectorEnv:
        """``factory(num_envs=k, **env_kwargs)``, as ``aiovec.make`` calls it."""
        return cls(num_envs, **kwargs)

    def _restart(self, rows: torch.Tensor) -> None:
        count = int(rows.sum())
        picks = torch.randint(len(self.start_states), (count,), generator=self._generator)
        self.state[rows] = self.start_states[picks]
        self.steps[rows] = 0
        self.ended[rows] = False

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        if seed is not None:
            self._generator.manual_seed(seed)
        self._restart(torch.ones(self.num_envs, dtype=torch.bool))
        return self.state.numpy().copy(), {}

    @torch.no_grad()
    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        resetting = self.ended.clone()
        next_state, rewards, logits = self.model(self.state, torch.as_tensor(np.asarray(actions)))
        self.state = next_state
        self.steps += 1
        terminated = logits > 0.0  # probability above one half
        truncated = (self.steps >= self.horizon) & ~terminated
        if resetting.any():  # NEXT_STEP: the step after an episode end restarts the row
            self._restart(resetting)
            rewards[resetting] = 0.0
            terminated[resetting] = False
            truncated[resetting] = False
        self.ended = terminated | truncated
        return (
            self.state.numpy().copy(),
            rewards.numpy().astype(np.float64),
            terminated.numpy(),
            truncated.numpy(),
            {},
        )
