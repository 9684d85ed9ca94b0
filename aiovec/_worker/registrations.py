"""The agent's Gymnasium registrations, for processes that do not share its memory.

A worker forked by aiovec's zygote, one started by multiprocessing's ``spawn`` or
``forkserver``, and a Ray actor each begin as a fresh interpreter: an id the agent
registered (in a script, a notebook, or a module the worker never imports) is unknown
there, and an entry point naming an object of the agent's ``__main__``
(``"__main__:MyEnv"``, an env, a vector env or a wrapper) names nothing there, since a
worker never imports the agent's main module. ``gymnasium.make_vec`` hands its workers
the registry's spec rather than the id, and so does ``aiovec.make``; the zygote's workers
and Ray's actors also get the agent's registrations, with the objects of its ``__main__``
that they name, so that a factory calling ``gymnasium.make("MyEnv-v0")`` builds there
too. Specs travel unchanged: an env's ``spec`` is the registry's, in a worker as here.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from functools import partial
from typing import Any, NamedTuple

import gymnasium
from gymnasium.envs.registration import EnvSpec

from aiovec._transport import by_value

_MAIN = "__main__:"


class _MainObject(NamedTuple):
    """An object of the agent's ``__main__`` that a registration names."""

    name: str
    value: Any


class _Unsendable(NamedTuple):
    """A registration of the agent's that could not be pickled, and why."""

    env_id: str
    reason: str


def _refuse(env_id: str, reason: str, **kwargs: Any) -> Any:
    """The entry point an unsendable registration gets in a worker: building it says why."""
    raise TypeError(
        f"{env_id} is registered in the agent's process, but its registration cannot be "
        f"sent to this worker ({reason}): give it picklable kwargs and entry points, or "
        "use backend='inline' to build its envs in the agent's process"
    )


def shown(argument: Any) -> str:
    """How a factory's repr shows one of its arguments: a spec by its id."""
    return repr(argument.id if isinstance(argument, EnvSpec) else argument)


def agent_registrations(known: Mapping[str, Any] | None = None) -> list[bytes]:
    """What another process needs to build this process's registered ids, each item
    pickled on its own: the specs that ``known`` (that process's registry) lacks or
    holds otherwise (every spec when ``known`` is ``None``), and the objects of this
    process's ``__main__`` that any spec names. A spec that cannot be pickled is sent
    as a stand-in that raises why when built; an object of ``__main__`` that cannot be
    is left out (building what names it there then says it is missing)."""
    pickled = []
    names: set[str] = set()
    for env_id, spec in gymnasium.registry.items():
        names.update(_main_names(spec))
        if known is not None and known.get(env_id) == spec:
            continue
        try:
            pickled.append(by_value.dumps(spec))
        except Exception as exc:  # an entry point or a keyword that cannot travel
            reason = f"{type(exc).__name__}: {exc}"
            pickled.append(by_value.dumps(_Unsendable(env_id, reason)))
    main = sys.modules.get("__main__")
    for name in sorted(names):
        if hasattr(main, name):
            try:  # defined in __main__: pickled by value
                pickled.append(by_value.dumps(_MainObject(name, getattr(main, name))))
            except Exception:
                continue
    return pickled


def install(pickled: Iterable[bytes]) -> None:
    """Install what :func:`agent_registrations` gave in this process: each spec unless
    registered the same way already, each object of the agent's ``__main__`` in this
    process's ``__main__``. An item that cannot be unpickled here (its module is not
    installed on this machine) is skipped: building what needs it says what is missing."""
    registry = gymnasium.registry
    main = sys.modules["__main__"]
    for blob in pickled:
        try:
            item = by_value.loads(blob)
        except Exception:
            continue
        if isinstance(item, _MainObject):
            setattr(main, item.name, item.value)
        elif isinstance(item, _Unsendable):  # not the id unknown, nor an older spec of it
            registry[item.env_id] = EnvSpec(item.env_id, partial(_refuse, item.env_id, item.reason))
        elif registry.get(item.id) != item:
            registry[item.id] = item


def _main_names(spec: EnvSpec) -> Iterable[str]:
    """The names of ``__main__`` objects that ``spec`` refers to by entry point."""
    entry_points = [spec.entry_point, spec.vector_entry_point]
    entry_points += [wrapper.entry_point for wrapper in spec.additional_wrappers]
    for entry_point in entry_points:
        if isinstance(entry_point, str) and entry_point.startswith(_MAIN):
            yield entry_point[len(_MAIN) :]
