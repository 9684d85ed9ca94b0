"""Every exception aiovec raises on purpose.

Each error names what went wrong, which env (by index) it concerns, and what to do.
They subclass the matching built-in or Gymnasium exception, so code written for
``gymnasium.vector.AsyncVectorEnv`` that catches those keeps working.
"""

from __future__ import annotations

from collections.abc import Sequence

import gymnasium.error


class AiovecError(Exception):
    """Base class of all aiovec errors."""


class EnvError(AiovecError):
    """An environment raised an exception inside ``operation`` (reset, step, call, make ...).

    Attributes:
        env_index: index of the env in the vector env.
        operation: what the env was doing.
        exc_type: name of the original exception class (e.g. ``"ValueError"``).
        exc_message: the original exception's message.
        worker_traceback: the traceback as formatted where the env ran.
    """

    def __init__(
        self,
        env_index: int,
        operation: str,
        exc_type: str,
        exc_message: str,
        worker_traceback: str = "",
    ) -> None:
        self.env_index = env_index
        self.operation = operation
        self.exc_type = exc_type
        self.exc_message = exc_message
        self.worker_traceback = worker_traceback
        text = f"env {env_index} raised {exc_type} in {operation}(): {exc_message}"
        if worker_traceback:
            text += f"\n\nTraceback from the env's worker:\n{worker_traceback.rstrip()}"
        super().__init__(text)

    def __reduce__(self):  # keep pickling (e.g. through Ray) lossless
        return (
            type(self),
            (
                self.env_index,
                self.operation,
                self.exc_type,
                self.exc_message,
                self.worker_traceback,
            ),
        )


class WorkerCrashedError(AiovecError):
    """A worker process died (killed, segfault, ``os._exit``) while hosting ``env_ids``.

    Attributes:
        worker_index: which worker died.
        env_ids: the envs it hosted; their in-flight results are lost.
        exitcode: the process exit code, negative for a signal (``-9`` is SIGKILL).
    """

    def __init__(
        self, worker_index: int, env_ids: Sequence[int], exitcode: int | None, hint: str = ""
    ) -> None:
        self.worker_index = worker_index
        self.env_ids = list(env_ids)
        self.exitcode = exitcode
        cause = _describe_exit(exitcode)
        text = f"worker {worker_index} hosting envs {self.env_ids} died ({cause})"
        if hint:
            text += f"; {hint}"
        super().__init__(text)

    def __reduce__(self):
        return (type(self), (self.worker_index, self.env_ids, self.exitcode))


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


class StepTimeoutError(WorkerCrashedError):
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

    def __reduce__(self):
        return (type(self), (self.worker_index, self.env_ids, self.timed_out, self.timeout))


class ClosedError(AiovecError, gymnasium.error.ClosedEnvironmentError):
    """The vector env was used after :meth:`~aiovec.VecEnv.close`."""

    def __init__(self, operation: str) -> None:
        super().__init__(
            f"cannot {operation}: the vector env is closed; create a new one with aiovec.make()"
        )


class EnvBusyError(AiovecError, RuntimeError):
    """An operation targeted envs that still have an action in flight or an unread result."""


class NothingInFlightError(AiovecError, RuntimeError):
    """``recv`` was awaited while no env was stepping: it would wait forever."""


class FactoryPicklingError(AiovecError, TypeError):
    """An env factory cannot be sent to a worker process."""


class SyncCallInEventLoopError(AiovecError, RuntimeError):
    """A blocking method was called from inside a running asyncio event loop."""
