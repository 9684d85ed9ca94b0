"""Functions the SB3 adapter runs where the envs live (``aiovec.VecEnv.apply``).

Kept apart from :mod:`aiovec.integrations.sb3` so that a worker process unpickling them
imports only this small module, not Stable-Baselines3 (and PyTorch).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import gymnasium as gym


class Missing(NamedTuple):
    """Returned for an attribute that neither ``env`` nor an env it wraps has, for the
    adapter to raise as an ``AttributeError``: raised here, it would be an env's failure,
    logged as Gymnasium logs one, for what SB3 often asks only to find out (its
    ``VecEnv.__init__`` probes ``render_mode``)."""

    message: str  #: the ``AttributeError``'s


def get_wrapper_attr(env: gym.Env, name: str) -> Any:
    """The attribute ``name`` of ``env`` or of an env it wraps, not called even if a
    method (as SB3's ``SubprocVecEnv.get_attr``); :class:`Missing` if none has it."""
    try:
        return env.get_wrapper_attr(name)
    except AttributeError as exc:
        return Missing(str(exc))


def call_wrapper_method(
    env: gym.Env, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """Call the method ``name`` of ``env`` or of an env it wraps, as SB3's
    ``SubprocVecEnv.env_method`` does (any name, ``"reset"`` included); :class:`Missing`
    if none has it (what the method itself raises is the env's error)."""
    method = get_wrapper_attr(env, name)
    return method if isinstance(method, Missing) else method(*args, **kwargs)


def has_wrapper_attr(env: gym.Env, name: str) -> bool:
    """Whether ``env`` or an env it wraps has the attribute ``name``."""
    return not isinstance(get_wrapper_attr(env, name), Missing)


def is_wrapped(env: gym.Env, wrapper_class: type[gym.Wrapper]) -> bool:
    """Whether a wrapper of ``env`` is a ``wrapper_class`` (SB3's ``env_util.is_wrapped``)."""
    while isinstance(env, gym.Wrapper):
        if isinstance(env, wrapper_class):
            return True
        env = env.env
    return False
