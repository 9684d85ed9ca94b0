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

import multiprocessing
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, cast

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import concatenate, create_empty_array
from stable_baselines3.common.vec_env import VecEnv, VecMonitor

import aiovec
from aiovec._transport.spaces import read_row
from aiovec.integrations import _sb3_env_side as env_side


class SB3VecEnv(VecEnv):
    """Wraps an :class:`aiovec.VecEnv` (created with ``autoreset_mode=SAME_STEP``) as a
    Stable-Baselines3 ``VecEnv``: ``step_async``/``step_wait``, ``reset`` with
    ``seed``/``set_options``, ``reset_infos``, each env's infos as it returned them (not
    through Gymnasium's batched layout) with ``terminal_observation`` and
    ``TimeLimit.truncated``, and ``get_attr``/``set_attr``/``env_method``/
    ``env_is_wrapped`` with ``indices``.

    It behaves as SB3's ``SubprocVecEnv`` where SB3's own tests look: actions come one
    per env (for Dict and Tuple action spaces, a list of per-env dicts or tuples is
    batched here; a dict of arrays is taken as a batch), ``indices`` may be negative,
    ``get_attr`` returns attributes without calling them, a missing attribute is an
    ``AttributeError`` (so ``has_attr`` is ``False``), and ``get_images`` needs
    ``render_mode="rgb_array"``. :class:`AiovecSubprocVecEnv` has ``SubprocVecEnv``'s
    constructor.

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
        # An env without options gets none (None), as from SubprocVecEnv, not {}.
        options = [option or None for option in self._options] if any(self._options) else None
        with self._per_env_infos():
            observations, infos = self.venv.reset(seed=seeds, options=options)
        self.reset_infos = [dict(info) for info in cast("list[dict[str, Any]]", infos)]
        self._reset_seeds()
        self._reset_options()
        return observations

    def step_async(self, actions: Any) -> None:
        self.venv.step_async(self._batch_actions(actions))

    def _batch_actions(self, actions: Any) -> Any:
        """SB3 hands over one action per env (``SubprocVecEnv`` iterates over
        ``actions``): for Dict and Tuple action spaces that is a list (or object array) of
        per-env dicts or tuples, which becomes the batched layout of Gymnasium (a dict or
        tuple of arrays). A dict is taken as batched already; anything that is not one
        action per env is left to aiovec's checks."""
        space = self.venv.single_action_space
        if isinstance(actions, dict) or not isinstance(space, (spaces.Dict, spaces.Tuple)):
            return actions
        if not isinstance(actions, (list, tuple, np.ndarray)) or len(actions) != self.num_envs:
            return actions
        try:
            # cast: create_empty_array is typed as possibly None, which it never returns
            out = cast(Any, create_empty_array(space, self.num_envs))
            return concatenate(space, list(actions), out)
        except (AssertionError, KeyError, TypeError, ValueError, IndexError):
            return actions  # not one action per env (a tuple of batches): aiovec checks it

    def step_wait(self) -> tuple[Any, np.ndarray, np.ndarray, list[dict[str, Any]]]:
        with self._per_env_infos():
            observations, rewards, terminations, truncations, infos = self.venv.step_wait()
        dones = terminations | truncations
        # Per env already (see _per_env_infos), whatever VecEnv's signature says.
        per_env = [dict(info) for info in cast("list[dict[str, Any]]", infos)]
        for index in range(self.num_envs):
            info = per_env[index]
            if dones[index] and "final_obs" in info:  # the finished episode's info; the
                final_observation = info.pop("final_obs")  # reset's goes aside
                final_info = info.pop("final_info", {})
                self.reset_infos[index] = info
                info = per_env[index] = dict(final_info)
                info["terminal_observation"] = final_observation
            elif dones[index]:  # a batched env's restart ended the episode without a
                # final observation (single envs give the last one): SB3 needs one, and
                # the rebuilt block's first stands in (the info says restarted)
                info["terminal_observation"] = read_row(observations, index)
            info["TimeLimit.truncated"] = bool(truncations[index] and not terminations[index])
        return observations, rewards.astype(np.float32), dones, per_env

    def _per_env_infos(self) -> Any:
        """Infos as each env returned them, as SubprocVecEnv passes them on (Gymnasium's
        batched layout would convert one env's values to another's type: 0.75 -> 0),
        for this adapter's calls only: the aiovec env itself keeps Gymnasium's infos."""
        return self.venv._results.per_env_infos()

    def close(self) -> None:
        self.venv.close()

    def has_attr(self, attr_name: str) -> bool:
        """Whether every env (or one of its wrappers) has the attribute ``attr_name``."""
        return all(self.venv.apply(env_side.has_wrapper_attr, attr_name))

    def get_attr(self, attr_name: str, indices: Any = None) -> list[Any]:
        """The attribute ``attr_name`` of each env (found through its wrappers), as is:
        a method is returned, not called (as in SB3's ``SubprocVecEnv``).

        Raises:
            AttributeError: an env has no attribute ``attr_name`` (the message names
                the env); nothing is logged, as no env failed.
        """
        env_ids = self._indices(indices)
        with _attribute_errors():
            return _present(
                self.venv.apply(env_side.get_wrapper_attr, attr_name, env_ids=env_ids), env_ids
            )

    def set_attr(self, attr_name: str, value: Any, indices: Any = None) -> None:
        env_ids = self._indices(indices)
        self.venv.set_attr(attr_name, [value] * len(env_ids), env_ids=env_ids)

    def env_method(
        self, method_name: str, *method_args: Any, indices: Any = None, **method_kwargs: Any
    ) -> list[Any]:
        """Call method ``method_name`` of each env (found through its wrappers).

        Raises:
            AttributeError: an env has no attribute ``method_name``.
        """
        # As SubprocVecEnv calls it: any name ("reset" included, which VecEnv.call
        # refuses as AsyncVectorEnv does), found through the wrappers, always called.
        env_ids = self._indices(indices)
        with _attribute_errors():
            results = self.venv.apply(
                env_side.call_wrapper_method,
                method_name,
                method_args,
                method_kwargs,
                env_ids=env_ids,
            )
        return _present(results, env_ids)

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper], indices: Any = None) -> list[bool]:
        return list(
            self.venv.apply(env_side.is_wrapped, wrapper_class, env_ids=self._indices(indices))
        )

    def get_images(self) -> Sequence[np.ndarray | None]:
        if self.render_mode != "rgb_array":  # as SubprocVecEnv
            warnings.warn(
                f"The render mode is {self.render_mode}, but this method assumes it is "
                "`rgb_array` to obtain images.",
                stacklevel=2,
            )
            return [None] * self.num_envs
        return list(cast("tuple[Any, ...]", self.venv.render()))  # rgb_array: a frame per env

    def _indices(self, indices: None | int | Iterable[int]) -> list[int]:
        """SB3's ``indices`` as env ids; negative ones count from the end, as in SB3's
        vec envs (which index a list with them)."""
        count = self.num_envs
        return [int(i) + count if -count <= i < 0 else int(i) for i in self._get_indices(indices)]


class AiovecSubprocVecEnv(SB3VecEnv):
    """A drop-in for SB3's ``SubprocVecEnv``: the same constructor (``env_fns``,
    ``start_method``), so it fits ``make_vec_env(..., vec_env_cls=AiovecSubprocVecEnv)``,
    built as ``SB3VecEnv(aiovec.VecEnv(env_fns, autoreset_mode=SAME_STEP, ...))``.

    Args:
        env_fns: one callable per env, each returning a new ``gymnasium.Env``.
        start_method: how worker processes start (aiovec's ``context``); ``None`` for
            aiovec's default.
        **options: more :class:`aiovec.VecEnv` options (``backend``, ``num_workers``, ...).

    Raises:
        ValueError: ``start_method`` is unknown (``"cannot find context for ..."``, as
            ``SubprocVecEnv`` says).
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        start_method: str | None = None,
        **options: Any,
    ) -> None:
        options["autoreset_mode"] = AutoresetMode.SAME_STEP
        try:
            venv = aiovec.VecEnv(env_fns, context=start_method, **options)
        except ValueError as error:
            known = start_method is None or start_method in multiprocessing.get_all_start_methods()
            if known or "context" not in str(error):
                raise
            # SubprocVecEnv's (multiprocessing's) words for an unknown start method
            raise ValueError(f"cannot find context for {start_method!r}: {error}") from error
        try:
            super().__init__(venv)
        except BaseException:
            venv.close()
            raise


def _present(values: Sequence[Any], env_ids: list[int]) -> list[Any]:
    """``values`` (one per env of ``env_ids``) as a list, or the ``AttributeError`` of
    the first env that lacked the attribute (see :class:`env_side.Missing`)."""
    for env_id, value in zip(env_ids, values):
        if isinstance(value, env_side.Missing):
            raise AttributeError(f"env {env_id}: {value.message}")
    return list(values)


@contextmanager
def _attribute_errors() -> Iterator[None]:
    """An env's ``AttributeError`` is an ``AttributeError`` here, as SB3 expects (its
    ``has_attr`` and ``VecEnv.__init__`` catch it): aiovec's error as is where it is one
    already, else an ``AttributeError`` caused by it."""
    try:
        yield
    except aiovec.EnvError as error:
        if isinstance(error, AttributeError) or error.exc_type != "AttributeError":
            raise
        raise AttributeError(f"env {error.env_index}: {error.exc_message}") from error


def make_sb3_vec_env(
    env_id: str | Any, n_envs: int, *, monitor: bool = True, **options: Any
) -> VecEnv:
    """``aiovec.make(env_id, n_envs, **options)`` as an SB3 ``VecEnv`` (same-step
    autoreset), wrapped in SB3's ``VecMonitor`` for episode statistics unless
    ``monitor=False``."""
    options["autoreset_mode"] = AutoresetMode.SAME_STEP
    env: VecEnv = SB3VecEnv(aiovec.make(env_id, n_envs, **options))
    return VecMonitor(env) if monitor else env
