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


#: Bytes that the envs' own copies of a worker's factories may add up to (one pickle
#: per env): beyond, what the factories capture is large data (a dataset, a map) and is
#: unpickled once and shared by the worker's envs, as a fork shares it copy-on-write,
#: rather than copied per env.
OWN_COPIES_UP_TO = 64 * 2**20


def loads_each(data: bytes) -> dict[int, Callable[[], Any]]:
    """The factories pickled together by :func:`dumps` (a dict keyed by env id; what
    several capture travels once), each env's its own copy, so that no two envs share
    what their factories captured, as no two envs of ``AsyncVectorEnv`` do (each
    unpickles its own): each distinct factory is pickled again here, once, and unpickled
    once per env. A restart rebuilds an env from its own copy (unpickling again would
    reset the class attributes of classes sent by value, which the other envs share).
    Within :data:`OWN_COPIES_UP_TO` bytes of copies; beyond, the factories as unpickled
    (shared). A factory that cannot be pickled again is shared too.

    Raises what unpickling raises, at once (a worker's start-up error)."""
    factories: dict[int, Callable[[], Any]] = loads(data)
    pickled: dict[int, bytes | None] = {}  # id(factory) -> its bytes: pickled once
    copies = 0  # bytes the envs' copies add up to
    for factory in factories.values():
        if id(factory) not in pickled:
            try:
                pickled[id(factory)] = dumps(factory)
            except Exception:  # (it arrived pickled: never seen) shared, rather than lost
                pickled[id(factory)] = None
        copies += len(pickled[id(factory)] or b"")
        if copies > OWN_COPIES_UP_TO:  # large data: shared, not copied per env
            return factories
    owned: dict[int, Callable[[], Any]] = {}
    for key, factory in factories.items():
        blob = pickled[id(factory)]
        owned[key] = factory if blob is None else loads(blob)
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
