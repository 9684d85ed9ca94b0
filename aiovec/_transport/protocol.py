"""Control messages between the vector env and its workers, as typed msgspec structs.

Bulk data (observations, actions, rewards, flags) never travels here: it lives in
shared memory. Messages carry sequence numbers, env ids, infos and errors. Values of
arbitrary Python type (infos, call results, options) are converted by :func:`to_wire`:
msgpack-native values stay native, numpy arrays and scalars become a compact extension,
anything else is pickled, so every value comes back with its exact type.
"""

from __future__ import annotations

import pickle
from typing import Any, Union

import cloudpickle
import msgspec
import numpy as np

from aiovec.errors import EnvError, StepTimeoutError

# --- commands (vector env -> worker) ---------------------------------------------------


class Reset(msgspec.Struct, array_like=True, tag=True):
    seq: int
    env_ids: list[int]
    seeds: list[Any]  # an int or None per env (on the wire, as to_wire writes them)
    options: Any = None  # one dict for all envs, or a list with one per env id
    per_env_options: bool = False

    def subset(self, positions: list[int]) -> Reset:
        """The same reset for the envs at ``positions`` of :attr:`env_ids` only."""
        options = self.options
        if self.per_env_options:
            options = [options[p] for p in positions]
        seeds = [self.seeds[p] for p in positions]
        return Reset(
            self.seq, [self.env_ids[p] for p in positions], seeds, options, self.per_env_options
        )


class Step(msgspec.Struct, array_like=True, tag=True):
    seq: int
    env_ids: list[int]
    actions: Any = None  # only for action spaces that are not in shared memory
    #: First-ready: answer in several replies as envs finish, rather than all at once.
    stream: bool = False

    def subset(self, positions: list[int]) -> Step:
        """The same step for the envs at ``positions`` of :attr:`env_ids` only."""
        return Step(
            self.seq,
            [self.env_ids[p] for p in positions],
            None if self.actions is None else [self.actions[p] for p in positions],
            self.stream,
        )


class Call(msgspec.Struct, array_like=True, tag=True):
    """Call method ``name`` of each env (or read the attribute), or, with ``function``,
    call ``function(env, *args, **kwargs)``."""

    seq: int
    env_ids: list[int]
    name: str
    args: Any = None
    kwargs: Any = None
    function: Any = None

    def subset(self, positions: list[int]) -> Call:
        """The same call for the envs at ``positions`` of :attr:`env_ids` only."""
        env_ids = [self.env_ids[p] for p in positions]
        return Call(self.seq, env_ids, self.name, self.args, self.kwargs, self.function)


class SetAttr(msgspec.Struct, array_like=True, tag=True):
    seq: int
    env_ids: list[int]
    name: str
    values: Any = None

    def subset(self, positions: list[int]) -> SetAttr:
        """The same assignment for the envs at ``positions`` of :attr:`env_ids` only."""
        env_ids = [self.env_ids[p] for p in positions]
        return SetAttr(self.seq, env_ids, self.name, [self.values[p] for p in positions])


class Close(msgspec.Struct, array_like=True, tag=True):
    seq: int


Command = Union[Reset, Step, Call, SetAttr, Close]
#: The commands that address envs (all but ``Close``, which workers handle themselves).
EnvCommand = Union[Reset, Step, Call, SetAttr]

# --- replies (worker -> vector env) ------------------------------------------------------


class ErrorInfo(msgspec.Struct, array_like=True):
    """An exception raised by one env, as the worker saw it."""

    env_id: int
    operation: str
    exc_type: str
    message: str
    traceback: str
    #: Set when the env's command was cancelled for taking longer than this (seconds).
    timeout: Union[float, None] = None
    #: The module of the exception's class, to re-create its type where it is raised.
    exc_module: Union[str, None] = None
    #: Every env this one error stands for (the rows of a batched env); ``None``: ``env_id``.
    env_ids: Union[list[int], None] = None
    #: The attributes the exception's own code set that can travel, each pickled on
    #: its own (see :func:`exception_attributes`); the caller's error gets them back.
    attributes: Union[dict[str, bytes], None] = None

    def to_exception(self) -> EnvError | StepTimeoutError:
        """The exception the user sees for this error: :class:`aiovec.EnvError`, or
        :class:`aiovec.StepTimeoutError` for a cancelled late command."""
        if self.timeout is not None:
            return StepTimeoutError(None, [self.env_id], [self.env_id], self.timeout)
        arguments = (
            self.env_id,
            self.operation,
            self.exc_type,
            self.message,
            self.traceback,
            self.exc_module,
        )
        try:
            error = EnvError.create(*arguments)
        except Exception:  # whatever the env's class does, its error reaches the caller
            error = EnvError(*arguments)
        if self.attributes is not None:
            _restore_attributes(error, self.attributes)
        return error


#: Most bytes one attribute of an env's exception may take in an :class:`ErrorInfo`
#: (a camera frame kept on an error stays behind; the other attributes travel).
MAX_ATTRIBUTE_BYTES = 1 << 20


def exception_attributes(exc: BaseException) -> dict[str, bytes] | None:
    """The attributes ``exc``'s own code set (``retryable``, ``returncode``: its
    ``__dict__``), each pickled on its own (by value where its class lives in a
    script); those that cannot be, or would take more than :data:`MAX_ATTRIBUTE_BYTES`,
    are left out. ``None`` when none is left."""
    kept: dict[str, bytes] = {}
    try:
        items = list(vars(exc).items())
    except Exception:  # an exception class whose __dict__ misbehaves: none travel
        return None
    for name, value in items:
        if not isinstance(name, str) or name.startswith("__"):  # __notes__: in the message
            continue
        try:
            data = cloudpickle.dumps(value)
        except Exception:  # a lock, a handle: left out, the rest travels
            continue
        if len(data) <= MAX_ATTRIBUTE_BYTES:
            kept[name] = data
    return kept or None


def _restore_attributes(error: EnvError, attributes: dict[str, bytes]) -> None:
    """Set on ``error`` each attribute :func:`exception_attributes` pickled that this
    process can unpickle, except those aiovec's error has itself (``env_index``, ...)."""
    own = vars(error)
    for name, data in attributes.items():
        if name in own or hasattr(EnvError, name):
            continue
        try:
            setattr(error, name, pickle.loads(data))
        except Exception:  # a class only the worker has, a read-only property: left out
            continue


class Reply(msgspec.Struct, array_like=True, tag=True):
    """The outcome of one command: per-env infos/values, and errors of envs that raised.

    ``infos`` and ``values`` are aligned with ``env_ids``; ``observations`` is set only
    for observation spaces that are not in shared memory. ``progressed``: an env of the
    reply completed a real step (not an autoreset nor a restart notice); only that ends
    a run of failures (``max_restarts``), so any other reply (a reset, a call, an error)
    leaves it false.
    ``busy`` is the seconds the host spent running envs since its previous reply.
    ``reward_dtype`` (batched envs only) is the numpy dtype of the rewards its batched
    envs returned so far (``"<f4"``), which the agent's results keep.
    """

    seq: int
    env_ids: list[int]
    infos: Any = None
    values: Any = None
    observations: Any = None
    errors: Union[list[ErrorInfo], None] = None
    progressed: bool = False
    busy: float = 0.0
    reward_dtype: Union[str, None] = None


def merge_replies(replies: list[Reply]) -> Reply:
    """One reply holding the env results of several replies to the same command."""
    if len(replies) == 1:
        return replies[0]
    env_ids = [env_id for reply in replies for env_id in reply.env_ids]

    def joined(field: str) -> list[Any] | None:
        if all(getattr(reply, field) is None for reply in replies):
            return None
        return [
            item
            for reply in replies
            for item in (getattr(reply, field) or [None] * len(reply.env_ids))
        ]

    errors = [error for reply in replies for error in reply.errors or ()]
    return Reply(
        seq=replies[0].seq,
        env_ids=env_ids,
        infos=joined("infos"),
        values=joined("values"),
        observations=joined("observations"),
        errors=errors or None,
        progressed=any(reply.progressed for reply in replies),
        busy=sum(reply.busy for reply in replies),
        reward_dtype=next((r.reward_dtype for r in replies if r.reward_dtype), None),
    )


class Hello(msgspec.Struct, array_like=True, tag=True):
    """A worker's first message: its envs were built (``spaces``) or one failed (``error``)."""

    spaces: bytes = b""  # pickled [(observation_space, action_space, metadata, render_mode, spec)]
    error: Union[ErrorInfo, None] = None
    #: The envs are async envs: the worker cancels a late env's command itself.
    async_envs: bool = False


class Threads(msgspec.Struct, array_like=True, tag=True):
    """A worker now serves each env from a thread of its own (a command's envs step at
    once), which reads the steps sent on that env's line, if it has one (see
    :mod:`aiovec._transport.lines`), as well as what the worker's receiving thread hands
    it."""


class LastWords(msgspec.Struct, array_like=True, tag=True):
    """A worker is dying of an exception raised outside any env's call (an env's signal
    handler, a bug): what it was, with the worker's traceback."""

    text: str


#: What a worker sends its agent: a reply, its first message, that it serves by threads,
#: or why it is dying.
WorkerMessage = Union[Reply, Hello, Threads, LastWords]

# --- encoding of arbitrary values -----------------------------------------------------------

_NUMPY_EXT = 1
_PICKLE_EXT = 2
_NATIVE_TYPES = frozenset((str, int, float, bool, type(None), bytes))


def to_wire(value: Any) -> Any:
    """``value`` as msgpack-encodable data that :func:`decode` turns back into an equal
    value; one that holds an object twice (a reference cycle, a list or array held in
    two places) is pickled whole, so that it arrives holding it twice, as pickle keeps it."""
    kind = type(value)
    if kind in _NATIVE_TYPES:
        return _native_to_wire(value, kind)
    try:
        return _walk(value, set())
    except _HeldTwice:
        return msgspec.msgpack.Ext(_PICKLE_EXT, cloudpickle.dumps(value))


class _HeldTwice(Exception):
    """:func:`_walk` met an object it had met before."""


def _walk(value: Any, seen: set[int]) -> Any:
    """:func:`to_wire` of ``value``, raising :class:`_HeldTwice` for an object (a dict,
    list or array, the kinds walked or copied) met twice."""
    kind = type(value)
    if kind in _NATIVE_TYPES:
        return _native_to_wire(value, kind)
    walked = kind is dict or kind is list
    if walked or kind is np.ndarray:
        if id(value) in seen:
            raise _HeldTwice
        seen.add(id(value))
    if kind is dict and all(type(key) is str and is_utf8(key) for key in value):
        return {key: _walk(item, seen) for key, item in value.items()}
    if kind is list:
        return [_walk(item, seen) for item in value]
    if (kind is np.ndarray or isinstance(value, np.generic)) and value.dtype.kind in "biufc":
        # Not np.ascontiguousarray alone: it turns a 0-d array into shape (1,).
        if kind is not np.ndarray:
            array = np.asarray(value)
        else:
            array = value if value.flags.c_contiguous else np.ascontiguousarray(value)
        header = msgspec.msgpack.encode((array.dtype.str, array.shape, kind is not np.ndarray))
        prefix = len(header).to_bytes(2, "little")
        return msgspec.msgpack.Ext(_NUMPY_EXT, prefix + header + array.tobytes())
    return msgspec.msgpack.Ext(_PICKLE_EXT, cloudpickle.dumps(value))


def _native_to_wire(value: Any, kind: type) -> Any:
    if kind is int and not -(2**63) <= value < 2**64:
        return msgspec.msgpack.Ext(_PICKLE_EXT, pickle.dumps(value))
    if kind is str and not is_utf8(value):
        return msgspec.msgpack.Ext(_PICKLE_EXT, pickle.dumps(value))  # lone surrogates
    return value


def is_utf8(text: str) -> bool:
    """Whether msgpack can carry ``text`` as a string (a lone surrogate, e.g. from
    ``os.fsdecode`` of an undecodable file name, cannot be UTF-8 encoded)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _ext_hook(code: int, data: memoryview) -> Any:
    if code == _NUMPY_EXT:
        header_end = 2 + int.from_bytes(data[:2], "little")
        dtype, shape, is_scalar = _numpy_header_decoder.decode(data[2:header_end])
        array = np.frombuffer(data, dtype=np.dtype(dtype), offset=header_end).reshape(shape)
        array = array.copy()  # own the memory: the message buffer is reused
        return array[()] if is_scalar else array
    if code == _PICKLE_EXT:
        try:
            return pickle.loads(data)
        except Exception as exc:  # reported to the caller by the envs, see undecodable_reply
            return Undecodable(f"{type(exc).__name__}: {exc}")
    raise ValueError(f"unknown msgpack extension {code}")


class Undecodable:
    """Stands for a value that could not be unpickled where it arrived."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _find_undecodable(value: Any, seen: set[int] | None = None) -> Undecodable | None:
    """The first :class:`Undecodable` in ``value`` (which may hold reference cycles)."""
    if isinstance(value, Undecodable):
        return value
    if isinstance(value, (list, tuple)):
        items: Any = value
    elif isinstance(value, dict):
        items = value.values()
    else:
        return None
    if seen is None:
        seen = set()
    elif id(value) in seen:
        return None
    seen.add(id(value))
    for item in items:
        found = _find_undecodable(item, seen)
        if found is not None:
            return found
    return None


_OPERATIONS = {Reset: "reset", Step: "step", Call: "call", SetAttr: "set_attr"}


def undecodable_reply(command: Command) -> Reply | None:
    """For a command carrying a value that could not be unpickled here: the reply that
    fails it for each of its envs (the worker goes on); ``None`` for a sound command."""
    if isinstance(command, Step) and command.actions is None:
        return None  # the hot path: nothing pickled
    if isinstance(command, Close):
        return None  # carries no values (what the search below would find too)
    values = [getattr(command, field, None) for field in ("options", "actions", "args")]
    values += [getattr(command, field, None) for field in ("kwargs", "function", "values")]
    found = _find_undecodable(values)
    if found is None:
        return None
    operation = _OPERATIONS.get(type(command), "command")
    fix = "send values whose classes the env's process can import"
    culprits: dict[int, Undecodable] = {}  # env id -> what its own value held
    for env_id, value in zip(command.env_ids, _values_by_env(command) or ()):
        bad = _find_undecodable(value)
        if bad is not None:
            culprits[env_id] = bad
    if not culprits:  # a value every env shares (a call's arguments): each env fails
        text = (
            f"an argument of {operation}() could not be unpickled in the env's process "
            f"({found.reason}); {fix}"
        )
        errors = [
            ErrorInfo(env_id, operation, "TypeError", text, "", exc_module="builtins")
            for env_id in command.env_ids
        ]
        return Reply(command.seq, command.env_ids, errors=errors)
    # Each env whose own value failed has its error; the first of them also stands for
    # the command's other envs here, which were not run (so that error is the one raised).
    first = next(iter(culprits))
    bystanders = [env_id for env_id in command.env_ids if env_id not in culprits]
    errors = []
    for env_id, bad in culprits.items():
        text = f"env {env_id}'s value for {operation}() could not be unpickled in its process"
        standing_for = None
        if env_id == first and bystanders:
            text += f"; so {operation}() was not run on envs {bystanders} of that process either"
            standing_for = [env_id, *bystanders]
        errors.append(
            ErrorInfo(
                env_id,
                operation,
                "TypeError",
                f"{text} ({bad.reason}); {fix}",
                "",
                exc_module="builtins",
                env_ids=standing_for,
            )
        )
    return Reply(command.seq, command.env_ids, errors=errors)


def _values_by_env(command: Command) -> list[Any] | None:
    """The values of ``command`` that are each env's own, by position (``None``: its
    values are shared by its envs)."""
    values: Any = None
    if isinstance(command, SetAttr):
        values = command.values
    elif isinstance(command, Step):
        values = command.actions
    elif isinstance(command, Reset) and command.per_env_options:
        values = command.options
    return values if isinstance(values, list) else None


def wire_command(command: Command) -> Command:
    """A copy of ``command`` with its arbitrary values converted by :func:`to_wire`, ready
    to encode (the original may be sent again later, to a restarted worker)."""
    if isinstance(command, Reset):  # seeds too: a seed may be beyond msgpack's 64 bits
        return msgspec.structs.replace(
            command, seeds=to_wire(command.seeds), options=to_wire(command.options)
        )
    if isinstance(command, Step) and command.actions is not None:
        return msgspec.structs.replace(command, actions=to_wire(command.actions))
    if isinstance(command, Call):
        return msgspec.structs.replace(
            command,
            args=to_wire(command.args),
            kwargs=to_wire(command.kwargs),
            function=to_wire(command.function),
        )
    if isinstance(command, SetAttr):
        return msgspec.structs.replace(command, values=to_wire(command.values))
    return command


def wire_reply(reply: Reply) -> Reply:
    """``reply`` with its arbitrary values converted by :func:`to_wire` (in place)."""
    if reply.infos is not None:
        reply.infos = [to_wire(info) for info in reply.infos]
    if reply.values is not None:
        reply.values = [to_wire(value) for value in reply.values]
    if reply.observations is not None:
        reply.observations = [to_wire(obs) for obs in reply.observations]
    return reply


# A Step or Reply whose ``env_ids`` is empty on the wire stands for the worker's whole
# group, in order: a lockstep step of thousands of envs (batched envs) then carries no
# env ids at all. An empty selection is never sent otherwise.


def compact_step(command: Step, group: list[int]) -> Step:
    """``command`` as it travels to the worker hosting ``group``."""
    if command.env_ids is group:
        return Step(command.seq, [], command.actions, command.stream)
    return command


def expand_command(command: Command, group: list[int]) -> Command:
    """A command as decoded by the worker hosting ``group``, with its env ids restored."""
    if type(command) is Step and not command.env_ids:
        command.env_ids = group
    return command


def encode_reply(reply: Reply, group: list[int] | None = None) -> bytes:
    """``reply`` as one frame for :func:`decode_message`; a reply for all of ``group``
    (the very list) travels without its env ids.

    A value that cannot be pickled (an info, a call's result) fails only the env it
    came from, with a ``TypeError`` naming it, rather than the worker or the reply's
    other envs; if the reply cannot travel for another reason, each of its envs fails."""
    parts = reply.infos, reply.values, reply.observations  # before wire_reply converts them
    try:
        return _encode_wire(wire_reply(reply), group)
    except Exception as exc:
        reply.infos, reply.values, reply.observations = parts
        return _encode_blaming(reply, group, exc)


def _encode_blaming(reply: Reply, group: list[int] | None, exc: Exception) -> bytes:
    """``reply`` (which failed to encode with ``exc``) encoded with each env whose own
    values cannot travel failed instead; every env failed if that is not enough."""
    failed = _send_back_errors(reply)
    if failed is not None:
        reply.errors = [*(reply.errors or ()), *failed]
        try:
            return _encode_wire(wire_reply(reply), group)
        except Exception as still:
            exc = still
    errors = [_send_back_error(env_id, exc) for env_id in reply.env_ids]
    return encode(Reply(reply.seq, reply.env_ids, errors=errors, busy=reply.busy))


def _encode_wire(wire: Reply, group: list[int] | None) -> bytes:
    if group is not None and wire.env_ids is group:
        wire = msgspec.structs.replace(wire, env_ids=[])
    return encode(wire)


def _send_back_errors(reply: Reply) -> list[ErrorInfo] | None:
    """The errors of the envs of ``reply`` whose own values (info, call result,
    observation) cannot travel, those values dropped from ``reply``; ``None`` when
    every env's values can."""
    failed: list[ErrorInfo] = []
    fields = [name for name in ("infos", "values", "observations") if getattr(reply, name)]
    for name in fields:  # changed below: the reply's own lists, not the caller's
        setattr(reply, name, list(getattr(reply, name)))
    for position, env_id in enumerate(reply.env_ids):
        for name in fields:
            values = getattr(reply, name)
            try:
                encode(to_wire(values[position]))
            except Exception as exc:
                part = _unsendable_part(values[position], _PART_NAMES[name])
                failed.append(_send_back_error(env_id, exc, part))
                for other in fields:  # nothing of this env's travels but its error
                    getattr(reply, other)[position] = None
                break
    return failed or None


#: How an error names each of a reply's per-env values.
_PART_NAMES = {"infos": "info", "values": "call result", "observations": "observation"}


def _unsendable_part(value: Any, path: str, depth: int = 0) -> str:
    """The path (``info['stats'][1]``) of the innermost part of ``value`` that cannot
    be encoded, following dicts, lists and tuples; ``path`` itself when no single item
    is to blame. Runs only once a value has failed: its cost never touches a reply."""
    if depth < 16 and isinstance(value, (dict, list, tuple)):
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            try:
                encode(to_wire(item))
            except Exception:
                return _unsendable_part(item, f"{path}[{key!r}]", depth + 1)
    return path


def _send_back_error(env_id: int, exc: Exception, part: str | None = None) -> ErrorInfo:
    where = f" ({part})" if part else ""
    message = (
        f"what the env returned could not be sent back{where}: {type(exc).__name__}: {exc}; "
        "return picklable values (infos, call results, observations)"
    )
    return ErrorInfo(env_id, "send back", "TypeError", message, "", exc_module="builtins")


def decoder(kind: Any) -> msgspec.msgpack.Decoder[Any]:
    """A decoder of ``kind`` that turns :func:`to_wire` values back into the originals."""
    return msgspec.msgpack.Decoder(kind, ext_hook=_ext_hook)


_numpy_header_decoder = msgspec.msgpack.Decoder(tuple[str, list[int], bool])
_encoder = msgspec.msgpack.Encoder()
_command_decoder: msgspec.msgpack.Decoder[Command] = decoder(Command)
_message_decoder = decoder(WorkerMessage)

encode = _encoder.encode
decode_command = _command_decoder.decode
decode_message = _message_decoder.decode
