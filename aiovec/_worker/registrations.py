"""The agent's Gymnasium registrations, for processes that do not share its memory.

A worker forked by aiovec's zygote, one started by multiprocessing's ``spawn`` or
``forkserver``, and a Ray actor each begin as a fresh interpreter: an id the agent
registered (in a script, a notebook, or a module the worker never imports) is unknown
there, and an entry point naming an object of the agent's ``__main__``
(``"__main__:Env"``) cannot be loaded there, since a worker never imports the agent's
main module. ``gymnasium.make_vec`` hands its workers the registry's spec rather than the
id; aiovec does the same, and also installs the agent's registrations in its workers, so
that a factory calling ``gymnasium.make("MyEnv-v0")`` builds there too.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterable, Mapping
from typing import Any

import cloudpickle
import gymnasium
from gymnasium.envs.registration import EnvSpec

_MAIN = "__main__:"


def portable(spec: EnvSpec) -> EnvSpec:
    """``spec`` as another process can build it: each entry point that names an object
    of this process's ``__main__`` is replaced by that object (which then travels by
    value); ``spec`` itself when there is none."""
    changes: dict[str, Any] = {}
    main = sys.modules.get("__main__")
    for field in ("entry_point", "vector_entry_point"):
        entry_point = getattr(spec, field)
        if isinstance(entry_point, str) and entry_point.startswith(_MAIN):
            target = getattr(main, entry_point[len(_MAIN) :], None)
            if target is not None:
                changes[field] = target
    return dataclasses.replace(spec, **changes) if changes else spec


def shown(argument: Any) -> str:
    """How a factory's repr shows one of its arguments: a spec by its id."""
    return repr(argument.id if isinstance(argument, EnvSpec) else argument)


def agent_specs(known: Mapping[str, Any] | None = None) -> list[bytes]:
    """This process's registrations that ``known`` (another process's registry) lacks
    or holds otherwise (every one when ``known`` is ``None``), :func:`portable` and
    pickled one by one. A spec that cannot be pickled is left out: building its id
    elsewhere then says that the id is unknown."""
    pickled = []
    for env_id, spec in gymnasium.registry.items():
        spec = portable(spec)
        if known is not None and known.get(env_id) == spec:
            continue
        try:
            pickled.append(cloudpickle.dumps(spec))
        except Exception:  # an entry point that cannot travel
            continue
    return pickled


def install(pickled: Iterable[bytes]) -> None:
    """Register specs from :func:`agent_specs` in this process, each unless it is
    registered the same way already. One that cannot be unpickled here (its module is
    not installed on this machine) is skipped: building its id says what is missing."""
    registry = gymnasium.registry
    for blob in pickled:
        try:
            spec = cloudpickle.loads(blob)
        except Exception:
            continue
        if registry.get(spec.id) != spec:
            registry[spec.id] = spec
