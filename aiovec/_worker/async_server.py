"""Runs commands on async envs, each env as a task of the running event loop.

One implementation for every place envs are stepped concurrently: the coroutine backend
(the agent's own loop), a subprocess worker hosting async envs (one loop per worker),
and a Ray actor whose envs mostly wait. Commands to one env run in order; different
envs overlap their waits. Step results are answered as envs finish, gathered into one
reply per command per loop iteration, so a thousand envs that wake together cost one
message, not a thousand. Other commands answer once all their envs are done.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from functools import partial
from typing import Any, TypeVar, cast

from aiovec._transport.protocol import (
    Call,
    EnvCommand,
    ErrorInfo,
    Reply,
    Reset,
    Step,
    merge_replies,
)
from aiovec._worker.blocks import BlockHost
from aiovec._worker.host import EnvHost, StepOutcome, call_errors, error_info, running_task
from aiovec.errors import StepTimeoutError

#: What recovering one env gives: a step's outcome, or a reset's reply.
_Answer = TypeVar("_Answer", StepOutcome, Reply)

logger = logging.getLogger("aiovec")

#: Seconds a late async env has to act on its cancellation before it is abandoned.
CANCEL_GRACE = 0.1


class AsyncEnvServer:
    """Executes commands on ``host``'s envs; every reply goes to ``emit``.

    With ``step_timeout``, an env's command that takes longer is cancelled alone and
    fails with :class:`aiovec.StepTimeoutError` (a step is then handled like any failed
    step: reported, or the env rebuilt under the host's restart policy).
    """

    def __init__(
        self,
        host: EnvHost,
        emit: Callable[[Reply], None],
        step_timeout: float | None = None,
    ) -> None:
        self.host = host
        self._emit = emit
        self._step_timeout = step_timeout
        self._queues: dict[int, deque[tuple[EnvCommand, int]]] = {e: deque() for e in host.envs}
        self.runners: dict[int, asyncio.Task[None]] = {}
        self._parked: dict[int, asyncio.Future[None]] = {}  # idle runners wait on these
        self._expired: set[int] = set()  # envs whose command is being cancelled for lateness
        self._gathering: dict[int, list[Reply | None]] = {}  # seq -> per-position replies
        self._finished_steps: dict[int, list[StepOutcome]] = {}  # seq -> not yet emitted
        self._flush_scheduled = False
        #: Runners end instead of parking when idle (a loop that only runs during calls).
        self.park = True

    def submit(self, command: EnvCommand, loop: asyncio.AbstractEventLoop) -> None:
        """Queue ``command`` on each of its envs; runners start on ``loop``."""
        if not isinstance(command, Step):
            self._gathering[command.seq] = [None] * len(command.env_ids)
        queues, parked = self._queues, self._parked
        for position, env_id in enumerate(command.env_ids):
            queues[env_id].append((command, position))
            waiting = parked.pop(env_id, None)
            if waiting is not None:
                waiting.set_result(None)  # cheaper than starting a task
            elif env_id not in self.runners:
                self.runners[env_id] = _runner(loop, self._run(env_id, loop))

    def busy(self) -> bool:
        """Whether some env has a command queued or running."""
        return any(self._queues[env_id] for env_id in self.runners)

    def owes_replies(self) -> bool:
        """Whether a reply is still to come without a new command: an env busy, or
        finished steps whose flush waits for the loop's next turn."""
        return self._flush_scheduled or self.busy()

    def retire(self) -> list[asyncio.Task[None]]:
        """Cancel every runner (idle ones on a loop being left, or all at shutdown)."""
        if self._finished_steps:  # its flush was scheduled on the loop being left
            self._flush()
        runners = list(self.runners.values())
        for runner in runners:
            if not runner.get_loop().is_closed():  # else it never runs again anyway
                runner.cancel()
        self.runners.clear()
        self._parked.clear()
        return runners

    async def aclose(
        self, timeout: float | None = None, despite_cancellation: bool = False
    ) -> None:
        """Cancel every runner, then close every env, awaiting async ``close`` methods
        for up to ``timeout`` seconds. Errors of envs that fail to close are ignored.
        ``despite_cancellation``: as :func:`close_after`."""
        await close_after(self.retire(), self.host.envs.values(), timeout, despite_cancellation)

    async def _run(self, env_id: int, loop: asyncio.AbstractEventLoop) -> None:
        queue = self._queues[env_id]
        try:
            while True:
                while queue:
                    command, position = queue[0]
                    if self._step_timeout is None:
                        result = await self._start(env_id, command, position)
                        if self.runners.get(env_id) is not asyncio.current_task():
                            return  # retired meanwhile (its env swallowed the cancellation)
                        self._finish(command, position, result, loop)
                    else:
                        await self._execute_in_time(env_id, command, position, loop)
                        if self.runners.get(env_id) is not asyncio.current_task():
                            return  # abandoned (a successor answered), or retired
                    queue.popleft()
                if not self.park:
                    return
                parked = self._parked[env_id] = loop.create_future()
                await parked
        except asyncio.CancelledError:
            self._parked.pop(env_id, None)
            if self.runners.get(env_id) is asyncio.current_task():  # not retired: the loop
                self._fail_queue(env_id, partial(_lost, env_id))
            queue.clear()
            raise
        except Exception as exc:
            # Raised in this runner outside the env's own calls (the host captures those):
            # by a signal handler of the caller's (a timeout decorator), when the env runs
            # on the caller's loop. What it owed fails with it, rather than never answered;
            # the next command starts a new runner.
            self._parked.pop(env_id, None)
            if self.runners.get(env_id) is asyncio.current_task():
                self._fail_queue(env_id, partial(_failed, env_id, exc))
            queue.clear()
        finally:
            current = running_task()  # None: its coroutine is closed, its loop gone
            if current is not None and self.runners.get(env_id) is current:
                del self.runners[env_id]

    def _fail_queue(self, env_id: int, error: Callable[[EnvCommand], ErrorInfo]) -> None:
        """Answer every command queued for env ``env_id`` with ``error(command)``."""
        for command, position in self._queues[env_id]:
            failed = error(command)
            if type(command) is Step:
                self._emit(Reply(command.seq, [env_id], errors=[failed]))
            else:
                self._part_done(command, position, Reply(command.seq, [env_id], errors=[failed]))

    def _start(self, env_id: int, command: EnvCommand, position: int) -> Awaitable[Any]:
        """The host's coroutine for env ``env_id``'s part of ``command`` (awaited by the
        runner itself: one coroutine frame less on every resume of the env)."""
        if type(command) is Step:
            return self.host.step_async(env_id, self.host.action_of(command, position))
        return self.host.execute_async(command.subset([position]))

    def _finish(
        self, command: EnvCommand, position: int, result: Any, loop: asyncio.AbstractEventLoop
    ) -> None:
        if type(command) is Step:
            self._step_done(command.seq, result, loop)
        else:
            self._part_done(command, position, result)

    async def _execute_in_time(
        self, env_id: int, command: EnvCommand, position: int, loop: asyncio.AbstractEventLoop
    ) -> None:
        """Run env ``env_id``'s part of ``command``, cancelled after ``step_timeout``:
        the command then fails with :class:`aiovec.StepTimeoutError`."""
        # Only called with a step_timeout (see _run), from inside a runner task.
        timeout = cast(float, self._step_timeout)
        runner = cast("asyncio.Task[None]", asyncio.current_task())
        timer = loop.call_later(timeout, self._expire, env_id, runner, loop)
        try:
            result = await self._start(env_id, command, position)
        except asyncio.CancelledError:
            if self.runners.get(env_id) is not runner:
                return  # abandoned meanwhile (see _abandon): already answered
            if env_id not in self._expired:
                raise  # shutting down, not a late env
            if hasattr(runner, "uncancel"):  # Python 3.11+: this cancellation is handled
                runner.uncancel()
        else:
            if self.runners.get(env_id) is runner:
                self._finish(command, position, result, loop)
            return
        finally:
            timer.cancel()
            if self.runners.get(env_id) is runner:
                self._expired.discard(env_id)
        await self._answer_late(env_id, command, position, loop)

    async def _answer_late(
        self, env_id: int, command: EnvCommand, position: int, loop: asyncio.AbstractEventLoop
    ) -> None:
        """Fail env ``env_id``'s part of ``command`` with StepTimeoutError (a step or a
        reset is then handled like any that failed: rebuilt under the restart policy)."""
        timeout = cast(float, self._step_timeout)  # only late with a step_timeout
        late = StepTimeoutError(None, [env_id], [env_id], timeout)
        if type(command) is Step:
            recover_step = partial(self.host.recover_async, env_id)
            outcome = await self._recover_in_time(
                env_id, late, recover_step, partial(_failed_step, env_id)
            )
            self._step_done(command.seq, outcome, loop)
        elif type(command) is Reset:  # rebuilt and reset again, as a reset that raised
            own = command.subset([position])
            recover_reset = partial(self.host.recover_reset_async, own)
            recovered = await self._recover_in_time(
                env_id, late, recover_reset, partial(_failed_reset, own)
            )
            self._part_done(command, position, recovered)
        else:
            operation = type(command).__name__.lower()
            error = error_info(env_id, operation, late)
            self._part_done(command, position, Reply(command.seq, [env_id], errors=[error]))

    async def _recover_in_time(
        self,
        env_id: int,
        error: BaseException,
        recover: Callable[[BaseException], Awaitable[_Answer]],
        failed: Callable[[BaseException], _Answer],
    ) -> _Answer:
        """The host's recovery of one env from ``error`` (the restart policy: ``recover``
        an outcome or reply), each attempt (closing the env, building and resetting its
        replacement) bounded by ``step_timeout``: an attempt late in turn is a failure
        in a row of its own, its env abandoned (closed in the background, not awaited),
        until the policy gives up; ``failed`` says so when an attempt cannot be ended."""
        timeout = cast(float, self._step_timeout)  # only late with a step_timeout
        while True:
            recovery = asyncio.ensure_future(recover(error))
            try:
                done, _ = await asyncio.wait([recovery], timeout=timeout)
            except asyncio.CancelledError:  # shutting down
                recovery.cancel()
                raise
            if done:
                return recovery.result()
            recovery.cancel()
            ended, _ = await asyncio.wait([recovery], timeout=CANCEL_GRACE)
            error = StepTimeoutError(None, [env_id], [env_id], timeout)
            _start_closing([self.host.abandon(env_id, error)])  # not waited for
            if not ended:  # it ignores its cancellation: no attempt may race with it
                return failed(error)

    def _expire(
        self, env_id: int, runner: asyncio.Task[None], loop: asyncio.AbstractEventLoop
    ) -> None:
        if self.runners.get(env_id) is runner:
            self._expired.add(env_id)
            runner.cancel()
            # An env that swallows the cancellation must not keep its command late.
            loop.call_later(CANCEL_GRACE, self._abandon, env_id, runner, loop)

    def _abandon(
        self, env_id: int, runner: asyncio.Task[None], loop: asyncio.AbstractEventLoop
    ) -> None:
        """The late env ignored its cancellation: answer its command without it, and
        serve its next commands from a new runner (the old task is left to itself)."""
        if self.runners.get(env_id) is not runner or env_id not in self._expired:
            return  # the cancellation took effect
        self._expired.discard(env_id)
        successor = _runner(loop, self._take_over(env_id, loop))
        self.runners[env_id] = successor

    async def _take_over(self, env_id: int, loop: asyncio.AbstractEventLoop) -> None:
        queue = self._queues[env_id]
        command, position = queue[0]
        await self._answer_late(env_id, command, position, loop)
        queue.popleft()
        await self._run(env_id, loop)

    def _step_done(self, seq: int, outcome: StepOutcome, loop: asyncio.AbstractEventLoop) -> None:
        finished = self._finished_steps.get(seq)
        if finished is None:
            self._finished_steps[seq] = [outcome]
        else:
            finished.append(outcome)
        if not self._flush_scheduled:
            # After the other envs woken in this iteration had their turn.
            self._flush_scheduled = True
            loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        finished, self._finished_steps = self._finished_steps, {}
        for seq, outcomes in finished.items():
            self._emit(self.host.step_reply(seq, outcomes))

    def _part_done(self, command: EnvCommand, position: int, reply: Reply) -> None:
        parts = self._gathering[command.seq]
        parts[position] = reply
        if all(part is not None for part in parts):
            del self._gathering[command.seq]
            self._emit(merge_replies(cast("list[Reply]", parts)))  # none is None now


def _failed_step(env_id: int, error: BaseException) -> StepOutcome:
    """The outcome of env ``env_id``'s step that failed with ``error``."""
    return StepOutcome(env_id, None, error_info(env_id, "step", error), False)


def _failed_reset(command: Reset, error: BaseException) -> Reply:
    """The reply to ``command``, a reset of one env that failed with ``error``."""
    env_id = command.env_ids[0]
    return Reply(command.seq, [env_id], errors=[error_info(env_id, "reset", error)])


class AsyncBlockServer:
    """Executes commands on ``host``'s async batched envs, each block as a task of the
    running loop: a step is answered block by block as blocks finish (first-ready at
    block granularity); another command once all its blocks are done. Commands to one
    block run in order. The interface of :class:`AsyncEnvServer` (step timeouts are not
    enforced for blocks).
    """

    def __init__(self, host: BlockHost, emit: Callable[[Reply], None]) -> None:
        self.host = host
        self._emit = emit
        # first row -> (command, its rows' positions for a step, else the block's index)
        self._queues: dict[int, deque[tuple[EnvCommand, Any]]] = {
            first_row: deque() for first_row in host.envs
        }
        self.runners: dict[int, asyncio.Task[None]] = {}
        # seq -> (blocks still to answer, each block's outcome in blocks_of order)
        self._gathering: dict[int, tuple[list[int], list[Any]]] = {}
        #: Accepted for AsyncEnvServer's interface: a block's runner always ends when idle.
        self.park = False

    def submit(self, command: EnvCommand, loop: asyncio.AbstractEventLoop) -> None:
        """Queue ``command`` on each of its blocks; runners start on ``loop``."""
        blocks = self.host.blocks_of(command.env_ids)
        if not isinstance(command, Step):
            self._gathering[command.seq] = ([len(blocks)], [None] * len(blocks))
        for index, (first_row, positions) in enumerate(blocks):
            where = positions if isinstance(command, Step) else index
            self._queues[first_row].append((command, where))
            if first_row not in self.runners:
                self.runners[first_row] = _runner(loop, self._run(first_row))

    def busy(self) -> bool:
        """Whether some block has a command queued or running."""
        return any(self._queues[first_row] for first_row in self.runners)

    def owes_replies(self) -> bool:
        """Whether a reply is still to come without a new command (a block's replies
        leave as it finishes: only a busy block owes one)."""
        return self.busy()

    def retire(self) -> list[asyncio.Task[None]]:
        """Cancel every runner."""
        runners = list(self.runners.values())
        for runner in runners:
            if not runner.get_loop().is_closed():  # else it never runs again anyway
                runner.cancel()
        self.runners.clear()
        return runners

    async def aclose(
        self, timeout: float | None = None, despite_cancellation: bool = False
    ) -> None:
        """Cancel every runner, then close every block (awaiting async ``close``
        methods for up to ``timeout`` seconds); errors while closing are ignored.
        ``despite_cancellation``: as :func:`close_after`."""
        await close_after(self.retire(), self.host.envs.values(), timeout, despite_cancellation)

    async def _run(self, first_row: int) -> None:
        queue = self._queues[first_row]
        try:
            while queue:
                command, where = queue[0]
                if isinstance(command, Step):
                    reply = await self.host.execute_block_async(command, first_row, where)
                    if self.runners.get(first_row) is not asyncio.current_task():
                        return  # retired meanwhile (its block swallowed the cancellation)
                    queue.popleft()
                    self._emit(reply)
                    continue
                blocks = self.host.blocks_of(command.env_ids)
                index = cast(int, where)
                outcome = await self.host.execute_block_async(command, first_row, blocks[index][1])
                if self.runners.get(first_row) is not asyncio.current_task():
                    return  # retired meanwhile
                queue.popleft()
                remaining, outcomes = self._gathering[command.seq]
                outcomes[index] = outcome
                remaining[0] -= 1
                if not remaining[0]:
                    del self._gathering[command.seq]
                    self._emit(self.host.other_reply(command, outcomes))
        except asyncio.CancelledError:
            if self.runners.get(first_row) is asyncio.current_task():  # not retired: the
                for command, _ in queue:  # loop is going away: fail what it owed
                    self._emit(self._lost_reply(first_row, command, partial(_lost, first_row)))
            queue.clear()
            raise
        except Exception as exc:  # outside the block's own calls: see AsyncEnvServer._run
            if self.runners.get(first_row) is asyncio.current_task():
                failed = partial(_failed, first_row, exc)
                for command, _ in queue:
                    self._emit(self._lost_reply(first_row, command, failed))
            queue.clear()
        finally:
            if self.runners.get(first_row) is asyncio.current_task():
                del self.runners[first_row]

    def _lost_reply(
        self, first_row: int, command: EnvCommand, error_of: Callable[[EnvCommand], ErrorInfo]
    ) -> Reply:
        """The reply to ``command`` for a block that cannot finish it, with the error
        ``error_of(command)`` (one error for the block; for another command, for all of
        its blocks)."""
        size = self.host.envs_per_block
        rows = list(range(first_row, first_row + size))
        error = error_of(command)
        error.env_ids = rows
        if isinstance(command, Step):
            return Reply(command.seq, rows, errors=[error])
        self._gathering.pop(command.seq, None)
        return Reply(command.seq, command.env_ids, errors=[error])


async def close_after(
    runners: list[asyncio.Task[None]],
    envs: Iterable[Any],
    timeout: float | None,
    despite_cancellation: bool = False,
) -> None:
    """Wait for the cancelled ``runners`` to end, then close every env (or batched
    env), awaiting async ``close`` methods, all within about ``timeout`` seconds each.
    Errors of envs that fail to close are ignored: closing must finish.

    ``despite_cancellation``: a cancellation of the task running this is put off until
    every env's close has ended (or its ``timeout``), then raised. For a close nobody
    awaits (scheduled by a synchronous ``close()`` on a running loop), which
    ``asyncio.run()`` would otherwise cancel on its way out, before any env closed."""
    cancelled = False

    async def wait(tasks: Sequence[asyncio.Future[Any]]) -> set[asyncio.Future[Any]]:
        """The tasks still running after ``timeout``."""
        nonlocal cancelled
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                return (await asyncio.wait(tasks, timeout=left))[1]
            except asyncio.CancelledError:
                if not despite_cancellation:
                    raise
                cancelled = True
                current = asyncio.current_task()
                if current is not None and hasattr(current, "uncancel"):  # 3.11+
                    current.uncancel()

    if runners:  # an env that swallows its cancellation is abandoned at the timeout
        await wait(runners)
    closing = _start_closing(envs)
    if closing:
        # Not wait_for: on timeout it waits for the cancelled closes to end, and a close
        # that ignores its cancellation would hold aclose() for as long as it likes.
        late = await wait(list(closing))
        if despite_cancellation:
            # asyncio.run() cancels every task it finds on its way out, these closes too:
            # closes interrupted so run again (Env.close may be called more than once),
            # as tasks that came after its sweep.
            interrupted = [env for task, env in closing.items() if task.cancelled()]
            if interrupted and (again := _start_closing(interrupted)):
                late |= await wait(list(again))
        for task in late:  # cancelled; those that ignore it are abandoned
            task.cancel()
            # Said once, here, in aiovec's words: not again as asyncio's "Task was
            # destroyed but it is pending!" when a loop closes over the abandoned close.
            task._log_destroy_pending = False  # type: ignore[attr-defined]
        if late:
            try:
                _, stubborn = await asyncio.wait(late, timeout=CANCEL_GRACE)
            except asyncio.CancelledError:
                if not despite_cancellation:
                    raise
                cancelled, stubborn = True, {task for task in late if not task.done()}
            if len(stubborn) < len(late):
                logger.warning(
                    "%d env close() call(s) did not finish within close_timeout=%s s: cancelled",
                    len(late) - len(stubborn),
                    timeout,
                )
            if stubborn:
                logger.warning(
                    "%d env close() call(s) did not finish within close_timeout=%s s and "
                    "ignore cancellation: abandoned (an async env's close should return "
                    "promptly when cancelled)",
                    len(stubborn),
                    timeout,
                )
    if cancelled:
        raise asyncio.CancelledError


def _start_closing(envs: Iterable[Any]) -> dict[asyncio.Future[Any], Any]:
    """Call every env's ``close``; the tasks awaiting those that are async, with their env.
    Errors of envs that fail to close are ignored."""
    closing: dict[asyncio.Future[Any], Any] = {}
    for env in envs:
        try:
            result: Any = env.close()  # async envs return an awaitable
        except call_errors():
            continue
        if inspect.isawaitable(result):
            task = asyncio.ensure_future(result)
            task.add_done_callback(_forget_outcome)
            closing[task] = env
    return closing


def _runner(
    loop: asyncio.AbstractEventLoop, coroutine: Coroutine[Any, Any, None]
) -> asyncio.Task[None]:
    """A task serving an env's (or a block's) commands on ``loop``."""
    task = loop.create_task(coroutine)
    task.add_done_callback(_retrieve_exit)
    _runners.add(task)
    return task


#: Every runner task not yet collected (see retrieve_interrupts).
_runners: weakref.WeakSet[asyncio.Task[None]] = weakref.WeakSet()


def retrieve_interrupts(loop: asyncio.AbstractEventLoop) -> None:
    """Retrieve what the runners on ``loop`` ended with, before it closes: a Ctrl-C (or
    an env's ``sys.exit``) that left the loop at once leaves their done callbacks
    (:func:`_retrieve_exit`) unrun, and asyncio would log it as "never retrieved"."""
    for task in list(_runners):
        if task.get_loop() is loop and task.done() and not task.cancelled():
            task.exception()


def _retrieve_exit(task: asyncio.Future[Any]) -> None:
    # A KeyboardInterrupt or SystemExit from an env on the caller's loop (a Ctrl-C in a
    # blocking env's step, an env's sys.exit) leaves run_until_complete as itself; the
    # task keeps it too, which asyncio would log later as "never retrieved".
    if task.cancelled():
        return
    exc = task.exception()  # (retrieved now, whatever it is)
    if exc is not None and not isinstance(exc, (KeyboardInterrupt, SystemExit)):
        # Not an env's error (the host captures those): aiovec's own, said at once.
        logger.error("an env runner failed", exc_info=exc)


def _forget_outcome(task: asyncio.Future[Any]) -> None:
    # Closing ignores errors: retrieve them so that asyncio does not log them as lost.
    if not task.cancelled():
        task.exception()


def _operation(command: EnvCommand) -> str:
    return type(command).__name__.lower() if not isinstance(command, Call) else command.name


def _failed(env_id: int, exc: Exception, command: EnvCommand) -> ErrorInfo:
    """The error of a command whose runner ``exc`` ended (see ``AsyncEnvServer._run``)."""
    return error_info(env_id, _operation(command), exc)


def _lost(env_id: int, command: EnvCommand) -> ErrorInfo:
    """The error of a command whose event loop stopped before it finished."""
    return ErrorInfo(
        env_id,
        _operation(command),
        "RuntimeError",
        "the event loop running this async env stopped (e.g. asyncio.run() returned) "
        "before the command finished, so its result is lost: send() and recv() must run "
        "on one event loop (or use the synchronous API throughout)",
        "",
        exc_module="builtins",
    )
