"""The contract between the vector env and the thing that hosts its envs.

A backend hosts ``num_envs`` envs split into *workers* (groups of env ids), accepts
commands addressed to one worker, and hands back what the workers said. It knows
nothing about batching, autoreset or the ready-queue: that is the scheduler's job.
"""

from __future__ import annotations

import abc
import asyncio
import math
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from aiovec._transport import by_value
from aiovec._transport.buffers import Buffers, build_buffers
from aiovec._transport.protocol import EnvCommand, Reply
from aiovec._worker.blocks import BlockHost, build_host
from aiovec._worker.host import EnvBuildError, EnvDescription, EnvHost
from aiovec.async_env import AsyncEnv
from aiovec.errors import FactoryPicklingError


class AsyncEnvsHereError(TypeError):
    """Async envs were built where blocking code steps them (``backend="inline"``, or a
    process backend's envs in this process), which would take their coroutines for
    results. ``backend="auto"`` probes only the first factory: it catches this and hosts
    the envs where they are awaited instead."""


def refuse_async_envs(host: Any, where: str) -> None:
    """Raise :class:`AsyncEnvsHereError` (after closing ``host``'s envs) if ``host``
    holds async envs; ``where`` names the placement in the message."""
    if not isinstance(host, EnvHost):  # blocks: async ones are refused when built
        return
    found = [env_id for env_id, env in host.envs.items() if isinstance(env, AsyncEnv)]
    if not found:
        return
    host.close()
    which = f"env {found[0]} is an async env" if len(found) == 1 else f"envs {found} are async envs"
    raise AsyncEnvsHereError(
        f"{which} (aiovec.AsyncEnv), and {where} steps envs with blocking calls: use "
        "backend='coroutine' (one event loop), 'process' (workers await them) or 'auto'"
    )


class WorkerExit(NamedTuple):
    """A worker stopped without being asked to: its in-flight commands will never finish."""

    exitcode: int | None
    hint: str = ""
    #: What to report instead of a crash (the worker's envs could not be rebuilt).
    error: Exception | None = None
    #: The envs the worker was inside a call of when it died, where known.
    running: tuple[int, ...] = ()


class WorkerGone(Exception):
    """Raised by :meth:`Backend.prepare` for a worker whose exit is known to the backend
    but not yet applied by the scheduler (which then applies it and tries again)."""


#: What a backend hands the scheduler: ``(worker index, its reply or its exit)``.
WorkerEvent = tuple[int, "Reply | WorkerExit"]


#: Seconds a spinning wait holds the event loop between two turns it gives it.
SPIN_SLICE = 50e-6


class Wakeup:
    """What a backend's ``wait`` awaits: woken by a message, or by the timeout."""

    def __init__(self) -> None:
        self._future: asyncio.Future[None] | None = None
        #: A :meth:`nudge` came while nothing waited: the next wait returns at once.
        self._nudged = False
        #: A wait is spinning (see :meth:`wait`); ``_spin_woken``: :meth:`wake` came meanwhile.
        self._spinning = False
        self._spin_woken = False
        self._woken_at = 0.0
        #: Seconds from the last :meth:`wake` to its waiter running again (the event
        #: loop's lag), until taken by :meth:`take_lag`.
        self._lag: float | None = None

    async def wait(
        self,
        loop: asyncio.AbstractEventLoop,
        timeout: float | None,
        spin: float = 0.0,
        poll: Callable[[float], bool] | None = None,
    ) -> None:
        """Return once woken, or after ``timeout`` seconds.

        ``spin``: for up to that many seconds first, call ``poll(seconds)`` (polls the
        backend's descriptors for up to ``seconds`` and handles what came; returns
        whether anything did) and give the loop a turn, by turns, instead of letting
        the loop sleep in ``select``: a message then costs no wake-up from sleep, and
        other tasks wait at most :data:`SPIN_SLICE` for their turn."""
        if spin and poll is not None:
            started = time.perf_counter()
            if await self._spin(min(spin, math.inf if timeout is None else timeout), poll):
                return
            if timeout is not None:
                timeout = max(0.0, timeout - (time.perf_counter() - started))
        self._future = loop.create_future()
        if self._nudged:  # (checked once the future is there: see nudge)
            self._nudged = False
            self._future.set_result(None)
        timer = None if timeout is None else loop.call_later(timeout, self.wake)
        try:
            await self._future
            self._lag = time.perf_counter() - self._woken_at
        finally:
            self._future = None
            if timer is not None:
                timer.cancel()

    async def _spin(self, seconds: float, poll: Callable[[float], bool]) -> bool:
        """Poll and give the loop turns for ``seconds``; whether anything came (a
        message, a :meth:`wake` or a nudge)."""
        self._spinning, self._spin_woken = True, False
        clock = time.perf_counter
        deadline = clock() + seconds
        try:
            while True:
                # The other tasks' turn comes before each slice, not after it: a message
                # found by the slice then returns at once, its latency free of the turn
                # (a loop turn costs ~5 µs, on the path of every first-ready result).
                await asyncio.sleep(0)
                if self._spin_woken or self._nudged:  # e.g. by a reader callback just now
                    found = False
                else:
                    found = poll(min(SPIN_SLICE, max(0.0, deadline - clock())))
                if found or self._spin_woken or self._nudged:
                    self._nudged = False  # served: the caller looks again
                    if self._spin_woken:  # the loop's lag since the wake-up
                        self._lag = clock() - self._woken_at
                    return True
                if clock() >= deadline:
                    return False
        finally:
            self._spinning = False

    def wake(self) -> None:
        if self._spinning:
            if not self._spin_woken:
                self._spin_woken, self._woken_at = True, time.perf_counter()
            return
        if self._future is not None and not self._future.done():
            self._future.set_result(None)
            self._woken_at = time.perf_counter()

    def nudge(self) -> None:
        """Make the loop a wait is on run its callbacks (:meth:`wake` was called from
        outside them: another thread, or a signal handler that ran while the loop was
        blocked in ``select``, which would otherwise go on blocking)."""
        future = self._future
        if future is None:  # e.g. an env's code, run on the loop before the wait began
            self._nudged = True
        elif not future.get_loop().is_closed():
            future.get_loop().call_soon_threadsafe(self.wake)

    def take_lag(self) -> float | None:
        """The loop lag of the last wait that was woken, once; ``None`` if none since."""
        lag, self._lag = self._lag, None
        return lag


class Backend(abc.ABC):
    """Hosts envs; moves commands in and replies out.

    Construction builds every env (blocking) and raises :class:`aiovec.EnvError` if a
    factory fails. Afterwards:

    - :attr:`groups` lists the env ids of each worker; :attr:`descriptions` holds an
      :class:`~aiovec._worker.host.EnvDescription` per env.
    - :meth:`attach` must be called once, before the first command.
    """

    groups: list[list[int]]
    #: True when every command completes inside :meth:`submit` (nothing ever waits).
    completes_inline: bool = False
    #: Worker processes or actors hosting envs outside this process.
    num_workers: int = 0
    #: Workers whose envs run inside the caller's calls, in this process (their time
    #: is the agent's, not a worker's).
    local_workers: frozenset[int] = frozenset()
    #: A :class:`WorkerExit`'s ``running`` names every env the worker was inside a call
    #: of (an empty tuple: none); otherwise it may leave some or all of them out.
    marks_running: bool = False
    #: What calls return from envs in this process (:attr:`local_workers`) reaches the
    #: caller as copies, as values unpickled from a worker do (never an env's own object).
    copies_local_results: bool = False
    descriptions: list[EnvDescription]
    buffers: Buffers

    @abc.abstractmethod
    def attach(
        self, observation_space: spaces.Space[Any], action_space: spaces.Space[Any]
    ) -> Buffers:
        """Create the buffers every worker reads actions from and writes results to."""

    def prepare(self, worker: int, command: EnvCommand) -> Any:
        """``command`` ready for :meth:`submit` (encoded, where it travels).

        Raises here, never in :meth:`submit`, when the command cannot be sent (a value
        that cannot be encoded, a worker that is gone), so that a command for several
        workers is sent to all of them or to none.
        """
        return command

    @abc.abstractmethod
    def submit(self, worker: int, command: Any) -> None:
        """Queue a command made by :meth:`prepare` for ``worker``; never blocks on the
        envs and never fails."""

    def execute_now(self, command: EnvCommand) -> Reply:
        """Run ``command`` to completion in this thread and return its reply; only for
        backends that :attr:`completes_inline` (the lockstep fast path)."""
        raise NotImplementedError(f"{type(self).__name__} does not complete commands inline")

    @abc.abstractmethod
    def poll(self) -> list[WorkerEvent]:
        """Whatever the workers have said since the last call, without waiting."""

    @abc.abstractmethod
    async def wait(self, timeout: float | None = None, *, spin: bool = True) -> list[WorkerEvent]:
        """Wait in the running event loop until a message is available; ``[]`` on timeout.
        ``spin=False``: the next message is not the last the caller waits for, so a
        backend that can poll before sleeping does not (its CPU would buy nothing)."""

    #: True when :meth:`wait` always gives the event loop a turn (suspends at least once),
    #: even with messages already waiting: a task that waits then needs no other turn.
    wait_suspends: bool = False

    def take_loop_lag(self) -> float | None:
        """How long the last :meth:`wait` that was woken took to run again after its
        wake-up (the event loop's lag), once; ``None`` when not measured."""
        return None

    @abc.abstractmethod
    def wait_blocking(
        self, timeout: float | None = None, *, spin: bool = True
    ) -> list[WorkerEvent]:
        """Like :meth:`wait`, blocking the thread instead (no event loop involved)."""

    def ready_since(self, worker: int) -> float:
        """When ``worker`` began serving as it does now (``time.monotonic``; ``inf`` while
        it is still starting): started, restarted, or switched to stepping its envs at
        once. A command's step timeout runs from then at the earliest."""
        return 0.0

    def interrupt(self) -> None:  # noqa: B027 -- optional: backends whose wait returns at once
        """Make a pending :meth:`wait` return now (with what it has, maybe nothing)."""

    #: True when the backend cancels late commands itself (given ``step_timeout``), env by
    #: env; the scheduler then never kills its workers for lateness.
    enforces_step_timeout: bool = False

    def cancels_late_envs(self, worker: int) -> bool:
        """Whether ``worker`` cancels a late env's command itself (given ``step_timeout``):
        the scheduler then kills it only if it failed to (its loop is blocked)."""
        return False

    #: Rows of each batched env (``envs_per_block``), or ``None`` for single envs.
    _envs_per_block: int | None = None

    def nudge(self) -> None:
        """Wake a wait on this backend (see :meth:`interrupt`) from outside its event
        loop's callbacks: another thread, or a signal handler (``close()``)."""
        self.interrupt()

    def steps_concurrently(self, worker: int) -> bool:
        """Whether ``worker`` runs a command's envs at once (threads, an event loop),
        rather than one after another."""
        return False

    def running_envs(self, worker: int) -> list[int]:
        """The envs of ``worker`` whose code it is running now (empty where unknown)."""
        return []

    def calls_in_turn(self, worker: int, num_envs: int) -> int:
        """How many env calls ``worker`` makes one after another to run a command to
        ``num_envs`` of its envs (each is allowed ``step_timeout`` in its turn)."""
        if self.steps_concurrently(worker):
            return 1
        if self._envs_per_block is not None:  # a command to whole blocks: a call per block
            return -(-num_envs // self._envs_per_block)
        return num_envs

    def restart(self, worker: int, reason: str) -> None:
        """Replace a dead worker by a fresh one that rebuilds its envs."""
        raise NotImplementedError(f"{type(self).__name__} cannot restart workers")

    def kill(self, worker: int) -> None:
        """Stop a hung worker now; its exit is then reported as a ``WorkerExit``."""
        raise NotImplementedError(f"{type(self).__name__} cannot kill workers")

    @abc.abstractmethod
    def close(self, timeout: float) -> None:
        """Stop every worker within about ``timeout`` seconds and release all resources.

        Idempotent; must succeed even after workers crashed.
        """


def split_groups(num_units: int, num_workers: int, unit_size: int = 1) -> list[list[int]]:
    """Contiguous env ids per worker: ``num_units`` units (single envs, or batched envs
    of ``unit_size`` rows each, never split) spread as evenly as possible."""
    return [
        list(range(int(chunk[0]) * unit_size, (int(chunk[-1]) + 1) * unit_size))
        for chunk in np.array_split(np.arange(num_units), num_workers)
    ]


def build_local_host(
    factories: dict[int, Callable[[], Any]],
    autoreset_mode: AutoresetMode,
    max_restarts: int,
    envs_per_block: int | None,
    async_blocks: bool = False,
    isolated: bool = False,
) -> tuple[EnvHost | BlockHost, list[EnvDescription]]:
    """A host of ``factories``' envs in this process; raises an env's build error.

    ``isolated``: as in a worker process, each env is built from its own copy of its
    factory (what the factory captured included; the factories as given when they
    cannot be pickled) and gets its own copy of the values commands give it (see
    :attr:`~aiovec._worker.host.HostState.copies_values`); the backend then hands the
    caller copies of what calls return (:attr:`Backend.copies_local_results`).
    """
    if isolated:
        try:
            factories = by_value.loads_each(by_value.dumps(factories))
        except Exception:  # cannot travel: shared, as they would be by the in-process
            pass  # backends (a worker could not take them at all)
    try:
        host, descriptions = build_host(
            factories, autoreset_mode, max_restarts, envs_per_block, async_blocks
        )
    except EnvBuildError as exc:
        raise exc.info.to_exception() from None
    host.copies_values = isolated
    return host, descriptions


def group_factories(
    env_fns: Sequence[Callable[[], Any]], group: list[int], unit_size: int = 1
) -> dict[int, Callable[[], Any]]:
    """The factories of ``group``'s units, keyed by each unit's first env id."""
    return {env_id: env_fns[env_id // unit_size] for env_id in group[::unit_size]}


def pickle_factories(
    env_fns: dict[int, Callable[[], Any]], advice: str = "", destination: str = "a worker process"
) -> bytes:
    """The factories as bytes to send to ``destination``, or a FactoryPicklingError
    naming the culprit (``advice``: what else this backend offers, after "or")."""
    try:  # together: what several capture travels once (each env unpickles its own)
        return by_value.dumps(env_fns)
    except Exception:
        pass
    for env_id, env_fn in env_fns.items():
        try:
            by_value.dumps(env_fn)
        except Exception as exc:
            raise FactoryPicklingError(
                f"the factory of env {env_id} ({env_fn!r}) cannot be pickled to send it to "
                f"{destination}: {type(exc).__name__}: {exc}. Make the factory capture only "
                "picklable values (create locks, files, sockets and clients inside the env), "
                f"or use backend='inline' to keep envs in this process{advice}."
            ) from exc
    raise AssertionError("unreachable: every factory pickled on its own")


class LocalBackend(Backend):
    """Base of the backends whose envs live in this process, in one host.

    ``isolated``: the envs are as isolated as in worker processes (see
    :func:`build_local_host`); otherwise they get the caller's objects, as in
    ``SyncVectorEnv``.
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], Any]],
        autoreset_mode: AutoresetMode,
        max_restarts: int = 0,
        envs_per_block: int | None = None,
        async_blocks: bool = False,
        isolated: bool = False,
    ) -> None:
        size = envs_per_block or 1  # rows per factory (None: single envs)
        factories = group_factories(env_fns, list(range(len(env_fns) * size)), size)
        self._host, self.descriptions = build_local_host(
            factories, autoreset_mode, max_restarts, envs_per_block, async_blocks, isolated
        )
        self.copies_local_results = isolated
        if not async_blocks:  # only the coroutine backend awaits what its envs return
            refuse_async_envs(self._host, "backend='inline'")

    def attach(
        self, observation_space: spaces.Space[Any], action_space: spaces.Space[Any]
    ) -> Buffers:
        self.buffers = build_buffers(
            observation_space, action_space, len(self.descriptions), np.zeros
        )
        self._host.attach(self.buffers)
        return self.buffers
