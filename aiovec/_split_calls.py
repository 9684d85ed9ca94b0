"""Gymnasium's split calls: ``reset_async``/``reset_wait``, ``step_async``/``step_wait``
and ``call_async``/``call_wait``, as :class:`gymnasium.vector.AsyncVectorEnv` has them,
on top of :class:`aiovec.VecEnv`'s async core.

Invariant (in ``_pending``): at most one split call is pending, ``(kind, state)``;
a ``*_wait`` that times out leaves it pending, as nothing of it is lost. A ``*_async``
call made then is taken at once, as AsyncVectorEnv takes it, but sent only once the
late call has finished (its state is a :class:`_Deferred`): its ``*_wait`` waits for
the late call within its own timeout and drops the late results. So no ``*_async``
ever waits for an env. This module only sequences the split calls: what they do is
the vector env's (it must not reach the scheduler or a backend itself).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeVar, cast

from aiovec._checks import check_seconds, take_reset_mask
from aiovec.errors import NoPendingCallError, PendingCallError, WaitTimeoutError

if TYPE_CHECKING:
    from aiovec._scheduler import Ticket

_T = TypeVar("_T")


class _Core(Protocol):
    """What the split calls need of the vector env."""

    _pending: tuple[str, Any] | None
    _pending_timed_out: bool
    closed: bool

    def _check_open(self, operation: str) -> None: ...
    def _blocking_call(self, method: str, async_method: str) -> None: ...
    def _run(self, coroutine: Coroutine[Any, Any, _T], call: str | None = None) -> _T: ...
    def _reset_submit(self, seed: Any, options: Any) -> list[Ticket]: ...
    def _reset_plan(self, seed: Any, options: Any) -> Any: ...
    def _check_actions(self, actions: Any, count: int) -> Any: ...
    def _check_call_name(self, name: str) -> None: ...

    num_envs: int

    def _reset_wait(
        self, tickets: list[Ticket], timeout: float | None = None
    ) -> Coroutine[Any, Any, tuple[Any, dict[str, Any]]]: ...
    def _send(self, actions: Any, env_ids: Any, stream: bool) -> list[Ticket]: ...
    def _step_wait(
        self, tickets: list[Ticket], timeout: float | None = None
    ) -> Coroutine[Any, Any, tuple[Any, ...]]: ...
    def _call_submit(self, name: str, args: Any, kwargs: Any) -> tuple[list[int], list[Ticket]]: ...
    def _call_wait(
        self, env_ids: list[int], tickets: list[Ticket], timeout: float | None = None
    ) -> Coroutine[Any, Any, tuple[Any, ...]]: ...
    def _finish(self, kind: str, timeout: float | None, call: str | None = None) -> Any: ...
    def _lockstep(self, kind: str, submit: Callable[[], Any]) -> Any: ...
    def _submitted(self, submit: Callable[[], _T]) -> _T: ...
    def _submit_closing_on_ctrl_c(self, submit: Callable[[], Any], call: str) -> Any: ...
    def _close_on_ctrl_c(self, call: str) -> None: ...
    def _defer(self, kind: str, late: tuple[str, Any], send: Callable[[], Any]) -> None: ...
    def _begin(self, kind: str, synchronous: bool = False) -> tuple[str, Any] | None: ...
    def _end(self, kind: str) -> Any: ...
    def _waiting(
        self, kind: str, state: Any, timeout: float | None
    ) -> Coroutine[Any, Any, Any]: ...
    def _drop_late_call(self) -> None: ...
    def _drop(self, late: tuple[str, Any], timeout: float | None) -> None: ...
    def _late_call(self) -> tuple[str, Any]: ...
    def _send_deferred(
        self, kind: str, deferred: _Deferred, timeout: float | None
    ) -> tuple[Any, float | None]: ...
    def _refuse_while_pending(self, method: str) -> None: ...


class _Deferred(NamedTuple):
    """A split call made while a late one (whose ``*_wait`` timed out) still runs:
    its ``*_wait`` sends it once the late call has finished."""

    late: tuple[str, Any]  #: the late call, ``(kind, state)``, whose results are dropped
    send: Callable[[], Any]  #: sends this call; returns what its ``*_wait`` needs


def _finished(call: tuple[str, Any]) -> bool:
    """Whether every command of the split ``call`` (``(kind, state)``) has its answer."""
    kind, state = call
    tickets = state[1] if kind == "call" else state
    return all(ticket.done for ticket in tickets)


class SplitCalls:
    """The ``*_async``/``*_wait`` methods of :class:`aiovec.VecEnv`."""

    #: The pending split call: ``(kind, what its *_wait needs)``, or None.
    _pending: tuple[str, Any] | None = None
    #: Whether the pending call's ``*_wait`` timed out: it may be waited for again, and a
    #: new call drops it (see :meth:`_drop_late_call`).
    _pending_timed_out: bool = False

    def reset_async(
        self: _Core,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | Sequence[dict[str, Any] | None] | None = None,
    ) -> None:
        """Start a reset; finish it with :meth:`reset_wait`."""
        late = self._begin("reset")
        if late is None:
            submit = partial(self._reset_submit, seed, options)
            self._pending = ("reset", self._submit_closing_on_ctrl_c(submit, "reset_async"))
        else:
            self._reset_plan(seed, options)  # bad arguments are refused now
            # The deferred reset keeps its own dict: the caller's loses its reset_mask
            # now, as with a reset sent at once.
            try:  # copied, as a reset sent at once takes them at once
                deferred = copy.deepcopy(options)
            except Exception:  # a value that does not copy: the containers at least
                deferred = dict(options) if isinstance(options, Mapping) else options
            self._defer("reset", late, partial(self._reset_submit, seed, deferred))
            take_reset_mask(options)

    def reset_wait(self: _Core, timeout: float | None = None) -> tuple[Any, dict[str, Any]]:
        """Finish :meth:`reset_async`."""
        timeout = check_seconds("timeout", timeout, negative_ok=True)
        return cast("tuple[Any, dict[str, Any]]", self._finish("reset", timeout))

    def step_async(self: _Core, actions: Any) -> None:
        """Start a step of every env; finish it with :meth:`step_wait`."""
        late = self._begin("step")
        if late is None:
            submit = partial(self._send, actions, None, False)
            self._pending = ("step", self._submit_closing_on_ctrl_c(submit, "step_async"))
            return
        checked, _ = self._check_actions(actions, self.num_envs)  # bad ones refused now
        # A copy, as AsyncVectorEnv's pipes take one: the caller may reuse its array.
        try:
            snapshot = copy.deepcopy(actions)
        except Exception:  # an array-like that does not copy: the values it gave
            snapshot = copy.deepcopy(checked)
        self._defer("step", late, partial(self._send, snapshot, None, stream=False))

    def step_wait(self: _Core, timeout: float | None = None) -> tuple[Any, ...]:
        """Finish :meth:`step_async`."""
        timeout = check_seconds("timeout", timeout, negative_ok=True)
        return cast("tuple[Any, ...]", self._finish("step", timeout))

    def call_async(self: _Core, name: str, /, *args: Any, **kwargs: Any) -> None:
        """Start a call on every env; finish it with :meth:`call_wait`."""
        late = self._begin("call")
        if late is None:
            submit = partial(self._call_submit, name, args, kwargs)
            self._pending = ("call", self._submit_closing_on_ctrl_c(submit, "call_async"))
        else:
            self._check_call_name(name)  # a name call refuses is refused now
            # Copies, as AsyncVectorEnv's pipes take them: the caller may change its own.
            args, kwargs = copy.deepcopy((args, kwargs))
            self._defer("call", late, partial(self._call_submit, name, args, kwargs))

    def call_wait(self: _Core, timeout: float | None = None) -> tuple[Any, ...]:
        """Finish :meth:`call_async`."""
        timeout = check_seconds("timeout", timeout, negative_ok=True)
        return cast("tuple[Any, ...]", self._finish("call", timeout))

    def _waiting(
        self: _Core, kind: str, state: Any, timeout: float | None
    ) -> Coroutine[Any, Any, Any]:
        """The wait of a pending ``kind`` call whose state is ``state``."""
        if kind == "reset":
            return self._reset_wait(state, timeout)
        if kind == "step":
            return self._step_wait(state, timeout)
        env_ids, tickets = state
        return self._call_wait(env_ids, tickets, timeout)

    def _finish(self: _Core, kind: str, timeout: float | None, call: str | None = None) -> Any:
        """The ``*_wait`` of the pending ``kind`` call (sent first if it was deferred), for
        the blocking ``call`` (default: that ``*_wait``; named by a Ctrl-C's closing).
        After a timeout the call stays pending (its ``*_wait`` may be called again), as
        nothing of it is lost; so it does when anything else ends the wait before the
        call finished (an exception a signal handler raised: a timeout decorator's)."""
        state = self._end(kind)
        left = timeout
        if isinstance(state, _Deferred):
            state, left = self._send_deferred(kind, state, timeout)
        try:
            return self._run(self._waiting(kind, state, left), call or f"{kind}_wait")
        except WaitTimeoutError:
            self._pending, self._pending_timed_out = (kind, state), True
            if left != timeout:  # part of it went to the late call: name the whole
                raise WaitTimeoutError(f"no result within {timeout} s") from None
            raise
        except BaseException:
            if not self.closed and not _finished((kind, state)):
                self._pending, self._pending_timed_out = (kind, state), True
            raise

    def _lockstep(self: _Core, kind: str, submit: Callable[[], Any]) -> Any:
        """A blocking ``kind`` call (``step``, ``reset``, ``call``) as Gymnasium's are:
        its ``*_async`` (``submit()``), then its ``*_wait``. So a wait ended before the
        call finished leaves it pending as :meth:`_finish` does: ``*_wait`` returns its
        results, and the next call drops them once it has finished."""
        state = self._submit_closing_on_ctrl_c(submit, kind)
        self._pending, self._pending_timed_out = (kind, state), False
        return self._finish(kind, None, kind)

    def _submit_closing_on_ctrl_c(self: _Core, submit: Callable[[], Any], call: str) -> Any:
        """:meth:`_submitted`; a Ctrl-C anywhere in it (the command may have reached
        some workers and not others, or all of them with nothing yet pending to collect
        it) closes the vector env, as one in any blocking call does."""
        try:
            return self._submitted(submit)
        except KeyboardInterrupt:
            if not self.closed:
                self._close_on_ctrl_c(call)
            raise

    def _defer(self: _Core, kind: str, late: tuple[str, Any], send: Callable[[], Any]) -> None:
        """Make ``kind`` the pending call, to be sent by its ``*_wait`` after ``late``."""
        self._pending, self._pending_timed_out = (kind, _Deferred(late, send)), False

    def _late_call(self: _Core) -> tuple[str, Any]:
        """The call still running whose ``*_wait`` timed out: the pending one, or the one
        a pending deferred call waits for (which, never sent, is simply replaced)."""
        assert self._pending is not None and self._pending_timed_out
        kind, state = self._pending
        return state.late if isinstance(state, _Deferred) else (kind, state)

    def _drop(self: _Core, late: tuple[str, Any], timeout: float | None) -> None:
        """Wait (up to ``timeout``) for the ``late`` call to finish, and drop its results:
        AsyncVectorEnv takes new calls after a timeout (and hands the late results to
        the next call); here they are never handed to anyone.

        Raises:
            aiovec.WaitTimeoutError: it did not finish within ``timeout``.
        """
        try:
            self._run(self._waiting(*late, timeout))
        except Exception:
            if not _finished(late):
                raise  # still running: the wait timed out, or could not wait here
            # It ended with errors: the dropped call's (logged, as Gymnasium logs them).

    def _drop_late_call(self: _Core) -> None:
        """Wait for the call whose ``*_wait`` timed out and drop it (a synchronous call
        is about to start: it would wait for the late call anyway). Until it has
        finished, it stays pending."""
        self._drop(self._late_call(), None)
        self._pending, self._pending_timed_out = None, False

    async def _before_async_call(self: _Core, method: str, check: Callable[[], object]) -> None:
        """Start a call of the async API: refused while a ``*_async`` call awaits its
        ``*_wait``; after a ``*_wait`` timed out, ``check()`` the call's arguments, then
        drop the late call once it has finished (a cancelled wait leaves it pending)."""
        if self._pending is not None and self._pending_timed_out:
            check()
            late = self._late_call()
            try:
                await self._waiting(*late, None)
            except Exception:
                if not _finished(late):
                    raise
            self._pending, self._pending_timed_out = None, False
        self._refuse_while_pending(method)

    def _send_deferred(
        self: _Core, kind: str, deferred: _Deferred, timeout: float | None
    ) -> tuple[Any, float | None]:
        """Send a deferred ``kind`` call once its late call has finished (waiting for
        that within ``timeout``): its state, and what is left of ``timeout``.

        Raises:
            aiovec.WaitTimeoutError: the late call is still running; the deferred call
                stays pending (its ``*_wait`` may be called again).
        """
        started = time.monotonic()
        try:
            self._drop(deferred.late, timeout)
        except BaseException:
            self._pending, self._pending_timed_out = (kind, deferred), True
            raise
        state = deferred.send()
        if timeout is not None:
            timeout = max(0.0, timeout - (time.monotonic() - started))
        return state, timeout

    def _begin(self: _Core, kind: str, synchronous: bool = False) -> tuple[str, Any] | None:
        """Refuse a call while a ``*_async`` call is pending (before anything is sent).

        After a ``*_wait`` timed out, a synchronous call drops the late call once it
        has finished; a ``*_async`` call gets the late call back (it is sent after it).
        """
        self._check_open(kind)
        if self._pending is not None and self._pending_timed_out:
            if not synchronous:
                return self._late_call()
            self._drop_late_call()
        self._refuse_while_pending(kind if synchronous else f"{kind}_async")
        return None

    def _refuse_while_pending(self: _Core, method: str) -> None:
        """Raise :class:`~aiovec.PendingCallError` if a ``*_async`` call awaits its
        ``*_wait``: its results are that wait's, and no other call may take them."""
        if self._pending is not None:
            pending = self._pending[0]
            raise PendingCallError(
                f"Calling `{method}` while waiting for a pending call to `{pending}` to "
                f"complete: call {pending}_wait() first",
                pending,
            )

    def _end(self: _Core, kind: str) -> Any:
        """Take the pending ``kind`` call's state (its ``timeout`` checked before: a
        refused wait leaves the call pending)."""
        self._blocking_call(f"{kind}_wait", f"a{kind}")
        self._check_open(f"{kind}_wait")
        if self._pending is None or self._pending[0] != kind:
            raise NoPendingCallError(
                f"Calling `{kind}_wait` without any prior call to `{kind}_async`.", kind
            )
        state, self._pending, self._pending_timed_out = self._pending[1], None, False
        return state
