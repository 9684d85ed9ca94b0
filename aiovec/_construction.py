"""Construction: which backend a new :class:`~aiovec.VecEnv` gets, and how many workers.

This module owns turning ``VecEnv``'s construction arguments into a :class:`BackendPlan`:
checking them (factories, ``envs_per_block``, ``max_concurrency``, ``on_failure``,
``step_timeout``), resolving ``backend="auto"`` (which probes an env, see
:mod:`aiovec._auto`) and what ``max_concurrency`` implies for the worker count. It
builds nothing and starts nothing that outlives a call: ``VecEnv`` builds the backend
from the plan, through the registry of :mod:`aiovec.backends`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from aiovec._auto import ProbeLimits, choose_backend, choose_block_layout
from aiovec._checks import FOREVER, check_count, check_seconds, is_int
from aiovec.backends import REGISTRY

ON_FAILURE = ("raise", "restart")


class BackendPlan(NamedTuple):
    """What to build: a backend of the registry by name, with the worker layout."""

    backend: str
    num_workers: int | None  #: ``None``: the backend's default (about one per core)
    inline_envs: int  #: envs the process backend steps in the agent's own process
    concurrent_envs: bool | None  #: step a worker's envs in threads (``None``: measure)
    max_restarts: int  #: rebuilds allowed per env; 0 unless ``on_failure="restart"``


def check_envs_per_block(envs_per_block: Any) -> int | None:
    """``envs_per_block`` as an int, or ``None`` for single envs; ValueError otherwise."""
    if envs_per_block is None:
        return None
    if not is_int(envs_per_block) or envs_per_block < 1:
        raise ValueError(f"envs_per_block must be a positive int or None, got {envs_per_block!r}")
    return int(envs_per_block)


def check_numbers(
    *,
    num_workers: Any,
    inline_envs: Any,
    max_restarts: Any,
    step_timeout: Any,
    close_timeout: Any,
    startup_timeout: Any,
    spin: Any,
) -> dict[str, float | None]:
    """Check the numeric construction arguments, before anything starts: each a number
    of the right kind and range (a NaN timeout used to pass and fail inside the poller).
    Returns the time arguments as the runtime uses them: Python floats (a numpy float32
    is not taken everywhere), ``inf`` as no limit.

    Raises:
        TypeError / ValueError: naming the argument, what it takes and what it got.
    """
    check_count("num_workers", num_workers, 1, none_ok=True)
    check_count("inline_envs", inline_envs, 0)
    check_count("max_restarts", max_restarts, 0)
    if close_timeout is None:
        raise TypeError("close_timeout must be a number of seconds (inf: no limit), got None")
    return {
        "step_timeout": check_seconds("step_timeout", step_timeout, positive=True),
        "close_timeout": check_seconds("close_timeout", close_timeout, unlimited=FOREVER),
        "startup_timeout": check_seconds("startup_timeout", startup_timeout, positive=True),
        "spin": check_seconds("spin", spin, unlimited=FOREVER),
    }


def check_factories(env_fns: Sequence[Callable[[], Any]]) -> list[Callable[[], Any]]:
    """The factories as a list; ValueError if there are none, TypeError for one that
    cannot be called."""
    factories = list(env_fns)
    if not factories:
        raise ValueError("env_fns is empty: a vector env needs at least one env factory")
    for index, env_fn in enumerate(factories):
        if not callable(env_fn):
            raise TypeError(
                f"env_fns[{index}] is {env_fn!r}, not a callable; pass factories such as "
                "`lambda: gymnasium.make('CartPole-v1')` or use aiovec.make()"
            )
    return factories


def plan_backend(
    backend: str,
    env_fns: list[Callable[[], Any]],
    *,
    envs_per_block: int | None,
    num_workers: int | None,
    inline_envs: int,
    concurrent_envs: bool | None,
    on_failure: str,
    max_restarts: int,
    step_timeout: float | None,
    max_concurrency: int | None,
    startup_timeout: float | None = None,
) -> BackendPlan:
    """Check the backend-related arguments and decide the backend and worker layout.

    A user's ``num_workers`` always wins over what ``"auto"`` would choose;
    ``max_concurrency`` caps the process backend's workers (each steps one env at a
    time). ``"auto"`` probes the first factory in a child process (see
    :func:`aiovec._auto.choose_backend`); with restarts or a step timeout asked for,
    it keeps every env out of this process.

    Raises:
        ValueError: an unknown backend, ``on_failure`` or a ``max_concurrency`` /
            ``step_timeout`` the backend cannot honour (the message names the fix).
    """
    isolate = on_failure == "restart" or step_timeout is not None
    limits = ProbeLimits.of(startup_timeout, step_timeout)  # a probe waits no longer
    if max_concurrency is not None:
        _check_max_concurrency(max_concurrency, backend)
        if backend == "auto":
            backend = "process"
        if backend == "process":  # one env at a time per worker: at most that many
            limit = min(int(max_concurrency), len(env_fns))
            num_workers = limit if num_workers is None else min(num_workers, limit)
            concurrent_envs, inline_envs = False, 0
    if backend == "auto" and envs_per_block is not None:  # only the backend: blocks are given
        backend = choose_block_layout(
            lambda size: env_fns[0], len(env_fns) * envs_per_block, isolate, envs_per_block, limits
        )["backend"]
    if envs_per_block is not None and step_timeout is not None and backend == "coroutine":
        raise ValueError(
            "step_timeout is not enforced for async batched envs (envs_per_block on "
            "backend='coroutine', the only backend that awaits them): leave it out"
        )
    if backend == "auto":
        chosen = choose_backend(env_fns[0], len(env_fns), isolate=isolate, limits=limits)
        backend = chosen.pop("backend")
        if backend in ("process", "ray") and num_workers is None:  # the user's count wins
            num_workers = chosen.get("num_workers")
            inline_envs = chosen.get("inline_envs", inline_envs)
    if backend not in REGISTRY:
        raise ValueError(f"backend must be one of {(*REGISTRY, 'auto')}, got {backend!r}")
    if on_failure not in ON_FAILURE:
        raise ValueError(f"on_failure must be 'raise' or 'restart', got {on_failure!r}")
    if step_timeout is not None and (backend == "inline" or step_timeout <= 0):
        raise ValueError(
            "step_timeout needs backend='process', 'ray' or 'coroutine' (async envs): an "
            "env stepped inline (backend='inline', or make(vectorization_mode='sync')) "
            "cannot be interrupted; and a positive number of seconds, got "
            f"{step_timeout!r}"
        )
    if step_timeout is not None and backend == "process" and inline_envs:
        raise ValueError(
            f"step_timeout cannot interrupt the inline_envs={inline_envs} envs this process "
            "steps itself: pass inline_envs=0 (every env in a worker, which is killed when "
            "one of its envs is late), or leave step_timeout out"
        )
    restarts = max_restarts if on_failure == "restart" else 0
    return BackendPlan(backend, num_workers, inline_envs, concurrent_envs, restarts)


def _check_max_concurrency(max_concurrency: Any, backend: str) -> None:
    # Gymnasium's own messages for a bad value, so code that checks for them still works.
    if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, (int, np.integer)):
        raise ValueError(
            f"`max_concurrency` must be an integer or None, got {type(max_concurrency)}."
        )
    if max_concurrency < 1:
        raise ValueError(f"`max_concurrency` must be a positive or None, got {max_concurrency}.")
    if backend not in ("auto", "process", "inline"):
        raise ValueError(
            "max_concurrency needs backend='process' (or 'inline', which steps one "
            f"env at a time anyway), got backend={backend!r}"
        )
