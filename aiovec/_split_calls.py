"""Gymnasium's split calls: ``reset_async``/``reset_wait``, ``step_async``/``step_wait``
and ``call_async``/``call_wait``, as :class:`gymnasium.vector.AsyncVectorEnv` has them,
on top of :class:`aiovec.VecEnv`'s async core.

Invariant (in ``_pending``): at most one split call is pending, ``(kind, state)``;
a ``*_wait`` that times out leaves it pending, as nothing of it is lost. This module
only sequences the split calls: what they do is the vector env's (it must not reach
the scheduler or a backend itself).
"""

from __future__ import annotations

from collections.abc import Coroutine, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from aiovec._checks import check_seconds
from aiovec.errors import EnvError, NoPendingCallError, PendingCallError, WaitTimeoutError

if TYPE_CHECKING:
    from aiovec._scheduler import Ticket

_T = TypeVar("_T")


class _Core(Protocol):
    """What the split calls need of the vector env."""

    _pending: tuple[str, Any] | None
    _pending_timed_out: bool

    def _check_open(self, operation: str) -> None: ...
    def _blocking_call(self, method: str, async_method: str) -> None: ...
    def _run(self, coroutine: Coroutine[Any, Any, _T]) -> _T: ...
    def _reset_submit(self, seed: Any, options: Any) -> list[Ticket]: ...
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
    def _wait_pending(self, kind: str, state: Any, waiting: Coroutine[Any, Any, _T]) -> _T: ...
    def _begin(self, kind: str, synchronous: bool = False) -> None: ...
    def _end(self, kind: str) -> Any: ...
    def _waiting(
        self, kind: str, state: Any, timeout: float | None
    ) -> Coroutine[Any, Any, Any]: ...
    def _drop_late_call(self) -> None: ...
    def _refuse_while_pending(self, method: str) -> None: ...


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
        self._begin("reset")
        self._pending = ("reset", self._reset_submit(seed, options))

    def reset_wait(self: _Core, timeout: float | None = None) -> tuple[Any, dict[str, Any]]:
        """Finish :meth:`reset_async`."""
        timeout = check_seconds("timeout", timeout, negative_ok=True)
        tickets = self._end("reset")
        return self._wait_pending("reset", tickets, self._reset_wait(tickets, timeout))

    def step_async(self: _Core, actions: Any) -> None:
        """Start a step of every env; finish it with :meth:`step_wait`."""
        self._begin("step")
        self._pending = ("step", self._send(actions, None, stream=False))

    def step_wait(self: _Core, timeout: float | None = None) -> tuple[Any, ...]:
        """Finish :meth:`step_async`."""
        timeout = check_seconds("timeout", timeout, negative_ok=True)
        tickets = self._end("step")
        return self._wait_pending("step", tickets, self._step_wait(tickets, timeout))

    def call_async(self: _Core, name: str, *args: Any, **kwargs: Any) -> None:
        """Start a call on every env; finish it with :meth:`call_wait`."""
        self._begin("call")
        self._pending = ("call", self._call_submit(name, args, kwargs))

    def call_wait(self: _Core, timeout: float | None = None) -> tuple[Any, ...]:
        """Finish :meth:`call_async`."""
        timeout = check_seconds("timeout", timeout, negative_ok=True)
        state: tuple[list[int], list[Ticket]] = self._end("call")
        return self._wait_pending("call", state, self._call_wait(*state, timeout))

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

    def _wait_pending(self: _Core, kind: str, state: Any, waiting: Coroutine[Any, Any, _T]) -> _T:
        """Run the wait of a ``*_async`` call; after a timeout the call stays pending
        (its ``*_wait`` may be called again), as nothing of it is lost."""
        try:
            return self._run(waiting)
        except WaitTimeoutError:
            self._pending, self._pending_timed_out = (kind, state), True
            raise

    def _drop_late_call(self: _Core) -> None:
        """Wait for the call whose ``*_wait`` timed out and drop its results, so that a
        new call can start: AsyncVectorEnv takes new calls after a timeout (and hands
        the late results to the next call); here they are never handed to anyone."""
        assert self._pending is not None
        kind, state = self._pending
        self._pending, self._pending_timed_out = None, False
        try:
            self._run(self._waiting(kind, state, None))
        except EnvError:
            pass  # the dropped call's env errors: already logged, as Gymnasium logs them

    def _begin(self: _Core, kind: str, synchronous: bool = False) -> None:
        """Refuse a call while a ``*_async`` call is pending (before anything is sent)."""
        self._check_open(kind)
        if self._pending is not None and self._pending_timed_out:
            self._drop_late_call()
        self._refuse_while_pending(kind if synchronous else f"{kind}_async")

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
