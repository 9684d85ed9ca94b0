"""Subprocess backend: worker processes each host a group of envs.

IPC is paid per worker, not per env. Bulk data lives in one anonymous shared region;
each worker has one socket pair that carries small msgspec frames both ways. The event
loop watches each worker's socket *and* its process sentinel, so a reply and a death are
both noticed the moment they happen, without polling or timeouts.
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import os
import pickle
import select
import socket
import sys
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import wait
from typing import Any, NamedTuple, cast

import cloudpickle
import gymnasium as gym
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from aiovec._transport.buffers import Buffers, buffers_nbytes, build_buffers
from aiovec._transport.channel import (
    HEADER,
    Channel,
    channel_pair,
    descriptor_limit_explained,
)
from aiovec._transport.lines import MAX_LINES, MAX_WORKER_LINES, open_lines
from aiovec._transport.memory import SharedRegion
from aiovec._transport.protocol import (
    Close,
    EnvCommand,
    ErrorInfo,
    Hello,
    LastWords,
    Step,
    Threads,
    compact_step,
    decode_message,
    encode,
    wire_command,
)
from aiovec._transport.spin import SpinPolicy
from aiovec._worker import zygote
from aiovec._worker.blocks import BlockHost
from aiovec._worker.host import EnvDescription, EnvHost
from aiovec._worker.main import worker_main
from aiovec.backends._base import (
    Backend,
    Wakeup,
    WorkerEvent,
    WorkerExit,
    WorkerGone,
    build_local_host,
    group_factories,
    pickle_factories,
    refuse_async_envs,
    split_groups,
)
from aiovec.errors import StartupTimeoutError, WorkerCrashedError

STARTUP_HINT = "it died while building its envs"
#: With multiprocessing's spawn/forkserver, the likeliest cause of such a death.
MAIN_GUARD_HINT = (
    "; if the script that creates the vector env has no `if __name__ == '__main__':` "
    "guard, add one (context='spawn' and 'forkserver' import the main module in every "
    "worker), or leave context unset"
)


#: Seconds workers have to exit after SIGTERM before SIGKILL (all together).
TERMINATE_GRACE = 1.0

#: Seconds a waiting side polls before sleeping, when there are idle cores (see Channel).
DEFAULT_SPIN = 200e-6
#: The same for this process, waiting on all its workers at once: results come from any
#: of them, so the next one is usually nearer than a worker's next command is (W3, 16
#: sleepy envs on 2 cores, first-ready one at a time, 6-8 interleaved runs: 0.89-0.90 of
#: ideal spinning up to 200 us, 0.89-0.91 up to 500 us, 0.82-0.87 not spinning).
AGENT_SPIN = 500e-6


#: ``context=`` values: aiovec's own zygote, or a multiprocessing start method.
CONTEXTS = ("zygote", "forkserver", "spawn", "fork")


class _Frame(NamedTuple):
    """A command ready for a worker's socket (see :meth:`ProcessBackend.prepare`)."""

    seq: int
    control: bool  #: not a step: steps stay off the env lines while it is in flight
    data: bytes


class _LineSteps(NamedTuple):
    """A step ready for the env lines of a worker that steps its envs in threads: one
    frame per env, each for that env's line."""

    frames: list[tuple[socket.socket, bytes]]


def default_context() -> str:
    """``zygote`` where available (Linux: fast starts, no ``__main__`` import, safe with
    threads), else ``spawn``."""
    return "zygote" if zygote.available() else "spawn"


def _check_main_importable() -> None:
    """Workers started with spawn/forkserver re-import ``__main__`` from its file: fail
    early, with the fix, when that file does not exist (code piped through stdin)."""
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if main_file is not None and not os.path.exists(main_file):
        raise RuntimeError(
            f"worker processes cannot re-import the main module ({main_file!r} is not a "
            "file): save the script to a file, or pass context='fork', or use "
            "backend='inline'"
        )


#: What else a factory that cannot be pickled can do on this backend.
_FORK_ADVICE = (
    ", or context='fork' (workers forked from this process inherit their factories, as "
    "AsyncVectorEnv's do on Linux; unsafe if this process runs threads)"
)


class ProcessBackend(Backend):
    """Envs in ``num_workers`` subprocesses, contiguous groups of env ids per worker.

    With ``inline_envs > 0`` the last ``inline_envs`` envs form one more group hosted
    by this process: it steps them while the workers step theirs, instead of sleeping
    through a cross-core wake-up (a lockstep speed-up when cores are few).
    """

    marks_running = True  # each worker marks the env it is in, in shared memory

    @descriptor_limit_explained()  # whichever descriptor meets the limit: say what to do
    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        autoreset_mode: AutoresetMode,
        num_workers: int | None = None,
        context: str | None = None,
        spin: float | None = None,
        inline_envs: int = 0,
        max_restarts: int = 0,
        step_timeout: float | None = None,
        concurrent_envs: bool | None = None,
        startup_timeout: float | None = None,
        envs_per_block: int | None = None,
        daemon: bool = True,
    ) -> None:
        # With envs_per_block, env_fns are factories of batched envs of that many rows.
        size = envs_per_block or 1
        num_envs = len(env_fns) * size
        if not 0 <= inline_envs < num_envs or inline_envs % size:
            raise ValueError(
                f"inline_envs must be between 0 and num_envs - 1 = {num_envs - 1}"
                + (f" and a multiple of envs_per_block={size}" if envs_per_block else "")
                + f", got {inline_envs}"
            )
        remote_envs = num_envs - inline_envs
        remote_units = remote_envs // size
        if num_workers is None:
            num_workers = min(remote_units, os.cpu_count() or 1)
        if not 1 <= num_workers <= remote_units:
            unit = "batched envs" if envs_per_block else "envs"
            raise ValueError(
                f"num_workers must be between 1 and the {remote_units} {unit} left for "
                f"workers, got {num_workers}"
            )
        cores = os.cpu_count() or 1
        # Poll briefly only while every process that needs a core can have one: the
        # workers' window (and the agent's) from the start when there are fewer workers
        # than cores; by default the agent also spins once fewer than that many workers
        # keep stepping in turn (the rest step waiting envs in threads: see _spin_begin).
        self._spin_by_default = spin is None
        self._cores = cores
        if spin is None:
            spin = DEFAULT_SPIN if num_workers < cores else 0.0
        self.spin = spin  # the workers' window
        # This process's: spins only while spinning pays.
        self._spin_policy = SpinPolicy(AGENT_SPIN if self._spin_by_default else spin)
        self.groups = split_groups(remote_units, num_workers, size)
        context = default_context() if context is None else context
        # A forked worker inherits its factories, as AsyncVectorEnv's do under fork: they
        # need not pickle (a lock, a class cloudpickle cannot rebuild). Else, as bytes.
        self._payloads: list[bytes | dict[int, Callable[[], gym.Env]]] = [
            group_factories(env_fns, group, size)
            if context == "fork"
            else pickle_factories(group_factories(env_fns, group, size), _FORK_ADVICE)
            for group in self.groups
        ]
        self._envs_per_block = envs_per_block
        self._autoreset_mode = autoreset_mode
        self._max_restarts = max_restarts
        self._step_timeout = step_timeout
        self._concurrent_envs = concurrent_envs
        self._owner_pid = os.getpid()  # a forked child must not stop our workers
        self._unsent: set[int] = set()  # workers whose socket has bytes waiting for room
        self._async_workers: set[int] = set()  # workers of async envs (they time envs out)
        self._startup_timeout = startup_timeout
        # daemon=False (AsyncVectorEnv's): a multiprocessing worker's envs may start
        # processes. Set inside the worker only: to this process it stays daemonic, so
        # that exiting without close() terminates it instead of joining it (a hang).
        self._daemon = daemon
        # Restarted workers that have not said hello yet: (deadline, commands waiting).
        self._starting: dict[int, tuple[float, list[Any]]] = {}
        self._start_errors: dict[int, Exception] = {}  # why a start failed, until its exit
        self._last_words: dict[int, str] = {}  # why a worker is dying, until its exit
        self._ready_since: dict[int, float] = {}
        # Env lines (aiovec._transport.lines), for workers of several blocking envs that
        # may step them in threads: worker -> env id -> the agent's end of its line.
        self._lines: dict[int, dict[int, socket.socket]] = {}
        self._lines_allowed = (
            envs_per_block is None and concurrent_envs is not False and remote_envs <= MAX_LINES
        )
        self._threaded: set[int] = set()  # workers that said Threads: steps may take lines
        self._concurrent: set[int] = set()  # workers that said Threads: envs step at once
        # Per worker: the seqs of its commands other than steps still in flight.
        self._controls: dict[int, set[int]] = {}
        self._local: EnvHost | BlockHost | None = None
        if inline_envs:
            self.groups.append(list(range(remote_envs, num_envs)))

        if context not in CONTEXTS:
            raise ValueError(f"context must be one of {CONTEXTS} (or None), got {context!r}")
        if context == "zygote" and not zygote.available():
            raise ValueError("context='zygote' needs Linux >= 5.3 (pidfd); use 'spawn'")
        if context in ("spawn", "forkserver"):
            _check_main_importable()
        self._startup_hint = STARTUP_HINT + (
            MAIN_GUARD_HINT if context in ("spawn", "forkserver") else ""
        )
        # Workers fork from a process that has already imported numpy and gymnasium, and
        # never import the user's __main__ (see aiovec._worker.zygote).
        self._zygote = zygote.shared() if context == "zygote" else None
        # Any: typeshed's BaseContext lacks the .Process that every real context has.
        self._context: Any = None if self._zygote else multiprocessing.get_context(context)
        self._processes: list[multiprocessing.process.BaseProcess | zygote.ZygoteProcess] = []
        self._connections: list[Channel] = []
        self._dead: set[int] = set()
        self._region: SharedRegion | None = None
        self._inbox: list[WorkerEvent] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakeup = Wakeup()
        self._poller: select.poll | None = None  # for wait_blocking, built on first use
        self._worker_of_fd: dict[int, int] = {}
        self.num_workers = num_workers
        try:
            for worker in range(num_workers):
                # Placeholders that _start fills at once (close() copes with a failed start).
                self._processes.append(None)  # type: ignore[arg-type]
                self._connections.append(None)  # type: ignore[arg-type]
                self._controls[worker] = set()
                self._start(worker)
            local_descriptions: list[EnvDescription] = []
            if inline_envs:  # built while the workers build theirs
                local_fns = group_factories(env_fns, self.groups[-1], size)
                # As isolated as the workers' envs: one vector env, one behaviour.
                local_host, local_descriptions = build_local_host(
                    local_fns, autoreset_mode, max_restarts, envs_per_block, isolated=True
                )
                self.copies_local_results = True
                refuse_async_envs(local_host, "inline_envs (envs in this process)")
                self._local = local_host
                self.groups[-1] = self._local.group  # the host's own list (see compact_step)
                self.local_workers = frozenset({len(self.groups) - 1})
            self.descriptions = self._handshake(range(num_workers)) + local_descriptions
        except BaseException:
            self.close(timeout=0)
            raise

    @descriptor_limit_explained()  # whichever descriptor meets the limit: say what to do
    def _start(self, worker: int, restart_reason: str | None = None) -> None:
        """Start the process of ``worker`` (again, after a failure, with the reason)."""
        parent_end, child_end = channel_pair()
        args = (self._payloads[worker], self.groups[worker][0])
        kwargs = {
            "autoreset_mode": self._autoreset_mode.value,
            "spin": self.spin,
            "max_restarts": self._max_restarts,
            "restart_reason": restart_reason,
            "step_timeout": self._step_timeout,
            "concurrent_envs": self._concurrent_envs,
            "envs_per_block": self._envs_per_block,
            "daemon": self._daemon,
            # A forkserver's workers watch the agent themselves; the zygote's die with it.
            "agent_pid": None if self._zygote is not None else os.getpid(),
        }
        try:
            if self._zygote is not None:
                if not self._zygote.alive:  # it died (killed by hand, OOM): start another
                    self._zygote = zygote.shared()
                process = self._zygote.spawn(worker_main, child_end, args, kwargs)
            else:
                process = self._context.Process(
                    target=worker_main,
                    args=(child_end, *args),
                    kwargs=kwargs,
                    name=f"aiovec-worker-{worker}",
                    daemon=True,
                )
                process.start()
        except BaseException:
            parent_end.close()
            raise
        finally:
            child_end.close()
        self._processes[worker], self._connections[worker] = process, parent_end
        self._worker_of_fd[process.sentinel] = worker
        self._worker_of_fd[parent_end.fileno()] = worker

    # --- start-up -------------------------------------------------------------------------

    def _handshake(self, workers: Sequence[int]) -> list[EnvDescription]:
        """Wait for the ``Hello`` of each of ``workers``; their env descriptions, in order."""
        described: dict[int, list[EnvDescription]] = {}
        # Channels and process sentinels (ints): wait() takes anything with a fileno().
        waiting: dict[Any, int] = {self._connections[w]: w for w in workers}
        waiting.update({self._processes[w].sentinel: w for w in workers})
        deadline = (
            None if self._startup_timeout is None else time.monotonic() + self._startup_timeout
        )
        while len(described) < len(workers):
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready_ones = wait(list(waiting), remaining)
            if not ready_ones:
                late = [w for w in workers if w not in described]
                raise StartupTimeoutError(
                    [env_id for w in late for env_id in self.groups[w]], self._startup_timeout
                )
            for ready in ready_ones:
                worker = waiting[ready]
                if worker in described:
                    continue
                connection = self._connections[worker]
                try:
                    hello = decode_message(connection.receive())
                except (EOFError, OSError):
                    hello = LastWords(self._startup_hint)
                if isinstance(hello, LastWords):  # it died (saying why, or not)
                    self._processes[worker].join(1.0)
                    raise WorkerCrashedError(
                        worker, self.groups[worker], self._processes[worker].exitcode, hello.text
                    ) from None
                assert isinstance(hello, Hello)
                if hello.error is not None:
                    raise hello.error.to_exception()
                described[worker] = cloudpickle.loads(hello.spaces)
                if hello.async_envs:
                    self._async_workers.add(worker)
        return [description for w in workers for description in described[w]]

    def cancels_late_envs(self, worker: int) -> bool:
        return worker in self._async_workers

    def steps_concurrently(self, worker: int) -> bool:
        return worker in self._concurrent or worker in self._async_workers

    def running_envs(self, worker: int) -> list[int]:
        return [] if worker in self._dead else self._marked_running(worker)

    def _marked_running(self, worker: int) -> list[int]:
        """The envs ``worker`` marked as running (see Buffers.running), dead or alive."""
        buffers = getattr(self, "buffers", None)  # none before the workers described envs
        if buffers is None:
            return []
        return [env_id for env_id in self.groups[worker] if buffers.running[env_id]]

    @descriptor_limit_explained()  # whichever descriptor meets the limit: say what to do
    def attach(
        self, observation_space: spaces.Space[Any], action_space: spaces.Space[Any]
    ) -> Buffers:
        num_envs = len(self.descriptions)
        self._region = SharedRegion(buffers_nbytes(observation_space, action_space, num_envs))
        self._layout = pickle.dumps((observation_space, action_space, num_envs, self._region.size))
        for worker in range(len(self._connections)):
            self._hand_buffers(worker)
        self.buffers = build_buffers(
            observation_space, action_space, num_envs, self._region.allocator()
        )
        if self._local is not None:
            self._local.attach(self.buffers)
        return self.buffers

    def _hand_buffers(self, worker: int) -> None:
        """Give ``worker`` the shared region, its layout and the env lines it gets (see
        aiovec._worker.main's protocol).

        Raises:
            OSError: the worker is gone.
        """
        self._close_lines(worker)
        group = self.groups[worker]
        lined = (
            self._lines_allowed
            and 1 < len(group) <= MAX_WORKER_LINES
            and worker not in self._async_workers
        )
        agent_ends, worker_fds = open_lines(len(group) if lined else 0)
        try:
            fds = [fd for pair in worker_fds for fd in pair]
            self._connections[worker].send_fds([cast(SharedRegion, self._region).fd, *fds])
        except BaseException:
            for end in agent_ends:
                end.close()
            raise
        finally:
            for receiving, _ in worker_fds:  # now the worker's alone
                socket.close(receiving)
        if agent_ends:
            self._lines[worker] = dict(zip(group, agent_ends))
        self._connections[worker].send(self._layout)

    def _close_lines(self, worker: int) -> None:
        self._threaded.discard(worker)
        for line in self._lines.pop(worker, {}).values():
            line.close()

    # --- failures -----------------------------------------------------------------------------

    def restart(self, worker: int, reason: str) -> None:
        """Replace dead ``worker`` by a new process that rebuilds its envs.

        Returns at once: commands submitted meanwhile wait until the new worker says
        hello, within ``startup_timeout`` (past that it is killed, and its exit reported
        as a :class:`aiovec.StartupTimeoutError`; a factory that raises is reported as its
        :class:`aiovec.EnvError`). Every env of the new worker answers its next step
        with a fresh reset observation flagged as restarted (``EnvHost.notify_restart``).
        """
        assert worker in self._dead, "only a dead worker can be restarted"
        old = self._processes[worker]
        _stop_processes([old], 0)
        old.close()  # frees its sentinel descriptor
        self._connections[worker].close()
        self._start(worker, restart_reason=reason)
        deadline = math.inf if self._startup_timeout is None else self._startup_timeout
        self._starting[worker] = (time.monotonic() + deadline, [])
        self._dead.discard(worker)
        self._poller = None
        if self._loop is not None and not self._loop.is_closed():
            self._watch(self._loop, worker)

    def ready_since(self, worker: int) -> float:
        return math.inf if worker in self._starting else self._ready_since.get(worker, 0.0)

    def _started(self, worker: int, hello: Any) -> None:
        """The ``Hello`` of a restarted worker: hand it the buffers and what waited."""
        _, waiting = self._starting.pop(worker)
        if not isinstance(hello, Hello) or hello.error is not None:
            if isinstance(hello, Hello):
                # not None: a Hello without an error did not get here
                self._start_errors[worker] = cast(ErrorInfo, hello.error).to_exception()
            self._processes[worker].kill()  # reported with that error through the sentinel
            return
        try:
            self._hand_buffers(worker)  # attached before restarts
        except OSError:  # it died just now, or cannot be reached: its end is reported
            self._processes[worker].kill()  # through the sentinel, with the commands
            return
        for payload in waiting:
            self.submit(worker, payload)
        self._ready_since[worker] = time.monotonic()

    def _expire_starts(self) -> float | None:
        """Kill restarted workers past their start-up deadline; seconds to the next one."""
        if not self._starting:
            return None
        now = time.monotonic()
        for worker, (deadline, _) in list(self._starting.items()):
            if deadline <= now and worker not in self._start_errors:
                self._start_errors[worker] = StartupTimeoutError(
                    self.groups[worker], self._startup_timeout, worker
                )
                self._processes[worker].kill()
        pending = [d for w, (d, _) in self._starting.items() if w not in self._start_errors]
        if not pending or min(pending) == math.inf:
            return None
        return max(0.0, min(pending) - now)

    def kill(self, worker: int) -> None:
        """SIGKILL ``worker`` (a hung env); its exit arrives as a ``WorkerExit`` message."""
        process = self._processes[worker]
        if worker not in self._dead and process.exitcode is None:
            process.kill()

    # --- commands and messages ----------------------------------------------------------------

    def prepare(self, worker: int, command: EnvCommand) -> EnvCommand | _Frame | _LineSteps:
        if worker == len(self._processes):  # this process's own group: run as is
            return command
        if worker in self._dead:
            raise WorkerGone(worker)
        if type(command) is not Step:
            return _Frame(command.seq, True, encode(wire_command(command)))
        if worker in self._threaded and command.actions is None and not self._controls[worker]:
            # Straight to the envs' threads (see aiovec._transport.lines): only while no
            # other command of this worker is in flight, which the step could overtake.
            lines, env_ids = self._lines[worker], command.env_ids
            if len(env_ids) == 1:  # first-ready one env at a time: the command as it is
                return _LineSteps([(lines[env_ids[0]], _framed(encode(command)))])
            seq, stream = command.seq, command.stream
            return _LineSteps(
                [
                    (lines[env_id], _framed(encode(Step(seq, [env_id], None, stream))))
                    for env_id in env_ids
                ]
            )
        command = compact_step(command, self.groups[worker])
        return _Frame(command.seq, False, encode(wire_command(command)))

    def submit(self, worker: int, command: Any) -> None:
        # command: from prepare: the EnvCommand itself for this process's own group
        if worker == len(self._processes):  # this process's own group: run it now
            local = cast("EnvHost | BlockHost", self._local)  # built with the own group
            self._inbox.append((worker, local.execute(command)))
            return
        starting = self._starting.get(worker)
        if starting is not None:  # sent once the new worker has said hello
            starting[1].append(command)
            return
        if type(command) is _LineSteps:
            for line, frame in command.frames:
                try:  # a few dozen bytes to a line holding nothing else: never blocks
                    line.sendall(frame)
                except OSError:  # it died just now; its exit is reported through the sentinel
                    return
            return
        if command.control:
            self._controls[worker].add(command.seq)
        self._send_soon(worker, command.data)

    def _send_soon(self, worker: int, frame: bytes) -> None:
        """Send without blocking: a worker that does not read now (its env is busy)
        gets the rest when its socket has room; the agent never waits on it."""
        try:
            if self._connections[worker].send_soon(frame):
                return
        except OSError:  # it died just now; its exit is reported through the sentinel
            return
        if worker not in self._unsent:
            self._unsent.add(worker)
            self._poller = None  # rebuilt watching for room too
            if self._loop is not None and not self._loop.is_closed():
                self._loop.add_writer(self._connections[worker].fileno(), self._flush, worker)

    def _flush(self, worker: int) -> None:
        """The socket of ``worker`` has room: send what waits."""
        try:
            done = self._connections[worker].flush()
        except OSError:  # gone: reported through the sentinel
            done = True
        if done:
            self._stop_flushing(worker)

    def _stop_flushing(self, worker: int) -> None:
        if worker in self._unsent:
            self._unsent.discard(worker)
            self._poller = None
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_writer(self._connections[worker].fileno())

    def interrupt(self) -> None:
        self._wakeup.wake()

    def nudge(self) -> None:
        self._wakeup.nudge()

    def poll(self) -> list[WorkerEvent]:
        for worker, connection in enumerate(self._connections):
            if worker not in self._dead:
                self._drain(worker, connection)
        messages, self._inbox = self._inbox, []
        return messages

    wait_suspends = True

    def take_loop_lag(self) -> float | None:
        return self._wakeup.take_lag()

    async def wait(self, timeout: float | None = None, *, spin: bool = True) -> list[WorkerEvent]:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._bind(loop)
        if self._starting:
            timeout = _sooner(timeout, self._expire_starts())
        if not self._inbox:
            window = self._spin_begin() if spin else None
            await self._wakeup.wait(loop, timeout, window or 0.0, self._spin_slice)
            if window is not None and self._inbox:
                self._spin_policy.end()
        else:  # a turn for the loop's other tasks all the same (see wait_suspends)
            await asyncio.sleep(0)
        messages, self._inbox = self._inbox, []
        return messages

    def _spin_begin(self) -> float | None:
        """A wait starts: the seconds to spin first (0: sleep at once, measured by the
        spin policy; ``None``: sleep at once, spinning is not allowed). It is allowed
        while the processes that need a core are no more than the cores: this one, and
        the workers that step their envs in turn (those stepping waiting envs in
        threads mostly sleep); then the policy decides whether it pays."""
        if self.spin or (
            self._spin_by_default and len(self._processes) - len(self._concurrent) < self._cores
        ):
            return self._spin_policy.begin()
        return None

    def wait_blocking(
        self, timeout: float | None = None, *, spin: bool = True
    ) -> list[WorkerEvent]:
        timeout = _sooner(timeout, self._expire_starts())
        if not self._inbox:
            window = self._spin_begin() if spin else None
            events: list[tuple[int, int]] = []
            if window:
                started = time.perf_counter()
                if timeout is not None:  # the spin is part of the wait, not added to it
                    window = min(window, timeout)
                events = self._spin_poll(window)
                if timeout is not None:
                    timeout = max(0.0, timeout - (time.perf_counter() - started))
            if not events:
                events = self._ready_poller().poll(None if timeout is None else timeout * 1000)
            if events and window is not None:
                self._spin_policy.end()
            self._handle(events)
        messages, self._inbox = self._inbox, []
        return messages

    def _ready_poller(self) -> select.poll:
        """The poller of every live worker's socket (and its room, while something waits
        to be sent to it) and sentinel; rebuilt after any change to those."""
        if self._poller is None:
            self._poller = select.poll()
            for worker in range(len(self._processes)):
                if worker not in self._dead:
                    interest = select.POLLIN | (select.POLLOUT if worker in self._unsent else 0)
                    self._poller.register(self._connections[worker].fileno(), interest)
                    self._poller.register(self._processes[worker].sentinel, select.POLLIN)
        return self._poller

    def _handle(self, events: list[tuple[int, int]]) -> None:
        """Act on what :meth:`_ready_poller` found: send, receive, note exits."""
        for fd, mask in events:
            worker = self._worker_of_fd[fd]
            if worker not in self._dead:
                if mask & select.POLLOUT:
                    self._flush(worker)
                self._drain(worker, self._connections[worker])
                if fd == self._processes[worker].sentinel:
                    self._on_exit(worker)

    def _spin_poll(self, seconds: float) -> list[tuple[int, int]]:
        deadline = time.perf_counter() + seconds
        poll = self._ready_poller().poll
        while time.perf_counter() < deadline:
            events = poll(0)
            if events:
                return events
        return []

    def _spin_slice(self, seconds: float) -> bool:
        """One slice of an awaited spin (:meth:`Wakeup.wait`): poll for up to ``seconds``
        and act on what came, as the event loop's callbacks would; whether anything did."""
        events = self._spin_poll(seconds)
        self._handle(events)
        return bool(events)

    def _drain(self, worker: int, connection: Channel) -> None:
        controls = self._controls[worker]
        for frame in connection.receive_ready():
            message = decode_message(frame)
            if type(message) is LastWords:  # why it is about to die (see _on_exit)
                self._last_words[worker] = message.text
                continue
            if worker in self._starting:
                self._started(worker, message)
                continue
            if type(message) is Threads:  # its envs now step in threads of their own,
                self._concurrent.add(worker)
                # ...from now: what was queued in it while it stepped them in turn
                # starts now, at once (see ready_since)
                self._ready_since[worker] = time.monotonic()
                if worker in self._lines:  # which read their lines
                    self._threaded.add(worker)
                continue
            if controls:
                controls.discard(message.seq)  # answered once, all its envs together
            self._inbox.append((worker, message))
        if connection.eof:
            self._on_exit(worker)

    def _on_readable(self, worker: int) -> None:
        self._drain(worker, self._connections[worker])
        self._wakeup.wake()

    def _on_exit(self, worker: int) -> None:
        if worker in self._dead:
            return
        self._dead.add(worker)
        self._threaded.discard(worker)
        self._concurrent.discard(worker)  # a restarted worker starts stepping in turn
        self._controls[worker].clear()  # in flight no more (the scheduler resends them)
        self._poller = None  # rebuilt without this worker's descriptors
        self._stop_flushing(worker)
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._connections[worker].fileno())
            self._loop.remove_reader(self._processes[worker].sentinel)
        self._drain(worker, self._connections[worker])  # what it said before dying
        process = self._processes[worker]
        process.join(1.0)
        hint = STARTUP_HINT if self._starting.pop(worker, None) is not None else ""
        last_words = self._last_words.pop(worker, None)
        if last_words is not None:
            hint = f"{last_words}; {hint}" if hint else last_words
        elif getattr(process, "zygote_died", False):
            hint = ZYGOTE_DIED_HINT
        error = self._start_errors.pop(worker, None)
        running = tuple(self._marked_running(worker))  # which env it was in when it died
        if running:
            self.buffers.running[list(running)] = 0  # a replacement starts with none
        self._inbox.append((worker, WorkerExit(process.exitcode, hint, error, running)))
        self._wakeup.wake()

    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Watch every live worker from ``loop`` (and stop watching from the previous one)."""
        self._unbind()
        for worker in range(len(self._processes)):
            if worker not in self._dead:
                self._watch(loop, worker)
        self._loop = loop

    def _watch(self, loop: asyncio.AbstractEventLoop, worker: int) -> None:
        loop.add_reader(self._connections[worker].fileno(), self._on_readable, worker)
        loop.add_reader(self._processes[worker].sentinel, self._on_exit, worker)
        if worker in self._unsent:
            loop.add_writer(self._connections[worker].fileno(), self._flush, worker)

    def _unbind(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            for worker, (process, connection) in enumerate(zip(self._processes, self._connections)):
                if worker not in self._dead:
                    self._loop.remove_reader(connection.fileno())
                    self._loop.remove_reader(process.sentinel)
                    self._loop.remove_writer(connection.fileno())
        self._loop = None

    # --- shutdown -------------------------------------------------------------------------

    def close(self, timeout: float) -> None:
        """Stop every worker (``timeout`` seconds to exit, then SIGTERM, then SIGKILL) and
        release every descriptor and the shared region. Interrupted (a Ctrl-C while it
        waits), it kills the workers that are left before the interruption goes on."""
        try:
            self._unbind()
            if self._forked_copy():
                return
            try:
                self._tell_workers_to_close(timeout)
                _stop_processes(self._processes, timeout)
            except BaseException:
                _kill_and_reap(self._processes)  # however the wait ended, no worker outlives it
                raise
            finally:
                self._close_sentinels()
        finally:
            self._release()

    async def aclose(self, timeout: float) -> None:
        """:meth:`close` from a coroutine: the event loop runs while the workers exit.
        Cancelled (Ctrl-C under ``asyncio.run()``), it kills the workers that are left
        before the cancellation goes on."""
        try:
            self._unbind()
            if self._forked_copy():
                return
            try:
                self._tell_workers_to_close(timeout)
                await _processes_stopped(self._processes, timeout)
            except BaseException:
                _kill_and_reap(self._processes)
                raise
            finally:
                self._close_sentinels()
        finally:
            self._release()

    def _forked_copy(self) -> bool:
        """Whether this is a forked copy of the agent (its child closing what it
        inherited): the workers are the parent's, never stopped from here; only the
        descriptors are dropped."""
        if os.getpid() == self._owner_pid:
            return False
        for process in self._processes:
            if isinstance(process, zygote.ZygoteProcess):
                process.forget()
        return True

    def _tell_workers_to_close(self, timeout: float) -> None:
        for worker, connection in enumerate(self._connections):
            if worker in self._starting and connection is not None:
                # Not handed its buffers yet, it waits for descriptors: a Close in
                # their place tells it to close (see FrameInsteadOfDescriptors), as
                # the others are; not the end of its channel, which says the agent
                # is gone (its envs' processes are then killed with it).
                try:
                    connection.sock.send(_framed(encode(Close(seq=0))), socket.MSG_DONTWAIT)
                except OSError:
                    pass
            elif worker not in self._dead and connection is not None:
                try:  # a worker that does not read (its env is busy) gets no more time
                    connection.send(encode(Close(seq=0)), timeout=min(timeout, 0.1))
                except OSError:  # gone, or not reading (TimeoutError): stopped below
                    pass

    def _close_sentinels(self) -> None:
        for process in _started(self._processes):
            if process.exitcode is not None:
                process.close()  # frees its sentinel (a pidfd for zygote workers)

    def _release(self) -> None:
        """Close every descriptor and the shared region (the workers are stopped)."""
        for connection in self._connections:
            if connection is not None:
                connection.close()
        for worker in list(self._lines):
            self._close_lines(worker)
        self._dead.update(range(len(self._processes)))
        if self._local is not None:
            self._local.close()
            self._local = None
        self.__dict__.pop("buffers", None)  # see SharedRegion.close: views keep the mapping
        if self._region is not None:
            self._region.close()
            self._region = None


#: Why a worker died when the zygote that forked it died first.
ZYGOTE_DIED_HINT = (
    "aiovec's zygote (the process that starts the workers) was killed, and its workers "
    "with it (by the kernel's OOM killer? see dmesg); restarted workers get a new one"
)


def _framed(data: bytes) -> bytes:
    return HEADER.pack(len(data)) + data


def _sooner(timeout: float | None, other: float | None) -> float | None:
    """The shorter of two optional timeouts."""
    if other is None:
        return timeout
    return other if timeout is None else min(timeout, other)


def _started(processes: list[Any]) -> list[Any]:
    """The workers of ``processes`` that were started (a slot may be empty or unstarted)."""
    return [process for process in processes if process is not None and process.pid is not None]


def _stop_processes(processes: list[Any], timeout: float) -> None:
    """Join, then SIGTERM, then SIGKILL: every process is reaped when this returns."""
    started = _started(processes)
    deadline = time.monotonic() + timeout
    for process in started:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in started:
        if process.exitcode is None:
            process.terminate()
    deadline = time.monotonic() + TERMINATE_GRACE  # one grace for all, not one each
    for process in started:
        process.join(max(0.0, deadline - time.monotonic()))
    _kill_and_reap(started)


async def _processes_stopped(processes: list[Any], timeout: float) -> None:
    """:func:`_stop_processes` from a coroutine (its twin: keep them in step), looking
    every few milliseconds while the event loop runs."""
    started = _started(processes)
    await _exited(started, timeout)
    for process in started:
        if process.is_alive():
            process.terminate()
    await _exited(started, TERMINATE_GRACE)  # one grace for all, not one each
    _kill_and_reap(started)


async def _exited(processes: list[Any], timeout: float) -> None:
    """Return once every process has exited, or after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while any(process.is_alive() for process in processes) and time.monotonic() < deadline:
        await asyncio.sleep(0.005)


def _kill_and_reap(processes: list[Any]) -> None:
    """SIGKILL every started process still running and wait for each to exit. A
    KeyboardInterrupt meanwhile (an impatient second Ctrl-C) is raised once all are
    reaped: a killed process exits within milliseconds."""
    started = _started(processes)
    interrupted: BaseException | None = None
    for process in started:
        while True:
            try:
                if process.exitcode is None:
                    process.kill()
                process.join()
                break
            except KeyboardInterrupt as exc:
                interrupted = exc
    if interrupted is not None:
        raise interrupted
