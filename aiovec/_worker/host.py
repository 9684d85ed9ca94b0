"""Runs commands on a group of envs: the one place where envs are reset, stepped and called.

Both the in-process backend and the subprocess worker drive an :class:`EnvHost`, so
autoreset semantics and error capture are written once and are identical everywhere.
An exception raised by one env is captured per env; the other envs of the command run
normally.
"""

from __future__ import annotations

import asyncio
import builtins
import inspect
import os
import reprlib
import threading
import traceback
from collections.abc import Awaitable, Callable, Generator, Mapping
from functools import partial
from operator import methodcaller
from time import perf_counter
from typing import Any, NamedTuple, cast

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from aiovec._transport.buffers import Buffers
from aiovec._transport.by_value import own_copy
from aiovec._transport.protocol import (
    Call,
    EnvCommand,
    ErrorInfo,
    Reply,
    Reset,
    SetAttr,
    Step,
    exception_attributes,
    is_utf8,
)
from aiovec._transport.spaces import is_shareable, read_row, row_writer
from aiovec._worker.threads import EnvThreads
from aiovec.async_env import AsyncEnv
from aiovec.errors import StepTimeoutError

_catch_env_exits = False

#: BaseExceptions that are never an env's failure, even in a worker: the cancellation of
#: the task that awaits the env (asyncio's timeouts and close) and the close of a
#: generator or coroutine (aiovec's own flows), which must run their course.
_NEVER_ENV_ERRORS = (asyncio.CancelledError, GeneratorExit)


def env_errors() -> tuple[type[BaseException], ...]:
    """What an env's call may raise that is that env's failure (reported, or the env
    rebuilt) rather than the end of whatever runs it: any ``Exception`` and, in a worker
    process, any other ``BaseException`` too (``KeyboardInterrupt``, ``SystemExit``, a
    library's own abort class) except those of ``_NEVER_ENV_ERRORS`` (see
    :func:`catch_env_exits`). A ``GeneratorExit`` the env raised itself is its failure
    too, but only where aiovec can tell it from the close of its own coroutine or
    generator: see :func:`call_errors` and :func:`as_env_error`.

    Evaluated where an ``except`` clause meets an exception (only then), so that the
    classes a program defines later are included."""
    if not _catch_env_exits:
        return (Exception,)
    # The direct subclasses of BaseException but those excluded: a class deriving from
    # one of them is matched through it.
    return tuple(
        cls for cls in BaseException.__subclasses__() if not issubclass(cls, _NEVER_ENV_ERRORS)
    )


def call_errors() -> tuple[type[BaseException], ...]:
    """What a synchronous call into an env (or its factory) may raise that is its
    failure: :func:`env_errors`, and a ``GeneratorExit`` too, since no coroutine or
    generator of aiovec's is being closed during such a call. Pass what is caught
    through :func:`as_env_error` before a flow or a coroutine of aiovec's handles it."""
    return (*env_errors(), GeneratorExit)


class EnvGeneratorExit(Exception):
    """A ``GeneratorExit`` an env's own code raised (not one closing a coroutine or
    generator of aiovec's), carried as an ordinary error so that every path for env
    errors handles it: reported (as the ``GeneratorExit`` it is, see ``_as_raised``),
    or the env rebuilt. Raised as itself, it would end aiovec's coroutine or generator
    that met it, leaving the env's command unanswered."""


def as_env_error(exc: BaseException) -> BaseException:
    """``exc``, an env's failure, as one that aiovec's flows and coroutines handle."""
    if type(exc) is GeneratorExit:
        wrapped = EnvGeneratorExit(str(exc))
        wrapped.__cause__ = exc
        return wrapped
    return exc


def catch_env_exits() -> None:
    """From now on, any ``BaseException`` raised by an env (but a cancellation) is that
    env's error (a ``GeneratorExit`` as :func:`env_errors` says). Only for a worker
    process: it ignores
    SIGINT, so there a ``KeyboardInterrupt`` or ``SystemExit`` can only come from an
    env's own code (``sys.exit()`` in a simulator's error handler), and its other envs
    must live on. In the agent's process a KeyboardInterrupt is the user's Ctrl-C, which
    must reach them."""
    global _catch_env_exits
    _catch_env_exits = True


def error_info(
    env_id: int, operation: str, exc: BaseException, keep_frames: bool = False
) -> ErrorInfo:
    """Capture ``exc`` (raised by env ``env_id``) with its formatted traceback.

    Unless ``keep_frames`` (for an error raised on, ``from exc``), ``exc`` and the
    exceptions chained to it let go of their tracebacks once captured: the frames there
    often refer back to the exception (the handler's, a restart flow's), and that cycle
    would keep every object those frames hold, a vector env and its shared memory
    among them, until the garbage collector runs."""
    original = exc
    exc = _as_raised(exc)
    module = type(exc).__module__
    info = ErrorInfo(
        env_id=env_id,
        operation=operation,
        exc_type=str(type(exc).__qualname__),
        message=_sendable(_describe(exc, str)),
        traceback=_sendable(_describe(exc, lambda e: "".join(traceback.format_exception(e)))),
        timeout=exc.timeout if isinstance(exc, StepTimeoutError) else None,
        exc_module=module if isinstance(module, str) else None,
        attributes=exception_attributes(exc),
    )
    if not keep_frames:
        _drop_tracebacks(original)
    return info


#: ``BaseExceptionGroup`` where Python has it (3.11+).
_exception_groups: Any = getattr(builtins, "BaseExceptionGroup", None)


def _drop_tracebacks(exc: BaseException) -> None:
    """Drop the tracebacks of ``exc`` and of every exception chained to it."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        try:  # an env's exception class may refuse attribute writes: then keep them
            current.__traceback__ = None
        except Exception:
            pass
        pending += [current.__cause__, current.__context__]
        if _exception_groups and isinstance(current, _exception_groups):
            pending += current.exceptions


def _describe(exc: BaseException, text: Callable[[BaseException], str]) -> str:
    """``text(exc)``, or what can be said of ``exc`` when its own ``__str__`` fails (an
    env's error must be reported whatever its class does)."""
    try:
        described = text(exc)
        if isinstance(described, str):
            return described
        failure = f"__str__ returned {type(described).__name__}"
    except Exception as inner:
        failure = f"{type(inner).__name__} in its __str__"
    return f"<{type(exc).__qualname__} that cannot be printed: {failure}>"


_AIOVEC_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _as_raised(exc: BaseException) -> BaseException:
    """The exception the env raised: a ``StopIteration`` crossing one of aiovec's
    generators or coroutines comes out of it as the ``RuntimeError`` Python makes of it
    (PEP 479), its cause the env's exception. Only where aiovec's own frame turned it
    into one: an env's generator doing so is the env's own ``RuntimeError``."""
    cause, tb = exc.__cause__, exc.__traceback__
    if type(exc) is EnvGeneratorExit and cause is not None:
        return cause
    if type(exc) is not RuntimeError or not isinstance(cause, StopIteration) or tb is None:
        return exc
    while tb.tb_next is not None:  # the frame that turned it into a RuntimeError
        tb = tb.tb_next
    return cause if tb.tb_frame.f_code.co_filename.startswith(_AIOVEC_DIR) else exc


def failure_reason(exc: BaseException) -> str:
    """``"Type: message"`` of the exception an env raised (a restart's reason)."""
    shown = _as_raised(exc)
    return f"{type(shown).__qualname__}: {shown}"


def _sendable(text: str) -> str:
    """``text`` as UTF-8 can carry it: a lone surrogate (a path decoded with
    ``os.fsdecode``) becomes its ``\\udcxx`` escape instead of failing the reply."""
    if is_utf8(text):
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class EnvBuildError(Exception):
    """An env factory raised; carries the captured error."""

    def __init__(self, info: ErrorInfo) -> None:
        super().__init__(info.message)
        self.info = info


#: What an object needs to be stepped as an env: Gymnasium's vector envs take any object
#: with the env API (duck typing), so a gymnasium.Env subclass is not required either.
_ENV_API = ("reset", "step", "observation_space", "action_space")


def check_env_type(env: Any) -> None:
    """Raise a ``TypeError`` naming what a factory returned if it cannot be stepped as
    one env: it lacks the env API, or it is a whole vector env."""
    if isinstance(env, gym.vector.VectorEnv):
        raise TypeError(
            f"the env factory returned {type(env).__name__}, a vector env of "
            f"{getattr(env, 'num_envs', '?')} envs; a factory creates one env. For envs "
            "that step a batch in one call, use aiovec.make(..., envs_per_block=k) or "
            "VecEnv(..., envs_per_block=k)"
        )
    missing = [name for name in _ENV_API if not hasattr(env, name)]
    if not missing:
        return
    if not isinstance(env, (gym.Env, AsyncEnv)):
        raise TypeError(
            f"the env factory returned {type(env).__name__}, not a gymnasium.Env (or "
            f"aiovec.AsyncEnv), nor an object with the env API (it has no "
            f"{', '.join(missing)}); it must be a callable that creates one env"
        )
    raise TypeError(  # an env class that never set its spaces
        f"the env {type(env).__name__} has no {', '.join(missing)}: an env sets its "
        "observation_space and action_space (in __init__, or as class attributes)"
    )


def checked_info(info: Any) -> Any:
    """``info`` when it is a dict (any mapping), as Gymnasium's API has it; else a
    ``TypeError`` naming what the env returned (raised as that env's error)."""
    if type(info) is dict or isinstance(info, Mapping):
        return info
    shown = reprlib.repr(info)
    raise TypeError(
        f"the env returned an info of type {type(info).__name__} ({shown}): step() and "
        "reset() must return their info as a dict"
    )


def step_values_error(reward: Any, terminated: Any, truncated: Any, cause: Exception) -> ValueError:
    """The error for a step whose reward or flags do not fit their buffers: which value
    it was, and what it must be (numpy's own message names neither)."""
    values = {"reward": reward, "terminated": terminated, "truncated": truncated}
    odd = {name: value for name, value in values.items() if np.ndim(value) != 0} or values
    shown = ", ".join(f"{name} {value!r} (shape {np.shape(value)})" for name, value in odd.items())
    return ValueError(
        f"the env returned {shown}: a reward must be a number and terminated/truncated "
        f"bools ({cause})"
    )


def restarted_info(info: dict[str, Any], reason: str) -> dict[str, Any]:
    """``info`` of a rebuilt env's first result, saying it was restarted and why."""
    return {**info, "restarted": True, "restart_reason": reason}


def build_envs(env_fns: dict[int, Callable[[], gym.Env]]) -> dict[int, gym.Env]:
    """Call each factory; on the first failure close what was built and raise EnvBuildError."""
    envs: dict[int, gym.Env] = {}
    for env_id, env_fn in env_fns.items():
        try:
            env = env_fn()
            check_env_type(env)
        except call_errors() as exc:
            for built in envs.values():
                _close_quietly(built)
            raise EnvBuildError(error_info(env_id, "make", exc, keep_frames=True)) from exc
        envs[env_id] = env
    return envs


class EnvDescription(NamedTuple):
    """What the vector env needs to know about one env (a row, for batched envs), as a
    host reports it once the env is built."""

    observation_space: gym.Space[Any]
    action_space: gym.Space[Any]
    metadata: dict[str, Any]
    render_mode: str | None
    spec: Any  # gymnasium.envs.registration.EnvSpec, or None


def describe(env: gym.Env[Any, Any]) -> EnvDescription:
    """The :class:`EnvDescription` of ``env``."""
    # An env with the API but not subclassing gymnasium.Env may lack the optional parts.
    return EnvDescription(
        env.observation_space,
        env.action_space,
        dict(getattr(env, "metadata", {})),
        getattr(env, "render_mode", None),
        getattr(env, "spec", None),
    )


class HostState:
    """What every host (single envs or blocks) keeps between commands: the seconds
    spent running envs not yet reported in a reply, and, for observation spaces not in
    shared memory, the latest observation of each env (they travel in replies).

    Busy time may be added and taken from several threads at once (envs stepped a
    thread each): every second added is reported by exactly one :meth:`take_busy`."""

    #: The shared buffers, set by the host's ``attach`` before its first command.
    buffers: Buffers

    def __init__(self, single_observation_space: gym.Space[Any]) -> None:
        self._busy = 0.0
        # ``+=`` on an attribute is a read then a write: threads would lose updates.
        self._busy_lock = threading.Lock()
        self._observations: dict[int, Any] | None = (
            None if is_shareable(single_observation_space) else {}
        )
        #: Whether observations travel in replies (spaces not in shared memory).
        self.observations_in_replies = self._observations is not None
        #: Each env gets its own copy of the values a command gives it (reset options,
        #: call arguments, set_attr values), as each env of AsyncVectorEnv unpickles its
        #: own: set in worker processes and actors, and for envs in this process that are
        #: isolated (see aiovec.backends._base.build_local_host); otherwise envs in this
        #: process get the caller's objects, as in SyncVectorEnv.
        self.copies_values = False

    def last_observation(self, row: int) -> Any:
        """A copy of the observation row ``row`` (an env) last got (``None``: unknown)."""
        if self._observations is not None:
            return self._observations.get(row)
        return read_row(self.buffers.observations, row)

    def own_copy(self, value: Any) -> Any:
        """``value`` for one env: its own copy with :attr:`copies_values`."""
        return own_copy(value) if self.copies_values else value

    def add_busy(self, seconds: float) -> None:
        """Count ``seconds`` spent running envs (reported by the next :meth:`take_busy`)."""
        with self._busy_lock:
            self._busy += seconds

    def take_busy(self) -> float:
        """Seconds spent running envs since the last call (what a reply reports)."""
        with self._busy_lock:
            busy, self._busy = self._busy, 0.0
        return busy

    def observations_of(self, env_ids: list[int]) -> list[Any] | None:
        """The latest observations of ``env_ids`` when they travel in replies (spaces not in
        shared memory); ``None`` when they are in the shared buffers."""
        if self._observations is None:
            return None
        return [self._observations.get(env_id) for env_id in env_ids]

    def control_reply(
        self, command: EnvCommand, results: list[Any], errors: list[ErrorInfo]
    ) -> Reply:
        """The reply to a reset, call or set_attr: ``results`` in ``command``'s env order
        (reset infos, call values), the errors of the envs that failed, and after a
        reset the observations that travel in replies. It never counts as progress:
        only a successful step ends a run of failures (see ``max_restarts``)."""
        env_ids = command.env_ids
        is_reset = isinstance(command, Reset)
        return Reply(
            seq=command.seq,
            env_ids=env_ids,
            infos=results if is_reset and any(results) else None,
            values=results if isinstance(command, Call) else None,
            observations=self.observations_of(env_ids) if is_reset else None,
            errors=errors or None,
        )


class EnvHost(HostState):
    """Executes :mod:`aiovec._transport.protocol` commands on ``envs`` (keyed by global env id).

    With ``env_fns`` and ``max_restarts > 0``, an env that raises in ``step`` is rebuilt
    from its factory, reset, and answers that step with its fresh observation,
    ``truncated=True`` and ``info["restarted"] = True`` (plus ``"restart_reason"``),
    unless it failed more than ``max_restarts`` times in a row: then the error is
    reported as usual. :meth:`notify_restart` gives every env the same treatment on its
    next step (used when a whole worker was rebuilt).
    """

    def __init__(
        self,
        envs: dict[int, gym.Env],
        autoreset_mode: AutoresetMode,
        buffers: Buffers | None,
        env_fns: dict[int, Callable[[], gym.Env]] | None = None,
        max_restarts: int = 0,
    ) -> None:
        self.envs = envs
        #: The env ids hosted, in order (a Step for all of them may travel without them).
        self.group = list(envs)
        self.autoreset_mode = autoreset_mode
        #: Where :meth:`step_async` and :meth:`execute_async` run the envs' blocking methods
        #: (so that envs that wait overlap); ``None``: on the event loop's thread.
        self.threads: EnvThreads | None = None
        self._same_step = autoreset_mode is AutoresetMode.SAME_STEP
        self._next_step = autoreset_mode is AutoresetMode.NEXT_STEP
        self._env_fns = env_fns or {}
        self._max_restarts = max_restarts if env_fns else 0
        self._failures_in_a_row = dict.fromkeys(envs, 0)
        self._restart_notices: dict[int, str] = {}  # env id -> why it was rebuilt
        self._recovering: dict[int, str] = {}  # env id -> why, while being rebuilt
        # env id -> (seed, options) of a reset that gave up (past max_restarts): the
        # reset that answers the env's restart notice replays them, once.
        self._owed_resets: dict[int, tuple[int | None, Any]] = {}
        # SAME_STEP: envs whose autoreset raised (their episode ended, none began): the
        # next step resets them, as NEXT_STEP's step after an episode end does.
        self._failed_autoresets: set[int] = set()
        # SAME_STEP, under the restart policy: the step (observation, reward, flags,
        # info) whose autoreset raised, which the restart that follows reports.
        self._ended_steps: dict[int, tuple[Any, Any, Any, Any, Any]] = {}
        self._observation_space = next(iter(envs.values())).observation_space
        self._needs_reset = dict.fromkeys(envs, False)
        super().__init__(self._observation_space)
        if buffers is not None:
            self.attach(buffers)

    def attach(self, buffers: Buffers) -> None:
        """Use ``buffers`` for actions and results; required before the first command."""
        self.buffers = buffers
        if self._observations is None:
            self._write_row = row_writer(self._observation_space, buffers.observations)

    # Every env operation is a *flow*: a generator that yields requests (functions of the
    # env) and receives their results. ``execute`` runs flows against envs synchronously,
    # ``execute_async`` awaits what async envs return: one implementation of resets,
    # autoreset, restarts and result writing for both kinds of env. Steps, the hot path,
    # enter a flow only when there is more to do than ``env.step`` and writing results.

    def execute(self, command: EnvCommand) -> Reply:
        """Run ``command`` on each of its envs and describe the outcome."""
        started = perf_counter()
        reply = self._execute(command)
        self.add_busy(perf_counter() - started)  # the whole command (nothing inside is timed)
        reply.busy = self.take_busy()
        return reply

    def _execute(self, command: EnvCommand) -> Reply:
        if type(command) is Step:
            return self.step_all(command)
        results: list[Any] = [None] * len(command.env_ids)
        errors: list[ErrorInfo] = []
        running = self.buffers.running
        for position, env_id in enumerate(command.env_ids):
            operation, flow = self._flow(command, position)
            running[env_id] = 1
            try:
                results[position] = self._drive(env_id, flow)
            except env_errors() as exc:
                errors.append(error_info(env_id, operation, exc))
            finally:
                running[env_id] = 0
        return self.control_reply(command, results, errors)

    async def execute_async(self, command: EnvCommand) -> Reply:
        """:meth:`execute` for envs whose methods may return awaitables, for any command
        but a step (async envs are stepped one by one, with :meth:`step_async`)."""
        started = perf_counter()
        reply = await self._execute_async(command)
        self.add_busy(perf_counter() - started)
        reply.busy = self.take_busy()
        return reply

    async def _execute_async(self, command: EnvCommand) -> Reply:
        results: list[Any] = [None] * len(command.env_ids)
        errors: list[ErrorInfo] = []
        running = self.buffers.running
        for position, env_id in enumerate(command.env_ids):
            operation, flow = self._flow(command, position)
            running[env_id] = 1
            try:
                results[position] = await self._drive_async(env_id, flow)
            except env_errors() as exc:
                errors.append(error_info(env_id, operation, exc))
            finally:
                running[env_id] = 0
        return self.control_reply(command, results, errors)

    def step_all(self, command: Step) -> Reply:
        """Step every env of ``command`` one after the other: :meth:`step` for each, with
        the common case (a plain step whose results fit the buffers) written out here,
        as it is the cost every lockstep env-step pays."""
        env_ids = command.env_ids
        actions = command.actions
        if actions is None:
            actions = self._read_actions(env_ids)
        envs, buffers, needs_reset = self.envs, self.buffers, self._needs_reset
        rewards, terminations, truncations = (
            buffers.rewards,
            buffers.terminations,
            buffers.truncations,
        )
        # Arrays of exactly the buffer's row shape and dtype are stored without further
        # checks; anything else goes through the checked writer (and its clear errors).
        write_observation = self._write_observation
        observation_buffer = buffers.observations
        if self._observations is None and type(observation_buffer) is np.ndarray:
            row_shape, row_dtype = observation_buffer.shape[1:], observation_buffer.dtype
        else:
            row_shape = row_dtype = None
        failures = self._failures_in_a_row
        # Only envs with nothing owed (no restart notice, no NEXT_STEP reset) and, in
        # SAME_STEP mode, no episode end take the written-out path.
        notices = self._restart_notices
        next_step, same_step = self._next_step, self._same_step
        failed_autoresets = self._failed_autoresets
        infos: list[Any] = []
        errors: list[ErrorInfo] = []
        progressed = False
        # Which env the worker is inside, for the agent should it die there: set as each
        # env starts, cleared as the next one does (a `continue` ends most turns).
        running = buffers.running
        previous = -1
        try:
            for env_id, action in zip(env_ids, actions):
                if previous >= 0:
                    running[previous] = 0
                running[env_id] = 1
                previous = env_id
                if (
                    not notices
                    and not (next_step and needs_reset[env_id])
                    and not (failed_autoresets and env_id in failed_autoresets)
                ):
                    try:
                        result = envs[env_id].step(action)
                        observation, reward, terminated, truncated, info = result
                        checked_info(info)
                        if same_step and (terminated or truncated):
                            info = self._drive(env_id, self._stepped_flow(env_id, result))
                        else:
                            if (
                                type(observation) is np.ndarray
                                and observation.shape == row_shape
                                and observation.dtype == row_dtype
                            ):
                                observation_buffer[env_id] = observation
                            else:
                                write_observation(env_id, observation)
                            try:
                                rewards[env_id] = reward
                                terminations[env_id] = terminated
                                truncations[env_id] = truncated
                            except (ValueError, TypeError) as exc:
                                error = step_values_error(reward, terminated, truncated, exc)
                                raise error from None
                            needs_reset[env_id] = bool(terminated or truncated)
                            if failures[env_id]:
                                failures[env_id] = 0
                    except call_errors() as exc:
                        outcome = self._recover(env_id, as_env_error(exc))
                    else:
                        infos.append(info)
                        progressed = True
                        continue
                elif not notices:  # the reset NEXT_STEP autoreset owes, written out too
                    try:
                        observation, info = envs[env_id].reset()
                        checked_info(info)
                        write_observation(env_id, observation)
                        rewards[env_id] = 0.0
                        terminations[env_id] = truncations[env_id] = False
                        needs_reset[env_id] = False
                        failed_autoresets.discard(env_id)
                    except call_errors() as exc:
                        outcome = self._recover(env_id, as_env_error(exc))
                    else:
                        infos.append(info)
                        continue
                else:
                    outcome = self._step(env_id, action)  # untimed: execute times the command
                infos.append(outcome.info)
                if outcome.error is not None:
                    errors.append(outcome.error)
                progressed = progressed or outcome.progressed
        finally:
            if previous >= 0:
                running[previous] = 0
        return Reply(
            seq=command.seq,
            env_ids=env_ids,
            infos=infos if any(infos) else None,
            observations=self.observations_of(env_ids),
            errors=errors or None,
            progressed=progressed,
        )

    def _read_actions(self, env_ids: list[int]) -> list[Any]:
        """The actions of ``env_ids`` from the shared buffer: a private copy for each env
        (an env may keep its action), numpy scalars for one-number spaces."""
        buffer = self.buffers.actions
        if type(buffer) is np.ndarray:
            if buffer.ndim == 1:
                return [buffer[env_id] for env_id in env_ids]
            return list(buffer[env_ids])  # fancy indexing copies: rows own their memory
        return [read_row(buffer, env_id) for env_id in env_ids]

    def action_of(self, command: Step, position: int) -> Any:
        """The action ``command`` carries for the env at ``position``."""
        if command.actions is None:  # in shared memory
            return read_row(self.buffers.actions, command.env_ids[position])
        return command.actions[position]

    # Stepping one env. ``_step`` and ``_step_async`` are twins (Python cannot share a body
    # between a function and a coroutine): keep them in step.

    def step(self, env_id: int, action: Any) -> StepOutcome:
        """Step env ``env_id``: its info, or the error it raised (after the restart
        policy had its say)."""
        started = perf_counter()
        running = self.buffers.running
        running[env_id] = 1
        try:
            outcome = self._step(env_id, action)
        finally:
            running[env_id] = 0
        self.add_busy(perf_counter() - started)
        return outcome

    def _step(self, env_id: int, action: Any) -> StepOutcome:
        stepped = self._plain_step(env_id)
        try:
            if stepped:
                result = self.envs[env_id].step(action)
                observation, reward, terminated, truncated, info = result
                checked_info(info)
                if self._same_step and (terminated or truncated):
                    info = self._drive(env_id, self._stepped_flow(env_id, result))
                else:  # no autoreset to run: no flow to drive
                    self._record_step(env_id, observation, reward, terminated, truncated)
            else:
                info = self._drive(env_id, self._unplain_step_flow(env_id))
        except call_errors() as exc:
            return self._recover(env_id, as_env_error(exc))
        return StepOutcome(env_id, info, None, stepped)

    async def step_async(self, env_id: int, action: Any) -> StepOutcome:
        """:meth:`step` for envs whose ``step`` may return an awaitable (or, with
        :attr:`threads`, blocking envs stepped in a thread): thousands per loop."""
        started = perf_counter()
        running = self.buffers.running
        running[env_id] = 1
        try:
            outcome = await self._step_async(env_id, action)
        finally:
            running[env_id] = 0
        self.add_busy(perf_counter() - started)
        return outcome

    async def _step_async(self, env_id: int, action: Any) -> StepOutcome:
        stepped = self._plain_step(env_id)
        task = running_task()
        try:
            if stepped:
                if self.threads is None:
                    result = self.envs[env_id].step(action)
                else:
                    result = await self.threads.run(env_id, self.envs[env_id].step, action)
                if type(result) is not tuple and inspect.isawaitable(result):
                    result = await result
                observation, reward, terminated, truncated, info = result
                checked_info(info)
                if self._same_step and (terminated or truncated):
                    info = await self._drive_async(env_id, self._stepped_flow(env_id, result))
                else:  # no autoreset to run: no flow to drive
                    self._record_step(env_id, observation, reward, terminated, truncated)
            else:
                info = await self._drive_async(env_id, self._unplain_step_flow(env_id))
        except env_errors() as exc:
            return await self.recover_async(env_id, exc)
        except asyncio.CancelledError as exc:
            if _being_cancelled():
                raise  # this task was cancelled (close, a timeout): not the env's doing
            return await self.recover_async(env_id, _cancelled_from_inside(exc))
        except GeneratorExit as exc:
            if running_task() is not task:
                raise  # this coroutine is being closed: not the env's doing
            return await self.recover_async(env_id, as_env_error(exc))
        return StepOutcome(env_id, info, None, stepped)

    def _plain_step(self, env_id: int) -> bool:
        """Whether env ``env_id``'s next step is a real ``env.step`` (not a restart notice
        or the reset that NEXT_STEP autoreset, or a failed SAME_STEP one, owes)."""
        return (
            env_id not in self._restart_notices
            and not (self._next_step and self._needs_reset[env_id])
            and env_id not in self._failed_autoresets
        )

    def _recover(self, env_id: int, exc: BaseException) -> StepOutcome:
        """The outcome of a step of env ``env_id`` that failed with ``exc``: the env
        rebuilt and reset (restart policy), or ``exc`` reported."""
        try:
            info = self._drive(env_id, self._recover_flow(env_id, exc))
        except env_errors() as final:
            return StepOutcome(env_id, None, error_info(env_id, "step", final), False)
        finally:
            self._ended_steps.pop(env_id, None)  # reported by the restart, or lost with it
        return StepOutcome(env_id, info, None, False)

    async def recover_reset_async(self, command: Reset, exc: BaseException) -> Reply:
        """The reply to ``command``, a reset of one env that failed with ``exc`` (a
        timeout): the env rebuilt and reset again with the same seed and options
        (restart policy), or ``exc`` reported."""
        env_id, seed = command.env_ids[0], command.seeds[0]
        options = self._reset_options(command, 0)
        again = partial(self._fresh_reset_flow, env_id, seed, options)
        try:
            info = await self._drive_async(env_id, self._recover_flow(env_id, exc, again))
        except env_errors() as final:
            self._owed_resets[env_id] = (seed, options)
            return self.control_reply(command, [None], [error_info(env_id, "reset", final)])
        return self.control_reply(command, [info], [])

    async def recover_async(self, env_id: int, exc: BaseException) -> StepOutcome:
        """:meth:`_recover` for envs whose methods may return awaitables."""
        try:
            info = await self._drive_async(env_id, self._recover_flow(env_id, exc))
        except env_errors() as final:
            return StepOutcome(env_id, None, error_info(env_id, "step", final), False)
        finally:
            self._ended_steps.pop(env_id, None)
        return StepOutcome(env_id, info, None, False)

    def step_reply(self, seq: int, outcomes: list[StepOutcome]) -> Reply:
        """The reply to step ``seq`` for the envs of ``outcomes``, in their order."""
        if len(outcomes) == 1:  # one env's step (first-ready): the same reply, sooner
            (outcome,) = outcomes
            observations = self._observations
            return Reply(
                seq=seq,
                env_ids=[outcome.env_id],
                infos=[outcome.info] if outcome.info else None,
                observations=None if observations is None else [observations.get(outcome.env_id)],
                errors=None if outcome.error is None else [outcome.error],
                progressed=outcome.progressed,
                busy=self.take_busy(),
            )
        env_ids = [outcome.env_id for outcome in outcomes]
        infos = [outcome.info for outcome in outcomes]
        errors = [outcome.error for outcome in outcomes if outcome.error is not None]
        return Reply(
            seq=seq,
            env_ids=env_ids,
            infos=infos if any(infos) else None,
            observations=self.observations_of(env_ids),
            errors=errors or None,
            progressed=any(outcome.progressed for outcome in outcomes),
            busy=self.take_busy(),
        )

    def _drive(self, env_id: int, flow: Flow) -> Any:
        return drive(flow, partial(self.envs.__getitem__, env_id))

    async def _drive_async(self, env_id: int, flow: Flow) -> Any:
        run = None if self.threads is None else partial(self.threads.run, env_id)
        return await drive_async(flow, partial(self.envs.__getitem__, env_id), run)

    def _flow(self, command: EnvCommand, position: int) -> tuple[str, Flow]:
        """``(operation name, flow)`` for the env at ``position`` of ``command`` (any
        command but a step)."""
        env_id = command.env_ids[position]
        if isinstance(command, Reset):
            options = self._reset_options(command, position)
            return "reset", self._reset_flow(env_id, command.seeds[position], options)
        if isinstance(command, Call):
            return command.name, _single(_call_request(command, self.own_copy))
        if isinstance(command, SetAttr):
            value = self.own_copy(command.values[position])
            request = methodcaller("set_wrapper_attr", command.name, value)
            return f"set_attr {command.name}", _single(request)
        raise TypeError(f"unexpected command {command!r}")

    def _reset_options(self, command: Reset, position: int) -> Any:
        """The options of ``command`` for its env at ``position`` (that env's own copy)."""
        options = command.options[position] if command.per_env_options else command.options
        return self.own_copy(options)

    def notify_restart(self, reason: str, env_ids: list[int] | None = None) -> None:
        """The next step of each of ``env_ids`` (default: all) reports a restart: their
        envs were just rebuilt."""
        self._restart_notices.update(
            dict.fromkeys(self.envs if env_ids is None else env_ids, reason)
        )

    def abandon(self, env_id: int, error: BaseException) -> Any:
        """Take env ``env_id`` out (its recovery did not end in time) and return it; a
        stand-in that raises ``error`` on use, and whose close does nothing, takes its
        place until the env is rebuilt."""
        env = self.envs[env_id]
        self.envs[env_id] = cast(gym.Env, _Unbuilt(error))
        return env

    def rebuild(self, env_id: int) -> Any:
        """A new env from env ``env_id``'s factory (the caller installs it)."""
        return self._env_fns[env_id]()

    def _reset_flow(self, env_id: int, seed: int | None, options: dict[str, Any] | None) -> Flow:
        """Reset env ``env_id``. Under the restart policy an env that fails its reset is
        rebuilt and reset again with the same ``seed`` and ``options``, as a failed
        step is; either way a rebuilt env's reset info says so (``restarted``)."""
        # A reset answers for a restart not yet reported (the env's worker was replaced,
        # this reset perhaps replayed on the new one): its info carries the notice.
        reason = self._restart_notices.get(env_id)
        try:
            return (yield from self._fresh_reset_flow(env_id, seed, options, reason))
        except env_errors() as exc:
            again = partial(self._fresh_reset_flow, env_id, seed, options)
            try:
                return (yield from self._recover_flow(env_id, exc, again))
            except env_errors():
                self._owed_resets[env_id] = (seed, options)  # see _restarted_flow
                raise

    def _fresh_reset_flow(
        self,
        env_id: int,
        seed: int | None,
        options: dict[str, Any] | None,
        restart_reason: str | None = None,
    ) -> Flow:
        observation, info = yield methodcaller("reset", seed=seed, options=options)
        checked_info(info)
        self._write_observation(env_id, observation)
        self.buffers.terminations[env_id] = False
        self.buffers.truncations[env_id] = False
        self._needs_reset[env_id] = False
        # Answered: a restart notice stays only while the rebuilt env's reset fails.
        self._restart_notices.pop(env_id, None)
        self._owed_resets.pop(env_id, None)  # a new reset replaces one that gave up
        self._failed_autoresets.discard(env_id)
        if restart_reason is None:
            return info
        return restarted_info(info, restart_reason)

    def _recover_flow(
        self, env_id: int, exc: BaseException, answer: Callable[[str], Flow] | None = None
    ) -> Flow:
        """Rebuild env ``env_id`` after ``exc`` and answer with ``answer(reason)`` run
        on the new env (by default its reset, reported as a step that restarted it);
        re-raise ``exc`` when restarting is off or the env keeps failing."""
        if answer is None:
            answer = partial(self._restarted_flow, env_id)
        self._failures_in_a_row[env_id] += 1
        if self._failures_in_a_row[env_id] > self._max_restarts:
            self._recovering.pop(env_id, None)
            raise exc
        # An attempt cut short (by step_timeout) is tried again: the restart's reason
        # stays the failure that began it.
        reason = self._recovering.setdefault(env_id, failure_reason(exc))
        while True:  # each failed attempt (a build, or the new env's reset) counts
            try:
                yield _CLOSE
            except env_errors():
                pass  # a broken env may fail to close too
            try:
                self.envs[env_id] = self.rebuild(env_id)
            except call_errors() as rebuild_error:
                failure = as_env_error(rebuild_error)
                # Never leave the closed env installed: the next command must not step it.
                self.envs[env_id] = cast(gym.Env, _Unbuilt(failure))  # raises on use
            else:
                try:
                    info = yield from answer(reason)
                except env_errors() as reset_error:  # thrown in by the driver
                    failure = reset_error
                else:
                    del self._recovering[env_id]
                    return info
            self._failures_in_a_row[env_id] += 1
            if self._failures_in_a_row[env_id] > self._max_restarts:
                del self._recovering[env_id]
                if not isinstance(self.envs[env_id], _Unbuilt):
                    # Rebuilt, but never reset: its next step tries the reset again (and
                    # reports the restart) rather than stepping it; so does the next step
                    # of an env whose restart notice's reset failed (the notice stays).
                    self._restart_notices[env_id] = reason
                raise failure from failure.__cause__  # as raised (and unwrapped) there

    def _restarted_flow(self, env_id: int, reason: str) -> Flow:
        # After a reset that gave up, the caller's seed and options, not a bare reset:
        # the env ends as that reset would have left it.
        owed = self._owed_resets.get(env_id)
        request = _RESET if owed is None else methodcaller("reset", seed=owed[0], options=owed[1])
        # SAME_STEP gives every ended episode its final observation: here the last one
        # the env returned (still in its row), else, gone with its worker, the new one.
        final = self.last_observation(env_id) if self._same_step else None
        ended = self._ended_steps.pop(env_id, None)  # a step whose autoreset raised
        observation, info = yield request
        checked_info(info)
        if ended is None:
            self._write_results(env_id, observation, 0.0, False, True)
        else:  # that step's own outcome stands: only its autoreset failed
            final, reward, terminated, truncated, step_info = ended
            self._write_results(env_id, observation, reward, terminated, truncated)
        # NEXT_STEP treats the truncation like any other: the next step resets again.
        self._needs_reset[env_id] = self._next_step
        self._restart_notices.pop(env_id, None)  # answered (kept while the reset fails)
        self._owed_resets.pop(env_id, None)
        self._failed_autoresets.discard(env_id)
        info = restarted_info(info, reason)
        if self._same_step:
            final = own_copy(observation) if final is None else final
            # why the episode ended, with that step's own info if it did end
            final_info = restarted_info({} if ended is None else step_info, reason)
            info = {"final_info": final_info, "final_obs": final, **info}
        return info

    def _unplain_step_flow(self, env_id: int) -> Flow:
        """A step that is no ``env.step``: the restart notice of a rebuilt env, or the
        reset that NEXT_STEP autoreset owes after an episode end."""
        reason = self._restart_notices.get(env_id)
        if reason is not None:
            return (yield from self._restarted_flow(env_id, reason))
        observation, info = yield _RESET
        checked_info(info)
        self._write_results(env_id, observation, 0.0, False, False)
        self._failed_autoresets.discard(env_id)
        return info

    def _stepped_flow(self, env_id: int, result: tuple[Any, ...]) -> Flow:
        """What follows ``env.step``: autoreset (same-step mode) and writing the results."""
        observation, reward, terminated, truncated, info = result
        if self._same_step and (terminated or truncated):
            # (in AsyncVectorEnv's key order, which code reading list(infos) sees)
            final = {"final_info": info, "final_obs": observation}
            try:
                observation, reset_info = yield _RESET
            except env_errors():  # the episode ended and none began: see _plain_step
                self._failed_autoresets.add(env_id)
                self._ended_steps[env_id] = (observation, reward, terminated, truncated, info)
                raise
            info = {**final, **checked_info(reset_info)}
        self._record_step(env_id, observation, reward, terminated, truncated)
        return info

    def _record_step(
        self, env_id: int, observation: Any, reward: Any, terminated: Any, truncated: Any
    ) -> None:
        self._write_results(env_id, observation, reward, terminated, truncated)
        self._failures_in_a_row[env_id] = 0  # whatever failed before is not a loop

    def _write_results(
        self, env_id: int, observation: Any, reward: Any, terminated: Any, truncated: Any
    ) -> None:
        self._write_observation(env_id, observation)
        try:
            self.buffers.rewards[env_id] = reward
            self.buffers.terminations[env_id] = terminated
            self.buffers.truncations[env_id] = truncated
        except (ValueError, TypeError) as exc:
            raise step_values_error(reward, terminated, truncated, exc) from None
        self._needs_reset[env_id] = bool(terminated or truncated)

    def _write_observation(self, env_id: int, observation: Any) -> None:
        if self._observations is not None:
            self._observations[env_id] = observation
            return
        try:
            self._write_row(env_id, observation)
        except (ValueError, TypeError) as exc:
            raise ValueError(
                f"the env returned an observation that does not fit its observation_space: {exc}"
            ) from None

    def close(self) -> None:
        """Close every env, ignoring their errors (closing must always finish)."""
        for env in self.envs.values():
            _close_quietly(env)


Flow = Generator[Callable[[Any], Any], Any, Any]


class _Unbuilt:
    """Stands in for an env whose rebuild failed: any use raises that failure (so the
    next command retries the rebuild, or reports it); closing it does nothing."""

    def __init__(self, error: BaseException) -> None:
        self._error = error

    def close(self) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        error = self._error
        raise RuntimeError(
            f"this env could not be rebuilt after a failure ({type(error).__qualname__}: "
            f"{error}), so it cannot {name}"
        ) from error


class StepOutcome(NamedTuple):
    """One env's step, as :meth:`EnvHost.step_async` reports it."""

    env_id: int
    info: Any
    error: ErrorInfo | None
    #: A real step went through (not only a reset after a restart or episode end).
    progressed: bool


def drive(flow: Flow, target: Callable[[], Any]) -> Any:
    """Run ``flow`` to its end: each request is called on ``target()`` (looked up anew
    each time, as a flow may rebuild its env), its result sent back, its exception
    thrown in; returns what the flow returns."""
    try:
        request = next(flow)
        while True:
            try:
                result = request(target())
            except call_errors() as exc:
                request = flow.throw(as_env_error(exc))
            else:
                request = flow.send(result)
    except StopIteration as finished:
        return finished.value


async def drive_async(
    flow: Flow,
    target: Callable[[], Any],
    run: Callable[[Callable[[Any], Any], Any], Awaitable[Any]] | None = None,
) -> Any:
    """:func:`drive` for envs whose methods may return awaitables (awaited here), or,
    with ``run``, blocking envs whose requests ``run(request, env)`` awaits elsewhere
    (a thread)."""
    task = running_task()
    try:
        request = next(flow)
        while True:
            try:
                result = request(target()) if run is None else await run(request, target())
                if inspect.isawaitable(result):
                    result = await result
            except env_errors() as exc:
                request = flow.throw(exc)
            except asyncio.CancelledError as exc:
                if _being_cancelled():
                    raise  # this task was cancelled (close, a timeout): not the env's doing
                request = flow.throw(_cancelled_from_inside(exc))
            except GeneratorExit as exc:
                if running_task() is not task:
                    raise  # this coroutine is being closed: not the env's doing
                request = flow.throw(as_env_error(exc))
            else:
                request = flow.send(result)
    except StopIteration as finished:
        return finished.value


def _cancelled_from_inside(exc: asyncio.CancelledError) -> RuntimeError:
    """The env's own code was cancelled (e.g. a transport cancelled a request), not
    the task running it: an error of that env, not a silently ended runner."""
    return RuntimeError(f"the env's coroutine was cancelled from inside: {exc!r}")


def running_task() -> asyncio.Task[Any] | None:
    """The task running now, if any (none: no event loop runs in this thread)."""
    try:
        return asyncio.current_task()
    except RuntimeError:
        return None


def _being_cancelled() -> bool:
    """Whether the running task has a cancellation request (Python >= 3.11; before,
    every CancelledError counts as one)."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    return cancelling is None or bool(cancelling())


_RESET = methodcaller("reset")
_CLOSE = methodcaller("close")


def _single(request: Callable[[Any], Any]) -> Flow:
    """A flow of one request, returning its result."""
    return (yield request)


def _call_request(
    command: Call, own_copy: Callable[[Any], Any] = lambda value: value
) -> Callable[[Any], Any]:
    args, kwargs = own_copy(command.args or ()), own_copy(command.kwargs or {})
    if command.function is not None:
        return lambda env: command.function(env, *args, **kwargs)

    def call(env: Any) -> Any:
        attribute = env.get_wrapper_attr(command.name)
        return attribute(*args, **kwargs) if callable(attribute) else attribute

    return call


def _close_quietly(env: Any) -> None:
    # Any: a gym.Env, a gymnasium VectorEnv, or an async env whose close() is a coroutine
    try:
        result = env.close()
    except call_errors():
        return
    if inspect.iscoroutine(result):  # an async env closed from sync code: cannot await here
        result.close()
