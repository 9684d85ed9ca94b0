"""Stable-Baselines3: an aiovec env as an SB3 ``VecEnv``.

SB3 resets finished envs within the same step and hands the last observation over in
``info["terminal_observation"]``: exactly aiovec's ``SAME_STEP`` autoreset mode, which
this adapter therefore requires.

Example:
    >>> from stable_baselines3 import PPO
    >>> from aiovec.integrations.sb3 import make_sb3_vec_env
    >>> env = make_sb3_vec_env("CartPole-v1", 8)          # doctest: +SKIP
    >>> PPO("MlpPolicy", env).learn(100_000)              # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from stable_baselines3.common.env_util import is_wrapped
from stable_baselines3.common.vec_env import VecEnv, VecMonitor

import aiovec


def unbatch_infos(infos: dict[str, Any], num_envs: int) -> list[dict[str, Any]]:
    """Gymnasium's vector infos (arrays plus ``_key`` masks) as one dict per env."""
    result: list[dict[str, Any]] = [{} for _ in range(num_envs)]
    for key, value in infos.items():
        if key.startswith("_"):
            continue
        mask = infos.get(f"_{key}")
        present = range(num_envs) if mask is None else np.flatnonzero(mask)
        per_env = unbatch_infos(value, num_envs) if isinstance(value, dict) else value
        for index in present:
            result[index][key] = per_env[index]
    return result


class SB3VecEnv(VecEnv):
    """Wraps an :class:`aiovec.VecEnv` (created with ``autoreset_mode=SAME_STEP``) as a
    Stable-Baselines3 ``VecEnv``: ``step_async``/``step_wait``, ``reset`` with
    ``seed``/``set_options``, ``reset_infos``, ``terminal_observation`` and
    ``TimeLimit.truncated`` in infos, and ``get_attr``/``set_attr``/``env_method``/
    ``env_is_wrapped`` with ``indices``.

    Raises:
        ValueError: the aiovec env does not use ``AutoresetMode.SAME_STEP``.
    """

    def __init__(self, venv: aiovec.VecEnv) -> None:
        if venv.autoreset_mode is not AutoresetMode.SAME_STEP:
            raise ValueError(
                "Stable-Baselines3 expects same-step autoreset: create the aiovec env with "
                "autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP, or use "
                "aiovec.integrations.sb3.make_sb3_vec_env()"
            )
        self.venv = venv
        super().__init__(venv.num_envs, venv.single_observation_space, venv.single_action_space)

    def reset(self) -> Any:
        seeds = None if all(seed is None for seed in self._seeds) else list(self._seeds)
        options = self._options if any(self._options) else None
        observations, infos = self.venv.reset(seed=seeds, options=options)
        self.reset_infos = unbatch_infos(infos, self.num_envs)
        self._reset_seeds()
        self._reset_options()
        return observations

    def step_async(self, actions: np.ndarray) -> None:
        self.venv.step_async(actions)

    def step_wait(self) -> tuple[Any, np.ndarray, np.ndarray, list[dict]]:
        observations, rewards, terminations, truncations, infos = self.venv.step_wait()
        dones = terminations | truncations
        per_env = unbatch_infos(infos, self.num_envs)
        for index in range(self.num_envs):
            info = per_env[index]
            if dones[index]:  # the info of the finished episode; the reset's goes aside
                final_observation = info.pop("final_obs")
                final_info = info.pop("final_info", {})
                self.reset_infos[index] = info
                info = per_env[index] = dict(final_info)
                info["terminal_observation"] = final_observation
            info["TimeLimit.truncated"] = bool(truncations[index] and not terminations[index])
        return observations, rewards.astype(np.float32), dones, per_env

    def close(self) -> None:
        self.venv.close()

    def get_attr(self, attr_name: str, indices: Any = None) -> list[Any]:
        return list(self.venv.call(attr_name, env_ids=self._indices(indices)))

    def set_attr(self, attr_name: str, value: Any, indices: Any = None) -> None:
        env_ids = self._indices(indices)
        self.venv.set_attr(attr_name, [value] * len(env_ids), env_ids=env_ids)

    def env_method(
        self, method_name: str, *method_args: Any, indices: Any = None, **method_kwargs: Any
    ) -> list[Any]:
        return list(
            self.venv.call(
                method_name, *method_args, env_ids=self._indices(indices), **method_kwargs
            )
        )

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper], indices: Any = None) -> list[bool]:
        return list(self.venv.apply(is_wrapped, wrapper_class, env_ids=self._indices(indices)))

    def get_images(self) -> Sequence[np.ndarray | None]:
        return list(self.venv.render())

    def _indices(self, indices: None | int | Iterable[int]) -> list[int]:
        return list(self._get_indices(indices))


def make_sb3_vec_env(
    env_id: str | Any, n_envs: int, *, monitor: bool = True, **options: Any
) -> VecEnv:
    """``aiovec.make(env_id, n_envs, **options)`` as an SB3 ``VecEnv`` (same-step
    autoreset), wrapped in SB3's ``VecMonitor`` for episode statistics unless
    ``monitor=False``."""
    options["autoreset_mode"] = AutoresetMode.SAME_STEP
    env: VecEnv = SB3VecEnv(aiovec.make(env_id, n_envs, **options))
    return VecMonitor(env) if monitor else env
