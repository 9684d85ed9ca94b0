"""``aiovec.make``: a vector env from a Gymnasium id or an env factory."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym

from aiovec.vector_env import VecEnv


class EnvFactory:
    """A picklable ``() -> Env``: ``make(*args, **kwargs)`` wrapped by ``wrappers`` in order."""

    def __init__(
        self,
        make: Callable[..., gym.Env],
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
        wrappers: Sequence[Callable[[gym.Env], gym.Env]] = (),
    ) -> None:
        self.make, self.args, self.kwargs, self.wrappers = make, args, kwargs or {}, tuple(wrappers)

    def __call__(self) -> gym.Env:
        env = self.make(*self.args, **self.kwargs)
        for wrapper in self.wrappers:
            env = wrapper(env)
        return env

    def __repr__(self) -> str:
        target = getattr(self.make, "__qualname__", repr(self.make))
        arguments = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"{target}({', '.join(arguments)})"


def make(
    env_id: str | Callable[..., gym.Env],
    num_envs: int,
    *,
    env_kwargs: dict[str, Any]
    | Sequence[dict[str, Any]]
    | Callable[[int], dict[str, Any]]
    | None = None,
    wrappers: Sequence[Callable[[gym.Env], gym.Env]] = (),
    backend: str = "auto",
    render_mode: str | None = None,
    **options: Any,
) -> VecEnv:
    """Create ``num_envs`` copies of an env as one :class:`VecEnv`.

    Args:
        env_id: a Gymnasium registry id (``"CartPole-v1"``, ``"module:Env-v0"``) or a
            callable returning a ``gymnasium.Env`` (an env class works).
        num_envs: how many envs.
        env_kwargs: keyword arguments for ``gymnasium.make`` or for the callable: one dict
            for every env, a list with one dict per env, or a function from env index to
            dict (per-env parameters, e.g. domain randomization).
        wrappers: ``gymnasium.Wrapper`` classes (or callables) applied to each env, in order.
        backend: ``"auto"`` (default) probes one env in this process for a few
            milliseconds and picks ``"inline"`` for envs too cheap to pay for IPC, one
            worker per env for envs that mostly wait, and one worker per core otherwise
            (see ``venv.backend`` / ``venv.num_workers`` for the choice). Or name the
            backend (``"process"``, ``"inline"``) to skip the probe.
        render_mode: each env's render mode (``"rgb_array"``, ...), as in
            ``gymnasium.make_vec``: passed to ``gymnasium.make`` (or to the callable, as a
            keyword). ``venv.render()`` returns one frame per env.
        **options: passed to :class:`VecEnv` (``num_workers``, ``copy``,
            ``autoreset_mode``, ``context``, ``observation_mode``, ...).

    Raises:
        gymnasium.error.Error: unknown env id (raised here, before any process starts).
        ValueError: ``num_envs`` is not a positive integer, or ``render_mode`` differs
            from a ``render_mode`` in ``env_kwargs``.

    Example:
        >>> import aiovec
        >>> with aiovec.make("CartPole-v1", num_envs=4, backend="inline") as envs:
        ...     observations, infos = envs.reset(seed=0)
        ...     observations.shape
        (4, 4)
    """
    if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
        raise ValueError(f"num_envs must be a positive int, got {num_envs!r}")
    spec = None
    if isinstance(env_id, str):
        spec = gym.spec(env_id)  # unknown ids fail here, with Gymnasium's suggestions
        make_env, args = gym.make, (env_id,)
    elif callable(env_id):
        make_env, args = env_id, ()
    else:
        raise TypeError(
            f"env_id must be a Gymnasium id or a callable returning an env, got {env_id!r}"
        )
    per_env_kwargs = _per_env_kwargs(env_kwargs, num_envs)
    if render_mode is not None:
        for kwargs in per_env_kwargs:
            if kwargs.setdefault("render_mode", render_mode) != render_mode:
                raise ValueError(
                    f"render_mode={render_mode!r} but env_kwargs has "
                    f"render_mode={kwargs['render_mode']!r}: give it once"
                )
    factories = [EnvFactory(make_env, args, kwargs, wrappers) for kwargs in per_env_kwargs]
    venv = VecEnv(factories, backend=backend, **options)
    venv.spec = spec
    return venv


def _per_env_kwargs(env_kwargs: Any, num_envs: int) -> list[dict[str, Any]]:
    if env_kwargs is None or isinstance(env_kwargs, dict):
        return [dict(env_kwargs or {}) for _ in range(num_envs)]
    if callable(env_kwargs):
        return [dict(env_kwargs(index)) for index in range(num_envs)]
    kwargs = list(env_kwargs)
    if len(kwargs) != num_envs:
        raise ValueError(
            f"env_kwargs has {len(kwargs)} entries for {num_envs} envs: give one dict per env, "
            "one dict for all, or a function from env index to dict"
        )
    return [dict(item or {}) for item in kwargs]
