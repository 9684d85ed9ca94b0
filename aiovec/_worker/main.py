"""The subprocess side: build a group of envs, then serve commands until told to stop.

Protocol on the worker's channel (a socket pair):
1. worker -> parent: ``Hello`` (the envs' spaces, or the error of a failing factory);
2. parent -> worker: the shared region's file descriptor (``SCM_RIGHTS``), with, in
   the same message, the two descriptors of each env's line (for all of its envs, or
   none; see :mod:`aiovec._transport.lines`), then a pickled
   ``(observation_space, action_space, num_envs, size)``;
3. then one ``Reply`` per command, in order, until ``Close`` or end of file; a worker
   that starts stepping its envs in threads says ``Threads`` first, after which steps
   may also come on its env lines.

The worker dies with the agent: ``PR_SET_PDEATHSIG`` on Linux (and a watch on the
agent's pidfd when its parent is a forkserver), and end of file on the connection
everywhere.
"""

from __future__ import annotations

import asyncio
import ctypes
import multiprocessing
import os
import pickle
import select
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Coroutine
from typing import Any, cast

import cloudpickle
from gymnasium.vector import AutoresetMode

from aiovec._loop import new_event_loop
from aiovec._transport import by_value
from aiovec._transport.buffers import build_buffers
from aiovec._transport.channel import Channel, FrameInsteadOfDescriptors
from aiovec._transport.memory import SharedRegion
from aiovec._transport.protocol import (
    Close,
    Hello,
    LastWords,
    Reply,
    Step,
    Threads,
    decode_command,
    encode,
    encode_reply,
    expand_command,
    undecodable_reply,
)
from aiovec._transport.spin import SpinPolicy
from aiovec._worker import mark_worker_process, thread_clock
from aiovec._worker.async_server import AsyncEnvServer
from aiovec._worker.blocks import BlockHost, build_host
from aiovec._worker.host import (
    EnvBuildError,
    EnvDescription,
    EnvHost,
    StepOutcome,
    catch_env_exits,
    error_info,
)
from aiovec._worker.thread_server import EnvLine, ThreadedEnvServer
from aiovec._worker.timer_slack import set_timer_slack
from aiovec._worker.waiting_meter import WaitingMeter
from aiovec.async_env import AsyncEnv


def _die_with_agent(agent_pid: int | None) -> None:
    """Be killed when the agent dies, even while an env hangs (end of file on the
    channel only stops a worker that reads it). The kernel's parent-death signal covers
    a worker the agent started itself, and a zygote's (the zygote dies with the agent);
    a worker whose parent is some other long-lived process (multiprocessing's
    forkserver) also watches the agent's pidfd from a thread."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # no prctl: end of file on the pipe still stops us
        pass
    if agent_pid is None or os.getppid() == agent_pid or not hasattr(os, "pidfd_open"):
        return
    try:
        agent = os.pidfd_open(agent_pid)
    except ProcessLookupError:  # gone already
        os.kill(os.getpid(), signal.SIGKILL)
        return
    except OSError:  # no pidfd here (Linux < 5.3): end of file still stops a reading worker
        return

    def kill_when_the_agent_exits() -> None:
        select.select([agent], [], [])  # readable once the agent has exited
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(
        target=kill_when_the_agent_exits, name="aiovec-agent-watch", daemon=True
    ).start()


def _yield_to_the_agent_on_wakeup() -> None:
    """Put this thread under ``SCHED_BATCH``: woken by the agent's command, it waits
    for a free core instead of preempting the agent on its own. Only the receiving
    thread of a worker serving waiting envs does this (it just hands commands to the
    envs' threads): measured, 16 envs sleeping 2 ms on 2 cores, first-ready one env at a
    time, the agent's time per env-step fell from 90-120 to 56-73 us and the rate from a
    median 0.60 to 0.70 of ideal in 5 interleaved pairs. The envs' threads keep the
    default policy. A no-op where Linux's policy cannot be set."""
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except (AttributeError, OSError):  # not Linux, or a policy this one cannot leave
        pass


def _pickled_descriptions(descriptions: list[EnvDescription]) -> bytes:
    """``descriptions`` pickled for the agent. Metadata entries that cannot be pickled
    (a lock, an open handle) are left out of them: Gymnasium reads metadata in the
    caller's process, where anything goes, and they are rarely read; the env is not
    refused for them. (Spaces or a spec that cannot be pickled still raise.)"""
    try:
        pickled: bytes = cloudpickle.dumps(descriptions)
    except Exception:  # the usual case costs one pickling; this one, one per entry
        kept = [d._replace(metadata=_picklable_entries(d.metadata)) for d in descriptions]
        pickled = cloudpickle.dumps(kept)
    return pickled


def _picklable_entries(mapping: dict[str, Any]) -> dict[str, Any]:
    kept = {}
    for key, value in mapping.items():
        try:
            cloudpickle.dumps(value)
        except Exception:
            continue
        kept[key] = value
    return kept


def worker_main(
    sock: socket.socket,
    factories: bytes | dict[int, Callable[[], Any]],
    first_env_id: int,
    autoreset_mode: str,
    spin: float = 0.0,
    max_restarts: int = 0,
    restart_reason: str | None = None,
    step_timeout: float | None = None,
    concurrent_envs: bool | None = None,
    envs_per_block: int | None = None,
    daemon: bool = True,
    agent_pid: int | None = None,
) -> None:
    """Entry point of a worker process; returns when the parent says so or goes away.

    A worker of async envs cancels an env's command that takes longer than
    ``step_timeout`` on its own (the others go on); blocking envs cannot be interrupted
    from inside, so the parent kills their worker instead.

    Blocking envs that mostly wait (sleep, IO, a remote simulator) are stepped
    concurrently, a thread each, answering first-ready; CPU-bound envs one after the
    other. ``concurrent_envs=None`` decides from the steps' CPU share (see
    :class:`~aiovec._worker.waiting_meter.WaitingMeter`). Batched
    envs (``envs_per_block`` given) are stepped one block after the other.
    """
    _die_with_agent(agent_pid)
    mark_worker_process()
    set_timer_slack()  # before any thread starts: each inherits it
    sock.set_inheritable(False)  # as every descriptor of ours: see Channel.receive_fds
    if not daemon:  # its envs may start processes (multiprocessing refuses daemonic parents)
        multiprocessing.current_process().daemon = False
    connection = Channel(sock)
    # Ctrl-C belongs to the agent's process, which then closes us in order.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    catch_env_exits()  # so an env's own KeyboardInterrupt or sys.exit() is its error
    try:
        try:
            # Inherited as they are (a fork: what they capture, shared memory included,
            # stays shared, as fork gives it) or pickled (the zygote, spawn: each env
            # unpickles its own copy of what its factory captured).
            env_fns = factories if isinstance(factories, dict) else by_value.loads_each(factories)
            host, descriptions = build_host(
                env_fns, AutoresetMode(autoreset_mode), max_restarts, envs_per_block
            )
        except EnvBuildError as exc:
            connection.send(encode(Hello(error=exc.info)))
            return
        except Exception as exc:  # the factories could not even be unpickled here
            connection.send(encode(Hello(error=error_info(first_env_id, "unpickle", exc))))
            return
        envs = host.envs
        host.copies_values = True  # its envs never share a value sent to them
        if restart_reason is not None:  # this worker replaces one that failed
            host.notify_restart(restart_reason)
        async_envs = any(isinstance(env, AsyncEnv) for env in envs.values())
        try:
            hello = Hello(spaces=_pickled_descriptions(descriptions), async_envs=async_envs)
            connection.send(encode(hello))
            # The region lives until this process exits; the kernel frees it after the last user.
            region_fd, *line_fds = connection.receive_fds()
            env_lines = _lines(line_fds, list(envs))
            observation_space, action_space, num_envs, size = _layout(connection.receive())
            region = SharedRegion(size, fd=region_fd)
            host.attach(
                build_buffers(observation_space, action_space, num_envs, region.allocator())
            )
            batched = isinstance(host, BlockHost)  # blocks are stepped here, never in threads
            if batched or (not async_envs and not concurrent_envs):
                measure = concurrent_envs is None and len(envs) > 1 and not batched
                if not _serve(connection, host, spin, measure):
                    return  # told to stop
            # A BlockHost never gets here: _serve (measure=False for it) returns only on Close.
            env_host = cast(EnvHost, host)
            if not async_envs:  # waiting envs: a thread each (never cancelled: see above)
                _serve_threads(connection, env_host, env_lines)
                return
            _run_to_the_end(_serve_async(connection, env_host, step_timeout))
        finally:
            host.close()
    except FrameInsteadOfDescriptors:  # told to close before it had its buffers
        pass  # a normal end: what its envs' close() left running is left alone
    except (EOFError, ConnectionError):  # the agent is gone: there is nobody to report to
        _end_with_agent()
    except BaseException as exc:  # not an env call's (those are its env's errors): say so
        _say_last_words(connection, exc)
        raise


def _say_last_words(connection: Channel, exc: BaseException) -> None:
    """Tell the agent what is ending this worker (its crash error then says it): an
    exception raised outside any env's call, which no env's error reports."""
    trace = "".join(traceback.format_exception(exc)).rstrip()
    text = (
        f"its main thread raised {type(exc).__name__}: {exc} outside any env's call (an "
        f"env's signal handler, say); the worker's traceback:\n{trace}"
    )
    try:
        connection.send(encode(LastWords(text)), timeout=1.0)
    except Exception:  # the agent is gone or does not read: the traceback is on stderr
        pass


def _layout(frame: bytes) -> Any:
    """The buffers' layout the agent sent after their descriptors.

    Raises:
        FrameInsteadOfDescriptors: the agent sent ``Close`` instead (it is closing: a
            Ctrl-C while it handed the buffers out).
    """
    try:
        return pickle.loads(frame)
    except Exception:
        try:
            command = decode_command(frame)
        except Exception:
            command = None
        if isinstance(command, Close):
            raise FrameInsteadOfDescriptors("closed before the buffers' layout came") from None
        raise


def _end_with_agent() -> None:
    """End as a worker killed with its agent would: a worker that leads its process
    group (a zygote's) takes the processes its envs started along (a simulator their
    close() left running). It can read the end of its channel before its pidfd watch or
    the zygote kill it, and a worker ending normally is not its group's killer."""
    if os.getpgid(0) == os.getpid():
        sys.stdout.flush()
        sys.stderr.flush()
        os.killpg(0, signal.SIGKILL)


#: A streamed step flushes the envs done so far once this much time has passed.
STREAM_INTERVAL = 100e-6


def _serve(connection: Channel, host: EnvHost | BlockHost, spin: float, measure: bool) -> bool:
    """Serve commands one after the other until ``Close`` (returns False) or, with
    ``measure``, until the envs' steps turn out to mostly wait (returns True: serve them
    concurrently from now on; see :class:`~aiovec._worker.waiting_meter.WaitingMeter`)."""
    receive, send = connection.receive, connection.send
    spin_policy = SpinPolicy(spin)
    step_times: dict[int, float] = {}
    meter = WaitingMeter(host) if measure else None
    while True:
        command = expand_command(decode_command(receive(spin_policy)), host.group)
        if isinstance(command, Close):
            return False
        failed = undecodable_reply(command)
        if failed is not None:  # the caller's error, not the worker's: answer and go on
            send(encode_reply(failed, host.group))
            continue
        timed = meter is not None and isinstance(command, Step) and meter.wants(command)
        if timed:
            start = thread_clock.read()
        if isinstance(command, Step) and command.stream and len(command.env_ids) > 1:
            if isinstance(host, BlockHost):
                host.stream_step(lambda reply: send(encode_reply(reply, host.group)), command)
            else:
                _stream_step(send, host, command, step_times)
        else:
            send(encode_reply(host.execute(command), host.group))
        if timed and cast(WaitingMeter, meter).add(thread_clock.since(start), cast(Step, command)):
            return True


def _lines(fds: list[int], env_ids: list[int]) -> dict[int, EnvLine]:
    """The env line of each of ``env_ids`` from the descriptors the agent passed (two
    per env, in that order; none: the envs have no lines)."""
    pairs = zip(fds[::2], fds[1::2])
    return {
        env_id: EnvLine(Channel(socket.socket(fileno=receiving)), socket.socket(fileno=sending))
        for env_id, (receiving, sending) in zip(env_ids, pairs)
    }


def _serve_threads(
    connection: Channel, host: EnvHost, lines: dict[int, EnvLine] | None = None
) -> None:
    """Serve blocking envs that mostly wait, a thread each (see
    :class:`~aiovec._worker.thread_server.ThreadedEnvServer`), until ``Close``.

    This thread only receives and hands commands out; the envs' threads send the replies.
    With ``lines``, steps may also come straight to the envs' threads, once the agent
    has read ``Threads``.

    Raises:
        EOFError: the parent closed the connection (or went away).
        BaseException: what escaped an env's thread that was not the env's error
            (a bug, a ``BaseException`` nothing expects): the worker fails as a whole.
    """

    def wake_receiver() -> None:  # an env's thread failed: end the blocking receive below
        try:
            connection.sock.shutdown(socket.SHUT_RD)
        except OSError:
            pass

    # Before any env's thread sends, so that the agent reads it before their replies:
    # from now on a command's envs step at once (and steps may come on their lines).
    connection.send(encode(Threads()))
    server = ThreadedEnvServer(host, connection.send_frames, on_failure=wake_receiver, lines=lines)
    _yield_to_the_agent_on_wakeup()  # after the envs' threads started: theirs is unchanged
    try:
        while True:
            try:
                frame = connection.receive()
            except (EOFError, OSError):
                if server.failure is not None:
                    raise server.failure from None
                raise
            command = expand_command(decode_command(frame), host.group)
            if isinstance(command, Close):
                # Let each env finish the call it is in before the envs are closed (as a
                # worker serving envs in turn does); what is still queued is dropped.
                server.shutdown()
                server.join()
                return
            failed = undecodable_reply(command)
            if failed is not None:  # the caller's error, not the worker's: answer and go on
                server.answer(failed)
                continue
            server.submit(command)
    finally:
        server.shutdown()


def _run_to_the_end(serving: Coroutine[Any, Any, None]) -> None:
    """Run ``serving`` on a new event loop until it returns.

    A ``KeyboardInterrupt`` or ``SystemExit`` raised in a task of an env's own (an
    ``asyncio.gather`` in its step) leaves the loop, as asyncio lets them; that task
    holds it too, so the loop is resumed and the env's command fails with it as with
    any of its errors (see :func:`~aiovec._worker.host.catch_env_exits`).
    """
    loop = new_event_loop()
    server = loop.create_task(serving)
    while True:
        try:
            loop.run_until_complete(server)
            return
        except (KeyboardInterrupt, SystemExit):
            if server.done():  # the server's own end, not an env's task
                raise


async def _serve_async(connection: Channel, host: EnvHost, step_timeout: float | None) -> None:
    """Serve async envs: each env steps as its own task, so the worker overlaps the waits
    of all its envs (see :class:`~aiovec._worker.async_server.AsyncEnvServer`)."""
    loop = asyncio.get_running_loop()

    def emit(reply: Reply) -> None:
        connection.send(encode_reply(reply, host.group))
        if connection.buffered:  # commands read while the reply waited for room
            loop.call_soon(on_readable)

    server = AsyncEnvServer(host, emit=emit, step_timeout=step_timeout)
    stopped: asyncio.Future[bool] = loop.create_future()  # True: told to close

    def on_readable() -> None:
        for frame in connection.receive_ready():
            command = expand_command(decode_command(frame), host.group)
            if isinstance(command, Close):
                closed = True
                break
            failed = undecodable_reply(command)
            if failed is not None:
                connection.send(encode_reply(failed, host.group))
                continue
            server.submit(command, loop)
        else:
            if not connection.eof:
                return
            closed = False
        if not stopped.done():
            stopped.set_result(closed)

    loop.add_reader(connection.fileno(), on_readable)
    on_readable()  # frames read ahead while setting up are already in the channel's buffer
    try:
        closed = await stopped
    finally:
        loop.remove_reader(connection.fileno())
        await server.aclose()
    if not closed:
        raise EOFError("the agent closed the connection")


def _stream_step(
    send: Callable[[bytes], None], host: EnvHost, command: Step, step_times: dict[int, float]
) -> None:
    """Step env by env, sending what is done before an env expected to be slow starts
    (and whenever STREAM_INTERVAL has passed), so the agent can re-use fast envs while
    slow ones of the same worker still run. ``step_times`` holds each env's recent step
    time (an exponential average) over real steps only: a restart notice or the reset
    NEXT_STEP owes says nothing of the env's next step (a rebuilt env that hangs again
    would have seemed fast, and the results before it gone unsent); an env not timed yet
    counts as slow."""
    done: list[StepOutcome] = []
    last_flush = time.perf_counter()
    for position, env_id in enumerate(command.env_ids):
        if done and step_times.get(env_id, STREAM_INTERVAL) >= STREAM_INTERVAL:
            send(encode_reply(host.step_reply(command.seq, done), host.group))
            done, last_flush = [], time.perf_counter()
        started = time.perf_counter()
        outcome = host.step(env_id, host.action_of(command, position))
        done.append(outcome)
        now = time.perf_counter()
        if outcome.progressed and outcome.error is None:
            took = now - started
            step_times[env_id] = 0.8 * step_times.get(env_id, took) + 0.2 * took
        else:  # not a step of the env as it is now: its next one is unknown again
            step_times.pop(env_id, None)
        if now - last_flush >= STREAM_INTERVAL:
            send(encode_reply(host.step_reply(command.seq, done), host.group))
            done, last_flush = [], now
    if done:
        send(encode_reply(host.step_reply(command.seq, done), host.group))
