"""Code sent to another process by value (env factories, classes of the agent's
``__main__`` or of a notebook cell), with where it came from.

cloudpickle gives every function it pickles by value the file name ``<dynamic-code>``:
in a worker, a traceback through such code showed no file and no line, and
``inspect.getsource`` (which TorchScript needs) failed, although ``AsyncVectorEnv``'s
workers have both. Here each code object keeps its file name, and the lines of files
that only this process's ``linecache`` holds (notebook cells) travel along and are
added to the other process's ``linecache``.

Guarantees: :func:`loads` of :func:`dumps` gives what ``cloudpickle.loads`` of
``cloudpickle.dumps`` gives, except that code keeps its ``co_filename``; a file the
other process can read itself (a script) is not sent.
"""

from __future__ import annotations

import copy
import io
import linecache
import pickle
import types
from collections.abc import Callable
from typing import Any

import cloudpickle

_RENAMED = "<dynamic-code>"  # what cloudpickle names the file of code it pickles


def _code_from(code: types.CodeType, filename: str) -> types.CodeType:
    """``code`` as it was in the agent, file name included (in the receiving process)."""
    return code.replace(co_filename=filename)


class _SourcePickler(cloudpickle.Pickler):  # type: ignore[misc]  # cloudpickle is untyped
    """cloudpickle's pickler, keeping each code object's file name (and noting it)."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.filenames: set[str] = set()

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is types.CodeType and obj.co_filename != _RENAMED:
            self.filenames.add(obj.co_filename)
            # cloudpickle pickles the renamed copy; the name is put back on arrival
            return _code_from, (obj.replace(co_filename=_RENAMED), obj.co_filename)
        return super().reducer_override(obj)


def dumps(value: Any) -> bytes:
    """``value`` pickled as cloudpickle does, with its code's file names, followed (in
    the same bytes: no second copy of a large payload) by the lines of those files that
    exist only in this process's ``linecache``."""
    buffer = io.BytesIO()
    pickler = _SourcePickler(buffer)
    pickler.dump(value)
    lines = {}
    for filename in pickler.filenames:
        entry = linecache.cache.get(filename)
        # (size, mtime, lines, name); no mtime: no file behind it (a notebook cell)
        if entry is not None and len(entry) == 4 and entry[1] is None:
            lines[filename] = entry
    pickle.dump(lines, buffer, protocol=pickle.HIGHEST_PROTOCOL)
    return buffer.getvalue()


def loads(data: bytes) -> Any:
    """What :func:`dumps` pickled; the source lines it carried join ``linecache``
    (where this process has none of its own under that name)."""
    stream = io.BytesIO(data)
    value = cloudpickle.load(stream)
    for filename, entry in pickle.load(stream).items():
        linecache.cache.setdefault(filename, entry)
    return value


class OwnCopies:
    """An env factory sent by value whose every env owns what the factory captured: each
    call unpickles the factory anew (a restart's rebuild too), as every env of
    ``AsyncVectorEnv`` unpickles its own in its own process. Without it, the envs of one
    worker would share a captured array (or ``make``'s keyword arguments), and an env
    changing it in place would change the others.

    The first copy is unpickled when this is made, so that a factory that cannot be
    unpickled fails there (a worker's start), not in its first call."""

    __slots__ = ("_pickled", "_unused")

    def __init__(self, pickled: bytes) -> None:
        self._pickled = pickled
        self._unused: Any = loads(pickled)

    def __call__(self) -> Any:
        factory, self._unused = self._unused, None
        if factory is None:
            factory = loads(self._pickled)
        return factory()

    def __repr__(self) -> str:
        return f"OwnCopies({loads(self._pickled)!r})"


def dumps_each(values: dict[int, Any]) -> bytes:
    """``values`` for :func:`loads_each`: each pickled on its own (by :func:`dumps`), so
    no object is shared between two of them on arrival. One object given for several
    keys (``[env_fn] * 16``) is pickled and sent once: each key still unpickles its own."""
    pickled: dict[int, bytes] = {}  # id(value) -> its bytes
    return pickle.dumps(
        {
            key: pickled.get(id(value)) or pickled.setdefault(id(value), dumps(value))
            for key, value in values.items()
        }
    )


def loads_each(data: bytes) -> dict[int, Callable[[], Any]]:
    """The factories of :func:`dumps_each`, each an :class:`OwnCopies`."""
    return {key: OwnCopies(pickled) for key, pickled in pickle.loads(data).items()}


def own_copies(factories: dict[int, Any]) -> dict[int, Any]:
    """``factories`` (inherited by a fork, not pickled), each as an :class:`OwnCopies`
    where it can be pickled; one that cannot (it captured a lock, say) stays as it is,
    its envs sharing what it captured."""
    owned: dict[int, Any] = {}
    for key, factory in factories.items():
        try:
            owned[key] = OwnCopies(dumps(factory))
        except Exception:
            owned[key] = factory
    return owned


#: Types whose values nobody can change: never copied (see :func:`own_copy`).
_IMMUTABLE = frozenset({type(None), bool, int, float, complex, str, bytes})


def own_copy(value: Any) -> Any:
    """A copy of ``value`` that nobody else holds (values that cannot change, as they
    are): what each env of ``AsyncVectorEnv`` gets by unpickling its own. A value
    ``copy.deepcopy`` refuses is kept as it is."""
    kind = type(value)
    if kind in _IMMUTABLE or (kind is tuple and all(type(item) in _IMMUTABLE for item in value)):
        return value
    try:
        return copy.deepcopy(value)
    except Exception:
        return value
