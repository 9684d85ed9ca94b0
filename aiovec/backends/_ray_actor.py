"""The Ray actor side of the Ray backend: a group of envs and their result rows.

An :class:`EnvActor` answers the agent in one of two ways (the backend picks one):

- **link**: the agent connects straight to the actor over TCP (:meth:`EnvActor.link`);
  requests arrive as frames and results are pushed back the moment envs finish, with no
  Ray call per step. Ray still places, reserves, watches and kills the actor.
- **calls**: every request is an :meth:`EnvActor.exchange` actor call whose object ref
  the agent awaits (for drivers that cannot reach the actors' nodes, e.g. Ray Client).

Both carry the same msgpack payloads: a request is ``(command, action rows)``, an answer
is ``(whether the actor steps a command's envs at once, [(reply, result rows), ...])``.
"""

from __future__ import annotations

import asyncio
import hmac
import secrets
import socket
import sys
import threading
import traceback
from collections.abc import Sequence
from typing import Any, Union, cast

import msgspec
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from aiovec._loop import new_event_loop
from aiovec._transport import by_value
from aiovec._transport.buffers import build_buffers
from aiovec._transport.channel import HEADER
from aiovec._transport.protocol import (
    Command,
    EnvCommand,
    ErrorInfo,
    Reply,
    Reset,
    Step,
    decoder,
    encode,
    encode_reply,
    to_wire,
    undecodable_reply,
)
from aiovec._transport.spaces import read_rows, write_rows
from aiovec._worker import mark_worker_process, thread_clock
from aiovec._worker.async_server import AsyncEnvServer
from aiovec._worker.blocks import build_host
from aiovec._worker.host import EnvBuildError, EnvHost
from aiovec._worker.registrations import install
from aiovec._worker.threads import EnvThreads
from aiovec._worker.waiting_meter import WaitingMeter
from aiovec.async_env import AsyncEnv

request_decoder = decoder(tuple[Union[Command, None], Any])
answer_decoder = decoder(tuple[bool, list[tuple[Reply, Any]]])

#: Bytes of the secret the agent sends first on a link (so nothing else can drive envs).
TOKEN_SIZE = 16


class EnvActor:
    """A group of envs, their own buffers, results as numpy payloads.

    Envs that mostly wait (async envs, or blocking envs that sleep or do IO, found from
    their first steps as a process worker finds them, see
    :class:`~aiovec._worker.waiting_meter.WaitingMeter`) run concurrently, each as a
    task of the actor's event loop (blocking ones in a thread each), and whichever envs
    finish are answered first. CPU-bound envs are stepped one after the other, a
    command at a time. Each answer says which of the two the actor does.
    """

    def __init__(
        self,
        factories: bytes,
        autoreset_mode: str,
        max_restarts: int,
        restart_reason: str | None,
        concurrent: bool | None = None,
        step_timeout: float | None = None,
        envs_per_block: int | None = None,
        registrations: Sequence[bytes] = (),
    ) -> None:
        mark_worker_process()
        install(registrations)  # before the factories, which may name those ids
        env_fns = by_value.loads_each(factories)
        try:
            self.host, self._descriptions = build_host(
                env_fns, AutoresetMode(autoreset_mode), max_restarts, envs_per_block
            )
        except EnvBuildError as exc:
            self.build_error: ErrorInfo | None = exc.info
            # Never used again: describe() reports the error and the agent gives up.
            self.host = None  # type: ignore[assignment]
            return
        self.build_error = None
        self.host.copies_values = True  # its envs never share a value sent to them
        envs = self.host.envs
        if envs_per_block is not None:
            concurrent = False  # a block is stepped in one call: nothing to overlap
        if restart_reason is not None:
            self.host.notify_restart(restart_reason)
        self._server: AsyncEnvServer | None = None
        #: Async envs only: a late env's command is cancelled here, alone. (An env stepped
        #: in a thread cannot be interrupted: the agent kills the actor instead.)
        self.cancels_late_envs = all(isinstance(env, AsyncEnv) for env in envs.values())
        if any(isinstance(env, AsyncEnv) for env in envs.values()):
            concurrent = True  # async envs can only be stepped on an event loop
        self._step_timeout = step_timeout
        #: Finds out whether the envs mostly wait, while they step one after another
        #: (``None``: decided already, or nothing to overlap).
        self._meter = WaitingMeter(self.host) if concurrent is None and len(envs) > 1 else None
        #: Whether a command's envs step at once (else one after another).
        self.concurrent = False
        if concurrent:
            self._step_concurrently()
        self._outbox: list[tuple[Reply, Any]] = []
        self._owed = 0  # env commands submitted and not answered yet
        # seq -> [whether its replies carry result rows, env ids still to answer]
        self._unanswered: dict[int, list[Any]] = {}
        self._progress: asyncio.Event | None = None  # calls: set when the outbox fills
        self._link: asyncio.StreamWriter | None = None  # link: where answers are pushed
        self._listeners: list[asyncio.Server] = []
        self._link_loop: asyncio.AbstractEventLoop | None = None  # link: runs the envs
        self._push_scheduled = False
        self._closed: asyncio.Event | None = None

    def _step_concurrently(self) -> None:
        """From now on, run each command's envs at once, answering them as they finish."""
        self.concurrent, self._meter = True, None
        if not self.cancels_late_envs:
            self.host.threads = EnvThreads()
        self._server = AsyncEnvServer(
            cast(EnvHost, self.host),  # a BlockHost is never concurrent (see __init__)
            emit=self._finished,
            step_timeout=self._step_timeout if self.cancels_late_envs else None,
        )

    def describe(self) -> Any:
        """The envs' descriptions, whether late envs are cancelled here and whether a
        command's envs step at once (or the error of the factory that raised)."""
        if self.build_error is not None:
            return self.build_error
        return self._descriptions, self.cancels_late_envs, self.concurrent

    def attach(
        self, observation_space: spaces.Space[Any], action_space: spaces.Space[Any], n: int
    ) -> None:
        self.host.attach(build_buffers(observation_space, action_space, n, np.zeros))

    # --- commands -------------------------------------------------------------------------

    def _start(self, command: EnvCommand, actions: Any) -> None:
        """Run ``command`` (now, or on the server); its answers reach the outbox."""
        failed = undecodable_reply(command)
        if failed is not None:  # the caller's error: the envs answer with it
            self._outbox.append((failed, None))
            return
        if actions is not None:
            write_rows(self.host.buffers.actions, command.env_ids, actions)
        carries_rows = isinstance(command, (Step, Reset))
        if self._server is None:  # one after the other: the whole command now
            meter = self._meter
            timed = meter is not None and type(command) is Step and meter.wants(command)
            if timed:
                start = thread_clock.read()
            reply = self.host.execute(command)
            self._outbox.append((reply, self._rows(reply.env_ids) if carries_rows else None))
            if timed and cast(WaitingMeter, meter).add(
                thread_clock.since(start), cast(Step, command)
            ):
                self._step_concurrently()  # (the envs wait: this answer says so)
            return
        self._owed += len(command.env_ids)
        self._unanswered[command.seq] = [carries_rows, len(command.env_ids)]
        self._server.submit(command, asyncio.get_running_loop())

    def _finished(self, reply: Reply) -> None:
        self._owed -= len(reply.env_ids)
        carries_rows, unanswered = entry = self._unanswered[reply.seq]
        entry[1] = unanswered = unanswered - len(reply.env_ids)
        if not unanswered:
            del self._unanswered[reply.seq]
        self._outbox.append((reply, self._rows(reply.env_ids) if carries_rows else None))
        if self._link is not None:
            if not self._push_scheduled:  # one frame for all that finish this iteration
                self._push_scheduled = True
                asyncio.get_running_loop().call_soon(self._push)
        elif self._progress is not None:
            self._progress.set()

    def _rows(self, env_ids: list[int]) -> Any:
        """Observations, rewards and flags of ``env_ids`` after a step or reset."""
        buffers = self.host.buffers
        observations = None
        if buffers.observations is not None:
            observations = read_rows(buffers.observations, env_ids)
        return [
            observations,
            buffers.rewards[env_ids],
            buffers.terminations[env_ids],
            buffers.truncations[env_ids],
        ]

    def _answer(self) -> bytes:
        """The outbox as one payload (and the outbox emptied)."""
        finished, self._outbox = self._outbox, []
        # Each reply encoded alone: a value of one env that cannot travel fails that
        # env (see encode_reply), never the whole answer and with it the link.
        replies = [(msgspec.Raw(encode_reply(reply)), to_wire(rows)) for reply, rows in finished]
        return encode((self.concurrent, replies))

    # --- calls ----------------------------------------------------------------------------

    async def exchange(self, request: bytes) -> bytes:
        """Start the request's command, if any (with the action rows of its envs, for
        shared spaces), then return ``(reply, result rows)`` of whatever finished,
        waiting for at least one while any command is unanswered. Requests and answers
        travel as msgpack bytes: Ray moves bytes for half the cost of pickled objects."""
        command, actions = request_decoder.decode(request)
        if command is not None:
            self._start(command, actions)
        if self._progress is None:
            self._progress = asyncio.Event()
        while not self._outbox and self._owed:
            self._progress.clear()
            await self._progress.wait()
        return self._answer()

    # --- link -----------------------------------------------------------------------------

    async def link(self, token: bytes) -> tuple[str, str, int, str | None]:
        """Listen for the agent's connection; returns ``(node id, host, port, unix
        socket name)``: an agent on the same node connects to the unix socket (Linux'
        abstract namespace: no file; ``None`` elsewhere), a fifth cheaper per round
        trip than TCP over loopback (25-30 vs 32-36 us here); others connect to
        ``host:port``.

        The first connection that sends ``token`` becomes the link; requests are then
        read from it and answers pushed to it until it closes. The link and the envs get
        an event loop of their own (uvloop when installed), in a thread: Ray's loop is
        plain asyncio, which doubles the cost of handing steps to env threads."""
        import ray

        host = ray.util.get_node_ip_address()
        self._link_loop = new_event_loop()
        serving = threading.Thread(target=self._link_loop.run_forever, name="aiovec-link")
        serving.daemon = True  # an actor is stopped by Ray, never by this thread
        serving.start()
        listening = asyncio.run_coroutine_threadsafe(self._listen(token, host), self._link_loop)
        port, unix_name = await asyncio.wrap_future(listening)
        return ray.get_runtime_context().get_node_id(), host, port, unix_name

    async def _listen(self, token: bytes, host: str) -> tuple[int, str | None]:
        def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> Any:
            return self._serve(token, reader, writer)

        tcp = await asyncio.start_server(serve, host=host, port=0)
        self._listeners = [tcp]
        unix_name = None
        if sys.platform.startswith("linux"):
            unix_name = f"\0aiovec-link-{secrets.token_hex(12)}"
            self._listeners.append(await asyncio.start_unix_server(serve, path=unix_name))
        return tcp.sockets[0].getsockname()[1], unix_name

    async def _serve(
        self, token: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            offered = await reader.readexactly(len(token))
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
            return
        if self._link is not None or not hmac.compare_digest(offered, token):
            writer.close()
            return
        for listener in self._listeners:
            listener.close()
        sock = writer.get_extra_info("socket")
        if sock.family != socket.AF_UNIX:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._link = writer
        try:
            while True:
                (size,) = HEADER.unpack(await reader.readexactly(HEADER.size))
                command, actions = request_decoder.decode(await reader.readexactly(size))
                self._start(command, actions)
                if self._outbox and not self._push_scheduled:
                    self._push()  # a command run one after the other: answered now
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the agent went away; Ray stops this actor
        except Exception:  # aiovec's own failure, not an env's: drop the link, say why
            traceback.print_exc()  # (to the actor's log)
            writer.close()

    def _push(self) -> None:
        self._push_scheduled = False
        if self._outbox and self._link is not None and not self._link.is_closing():
            answer = self._answer()
            self._link.write(HEADER.pack(len(answer)) + answer)

    async def closed(self) -> None:
        """Returns once :meth:`close` ran: a call of this that fails instead tells the
        agent that the actor died."""
        if self._closed is None:
            self._closed = asyncio.Event()
        await self._closed.wait()

    async def close(self) -> None:
        if self._closed is None:
            self._closed = asyncio.Event()
        self._closed.set()
        if self._link_loop is None:
            await self._close_envs()
            return
        closing = asyncio.run_coroutine_threadsafe(self._close_envs(), self._link_loop)
        try:
            await asyncio.wrap_future(closing)
        finally:
            self._link_loop.call_soon_threadsafe(self._link_loop.stop)

    async def _close_envs(self) -> None:
        if self._link is not None:
            self._link.close()
        if self.host is None:
            return
        if self._server is not None:
            await self._server.aclose(timeout=5.0)
        else:
            self.host.close()
        if self.host.threads is not None:
            self.host.threads.shutdown()
