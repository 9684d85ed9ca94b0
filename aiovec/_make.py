"""``aiovec.make``: a vector env from a Gymnasium id or an env factory."""

from __future__ import annotations

import copy
import importlib
import inspect
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import gymnasium as gym
from gymnasium.envs.registration import EnvSpec, VectorizeMode

try:  # private, but it is how gymnasium.make and make_vec find an id's spec
    from gymnasium.envs.registration import _find_spec
except ImportError:  # a Gymnasium without it: the public lookup (versions must be given)
    _find_spec = None  # type: ignore[assignment]

from aiovec._auto import ProbeLimits, choose_block_layout
from aiovec._worker.blocks import BlockFactory
from aiovec._worker.registrations import shown
from aiovec.vector_env import VecEnv


class EnvFactory:
    """A picklable ``() -> Env``: ``make(*args, **kwargs)`` wrapped by ``wrappers`` in order."""

    def __init__(
        self,
        make: Callable[..., gym.Env],
        args: tuple[Any, ...] = (),
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
        arguments = [shown(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"{target}({', '.join(arguments)})"


def make(
    # make_vec's parameters first, in its order and under its names (``id`` included)
    # a callable returns a gymnasium.Env (a VectorEnv under vector_entry_point)
    id: str | EnvSpec | Callable[..., Any] | None = None,
    num_envs: int = 1,
    vectorization_mode: str | None = None,
    vector_kwargs: dict[str, Any] | None = None,
    wrappers: Sequence[Callable[[gym.Env], gym.Env]] | None = (),
    *,
    env_kwargs: dict[str, Any]
    | Sequence[dict[str, Any]]
    | Callable[[int], dict[str, Any]]
    | None = None,
    backend: str = "auto",
    render_mode: str | None = None,
    envs_per_block: int | None = None,
    **options: Any,
) -> VecEnv:
    """Create ``num_envs`` copies of an env as one :class:`VecEnv`.

    Takes ``gymnasium.make_vec``'s arguments, by name or in its order (``id``,
    ``num_envs``, ``vectorization_mode``, ``vector_kwargs``, ``wrappers``), then
    aiovec's own as keywords.

    Args:
        id: a Gymnasium registry id (``"CartPole-v1"``, ``"module:Env-v0"``, or
            ``"CartPole"`` for its latest version, as ``gymnasium.make_vec`` finds it),
            an ``EnvSpec``, or a callable returning a ``gymnasium.Env`` (an env class
            works). Also taken as ``env_id=`` when ``id`` is left out.
        num_envs: how many envs (1 when left out, as in ``gymnasium.make_vec``).
        env_kwargs: keyword arguments for ``gymnasium.make`` or for the callable: one dict
            for every env, a list with one dict per env, or a function from env index to
            dict (per-env parameters, e.g. domain randomization).
        wrappers: ``gymnasium.Wrapper`` classes (or callables) applied to each env, in order.
        backend: ``"auto"`` (default) probes one env in a child process for a few
            milliseconds and picks ``"inline"`` for envs too cheap to pay for IPC, a
            worker per core stepping its envs in threads for envs that mostly wait (a
            worker per env with restarts or step timeouts), ``cores - 1`` workers plus a
            share stepped in this process for cheap CPU-bound envs, and one worker per
            core for dearer ones (see ``venv.backend`` / ``venv.num_workers`` /
            ``venv.inline_envs`` for the choice). Or name the backend (``"process"``,
            ``"inline"``, ``"coroutine"``, ``"ray"``) to skip the probe.
        render_mode: each env's render mode (``"rgb_array"``, ...), as in
            ``gymnasium.make_vec``: passed to ``gymnasium.make`` (or to the callable, as a
            keyword). ``venv.render()`` returns one frame per env.
        vectorization_mode: ``None`` (the default: one env per copy, run where
            ``backend`` puts them), ``"async"`` (one env per copy, each in a worker
            process, as ``AsyncVectorEnv``: ``backend="process"`` unless a backend is
            named), ``"sync"`` (in this process, as ``SyncVectorEnv``:
            ``backend="inline"`` unless a backend is named), or ``"vector_entry_point"``:
            *batched envs*, as in ``gymnasium.make_vec``. Each block of
            ``envs_per_block`` rows is one ``gymnasium.vector.VectorEnv`` stepped in one
            call: from the registry's vector entry point for an id (CartPole-v1 has
            one), or ``id(num_envs=k, **env_kwargs)`` for a callable (your own
            numpy/torch-vectorized env or learned model). ``env_kwargs`` is then per
            *block* (one dict, a list with one dict per block, or a function of the
            block index) and ``wrappers`` are vector wrappers applied to each block. See
            :class:`VecEnv` (``envs_per_block``) for how blocks behave.
        envs_per_block: rows per batched env (``num_envs`` must be a multiple of it);
            implies ``vectorization_mode="vector_entry_point"``. Default with
            ``backend="auto"``: one block per core when a probe says splitting pays
            (this process steps the last block while ``cores - 1`` workers step the
            others), else one block of ``num_envs`` stepped in this process.
            ``"process"``: one block per worker (of ``inline_envs`` rows, if given);
            ``"inline"``: one block.
        vector_kwargs: options for :class:`VecEnv`, as ``gymnasium.make_vec`` takes them.
        **options: :class:`VecEnv`'s own options (``num_workers``, ``copy``,
            ``autoreset_mode``, ``context``, ``observation_mode``, ...); any other keyword
            is the env's, as in ``gymnasium.make_vec`` (``make("FrozenLake-v1", 4,
            is_slippery=False)``), added to every env's (or block's) ``env_kwargs``.

    ``venv.spec`` is the registry's spec for an id, with the ``kwargs`` that
    ``gymnasium.make_vec`` records: the env's keyword arguments, ``num_envs``,
    ``vectorization_mode`` (and ``vector_kwargs``, ``wrappers`` when given).

    Raises:
        gymnasium.error.Error: unknown env id (raised here, before any process starts).
        ValueError: ``num_envs`` is not a positive integer, ``render_mode`` differs
            from a ``render_mode`` in ``env_kwargs``, or a keyword is given twice (in
            ``env_kwargs`` and as a keyword, or in ``vector_kwargs`` and as an option).

    Example:
        >>> import aiovec
        >>> with aiovec.make("CartPole-v1", num_envs=4, backend="inline") as envs:
        ...     observations, infos = envs.reset(seed=0)
        ...     observations.shape
        (4, 4)
    """
    env_id = _the_id(id, options)
    wrappers = wrappers or ()  # None, as gymnasium.make_vec takes it
    if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
        raise ValueError(f"num_envs must be a positive int, got {num_envs!r}")
    spec = None
    args: tuple[Any, ...]
    if isinstance(env_id, (str, EnvSpec)):
        # unknown ids fail here, with Gymnasium's suggestions; a spec is taken as given
        spec = registry_spec(env_id)
        # The spec, not the id, as gymnasium.make_vec passes it: a worker started fresh
        # never saw an id registered here (see aiovec._worker.registrations).
        make_env, args = gym.make, (spec,)
    elif callable(env_id):
        make_env, args = env_id, ()
    else:
        raise TypeError(
            f"id must be a Gymnasium id, an EnvSpec or a callable returning an env, got {env_id!r}"
        )
    if isinstance(vectorization_mode, VectorizeMode):
        vectorization_mode = vectorization_mode.value
    if vectorization_mode not in (None, "sync", "async", "vector_entry_point"):
        raise ValueError(
            "vectorization_mode must be None, 'sync', 'async' or 'vector_entry_point', "
            f"got {vectorization_mode!r}"
        )
    if backend == "auto" and vectorization_mode in _MODE_BACKENDS:
        # Where make_vec steps them: "async" is AsyncVectorEnv (every env in a worker
        # process, so a crashing env cannot take this one down), "sync" SyncVectorEnv.
        backend = _MODE_BACKENDS[vectorization_mode]
    env_extra = {key: options.pop(key) for key in list(options) if key not in _VECENV_OPTIONS}
    for key in options.keys() & (vector_kwargs or {}).keys():
        raise ValueError(f"{key!r} is given twice, in vector_kwargs and as a keyword: give it once")
    options = {**(vector_kwargs or {}), **options}
    batched = envs_per_block is not None or vectorization_mode == "vector_entry_point"
    if batched:
        venv = _make_batched(
            env_id,
            num_envs,
            env_kwargs,
            env_extra,
            wrappers,
            backend,
            render_mode,
            envs_per_block,
            options,
        )
    else:
        per_env_kwargs = _per_env_kwargs(env_kwargs, num_envs, env_extra)
        for kwargs in per_env_kwargs:
            _set_render_mode(kwargs, render_mode)
        factories = [EnvFactory(make_env, args, kwargs, wrappers) for kwargs in per_env_kwargs]
        venv = VecEnv(factories, backend=backend, **options)
    if spec is not None:
        venv.spec = _vector_spec(
            spec,
            num_envs,
            {**(env_kwargs if isinstance(env_kwargs, Mapping) else {}), **env_extra},
            render_mode,
            vectorization_mode or _mode_of(venv, batched),
            vector_kwargs,
            wrappers,
        )
    return venv


def _the_id(id: Any, options: dict[str, Any]) -> Any:
    """The env :func:`make` was asked for: ``id``, else ``env_id`` (its earlier name),
    taken out of ``options``. Beside an ``id``, ``env_id`` is the env's keyword, as
    ``gymnasium.make_vec`` passes it."""
    if id is None and "env_id" in options:
        return options.pop("env_id")
    if id is None:
        raise TypeError("make() missing the env: make(id, num_envs), as gymnasium.make_vec")
    return id


def registry_spec(env_id: str | EnvSpec) -> EnvSpec:
    """The registry's spec for ``env_id``, found as ``gymnasium.make`` finds it: for
    ``"module:Env-v0"`` the module is imported first (importing it registers the id),
    and an id without a version is its latest version (with Gymnasium's warning). An
    unknown id raises Gymnasium's error, with its suggestions."""
    if isinstance(env_id, EnvSpec):
        return env_id
    if _find_spec is not None:  # Gymnasium's own lookup, the one make and make_vec use
        return _find_spec(env_id)
    module, _, name = env_id.rpartition(":")
    if module:
        importlib.import_module(module)
    return gym.spec(name)


#: The backend a ``vectorization_mode`` of ``gymnasium.make_vec`` stands for.
_MODE_BACKENDS = {"async": "process", "sync": "inline"}

#: The keywords :func:`make` passes to :class:`VecEnv`; any other is the env's.
_VECENV_OPTIONS = frozenset(inspect.signature(VecEnv.__init__).parameters) - {"self", "env_fns"}


def _mode_of(venv: VecEnv, batched: bool) -> str:
    """The ``vectorization_mode`` of ``gymnasium.make_vec`` that does what ``venv``
    does: its envs batched, stepped one by one in this process, or elsewhere."""
    if batched:
        return "vector_entry_point"
    return "sync" if venv.backend == "inline" else "async"


def _vector_spec(
    spec: EnvSpec,
    num_envs: int,
    env_kwargs: dict[str, Any],
    render_mode: str | None,
    vectorization_mode: str,
    vector_kwargs: dict[str, Any] | None,
    wrappers: Sequence[Any],
) -> EnvSpec:
    """The spec ``gymnasium.make_vec`` gives its vector env: the registry's, with the
    env's keyword arguments and how it was vectorized in ``kwargs``."""
    vector_spec = copy.deepcopy(spec)
    kwargs = {**spec.kwargs, **env_kwargs}
    if vectorization_mode == "vector_entry_point" and spec.max_episode_steps is not None:
        kwargs.setdefault("max_episode_steps", spec.max_episode_steps)  # as make_vec passes it
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    if num_envs != 1:
        kwargs["num_envs"] = num_envs
    kwargs["vectorization_mode"] = vectorization_mode
    if vector_kwargs:
        kwargs["vector_kwargs"] = vector_kwargs
    if wrappers:
        kwargs["wrappers"] = wrappers
    vector_spec.kwargs = kwargs
    return vector_spec


def _make_batched(
    env_id: str | EnvSpec | Callable[..., Any],
    num_envs: int,
    env_kwargs: Any,
    env_extra: dict[str, Any],
    wrappers: Sequence[Callable[[Any], Any]],
    backend: str,
    render_mode: str | None,
    envs_per_block: int | None,
    options: dict[str, Any],
) -> VecEnv:
    """``make`` with ``vectorization_mode="vector_entry_point"``: a VecEnv of blocks."""
    if isinstance(env_id, (str, EnvSpec)):
        spec = registry_spec(env_id)
        if spec.vector_entry_point is None:
            raise ValueError(
                f"{spec.id} has no vector_entry_point in the Gymnasium registry, so it cannot "
                "be made with vectorization_mode='vector_entry_point'; leave "
                "vectorization_mode out (one env per copy), or pass a factory "
                "factory(num_envs=k, **env_kwargs) -> gymnasium.vector.VectorEnv"
            )
        make_block: Callable[..., Any] = gym.make_vec
        args: tuple[Any, ...] = (spec,)
        fixed: dict[str, Any] = {"vectorization_mode": "vector_entry_point"}
    else:
        make_block, args, fixed = env_id, (), {}
    if envs_per_block is not None and (
        isinstance(envs_per_block, bool)
        or not isinstance(envs_per_block, int)
        or envs_per_block < 1
        or num_envs % envs_per_block
    ):
        raise ValueError(
            f"envs_per_block must be a positive int that divides num_envs={num_envs}, "
            f"got {envs_per_block!r}"
        )

    def factories(size: int) -> list[BlockFactory]:
        per_block = _per_env_kwargs(env_kwargs, num_envs // size, env_extra, unit="block")
        for kwargs in per_block:
            _set_render_mode(kwargs, render_mode)
        return [
            BlockFactory(make_block, size, args, {**fixed, **kwargs}, wrappers)
            for kwargs in per_block
        ]

    if backend == "auto":
        isolate = options.get("on_failure") == "restart" or "step_timeout" in options
        limits = ProbeLimits.of(options.get("startup_timeout"), options.get("step_timeout"))
        layout = choose_block_layout(
            lambda size: factories(size)[0], num_envs, isolate, envs_per_block, limits
        )
        envs_per_block = layout.pop("envs_per_block")
        backend = layout.pop("backend")
        for key, value in layout.items():
            options.setdefault(key, value)
    elif envs_per_block is None:
        if backend == "process" and options.get("inline_envs"):
            envs_per_block = options["inline_envs"]  # one block stepped in this process
        elif backend == "process":
            workers = options.get("num_workers") or os.cpu_count() or 1
            blocks = max(d for d in range(1, min(workers, num_envs) + 1) if num_envs % d == 0)
            envs_per_block = num_envs // blocks
        else:
            envs_per_block = num_envs
    return VecEnv(
        factories(envs_per_block), backend=backend, envs_per_block=envs_per_block, **options
    )


def _set_render_mode(kwargs: dict[str, Any], render_mode: str | None) -> None:
    if render_mode is not None and kwargs.setdefault("render_mode", render_mode) != render_mode:
        raise ValueError(
            f"render_mode={render_mode!r} but env_kwargs has "
            f"render_mode={kwargs['render_mode']!r}: give it once"
        )


def _per_env_kwargs(
    env_kwargs: Any, count: int, extra: dict[str, Any], unit: str = "env"
) -> list[dict[str, Any]]:
    """Each env's (or block's) keyword arguments: its ``env_kwargs`` and ``extra``.

    Raises:
        TypeError: ``env_kwargs`` (or an entry, or what its function returned) is not a
            dict; the message says which.
        ValueError: a list of the wrong length, or a keyword given twice.
    """
    if env_kwargs is None or isinstance(env_kwargs, Mapping):
        per_env = [dict(env_kwargs or {}) for _ in range(count)]
    elif callable(env_kwargs):
        per_env = [
            _kwargs_dict(env_kwargs(index), f"env_kwargs({index}) returned", unit)
            for index in range(count)
        ]
    else:
        if isinstance(env_kwargs, (str, bytes)) or not isinstance(env_kwargs, Iterable):
            raise TypeError(
                f"env_kwargs must be a dict (for every {unit}), a list of one dict per "
                f"{unit}, or a function from {unit} index to dict; got "
                f"{type(env_kwargs).__name__}"
            )
        per_env = [
            _kwargs_dict(item, f"env_kwargs[{index}] is", unit)
            for index, item in enumerate(env_kwargs)
        ]
        if len(per_env) != count:
            raise ValueError(
                f"env_kwargs has {len(per_env)} entries for {count} {unit}s: give one dict "
                f"per {unit}, one dict for all, or a function from {unit} index to dict"
            )
    for kwargs in per_env:
        for key in kwargs.keys() & extra.keys():
            raise ValueError(
                f"the env keyword {key!r} is given twice, in env_kwargs and as a keyword "
                "of make(): give it once"
            )
        kwargs.update(extra)
    return per_env


def _kwargs_dict(kwargs: Any, what: str, unit: str) -> dict[str, Any]:
    """``kwargs`` (one env's or block's keyword arguments, ``None`` for none) as a new
    dict; ``what`` starts the message of the ``TypeError`` raised for anything else."""
    if kwargs is None:
        return {}
    if not isinstance(kwargs, Mapping):
        raise TypeError(
            f"{what} {type(kwargs).__name__}, not a dict: each {unit}'s keyword arguments "
            "are a dict (e.g. {'gravity': 9.8})"
        )
    return dict(kwargs)
