"""Per-env state, sequence-numbered requests and the ready-queue.

Every env is IDLE (may be sent an action), BUSY (a step is in flight) or READY (its
step result arrived and waits in the ready-queue for ``recv``). Resets and calls do not
change that state: a worker runs an env's commands in the order they were sent, so a
call may be sent to an env while it steps (and a step after a reset still in flight).
Each command carries a fresh sequence number; a reply is matched to its request by that
number, so a late or unknown reply can never be taken for a current one.

Messages are applied synchronously (:meth:`Scheduler.dispatch`), never across an
``await``: cancelling a coroutine that waits here loses nothing.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NoReturn, cast

import numpy as np

from aiovec._checks import check_seconds
from aiovec._stats import StatsRecorder
from aiovec._transport.by_value import own_copy
from aiovec._transport.protocol import EnvCommand, Reply, Reset, Step
from aiovec.backends._base import Backend, WorkerEvent, WorkerExit, WorkerGone
from aiovec.errors import (
    ClosedError,
    StepTimeoutError,
    WaitTimeoutError,
    WorkerCrashedError,
)

logger = logging.getLogger("aiovec")

IDLE, BUSY, READY = 0, 1, 2


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _nothing() -> None:
    pass


def raise_alone(error: BaseException) -> NoReturn:
    """Raise ``error`` (one the vector env kept, maybe raised before) with a traceback of
    this raise only: an error raised again and again (a dead worker's crash, by every
    call on its envs) would otherwise carry every earlier raise's frames, and whatever
    they hold, growing each time. No frame here keeps ``error`` (its traceback would
    make a reference cycle through that frame); the caller must not either (``del`` its
    name in a ``finally``)."""
    try:
        raise error.with_traceback(None)
    finally:
        del error


class Ticket:
    """One command sent to one worker, and what came back."""

    __slots__ = (
        "worker", "env_ids", "rows", "is_step", "command", "sent_at", "started_at",
        "done", "reply", "failure", "errors", "answered",
    )  # fmt: skip

    def __init__(
        self,
        worker: int,
        env_ids: list[int],
        rows: Any,
        is_step: bool,
        command: EnvCommand,
        sent_at: float,
    ) -> None:
        self.worker = worker
        self.command = command  # kept to send again to a restarted worker
        self.sent_at = sent_at
        # When its envs got to it, on a worker stepping them at once: fixed once found
        # (see Scheduler._kill_times); None until then.
        self.started_at: float | None = None
        self.env_ids = env_ids
        self.rows = rows  # env_ids as an index into per-env arrays (a slice when contiguous)
        self.is_step = is_step
        self.done = False
        self.reply: Reply | None = None
        # The worker died before answering (a control command: a step's failure goes
        # to its envs' errors in the scheduler).
        self.failure: Exception | None = None
        # env id -> EnvError, until a step's are moved to the scheduler's errors
        self.errors: dict[int, Exception] = {}
        # env ids already answered, once a streamed step has answered in parts
        self.answered: set[int] | None = None

    def unanswered(self) -> int:
        """How many envs of this ticket still owe a result."""
        return len(self.env_ids) - (len(self.answered) if self.answered else 0)


class Scheduler:
    """Tracks which env is doing what; routes backend messages to tickets and the ready-queue."""

    def __init__(
        self,
        backend: Backend,
        num_envs: int,
        *,
        restart: bool = False,
        max_restarts: int = 0,
        step_timeout: float | None = None,
    ) -> None:
        self.backend = backend
        self.restart = restart
        self.max_restarts = max_restarts
        self.step_timeout = step_timeout
        self.worker_restarts = [0] * len(backend.groups)  # total, per worker
        self._crashes_in_a_row = [0] * len(backend.groups)
        # Worker deaths in a row while each env was running (the env to blame), so that
        # another env of the worker stepping fine meanwhile does not hide a crash loop.
        self._env_crashes_in_a_row: dict[int, int] = {}
        self._timed_out: dict[int, list[int]] = {}  # worker -> env ids it was killed for
        # worker -> when its last answer arrived, and env id -> when its last answer
        # arrived (kept with a step_timeout only: see _kill_times)
        self._answered_at: dict[int, float] = {}
        self._env_answered_at: dict[int, float] = {}
        self.state = bytearray(num_envs)  # IDLE/BUSY/READY per env (cheap single-item access)
        self.worker_of = np.empty(num_envs, dtype=np.intp)
        for worker, group in enumerate(backend.groups):
            self.worker_of[group] = worker
        self._worker_list: list[int] = self.worker_of.tolist()  # single items, cheaply
        groups = backend.groups
        # One group of every env (inline, coroutine): the very list its host holds, so a
        # step of all envs is recognised by identity there.
        whole = len(groups) == 1 and len(groups[0]) == num_envs
        self.all_env_ids = groups[0] if whole else list(range(num_envs))
        # The whole batch, split by worker; rows are slices (groups are contiguous).
        # The backend's own lists: a worker's whole group is recognised by identity.
        self._all_groups = [
            (worker, group, slice(group[0], group[-1] + 1))
            for worker, group in enumerate(backend.groups)
        ]
        self.ready_queue: deque[int] = deque()
        self.num_busy = 0  # envs with a command in flight
        self.num_stepping = 0  # of those, envs with a step in flight (what recv waits for)
        self.infos: dict[int, dict[str, Any]] = {}  # env id -> its non-empty info, until taken
        #: Calls whose code is on this thread's stack now (not those suspended or
        #: blocked in a wait): a close() while it is not 0 came from a signal handler or
        #: an env's own code, and must not pull the state from under that code.
        self.active = 0
        #: Closes the vector env: set by a close() asked for while :attr:`active`, run by
        #: the next wait of a call (or when the calls return, see VecEnv).
        self.close_requested: Callable[[], None] | None = None
        #: The dtype batched envs return their rewards in (``None``: float64, Gymnasium's
        #: for single envs); results are given in it (see _note_reward_dtype).
        self.reward_dtype: np.dtype[Any] | None = None
        self.errors: dict[int, Exception] = {}  # env id -> failure to report instead of a result
        self.observations: list[Any] = [None] * num_envs  # for spaces not in shared memory
        self.dead_workers: dict[int, Exception] = {}  # worker -> what to raise
        #: Where time goes (see :meth:`aiovec.VecEnv.stats`).
        self.stats = StatsRecorder()
        self._local_workers = backend.local_workers
        # Workers in this process whose calls' results reach the caller as copies.
        self._copied_workers = backend.local_workers if backend.copies_local_results else ()
        #: Set while the synchronous API drives a coroutine: waits block instead of awaiting.
        self.blocking = False
        #: Set by :meth:`close`: every waiter, present and future, raises ClosedError.
        self.closed = False
        self._tickets: dict[int, Ticket] = {}
        self._sequence = itertools.count(1)
        # Any number of tasks may wait at once. One of them (the pump) waits on the
        # backend and applies what arrives; the others park on a future each, woken
        # whenever the state changes, and one of them takes over when the pump leaves.
        self._pumping = False
        self._parked: set[asyncio.Future[None]] = set()
        self._async_thread: int | None = None  # the thread whose tasks wait here
        # Held during a blocking call. An RLock knows its owner from the moment it is
        # taken: a Ctrl-C landing right after the taking is still undone (see leave).
        self._sync_lock = threading.RLock()
        self._sync_thread: int | None = None
        # Calls in progress (sync or async, nested or from several tasks) and their thread.
        self._calls = 0
        self._call_thread: int | None = None
        self._calls_started = 0.0
        self._waiting = 0  # tasks inside wait_until
        self._waits_started = 0.0

    # --- sending ------------------------------------------------------------------------

    def split(self, env_ids: Sequence[int]) -> list[tuple[int, list[int], Any]]:
        """``(worker, env ids, rows)`` per worker, order kept within each group."""
        if env_ids is self.all_env_ids:
            return self._all_groups
        if len(env_ids) == 1:  # first-ready one env at a time: no grouping needed
            (env_id,) = env_ids
            worker, group = int(self.worker_of[env_id]), [int(env_id)]
            return [(worker, group, group)]
        if len(self._all_groups) == 1:  # one group (inline, coroutine): no sorting needed
            env_ids = [int(env_id) for env_id in env_ids]
            return [(0, env_ids, env_ids)]
        groups: dict[int, list[int]] = {}
        worker_of = self.worker_of
        for env_id in env_ids:
            groups.setdefault(int(worker_of[env_id]), []).append(int(env_id))
        # By worker index: a group the agent's process steps itself comes last, after
        # every worker has its command.
        return [(worker, group, group) for worker, group in sorted(groups.items())]

    def check_alive(self, env_ids: Iterable[int]) -> None:
        """Raise the crash of the first dead worker hosting one of ``env_ids``; under
        the restart policy, replace it instead (see :meth:`_try_again`)."""
        if self.dead_workers:
            for env_id in env_ids:
                worker = int(self.worker_of[env_id])
                if worker in self.dead_workers and not self._try_again(worker):
                    raise_alone(self.dead_workers[worker])

    def _try_again(self, worker: int) -> bool:
        """Under the restart policy, a worker given up on (past ``max_restarts``, its
        crash raised) gets one more replacement when a command comes for its envs, as an
        env given up on is tried again by its next step: whether it was started. Its
        failures in a row are kept, so should it die too, its crash is raised at once."""
        if not self.restart:
            return False
        crash = self.dead_workers[worker]
        try:
            self.backend.restart(worker, f"{type(crash).__name__}: {crash}")
        except Exception:  # no replacement now (out of descriptors, say): as it was
            return False
        finally:
            del crash  # (see raise_alone)
        del self.dead_workers[worker]
        self.worker_restarts[worker] += 1
        logger.warning("starting worker %d again, given up on before", worker)
        return True

    def submit(
        self,
        env_ids: Sequence[int],
        make_command: Callable[[int, list[int]], EnvCommand],
        is_step: bool,
    ) -> list[Ticket]:
        """Send one command per worker; ``make_command(seq, env_ids_of_that_worker)``."""
        tickets = []
        now = time.monotonic()
        # Build and encode every worker's command first: a value that cannot travel, or
        # a worker that is gone, fails the whole call before any worker was sent a thing.
        try:
            prepared = self._prepare(env_ids, make_command)
        except WorkerGone:
            # A worker died since the last wait: apply its exit first (restarted, or
            # recorded as dead and raised by check_alive), then build again.
            self.dispatch(self.backend.poll())
            self.check_alive(env_ids)
            prepared = self._prepare(env_ids, make_command)
        for worker, group, rows, command, payload in prepared:
            self.backend.submit(worker, payload)  # first: the rest overlaps the envs' work
            ticket = Ticket(worker, group, rows, is_step, command, now)
            self._tickets[command.seq] = ticket
            self.num_busy += len(group)
            if is_step:  # resets and calls queue behind steps in the worker: no state
                self._mark(rows, BUSY)
                self.num_stepping += len(group)
            tickets.append(ticket)
        self.stats.commands += len(prepared)
        if self._parked:  # e.g. an inline backend: the results are already waiting
            self._wake_parked()
        return tickets

    def _prepare(
        self, env_ids: Sequence[int], make_command: Callable[[int, list[int]], EnvCommand]
    ) -> list[tuple[int, list[int], Any, EnvCommand, Any]]:
        prepared = []
        for worker, group, rows in self.split(env_ids):
            command = make_command(next(self._sequence), group)
            prepared.append((worker, group, rows, command, self.backend.prepare(worker, command)))
        return prepared

    # --- receiving ----------------------------------------------------------------------

    async def wait_for_tickets(self, tickets: list[Ticket], timeout: float | None = None) -> None:
        """:meth:`wait_until` every ticket of ``tickets`` is done."""
        await self.wait_until(
            lambda: all(ticket.done for ticket in tickets),
            timeout,
            last_message=lambda: self._replies_owed(tickets) <= 1,
        )

    def _replies_owed(self, tickets: list[Ticket]) -> int:
        """How many more messages ``tickets`` need: one per env of a step stepped at once
        (its envs answer one by one), one per other command."""
        owed = 0
        steps_concurrently = self.backend.steps_concurrently
        for ticket in tickets:
            if not ticket.done:
                if ticket.is_step and steps_concurrently(ticket.worker):
                    owed += len(ticket.env_ids) - len(ticket.answered or ())
                else:
                    owed += 1
        return owed

    async def wait_until(
        self,
        condition: Callable[[], bool],
        timeout: float | None = None,
        last_message: Callable[[], bool] | None = None,
    ) -> None:
        """Apply backend messages until ``condition()`` holds. ``last_message()``: whether
        the next message may be the last one the condition needs; the backend spins
        (polls before sleeping) only for that one, whose latency alone delays the caller
        (default: any message may be).

        With :attr:`blocking` set (the synchronous API), waits block in the kernel and
        the coroutine never suspends; otherwise they await the running event loop, and
        always give other tasks a turn before returning or timing out (a result that is
        ready, a timeout of 0). Any number of tasks may wait at once, each for its own
        condition; ``condition`` may raise to give up.

        Raises:
            aiovec.WaitTimeoutError: ``timeout`` seconds passed first (nothing is lost).
            aiovec.ClosedError: the vector env was closed meanwhile.
        """
        if timeout is not None:  # checked before anything is waited for
            timeout = check_seconds("timeout", timeout, negative_ok=True)
        started = time.perf_counter()
        if not self._waiting:
            self._waits_started = started
        self._waiting += 1
        try:
            deadline = None if timeout is None else time.monotonic() + timeout
            ready = condition()
            if not self.blocking:
                self._check_thread()
                # Never starve the loop's other tasks: a turn for them first, unless the
                # wait below gives them one anyway (with a timeout, it may end first).
                if ready or timeout is not None or not self.backend.wait_suspends:
                    active, self.active = self.active, 0  # suspended: see active
                    try:
                        await asyncio.sleep(0)
                    finally:
                        self.active = active
                    self._raise_if_closed()
                    self.stats.record_lag(time.perf_counter() - started)
                    ready = condition()
            if not ready:
                await self._wait_for(condition, timeout, deadline, last_message)
        finally:
            self._waiting -= 1
            if not self._waiting:  # count the time any task waited once
                self.stats.wait_time += time.perf_counter() - self._waits_started

    async def _wait_for(
        self,
        condition: Callable[[], bool],
        timeout: float | None,
        deadline: float | None,
        last_message: Callable[[], bool] | None,
    ) -> None:
        """The rest of :meth:`wait_until`, once ``condition`` was found not to hold: a
        coroutine of its own only then."""
        while True:
            self._raise_if_closed()
            if self.close_requested is not None:  # asked for while this thread was busy
                self.close_requested()
                raise ClosedError(reason="the vector env was closed while this call ran")
            now = time.monotonic()
            remaining = None
            if deadline is not None:
                remaining = deadline - now
                if remaining <= 0:
                    # What has arrived meanwhile counts (recv(timeout=0) is a poll).
                    self.dispatch(self.backend.poll())
                    if condition():
                        return
                    raise WaitTimeoutError(f"no result within {timeout} s")
            if self.step_timeout is not None and self._tickets:
                expires = min((kill_at for _, kill_at in self._kill_times()), default=math.inf)
                if expires <= now:
                    self._kill_late_workers(now)
                    expires = now + 0.05  # the kill is reported through the sentinel
                if expires != math.inf:  # inf: every late worker is still (re)starting
                    until = expires - now
                    remaining = until if remaining is None else min(remaining, until)
            # While this call waits (blocked in the kernel, or suspended), this thread
            # runs none of the vector env's code: a close() now may close at once.
            active, self.active = self.active, 0
            pumped = False
            messages: list[WorkerEvent] | None = None
            spin = last_message is None or last_message()
            try:
                if self.blocking:
                    messages = self.backend.wait_blocking(remaining, spin=spin)
                elif self._pumping:
                    await self._park(remaining)
                else:
                    pumped = self._pumping = True
                    try:
                        messages = await self.backend.wait(remaining, spin=spin)
                    finally:
                        self._pumping = False
                        if self._parked:  # one of them becomes the pump if it still waits
                            self._wake_parked()
                    if not messages and self.backend.completes_inline and not self.closed:
                        # Nothing can arrive by itself: wait for another task to act.
                        await self._park(remaining)
            finally:
                self.active = active
            self._raise_if_closed()
            if pumped:
                lag = self.backend.take_loop_lag()
                if lag is not None:
                    self.stats.record_lag(lag)
            if messages:
                self.dispatch(messages, pump=pumped)
            if condition():
                return

    def _raise_if_closed(self) -> None:
        """After a wait: the vector env may have been closed meanwhile (by another task,
        a signal handler, another thread), its buffers gone: nothing more is read."""
        if self.closed:
            raise ClosedError(reason="the vector env was closed while this call waited")

    async def _park(self, timeout: float | None) -> None:
        """Sleep until the state changes (or ``timeout``)."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._parked.add(future)
        # A timer, not asyncio.wait_for: before Python 3.12, wait_for drops a
        # cancellation that arrives as the future completes, and the cancelled task
        # would go on waiting (and take results its caller then discards).
        timer = None if timeout is None else loop.call_later(timeout, _settle, future)
        try:
            await future
        finally:
            self._parked.discard(future)
            if timer is not None:
                timer.cancel()

    def _wake_parked(self) -> None:
        for future in self._parked:
            _settle(future)
        self._parked.clear()

    def _check_thread(self) -> None:
        thread = threading.get_ident()
        if self._sync_thread is not None and self._sync_thread != thread:
            raise RuntimeError(
                "this vector env is in a blocking call in another thread; a vector env "
                "belongs to one thread at a time: hand work between threads with a queue"
            )
        if self._async_thread is None or not (self._pumping or self._parked):
            self._async_thread = thread
        elif thread != self._async_thread:
            raise RuntimeError(
                "this vector env is awaited from two threads at once; a vector env belongs "
                "to one thread (or event loop) at a time: hand results between threads "
                "with a queue instead"
            )

    def enter_call(self) -> None:
        """A call into the vector env starts (any public method, sync or async).

        Raises:
            RuntimeError: a call from another thread is in progress (a vector env
                belongs to one thread at a time); nothing was done.
        """
        thread = threading.get_ident()
        # None while calls are counted: a signal handler's call (a close()) ran between
        # this thread's lines below, and ended; still this thread's.
        if self._calls and self._call_thread not in (None, thread):
            raise RuntimeError(
                "this vector env is being used by another thread right now; a vector "
                "env belongs to one thread at a time: hand work between threads with a "
                "queue (or loop.call_soon_threadsafe) instead"
            )
        if not self._calls:
            self._calls_started = time.perf_counter()
        self._call_thread = thread
        # One statement: no signal handler runs between the two (see leave).
        self._calls, self.active = self._calls + 1, self.active + 1

    @property
    def calls(self) -> int:
        """Calls in progress (see :meth:`enter_call`): read before entering one, for
        :meth:`leave`."""
        return self._calls

    def leave(self, calls: int, owned_sync: bool = True) -> None:
        """End what a call entered since :attr:`calls` was ``calls`` (and, with
        ``owned_sync`` false, since this thread did not hold the blocking-call lock),
        however much of it happened: a Ctrl-C can land before :meth:`enter_call` or
        :meth:`enter_sync` took anything, inside them, or right after, before the
        caller's ``try``; the call's count and lock are released exactly once. A Ctrl-C
        landing in this release does not cut it short: it is finished, then raised."""
        interrupted: KeyboardInterrupt | None = None
        while True:
            try:
                if self._calls > calls:
                    self.exit_call()
                if not owned_sync and self._sync_lock._is_owned():  # type: ignore[attr-defined]
                    self.exit_sync()
                break
            except KeyboardInterrupt as exc:  # each step above is done at most once
                interrupted = exc
        if interrupted is not None:
            raise interrupted

    def holds_sync(self) -> bool:
        """Whether this thread is in a blocking call (holds its lock)."""
        return bool(self._sync_lock._is_owned())  # type: ignore[attr-defined]

    def exit_call(self) -> None:
        """The call begun by :meth:`enter_call` ended (however)."""
        self._calls, self.active = self._calls - 1, self.active - 1
        if not self._calls:
            self._call_thread = None
            self.stats.call_time += time.perf_counter() - self._calls_started

    def enter_sync(self) -> None:
        """Start a blocking call (waits block, see :attr:`blocking`); one thread at a time."""
        if self.holds_sync() or not self._sync_lock.acquire(blocking=False):
            raise RuntimeError(
                "this vector env is in a blocking call in another thread (or this call "
                "was made from inside one); a vector env belongs to one thread at a time: "
                "hand work between threads with a queue instead"
            )
        self._sync_thread = threading.get_ident()
        self.blocking = True

    def exit_sync(self) -> None:
        self.blocking = False
        self._sync_thread = None
        self._sync_lock.release()

    def check_sync_call(self) -> None:
        """Refuse a blocking call from a thread other than the one whose tasks wait here."""
        if (self._pumping or self._parked) and threading.get_ident() != self._async_thread:
            raise RuntimeError(
                "a blocking call was made from another thread while tasks of this vector "
                "env await it in their event loop's thread; a vector env belongs to one "
                "thread at a time: call it from the loop's thread "
                "(loop.call_soon_threadsafe / asyncio.run_coroutine_threadsafe)"
            )

    def wake_waiters(self) -> None:
        """Have every waiting task look at the state again (from this loop's thread)."""
        self._wake_parked()
        if self._pumping:
            self.backend.interrupt()

    def close(self) -> None:
        """Wake every waiting task: they raise :class:`aiovec.ClosedError`. From any
        thread, or a signal handler that ran while a loop was blocked in ``select``."""
        self.closed = True
        loops = {future.get_loop() for future in self._parked}
        self.wake_waiters()
        # The loops must run those callbacks now, wherever this was called from (a blocked
        # loop would not notice them); the backend's own wait too (a blocking call's).
        self.backend.nudge()
        for loop in loops:
            if not loop.is_closed():
                loop.call_soon_threadsafe(_nothing)

    def forget_failures(self) -> None:
        """Let go of the failures kept for raising (once closed, nothing raises them):
        one raised before holds, through its traceback, frames that refer to this
        scheduler's vector env, a cycle that would keep it alive until the garbage
        collector runs."""
        self.dead_workers.clear()
        self.errors.clear()
        for ticket in self._tickets.values():
            ticket.failure = None
            ticket.errors.clear()

    def _kill_times(self) -> Iterator[tuple[Ticket, float]]:
        """Each in-flight ticket that its worker runs now, with the time at which the
        worker is killed if it is still unanswered (see :meth:`_kill_after`).

        Its clock starts once the command reached a worker able to run it (a restarted
        worker builds its envs first, under its own start-up deadline) and once the
        commands it waits for were answered: on a worker that runs its commands in turn,
        all those sent before it; on one that runs its envs at once, those before it to
        any of its envs (each env runs its commands in order). A command queued there
        (first-ready sends one env at a time, a call sent while a step runs) is not late
        for the time the others took; it is not running yet while it waits (so a hang in
        another of its envs is found at most one earlier command's time later)."""
        backend = self.backend
        answered_at, env_answered_at = self._answered_at, self._env_answered_at
        running_in_turn: set[int] = set()  # in-turn workers whose running ticket was seen
        running_envs: set[int] = set()  # envs of concurrent workers with a running ticket
        for ticket in self._tickets.values():  # in the order they were sent
            worker = ticket.worker
            started = max(ticket.sent_at, backend.ready_since(worker))
            if backend.steps_concurrently(worker):
                if not running_envs.isdisjoint(ticket.env_ids):
                    running_envs.update(ticket.env_ids)
                    continue
                running_envs.update(ticket.env_ids)
                if ticket.started_at is None:
                    # When its envs' commands before it ended, fixed from now on: later
                    # answers of its envs (to commands sent after it) are not its start.
                    answered = ticket.answered or ()
                    ticket.started_at = max(
                        (env_answered_at.get(e, 0.0) for e in ticket.env_ids if e not in answered),
                        default=0.0,
                    )
                started = max(started, ticket.started_at)
            else:
                if worker in running_in_turn:
                    continue
                running_in_turn.add(worker)
                started = max(started, answered_at.get(worker, 0.0))
            yield ticket, started + self._kill_after(ticket)

    def _kill_after(self, ticket: Ticket) -> float:
        """Seconds after which ``ticket``'s command, still unanswered, gets its worker
        killed: ``step_timeout`` for each env call the worker makes in turn (an env is
        late only if its own call takes longer, not because others came first)."""
        step_timeout = cast(float, self.step_timeout)  # only asked when there is one
        if self.backend.cancels_late_envs(ticket.worker):
            # It answers for its late envs at step_timeout; killing is the backstop for a
            # worker too busy to do so (an async env that blocks its loop).
            return step_timeout + max(1.0, step_timeout)
        # After a streamed step's partial answer, its clock restarted (see _kill_times)
        # for the envs still owing theirs.
        return step_timeout * self.backend.calls_in_turn(ticket.worker, ticket.unanswered())

    def _kill_late_workers(self, now: float) -> None:
        for ticket, kill_at in list(self._kill_times()):
            if kill_at <= now and ticket.worker not in self._timed_out:
                # Only the envs still owing their result: the others already answered;
                # of those, the ones the worker is inside, where it says (envs queued
                # behind a hung one in a worker stepping in turn never started).
                answered = ticket.answered or ()
                owing = [e for e in ticket.env_ids if e not in answered]
                running = set(self.backend.running_envs(ticket.worker))
                self._timed_out[ticket.worker] = [e for e in owing if e in running] or owing
                self.backend.kill(ticket.worker)

    def dispatch(self, messages: list[WorkerEvent], pump: bool = False) -> None:
        """Apply what the workers said: finish tickets, fill the ready-queue; wake the
        waiting tasks (``pump``: the caller is the task that waits on the backend)."""
        if not messages:
            return
        self._apply(messages)
        if self._parked:
            self._wake_parked()
        if self._pumping and not pump:
            self.backend.interrupt()  # the pump's own condition may hold now

    def _apply(self, messages: list[WorkerEvent]) -> None:
        tickets = self._tickets
        timed = self.step_timeout is not None
        if timed:
            now = time.monotonic()
        for worker, message in messages:
            if timed:  # the worker (and the envs answered) go on with their next command
                self._answered_at[worker] = now
            if isinstance(message, WorkerExit):
                self._worker_exited(worker, message)
                continue
            ticket = tickets.get(message.seq)
            if ticket is None:  # a late reply to a request given up on
                continue
            if not message.env_ids:  # sent compact: the command's whole group
                message.env_ids = ticket.env_ids
            if message.values is not None and worker in self._copied_workers:
                message.values = [own_copy(value) for value in message.values]
            if timed:
                for env_id in message.env_ids:
                    self._env_answered_at[env_id] = now
            self._count_busy(worker, message)
            if message.reward_dtype is not None:
                self._note_reward_dtype(message.reward_dtype)
            if message.progressed:  # real work happened: not a crash loop
                self._crashes_in_a_row[worker] = 0
                if self._env_crashes_in_a_row:
                    for env_id in message.env_ids:
                        self._env_crashes_in_a_row.pop(env_id, None)
            unanswered = ticket.unanswered() if ticket.answered else len(ticket.env_ids)
            if ticket.is_step and len(message.env_ids) < unanswered:
                if ticket.answered is None:
                    ticket.answered = set()
                ticket.answered.update(message.env_ids)
                self._step_results(ticket, message.env_ids, message, None)
                continue
            del tickets[message.seq]
            self._finish(ticket, message, None)

    def _worker_exited(self, worker: int, exit: WorkerExit) -> None:
        group = self.backend.groups[worker]
        timed_out = self._timed_out.pop(worker, None)
        if timed_out is not None:
            timeout = cast(float, self.step_timeout)  # workers only time out with one
            crash: Exception = StepTimeoutError(worker, group, timed_out, timeout)
        elif exit.error is not None:  # e.g. its envs' factory raised while rebuilding
            crash = exit.error
        else:
            crash = WorkerCrashedError(worker, group, exit.exitcode, exit.hint, exit.running)
        in_flight = sorted(
            (seq, ticket) for seq, ticket in self._tickets.items() if ticket.worker == worker
        )
        blamed = {*exit.running, *(timed_out or ())}  # what it was running, where known
        env_crashes = self._env_crashes_in_a_row
        for env_id in blamed:
            env_crashes[env_id] = env_crashes.get(env_id, 0) + 1
        in_a_row = max((env_crashes[env_id] - 1 for env_id in blamed), default=0)
        if self.restart and max(self._crashes_in_a_row[worker], in_a_row) < self.max_restarts:
            self._crashes_in_a_row[worker] += 1
            self.worker_restarts[worker] += 1
            logger.warning("restarting worker %d after: %s", worker, crash)
            try:
                self.backend.restart(worker, f"{type(crash).__name__}: {crash}")
            except Exception as cannot_start:  # no replacement (out of descriptors, say):
                self._fail_worker(worker, cannot_start, in_flight)  # dead, not in flight
                return
            # The envs the worker was inside a call of: a call or set_attr there may have
            # had its side effects, and may be what killed the worker. An env runs its
            # commands in the order sent, so one with an earlier command unanswered
            # was running that one, not a later call queued behind it.
            started = {*exit.running, *(timed_out or ())}
            owing: set[int] = set()  # envs with an earlier command still unanswered
            for seq, ticket in in_flight:  # the new envs answer with restart notices
                if not isinstance(ticket.command, (Step, Reset)) and (
                    not self.backend.marks_running
                    or started.intersection(ticket.env_ids).difference(owing)
                ):  # it fails with the crash, never runs again (one not started does)
                    del self._tickets[seq]
                    self._finish(ticket, None, crash)
                    continue
                owing.update(e for e in ticket.env_ids if e not in (ticket.answered or ()))
                ticket.sent_at, ticket.started_at = time.monotonic(), None
                command = ticket.command
                if ticket.is_step and ticket.answered:  # partly answered: the rest only
                    answered = ticket.answered
                    positions = [p for p, e in enumerate(command.env_ids) if e not in answered]
                    command = command.subset(positions)
                self.backend.submit(worker, self.backend.prepare(worker, command))
            return
        self._fail_worker(worker, crash, in_flight)

    def _fail_worker(
        self, worker: int, crash: Exception, in_flight: list[tuple[int, Ticket]]
    ) -> None:
        """``worker`` is gone for good: its in-flight commands fail with ``crash``, as
        will any later command to its envs."""
        self.dead_workers[worker] = crash
        for seq, ticket in in_flight:
            del self._tickets[seq]
            self._finish(ticket, None, crash)

    def _finish(self, ticket: Ticket, reply: Reply | None, failure: Exception | None) -> None:
        """The last answer to ``ticket`` (or its failure) arrived."""
        ticket.done, ticket.reply = True, reply
        if ticket.is_step:  # its failure goes to self.errors, for the recv taking it
            if reply is not None:  # in the order the envs finished, not necessarily sent
                env_ids = reply.env_ids
            elif ticket.answered:  # failed after a part was answered: the rest
                env_ids = [e for e in ticket.env_ids if e not in ticket.answered]
            else:
                env_ids = ticket.env_ids
            self._step_results(ticket, env_ids, reply, failure)
            return
        ticket.failure = failure
        if reply is not None:
            self._record(ticket, reply)
        self.num_busy -= len(ticket.env_ids)

    def _step_results(
        self, ticket: Ticket, env_ids: list[int], reply: Reply | None, failure: Exception | None
    ) -> None:
        """Step results for ``env_ids`` (all or part of ``ticket``) go to the ready-queue."""
        # This runs on each result's latency: what has nothing to do is skipped (the usual
        # result has no info or error to keep).
        if reply is not None:
            self._record(ticket, reply)
        if (
            failure is not None
            or ticket.errors
            or self.infos
            or (reply is not None and reply.infos is not None)
        ):
            self._store_results(env_ids, reply, failure, ticket.errors)
        count = len(env_ids)
        self.num_busy -= count
        self.num_stepping -= count
        stats = self.stats
        stats.env_steps += count
        stats.record_latency(time.monotonic() - ticket.sent_at, count)
        if count == 1:  # first-ready one env at a time
            self.state[env_ids[0]] = READY
        else:  # the whole ticket at once (the same env ids): its rows, a slice if contiguous
            whole = env_ids is ticket.env_ids or count == len(ticket.env_ids)
            self._mark(ticket.rows if whole else env_ids, READY)
        self.ready_queue.extend(env_ids)

    def _store_results(
        self,
        env_ids: list[int],
        reply: Reply | None,
        failure: Exception | None,
        errors: dict[int, Exception],
    ) -> None:
        """Keep the infos and errors of step results for ``env_ids`` until taken."""
        infos = reply.infos if reply is not None else None
        if infos is not None:
            for env_id, info in zip(env_ids, infos):
                if info:
                    self.infos[env_id] = info
                else:
                    self.infos.pop(env_id, None)
        elif self.infos:  # drop what an earlier, discarded result left
            for env_id in env_ids:
                self.infos.pop(env_id, None)
        if failure is not None or errors:
            # Moved out of ``errors`` (a ticket's), not copied: frames of the error's
            # traceback may hold the ticket (see raise_alone).
            for env_id in env_ids:
                error = failure or errors.pop(env_id, None)
                if error is not None:
                    self.errors[env_id] = error

    def step_in_place(self, command: EnvCommand) -> None:
        """Run a step of every env to completion in this thread, for a backend that
        :attr:`~Backend.completes_inline`, while no env has anything in flight or
        unread: its results are kept as any step's are, for the caller to take at once
        (they never enter the ready-queue, and no env changes state)."""
        reply = self.backend.execute_now(command)
        self._count_busy(0, reply)  # such a backend's one group runs in this process
        if reply.reward_dtype is not None:
            self._note_reward_dtype(reply.reward_dtype)
        stats, count = self.stats, len(reply.env_ids)
        stats.commands += 1
        stats.env_steps += count
        stats.record_latency(reply.busy, count)
        self._store_results(reply.env_ids, reply, None, self._read_reply(reply))

    def _note_reward_dtype(self, dtype: str) -> None:
        """Batched envs returned rewards of ``dtype`` (their workers combine their own
        blocks'): results carry that dtype, combined over the workers."""
        known = self.reward_dtype
        if known is None or known.str != dtype:
            new = np.dtype(dtype)
            self.reward_dtype = new if known is None else np.result_type(known, new)

    def _count_busy(self, worker: int, reply: Reply) -> None:
        self.stats.env_time += reply.busy
        if worker in self._local_workers:
            self.stats.local_env_time += reply.busy

    def next_seq(self) -> int:
        """A fresh sequence number for a command."""
        return next(self._sequence)

    def _record(self, ticket: Ticket, reply: Reply) -> None:
        if reply.observations is not None or reply.errors:  # else nothing to keep
            ticket.errors.update(self._read_reply(reply))

    def _read_reply(self, reply: Reply) -> dict[int, Exception]:
        """Keep the observations ``reply`` carries; its envs' errors, by env id."""
        if reply.observations is not None:
            for env_id, observation in zip(reply.env_ids, reply.observations):
                self.observations[env_id] = observation
        errors: dict[int, Exception] = {}
        for error in reply.errors or ():
            exception = error.to_exception()  # one object for all the envs it stands for
            for env_id in error.env_ids or (error.env_id,):
                errors[env_id] = exception
        return errors

    def _mark(self, rows: slice | list[int], value: int) -> None:
        if isinstance(rows, slice):
            self.state[rows] = bytes((value,)) * (rows.stop - rows.start)
        else:
            state = self.state
            for env_id in rows:
                state[env_id] = value

    def take_ready(self, limit: int) -> list[int]:
        """Up to ``limit`` env ids from the ready-queue, oldest first, marked IDLE."""
        queue = self.ready_queue
        self.stats.record_queue_depth(len(queue))
        if queue and (limit == 1 or len(queue) == 1):  # first-ready one env at a time
            env_id = queue.popleft()
            self.state[env_id] = IDLE
            return [env_id]
        if limit >= len(queue):
            env_ids = list(queue)
            queue.clear()
        else:
            env_ids = [queue.popleft() for _ in range(limit)]
        # Every env (a lockstep step): one slice, not one write per env.
        self._mark(slice(0, len(env_ids)) if len(env_ids) == len(self.state) else env_ids, IDLE)
        return env_ids

    def give_back(self, env_ids: list[int]) -> None:
        """Put env ids taken by :meth:`take_ready` back at the front, in order."""
        self.ready_queue.extendleft(reversed(env_ids))
        self._mark(env_ids, READY)
