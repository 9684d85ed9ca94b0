"""Coroutine backend: async envs (:class:`aiovec.AsyncEnv`) as tasks on the event loop.

All envs form one group, served by an :class:`~aiovec._worker.async_server.AsyncEnvServer` on
the loop that drives the vector env: the running loop for the async API, a private one
for the synchronous API. Step timeouts are enforced per env by the server: a late env
is cancelled alone (and rebuilt under the restart policy) while the others go on.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import warnings
from collections.abc import AsyncGenerator, Callable, Generator, Sequence
from typing import Any, cast

from gymnasium.vector import AutoresetMode

from aiovec._loop import new_event_loop, run
from aiovec._transport.protocol import EnvCommand
from aiovec._worker.async_server import (
    CANCEL_GRACE,
    AsyncBlockServer,
    AsyncEnvServer,
    close_after,
    retrieve_interrupts,
)
from aiovec._worker.blocks import BlockHost
from aiovec._worker.host import EnvHost, call_errors
from aiovec.async_env import AsyncEnv
from aiovec.backends._base import LocalBackend, Wakeup, WorkerEvent


class CoroutineBackend(LocalBackend):
    """Hosts async envs (or async batched envs) as tasks of one event loop, in one group."""

    enforces_step_timeout = True

    def __init__(
        self,
        env_fns: Sequence[Callable[[], AsyncEnv]],
        autoreset_mode: AutoresetMode,
        max_restarts: int = 0,
        step_timeout: float | None = None,
        envs_per_block: int | None = None,
        isolated: bool = False,
    ) -> None:
        super().__init__(
            env_fns,
            autoreset_mode,
            max_restarts,
            envs_per_block,
            async_blocks=True,
            isolated=isolated,
        )
        if step_timeout is not None:
            _refuse_blocking_envs(self._host)
        self.groups = [self._host.group]
        self._server: AsyncEnvServer | AsyncBlockServer
        if isinstance(self._host, BlockHost):  # async batched envs: a task per block
            self._server = AsyncBlockServer(
                self._host, emit=lambda reply: self._deliver((0, reply))
            )
        else:
            self._server = AsyncEnvServer(
                self._host, emit=lambda reply: self._deliver((0, reply)), step_timeout=step_timeout
            )
        self._inbox: list[WorkerEvent] = []
        self._wakeup = Wakeup()
        self._private_loop: asyncio.AbstractEventLoop | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # where the runners live
        self._loop_thread = 0  # the thread that runs it
        #: The envs' close that close() scheduled on a running loop (the caller's, or the
        #: private one while a sync call waited on it: that wait runs it to its end).
        self._scheduled_close: asyncio.Task[None] | None = None
        self._envs_closed = False  # that close ran (to its end: it finishes regardless)
        self._waiting_thread: int | None = None  # in wait_blocking's run of the loop
        #: Awaits (or runs) that close when its loop shuts down: see _close_at_loop_shutdown.
        self._shutdown_hook: AsyncGenerator[None, None] | None = None

    # --- commands -------------------------------------------------------------------------

    def submit(self, worker: int, command: EnvCommand) -> None:
        self._server.submit(command, self._current_loop())

    def _current_loop(self) -> asyncio.AbstractEventLoop:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            if self._private_loop is None:
                # asyncio's, not uvloop: a Ctrl-C in an env's code on uvloop is held back
                # until every ready env has run, and leaves that loop marked running, so
                # it can never be closed (its descriptors leak, a notebook cell at a time).
                self._private_loop = new_event_loop("asyncio")
            loop = self._private_loop
        if loop is not self._loop and self._server.runners:
            if self._server.busy():
                raise RuntimeError(
                    "this vector env's async envs are busy on another event loop; "
                    "collect their results (recv) on that loop first"
                )
            self._server.retire()  # idle on the old loop
        self._loop, self._loop_thread = loop, threading.get_ident()
        # The sync API's loop only runs during calls: idle runners cannot park there.
        self._server.park = loop is not self._private_loop
        return loop

    # --- messages -------------------------------------------------------------------------

    def _deliver(self, message: WorkerEvent) -> None:
        self._inbox.append(message)
        self._wakeup.wake()

    def interrupt(self) -> None:
        self._wakeup.wake()

    def nudge(self) -> None:
        self._wakeup.nudge()

    def poll(self) -> list[WorkerEvent]:
        if not self._inbox and self._loop is not None and self._loop is self._private_loop:
            # Envs started from synchronous code live on the private loop, which runs only
            # during calls: give it one turn, so that recv_nowait() polling makes progress
            # (also once every env is done: their replies may wait for a flush there).
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                if self._server.owes_replies() and not self._loop.is_closed():
                    self._loop.run_until_complete(asyncio.sleep(0))
        messages, self._inbox = self._inbox, []
        return messages

    async def wait(self, timeout: float | None = None, *, spin: bool = True) -> list[WorkerEvent]:
        if not self._inbox:
            loop = asyncio.get_running_loop()
            if loop is not self._loop and self._server.busy():
                raise RuntimeError(
                    "the async envs were started on another event loop (send() and recv() "
                    "must run on the same loop; the synchronous API uses a private one)"
                )
            await self._wakeup.wait(loop, timeout)
        return self.poll()

    def wait_blocking(
        self, timeout: float | None = None, *, spin: bool = True
    ) -> list[WorkerEvent]:
        if self._inbox:
            return self.poll()
        loop = self._current_loop()
        waiting = self.wait(timeout)
        # While set, a signal handler's close() schedules the envs' close here (run
        # below) even where the loop does not count as running yet or any more: a
        # run_until_complete of its own, nested in this one, would stop this one.
        self._waiting_thread = threading.get_ident()
        try:
            messages = loop.run_until_complete(waiting)
        except RuntimeError:
            if not loop.is_closed():
                raise
            # Closed as the wait began (a signal handler's close()): the scheduler, told
            # by an empty answer, raises ClosedError.
            waiting.close()
            return []
        finally:
            self._waiting_thread = None
        scheduled = self._scheduled_close
        if scheduled is not None and scheduled.get_loop() is loop and not loop.is_closed():
            self._scheduled_close = None
            loop.run_until_complete(scheduled)  # the envs' close, asked for meanwhile
            loop.close()
        return messages

    # --- shutdown -------------------------------------------------------------------------

    async def aclose(self, timeout: float) -> None:
        """Cancel what runs and await every env's ``close`` (within ``timeout``), on the
        loop the envs live on (which may run in another thread)."""
        elsewhere = self._loop_elsewhere()
        if elsewhere is not None:
            closing = asyncio.run_coroutine_threadsafe(self._server.aclose(timeout), elsewhere)
            await asyncio.wrap_future(closing)
        else:
            await self._server.aclose(timeout)
        if self._private_loop is not None:
            self._private_loop.close()

    async def _close_envs(self, timeout: float) -> None:
        try:
            await self._server.aclose(timeout, despite_cancellation=True)
        finally:  # (not run if the task was cancelled before it started)
            self._envs_closed = True

    def _close_at_loop_shutdown(self, timeout: float) -> None:
        """Make sure the loop's shutdown (``asyncio.run()``'s end, ``shutdown_asyncgens``)
        awaits the scheduled close, or runs it if its task never started: a close that
        came after ``asyncio.run()`` collected the tasks to cancel (in the ``finally`` of
        one of them), or whose task was cancelled before its first step. An async
        generator paused here is what the loop's shutdown closes, awaiting its
        ``finally``."""

        async def closing_at_shutdown() -> AsyncGenerator[None, None]:
            try:
                yield
            finally:
                scheduled = self._scheduled_close
                if scheduled is not None and not scheduled.done():
                    await asyncio.wait([scheduled])
                if not self._envs_closed:
                    await self._close_envs(timeout)

        hook = closing_at_shutdown()
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            try:  # to its yield, which registers it with the running loop (firstiter hook)
                cast("Generator[Any, None, Any]", hook.asend(None)).send(None)
            except StopIteration:
                pass
        if any("shutdown_asyncgens" in str(warning.message) for warning in said):
            # Called from an async generator's finally as the loop shuts down: nothing
            # will run what is scheduled now to its end.
            warnings.warn(
                "close() was called while the event loop shuts down (in the finally of an "
                "async generator it closes, say): the async envs' close may not finish "
                "before the loop closes; use `await envs.aclose()` there",
                RuntimeWarning,
                stacklevel=4,
            )
        else:
            for warning in said:  # not ours to swallow
                warnings.warn_explicit(
                    warning.message, warning.category, warning.filename, warning.lineno
                )
        self._shutdown_hook = hook

    async def wait_closed(self) -> None:
        """Return once the envs' close that :meth:`close` scheduled on this running loop
        (if any) has ended."""
        scheduled = self._scheduled_close
        if scheduled is not None and scheduled.get_loop() is asyncio.get_running_loop():
            await asyncio.wait([scheduled])  # its outcome is its own (a cancellation)

    def _loop_elsewhere(self) -> asyncio.AbstractEventLoop | None:
        """The envs' loop when it runs in another thread than this (where only it may
        cancel their tasks and await their ``close``), else ``None``."""
        loop = self._loop
        if loop is None or loop.is_closed() or not loop.is_running():
            return None
        # By thread, not by the running loop: a signal handler can run in this thread
        # while its loop is running but not (or no longer) set as the running one.
        return None if self._loop_thread == threading.get_ident() else loop

    def close(self, timeout: float) -> None:
        """Cancel what runs and close every env: awaited on this backend's loop when no
        loop is running (on a loop of their own when that one is gone), scheduled on the
        running loop otherwise (use ``aclose`` there to wait for it; the loop's shutdown
        awaits it too), skipped when ``timeout`` is 0 (``__del__``, Ctrl-C). When that
        loop runs in another thread, it is done there (waited for, up to ``timeout``)."""
        elsewhere = self._loop_elsewhere()
        if elsewhere is not None:
            closing = asyncio.run_coroutine_threadsafe(self._server.aclose(timeout), elsewhere)
            if timeout:
                try:
                    closing.result(timeout + CANCEL_GRACE)
                except Exception:  # late (its envs ignore cancellation), or failed: done
                    closing.cancel()
            return
        runners = self._server.retire()
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        loop = self._loop or self._private_loop
        if (
            running is None
            and loop is not None
            and (loop.is_running() or self._waiting_thread == threading.get_ident())
        ):
            running = loop  # this thread's (see _loop_elsewhere), as a signal handler saw it
        if running is not None and timeout:
            # Nobody awaits it (but wait_closed): it ends even if asyncio.run() cancels it
            # on its way out, which it does to every task left on the loop.
            self._scheduled_close = running.create_task(self._close_envs(timeout))
            self._close_at_loop_shutdown(timeout)
        elif loop is not None and not loop.is_closed() and timeout:
            loop.run_until_complete(self._server.aclose(timeout))
        elif timeout:  # their loop is gone (asyncio.run() returned), or none ever ran
            run(close_after([], self._host.envs.values(), timeout))
        else:
            for env in self._host.envs.values():
                result = _close_call(env)
                if inspect.isawaitable(result):
                    getattr(result, "close", lambda: None)()  # never run: discard quietly
        private = self._private_loop
        if private is not None and running is not private:
            if running is None and not private.is_closed():
                # Let the cancelled runners end (their envs' finally blocks run), even with
                # timeout 0: a loop closed over pending tasks warns about each of them.
                pending = [r for r in runners if r.get_loop() is private and not r.done()]
                if pending:
                    private.run_until_complete(asyncio.wait(pending, timeout=CANCEL_GRACE))
                elif timeout:
                    private.run_until_complete(asyncio.sleep(0))  # cancellations land
            elif not private.is_closed():
                # Another loop runs in this thread, so this one cannot: its runners are
                # dropped, quietly (closing a loop over pending tasks warns about each).
                for runner in runners:
                    if runner.get_loop() is private and not runner.done():
                        runner._log_destroy_pending = False  # type: ignore[attr-defined]
                        coroutine = runner.get_coro()
                        if coroutine is not None:
                            coroutine.close()  # its env's finally blocks run now
            retrieve_interrupts(private)
            private.close()


def _close_call(env: Any) -> Any:
    try:
        return env.close()
    except call_errors():  # closing must finish
        return None


#: Seconds the envs of a refused construction get to close (``close_timeout``'s default).
_REFUSED_CLOSE_TIMEOUT = 5.0


def _refuse_blocking_envs(host: EnvHost | BlockHost) -> None:
    """Raise ``ValueError`` (after closing ``host``'s envs) if it holds blocking envs: on
    this backend they run on the loop itself, where no ``step_timeout`` can stop them."""
    if not isinstance(host, EnvHost):  # async batched envs with a timeout: refused earlier
        return
    blocking = [env_id for env_id, env in host.envs.items() if not isinstance(env, AsyncEnv)]
    if not blocking:
        return
    # Every env closed, async ones awaited: on the running loop (construction from a
    # coroutine) as a task, else on a loop of their own, now.
    closing = close_after([], host.envs.values(), _REFUSED_CLOSE_TIMEOUT)
    try:
        asyncio.get_running_loop().create_task(closing)
    except RuntimeError:
        run(closing)
    raise ValueError(
        f"step_timeout cannot interrupt envs {blocking} on backend='coroutine': they are "
        "blocking envs (not aiovec.AsyncEnv), stepped on the event loop itself; use "
        "backend='process' (a late env's worker is killed), or leave step_timeout out"
    )
