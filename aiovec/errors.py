"""Every exception aiovec raises on purpose.

Each error names what went wrong, which env (by index) it concerns, and what to do.
They subclass the matching built-in or Gymnasium exception, so code written for
``gymnasium.vector.AsyncVectorEnv`` that catches those keeps working.
"""

from __future__ import annotations

import multiprocessing
import sys
from collections.abc import Sequence
from typing import Any

import gymnasium.error


class AiovecError(Exception):
    """Base class of all aiovec errors."""


class EnvError(AiovecError):
    """An environment raised an exception inside ``operation`` (reset, step, call, make ...).

    The exception raised is also an instance of the env's own exception class when that
    class can be found in this process (an env's ``ValueError`` is caught by
    ``except ValueError``, as with Gymnasium's ``AsyncVectorEnv``); its message and
    attributes are aiovec's.

    Attributes:
        env_index: index of the env in the vector env.
        operation: what the env was doing (``"step"``, ``"reset"``, ``"call"``,
            ``"make"`` ...; for a batched env too, whose rows the message names).
        exc_type: name of the original exception class (e.g. ``"ValueError"``).
        exc_message: the original exception's message.
        worker_traceback: the traceback as formatted where the env ran.
        exc_module: the module of the original exception class (``"builtins"`` ...).
    """

    def __new__(cls, env_index: int = 0, *args: object, **kwargs: object) -> EnvError:
        # Exception bases such as OSError interpret constructor arguments; give none.
        try:
            return super().__new__(cls)
        except TypeError:  # the env's class has a __new__ that wants its own arguments:
            # skipped, as its __init__ is (the attributes are aiovec's)
            return BaseException.__new__(cls)

    def __init__(
        self,
        env_index: int,
        operation: str,
        exc_type: str,
        exc_message: str,
        worker_traceback: str = "",
        exc_module: str | None = None,
    ) -> None:
        self.env_index = env_index
        # "step" reads "step()"; an operation that names its call already stays as it is
        # in the message (e.g. "step() of the batched env of envs 2..3"), and its call
        # alone is the attribute, as for single envs ("step").
        self._operation = operation
        self.operation = operation.split("(", 1)[0]
        self.exc_type = exc_type
        self.exc_message = exc_message
        self.worker_traceback = worker_traceback
        self.exc_module = exc_module
        call = operation if "(" in operation else f"{operation}()"
        text = f"env {env_index} raised {exc_type} in {call}: {exc_message}"
        if worker_traceback:
            text += f"\n\nTraceback from the env's worker:\n{worker_traceback.rstrip()}"
        self._text = text
        Exception.__init__(self, text)

    def __str__(self) -> str:
        return self._text

    @classmethod
    def create(
        cls,
        env_index: int,
        operation: str,
        exc_type: str,
        exc_message: str,
        worker_traceback: str = "",
        exc_module: str | None = None,
    ) -> EnvError:
        """An ``EnvError`` that is also an instance of the env's exception class, when
        that class is loaded here and can be combined; a plain ``EnvError`` otherwise."""
        arguments = (env_index, operation, exc_type, exc_message, worker_traceback, exc_module)
        error_class = _env_error_class(cls, exc_module, exc_type)
        if error_class is cls:
            return cls(*arguments)
        try:
            error = error_class(*arguments)
            if isinstance(error, cls):  # a __new__ of the env's class may return another
                return error
        except Exception:  # a class whose __new__ insists on its own arguments (an
            pass  # ExceptionGroup's)
        # A plain EnvError, from now on, rather than no error at all.
        _ENV_ERROR_CLASSES[(exc_module, exc_type)] = cls
        return cls(*arguments)

    def __reduce__(self) -> tuple[Any, ...]:  # keep pickling (e.g. through Ray) lossless
        arguments = (
            self.env_index,
            self._operation,
            self.exc_type,
            self.exc_message,
            self.worker_traceback,
            self.exc_module,
        )
        # The env exception's own attributes (``retryable``), set after construction.
        extra = {k: v for k, v in vars(self).items() if k not in _ENV_ERROR_FIELDS}
        return (_rebuild_env_error, arguments, extra or None)


_ENV_ERROR_CLASSES: dict[tuple[str | None, str], type[EnvError]] = {}


def _env_error_class(base: type[EnvError], module: str | None, qualname: str) -> type[EnvError]:
    key = (module, qualname)
    known = _ENV_ERROR_CLASSES.get(key)
    if known is not None:
        return known
    found: object = sys.modules.get(module) if module else None
    try:
        for part in qualname.split("."):
            found = getattr(found, part, None)
    except Exception:  # a module whose __getattr__ raises something else: no class
        found = None
    error_class = base
    if (
        isinstance(found, type)
        # Never KeyboardInterrupt or SystemExit (an env's own, raised in a worker):
        # wherever it crossed a task, asyncio would take it for Ctrl-C or an exit and
        # stop the caller's event loop. Nor StopIteration: raised from a coroutine (the
        # async API, or the sync API driving one), Python turns it into a RuntimeError.
        and issubclass(found, Exception)
        and not issubclass(found, (AiovecError, StopIteration, StopAsyncIteration))
    ):
        try:
            error_class = type(f"EnvError[{qualname}]", (base, found), {"__module__": __name__})
        except Exception:  # a class that cannot be combined (its layout, a metaclass or
            error_class = base  # an __init_subclass__ that refuses): plain
    _ENV_ERROR_CLASSES[key] = error_class
    return error_class


#: What ``EnvError.__init__`` sets: everything else on one came from the env's exception.
_ENV_ERROR_FIELDS = frozenset(
    vars(EnvError(0, "step", "ValueError", "")).keys() | {"__traceback__", "__cause__"}
)


def _rebuild_env_error(*args: object) -> EnvError:
    # args are the tuple __reduce__ built from an EnvError, in create's order
    return EnvError.create(*args)  # type: ignore[arg-type]


class WorkerCrashedError(AiovecError):
    """A worker process died (killed, segfault, ``os._exit``) while hosting ``env_ids``.

    Attributes:
        worker_index: which worker died.
        env_ids: the envs it hosted; their in-flight results are lost.
        exitcode: the process exit code, negative for a signal (``-9`` is SIGKILL).
        running_env_ids: the envs whose code was running when it died (the one that
            crashed it, or several stepped in threads); empty where unknown.
    """

    def __init__(
        self,
        worker_index: int,
        env_ids: Sequence[int],
        exitcode: int | None,
        hint: str = "",
        running_env_ids: Sequence[int] = (),
    ) -> None:
        # int | None: a StepTimeoutError of async envs has no worker to name
        self.worker_index: int | None = worker_index
        self.env_ids = list(env_ids)
        self.exitcode = exitcode
        self.running_env_ids = list(running_env_ids)
        cause = _describe_exit(exitcode)
        text = f"worker {worker_index} hosting envs {self.env_ids} died ({cause})"
        running = self.running_env_ids
        if running:
            text += (
                f" while env {running[0]} was running"
                if len(running) == 1
                else (f" while envs {running} were running")
            )
        if hint:
            text += f"; {hint}"
        super().__init__(text)

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            type(self),
            (self.worker_index, self.env_ids, self.exitcode, "", self.running_env_ids),
        )


def _describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "exit status unknown"
    if exitcode < 0:
        import signal

        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


class StepTimeoutError(WorkerCrashedError, multiprocessing.TimeoutError):
    """Envs did not answer within ``step_timeout``: their worker was killed, or, for
    async envs (coroutine backend, or a worker process or Ray actor of async envs), the
    late env's command alone was cancelled (``worker_index`` is then ``None``; the other
    envs go on).

    Attributes:
        timed_out: the env ids whose command was late.
        timeout: the ``step_timeout`` in force, in seconds.
    """

    def __init__(
        self,
        worker_index: int | None,
        env_ids: Sequence[int],
        timed_out: Sequence[int],
        timeout: float,
    ) -> None:
        self.timed_out = list(timed_out)
        self.timeout = timeout
        outcome = (
            "its command was cancelled; the other envs go on"
            if worker_index is None
            else f"worker {worker_index} hosting envs {list(env_ids)} was killed"
        )
        AiovecError.__init__(
            self, f"envs {self.timed_out} did not answer within step_timeout={timeout} s; {outcome}"
        )
        self.worker_index, self.env_ids, self.exitcode = worker_index, list(env_ids), None

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.worker_index, self.env_ids, self.timed_out, self.timeout))


class StartupTimeoutError(AiovecError, TimeoutError):
    """Envs were not built within ``startup_timeout`` (their constructor hangs or is
    too slow): their worker was killed.

    Attributes:
        env_ids: the envs that were not built in time.
        timeout: the ``startup_timeout`` in force, in seconds.
        worker_index: the worker that was killed (``None`` at construction).
    """

    def __init__(
        self,
        env_ids: Sequence[int],
        timeout: float | None,
        worker_index: int | None = None,
        hint: str = "",
    ) -> None:
        self.env_ids = list(env_ids)
        self.timeout = timeout
        self.worker_index = worker_index
        self.hint = hint
        super().__init__(
            f"envs {self.env_ids} were not built within startup_timeout={timeout} s "
            + (hint or "(their constructor hangs or is slow)")
            + "; pass a larger startup_timeout= if building them takes longer"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.env_ids, self.timeout, self.worker_index, self.hint))


class ClosedError(AiovecError, gymnasium.error.ClosedEnvironmentError):
    """The vector env was used after :meth:`~aiovec.VecEnv.close`, or closed while a task
    awaited it."""

    def __init__(
        self, operation: str = "", *, reason: str | None = None, closed_by: str | None = None
    ) -> None:
        """``reason``: the whole message; ``closed_by``: what closed the env (else the
        user's ``close()``)."""
        state = "is closed" if closed_by is None else f"was closed by {closed_by}"
        super().__init__(
            reason
            or f"cannot {operation}: the vector env {state}; create a new one with aiovec.make()"
        )


class WaitTimeoutError(AiovecError, TimeoutError, multiprocessing.TimeoutError):
    """A wait's ``timeout`` passed before its results arrived; nothing is lost (a later
    call returns them). Both the builtin ``TimeoutError`` and
    ``multiprocessing.TimeoutError`` (what Gymnasium's ``AsyncVectorEnv`` raises)."""


class EnvBusyError(AiovecError, RuntimeError):
    """An operation targeted envs that still have an action in flight or an unread result."""


class PendingCallError(EnvBusyError, gymnasium.error.AlreadyPendingCallError):
    """A ``*_async`` call was made while another one waits for its ``*_wait``."""

    def __init__(self, message: str, name: str) -> None:
        RuntimeError.__init__(self, message)
        self.name = name


class NoPendingCallError(AiovecError, gymnasium.error.NoAsyncCallError):
    """A ``*_wait`` call was made without the matching ``*_async`` call."""

    def __init__(self, message: str, name: str) -> None:
        Exception.__init__(self, message)
        self.name = name


class NothingInFlightError(AiovecError, RuntimeError):
    """``recv`` was awaited while no env was stepping: it would wait forever."""


class NeedsResetError(AiovecError, RuntimeError, AssertionError):
    """With ``autoreset_mode=DISABLED``, a step was sent to an env whose episode ended
    and that was not reset since; nothing was sent. Also the ``AssertionError``
    Gymnasium's vector envs raise then."""


class InvalidSeedError(AiovecError, ValueError, TypeError, AssertionError, gymnasium.error.Error):
    """``reset`` got a seed it cannot use (negative, 2**64 or more, not an int, a list of
    the wrong length); nothing was sent. It is an instance of each class Gymnasium
    raises for such a seed: ``gymnasium.error.Error`` (its envs' ``np_random``),
    ``AssertionError`` (a list of the wrong length) and ``TypeError``."""


class FactoryPicklingError(AiovecError, TypeError):
    """An env factory cannot be sent to a worker process."""


class SyncCallInEventLoopError(AiovecError, RuntimeError):
    """A blocking method was called from inside a running asyncio event loop."""
