"""Backends by name: :func:`build_backend` looks a name up in :data:`REGISTRY` and builds
that backend from what every backend takes (:class:`Hosting`) and its own options (one
frozen dataclass per backend). A backend module is imported only when it is chosen, so
Ray, for one, is never imported unless asked for.

The vector env keeps its keyword arguments (``num_workers=``, ``context=``,
``ray_options=``, ...); :func:`backend_options` sorts them into the chosen backend's
options, so each backend's settings are typed and named in one place.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gymnasium.vector import AutoresetMode

from aiovec.backends._base import Backend


@dataclass(frozen=True)
class Hosting:
    """What every backend is built from."""

    #: One factory per env, or with ``envs_per_block``, one per batched env.
    env_fns: Sequence[Callable[[], Any]]
    autoreset_mode: AutoresetMode
    #: Failures in a row an env (or worker) may have before it is reported (0: no restarts).
    max_restarts: int = 0
    #: Rows per batched env; ``None``: single envs.
    envs_per_block: int | None = None
    #: Seconds an env may take to answer a command (the backends that enforce it).
    step_timeout: float | None = None
    #: Envs in this process are as isolated as in workers (see
    #: :class:`~aiovec.backends._base.LocalBackend`): ``backend="auto"`` chose where they
    #: run, so they behave as ``AsyncVectorEnv``'s wherever that is.
    isolated: bool = False


@dataclass(frozen=True)
class InlineOptions:
    """The inline backend has no options of its own."""


@dataclass(frozen=True)
class CoroutineOptions:
    """The coroutine backend has no options of its own."""


@dataclass(frozen=True)
class ProcessOptions:
    """Worker processes; see :class:`aiovec.VecEnv` for each option."""

    num_workers: int | None = None
    context: str | None = None
    spin: float | None = None
    inline_envs: int = 0
    concurrent_envs: bool | None = None
    startup_timeout: float | None = 300.0
    daemon: bool = True


@dataclass(frozen=True)
class RayOptions:
    """Ray actors; ``ray_options`` as documented on :class:`aiovec.VecEnv`."""

    num_workers: int | None = None
    ray_options: dict[str, Any] = field(default_factory=dict)
    startup_timeout: float | None = 300.0


Options = InlineOptions | CoroutineOptions | ProcessOptions | RayOptions


def _inline(hosting: Hosting, options: InlineOptions) -> Backend:
    from aiovec.backends.inline import InlineBackend

    return InlineBackend(
        hosting.env_fns,
        hosting.autoreset_mode,
        hosting.max_restarts,
        hosting.envs_per_block,
        isolated=hosting.isolated,
    )


def _coroutine(hosting: Hosting, options: CoroutineOptions) -> Backend:
    from aiovec.backends.coroutine import CoroutineBackend

    return CoroutineBackend(
        hosting.env_fns,
        hosting.autoreset_mode,
        hosting.max_restarts,
        step_timeout=hosting.step_timeout,
        envs_per_block=hosting.envs_per_block,
        isolated=hosting.isolated,
    )


def _process(hosting: Hosting, options: ProcessOptions) -> Backend:
    from aiovec.backends.process import ProcessBackend

    return ProcessBackend(
        hosting.env_fns,
        hosting.autoreset_mode,
        num_workers=options.num_workers,
        context=options.context,
        spin=options.spin,
        inline_envs=options.inline_envs,
        max_restarts=hosting.max_restarts,
        step_timeout=hosting.step_timeout,
        concurrent_envs=options.concurrent_envs,
        startup_timeout=options.startup_timeout,
        envs_per_block=hosting.envs_per_block,
        daemon=options.daemon,
    )


def _ray(hosting: Hosting, options: RayOptions) -> Backend:
    from aiovec.backends.ray import RayBackend

    return RayBackend(
        hosting.env_fns,
        hosting.autoreset_mode,
        options.num_workers,
        hosting.max_restarts,
        dict(options.ray_options),
        hosting.step_timeout,
        envs_per_block=hosting.envs_per_block,
        startup_timeout=options.startup_timeout,
    )


@dataclass(frozen=True)
class BackendEntry:
    """A registered backend: its options class and how to build it."""

    options: type[Any]
    build: Callable[[Hosting, Any], Backend]


#: Every backend by name (``backend="auto"`` picks one of these).
REGISTRY: dict[str, BackendEntry] = {
    "process": BackendEntry(ProcessOptions, _process),
    "inline": BackendEntry(InlineOptions, _inline),
    "coroutine": BackendEntry(CoroutineOptions, _coroutine),
    "ray": BackendEntry(RayOptions, _ray),
}


def backend_options(name: str, **settings: Any) -> Options:
    """The options of backend ``name`` taken from ``settings`` (the vector env's keyword
    arguments); settings the backend does not have are ignored."""
    options_class = REGISTRY[name].options
    fields = _fields(REGISTRY[name])
    chosen = {key: value for key, value in settings.items() if key in fields}
    if "ray_options" in chosen and chosen["ray_options"] is None:
        chosen["ray_options"] = {}
    options: Options = options_class(**chosen)
    return options


#: aiovec's own per-backend keyword arguments of the vector env, and their defaults.
#: (Gymnasium's ``context`` and ``daemon`` are left out: code written for
#: AsyncVectorEnv passes them whatever the backend.)
_OWN_OPTIONS = {
    "num_workers": None,
    "inline_envs": 0,
    "concurrent_envs": None,
    "spin": None,
    "ray_options": None,
}


def _fields(entry: BackendEntry) -> dict[str, Any]:
    return entry.options.__dataclass_fields__  # type: ignore[no-any-return]


def refuse_options_not_taken(name: str, **given: Any) -> None:
    """Raise ``ValueError`` if any of aiovec's own per-backend options in ``given`` is
    set (not its default) although backend ``name`` (one the user named) has no use for
    it: an option that would be ignored is more likely a mistake than a wish."""
    fields = _fields(REGISTRY[name])
    for option, default in _OWN_OPTIONS.items():
        value = given.get(option, default)
        if option in fields or value is None or value == default or value == {}:
            continue
        takers = [other for other, entry in REGISTRY.items() if option in _fields(entry)]
        hint = " or ".join(repr(other) for other in takers)
        if name == "ray" and option == "concurrent_envs":
            hint = "'process' (for Ray actors: ray_options={'concurrent_envs': ...})"
        raise ValueError(
            f"{option}={value!r} does nothing with backend={name!r}: it is an option of "
            f"backend={hint}; leave it out, or choose that backend"
        )


def build_backend(name: str, hosting: Hosting, options: Options) -> Backend:
    """Build backend ``name``; raises ValueError for a name that is not registered."""
    entry = REGISTRY.get(name)
    if entry is None:
        raise ValueError(f"backend must be one of {(*REGISTRY, 'auto')}, got {name!r}")
    if not isinstance(options, entry.options):
        raise TypeError(f"backend {name!r} takes {entry.options.__name__}, got {options!r}")
    return entry.build(hosting, options)
