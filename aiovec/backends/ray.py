"""Ray backend: groups of envs hosted in Ray actors, for more cores than one machine has.

Each actor (:class:`~aiovec.backends._ray_actor.EnvActor`) runs an ``EnvHost`` over its
group (several envs per actor, like a worker process). Ray places the actors (resources,
``actors_per_node``), watches them and kills them; results of one actor travel as one
numpy payload, whatever number of envs finished. Two transports carry requests and
answers (``ray_options={"transport": ...}``):

- ``"link"`` (the default): the agent connects to each actor over TCP and the actor
  pushes results the moment its envs finish; the event loop watches the connections as
  it watches worker pipes, and a Ray call left pending on each actor reports its death.
  A Ray actor call costs milliseconds of CPU on both sides; a frame costs microseconds.
- ``"calls"`` (the default under Ray Client, whose driver may not reach the nodes):
  every request is an actor call and the event loop awaits its object ref; an actor that
  owes results gets a call when the agent is about to wait.

A dead actor (``ray.kill``, a crashed node) is reported like a dead worker process, and
the restart policy rebuilds it. aiovec calls ``ray.init`` only when Ray is not
initialized yet (and then shuts it down on ``close``); connect to a cluster with
``ray_options={"address": ...}`` or by calling ``ray.init`` yourself first.
"""

from __future__ import annotations

import asyncio
import secrets
import select
import socket
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from aiovec._transport.buffers import Buffers, build_buffers
from aiovec._transport.channel import Channel
from aiovec._transport.protocol import EnvCommand, Step, encode, to_wire, wire_command
from aiovec._transport.spaces import read_rows, write_rows
from aiovec._worker.host import EnvDescription
from aiovec._worker.registrations import agent_registrations
from aiovec.backends._base import (
    Backend,
    Wakeup,
    WorkerEvent,
    WorkerExit,
    group_factories,
    pickle_factories,
    split_groups,
)
from aiovec.backends._ray_actor import TOKEN_SIZE, EnvActor, answer_decoder
from aiovec.errors import StartupTimeoutError, WorkerCrashedError

try:
    import ray
    from ray.util.client import ray as ray_client
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "backend='ray' needs Ray: pip install 'aiovec[ray]' (or pip install ray)"
    ) from exc

TRANSPORTS = ("link", "calls")
#: Seconds to connect a link (an actor that started listens at once).
CONNECT_TIMEOUT = 30.0
#: The request that carries no command: "answer whatever finished".
_ASK = encode((None, None))


class ActorDied(str):
    """What a transport reports when an actor is gone (the text says how it went)."""


class RayBackend(Backend):
    """``num_workers`` Ray actors, each hosting a contiguous group of envs."""

    def __init__(
        self,
        env_fns: Sequence[Callable[[], Any]],
        autoreset_mode: AutoresetMode,
        num_workers: int | None = None,
        max_restarts: int = 0,
        ray_options: dict[str, Any] | None = None,
        step_timeout: float | None = None,
        envs_per_block: int | None = None,
        startup_timeout: float | None = 300.0,
    ) -> None:
        options = dict(ray_options or {})
        transport = options.pop("transport", None)
        if transport not in (None, *TRANSPORTS):
            raise ValueError(
                f"ray_options['transport'] must be one of {TRANSPORTS} (or left out), "
                f"got {transport!r}"
            )
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            ray.init(
                address=options.pop("address", None),
                include_dashboard=False,
                log_to_driver=options.pop("log_to_driver", False),
                **options.pop("init_kwargs", {}),
            )
        if transport is None:
            transport = "calls" if ray_client.is_connected() else "link"
        self.transport = transport
        units = len(env_fns)  # envs, or batched envs of envs_per_block rows each
        if num_workers is None:
            num_workers = min(units, int(ray.available_resources().get("CPU", 1)) or 1)
        if not 1 <= num_workers <= units:
            raise ValueError(f"num_workers must be between 1 and {units}, got {num_workers}")
        self.groups = split_groups(units, num_workers, envs_per_block or 1)
        self.num_workers = num_workers
        self._envs_per_block = envs_per_block
        self._factories = [
            pickle_factories(
                group_factories(env_fns, group, envs_per_block or 1), destination="a Ray actor"
            )
            for group in self.groups
        ]
        # An actor is a fresh interpreter: it gets the ids registered here (see
        # aiovec._worker.registrations), every one, as its registry cannot be known from here.
        self._registrations = agent_registrations()
        self._autoreset_mode = autoreset_mode
        self._max_restarts = max_restarts
        self._cpus_per_actor = options.pop("num_cpus", 1)
        self._actor_class = ray.remote(num_cpus=self._cpus_per_actor)(EnvActor)
        self._startup_timeout = startup_timeout
        self._concurrent = options.pop("concurrent_envs", None)
        actors_per_node = options.pop("actors_per_node", None)
        self._actor_options = options  # the rest: resources, scheduling_strategy, ...
        self._actors: list[Any] = [None] * num_workers
        self._owed = [0] * num_workers  # env commands each actor has not answered yet
        self._dead: set[int] = set()
        self._inbox: list[WorkerEvent] = []
        self._placement: list[dict[str, Any]] = [{}] * num_workers
        self._step_timeout = step_timeout
        self._cancelling: set[int] = set()  # actors that cancel their late (async) envs
        self._stepping_at_once: set[int] = set()  # actors stepping a command's envs at once
        self._transport: _Links | _Calls = (_Links if transport == "link" else _Calls)(self)
        try:
            if actors_per_node is not None:
                self._placement = _spread(num_workers, actors_per_node)
            deadline = None if startup_timeout is None else time.monotonic() + startup_timeout
            for worker in range(num_workers):
                self._start(worker)
            self.descriptions = [
                d for worker in range(num_workers) for d in self._describe(worker, deadline)
            ]
        except BaseException:
            self.close(0)
            raise

    def _start(self, worker: int, restart_reason: str | None = None) -> None:
        options = {**self._actor_options, **self._placement[worker]}
        self._actors[worker] = self._actor_class.options(**options).remote(
            self._factories[worker],
            self._autoreset_mode.value,
            self._max_restarts,
            restart_reason,
            self._concurrent,
            self._step_timeout,
            self._envs_per_block,
            registrations=self._registrations,
        )
        self._owed[worker] = 0

    def _describe(self, worker: int, deadline: float | None) -> list[Any]:
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            description = ray.get(self._actors[worker].describe.remote(), timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise StartupTimeoutError(
                self.groups[worker], self._startup_timeout, hint=self._placement_hint()
            ) from None
        except ray.exceptions.RayActorError as exc:
            hint = f"its Ray actor died while building its envs: {exc}".split("\n")[0]
            raise WorkerCrashedError(worker, self.groups[worker], None, hint) from exc
        if not isinstance(description, tuple):  # an ErrorInfo: a factory raised
            raise description.to_exception()
        descriptions: list[EnvDescription]
        descriptions, cancels_late_envs, concurrent = description
        if cancels_late_envs:
            self._cancelling.add(worker)
        if concurrent:
            self._stepping_at_once.add(worker)
        else:  # a restarted actor may decide otherwise
            self._stepping_at_once.discard(worker)
        return descriptions

    def _placement_hint(self) -> str:
        """Why an actor may not have started: the usual cause is that Ray cannot place
        it (each asks ``num_cpus`` and keeps it while it lives), not a slow constructor."""
        total = ray.cluster_resources().get("CPU", 0)
        asked = self._cpus_per_actor * self.num_workers
        if asked <= total:
            return "(their constructor hangs or is slow, or Ray cannot place their actor)"
        return (
            f"(Ray cannot place every actor: {self.num_workers} actors asking "
            f"num_cpus={self._cpus_per_actor} each need {asked:g} CPUs, and the cluster has "
            f"{total:g}; pass fewer num_workers=, or ray_options={{'num_cpus': ...}} with "
            "less per actor)"
        )

    def cancels_late_envs(self, worker: int) -> bool:
        return worker in self._cancelling

    def steps_concurrently(self, worker: int) -> bool:
        return worker in self._stepping_at_once

    def attach(
        self, observation_space: spaces.Space[Any], action_space: spaces.Space[Any]
    ) -> Buffers:
        self._spaces = (observation_space, action_space, len(self.descriptions))
        ray.get([actor.attach.remote(*self._spaces) for actor in self._actors])
        for worker in range(self.num_workers):
            self._transport.open(worker)
        self.buffers = build_buffers(observation_space, action_space, self._spaces[2], np.zeros)
        return self.buffers

    # --- commands and results -------------------------------------------------------------

    def prepare(self, worker: int, command: EnvCommand) -> tuple[int, bytes]:
        actions = None
        if isinstance(command, Step) and command.actions is None:
            actions = read_rows(self.buffers.actions, command.env_ids)
        return len(command.env_ids), encode((wire_command(command), to_wire(actions)))

    def submit(self, worker: int, command: tuple[int, bytes]) -> None:
        count, request = command
        self._owed[worker] += count
        self._transport.send(worker, request)

    def _collect(self, worker: int, answer: Any) -> None:
        """Apply what ``worker`` answered (a payload, :class:`ActorDied`, or the exception
        its call raised)."""
        if worker in self._dead:
            return
        if isinstance(answer, ActorDied):
            self._dead.add(worker)
            self._transport.forget(worker)
            self._inbox.append((worker, WorkerExit(None, answer)))
            return
        if isinstance(answer, BaseException):
            raise answer  # not the envs' fault: aiovec's own actor code failed
        concurrent, finished = answer_decoder.decode(answer)
        if concurrent:  # the actor found that its envs wait (see EnvActor)
            self._stepping_at_once.add(worker)
        for reply, rows in finished:
            env_ids = reply.env_ids
            if rows is not None:
                observations, rewards, terminations, truncations = rows
                if observations is not None:
                    write_rows(self.buffers.observations, env_ids, observations)
                self.buffers.rewards[env_ids] = rewards
                self.buffers.terminations[env_ids] = terminations
                self.buffers.truncations[env_ids] = truncations
            self._owed[worker] -= len(env_ids)
            self._inbox.append((worker, reply))

    def interrupt(self) -> None:
        self._transport.interrupt()

    def nudge(self) -> None:
        self._transport.nudge()

    def poll(self) -> list[WorkerEvent]:
        return self._messages(self._transport.poll())

    async def wait(self, timeout: float | None = None, *, spin: bool = True) -> list[WorkerEvent]:
        if not self._inbox:
            await self._transport.wait(timeout)
        # What woke us is already gathered (read by the loop's callbacks, or an awaited
        # ref): no second pass over every link or in-flight call.
        return self._messages(self._transport.take())

    def _messages(self, answers: list[tuple[int, Any]]) -> list[WorkerEvent]:
        for worker, answer in answers:
            self._collect(worker, answer)
        messages, self._inbox = self._inbox, []
        return messages

    def wait_blocking(
        self, timeout: float | None = None, *, spin: bool = True
    ) -> list[WorkerEvent]:
        if not self._inbox:
            self._transport.wait_blocking(timeout)
        return self.poll()

    # --- failures -----------------------------------------------------------------------------

    def kill(self, worker: int) -> None:
        if worker not in self._dead:
            ray.kill(self._actors[worker], no_restart=True)

    def restart(self, worker: int, reason: str) -> None:
        self._start(worker, restart_reason=reason)
        timeout = self._startup_timeout
        self._describe(worker, None if timeout is None else time.monotonic() + timeout)
        ray.get(self._actors[worker].attach.remote(*self._spaces))
        self._transport.open(worker)
        self._dead.discard(worker)

    # --- shutdown -------------------------------------------------------------------------

    def close(self, timeout: float) -> None:
        self._transport.closing = True
        # Without Ray (shut down already, e.g. at interpreter exit) the actors are gone
        # with it, or with their owner: any Ray call now would start a new Ray.
        if ray.is_initialized():
            live = [
                actor
                for worker, actor in enumerate(self._actors)
                if actor is not None and worker not in self._dead
            ]
            if timeout and live:
                closing = [actor.close.remote() for actor in live]
                ray.wait(closing, num_returns=len(closing), timeout=timeout)
            for actor in self._actors:
                if actor is not None:
                    ray.kill(actor, no_restart=True)
        self._transport.close()
        self._dead.update(range(len(self._actors)))
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()


class _Links:
    """The ``link`` transport: a connection to each actor (unix socket on this node, TCP
    elsewhere), watched like worker pipes.

    Answers are pushed by the actors; a pending ``closed`` call on each actor fails when
    the actor dies, which is reported through a socket pair so that both the event loop
    and a blocking wait notice it (an actor whose node vanished may never close its
    connection)."""

    def __init__(self, backend: RayBackend) -> None:
        self._backend = backend
        self._links: list[Channel | None] = [None] * backend.num_workers
        self._answers: list[tuple[int, Any]] = []
        self._deaths: list[tuple[int, Channel, str]] = []  # appended by Ray's threads
        self._death_signal, self._death_signal_writer = socket.socketpair()
        self._death_signal.setblocking(False)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakeup = Wakeup()
        self._poller: select.poll | None = None
        self.closing = False

    def open(self, worker: int) -> None:
        actor = self._backend._actors[worker]
        token = secrets.token_bytes(TOKEN_SIZE)
        node, host, port, unix_name = ray.get(actor.link.remote(token))
        try:
            if unix_name is not None and node == this_node():
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(CONNECT_TIMEOUT)
                sock.connect(unix_name)
            else:
                sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(token)
        except OSError as exc:
            raise ConnectionError(
                f"could not connect to the Ray actor of worker {worker} at {host}:{port} "
                f"({exc}): this process must reach the cluster's nodes on any TCP port; "
                "where it cannot, pass ray_options={'transport': 'calls'}"
            ) from exc
        sock.settimeout(None)
        self._drop(worker)
        link = self._links[worker] = Channel(sock)
        actor.closed.remote().future().add_done_callback(partial(self._on_closed, worker, link))
        if self._loop is not None:
            self._loop.add_reader(link.fileno(), self._on_readable, worker)
        self._poller = None

    def send(self, worker: int, request: bytes) -> None:
        link = self._links[worker]
        if link is not None:
            try:
                link.send(request)
            except OSError:  # it died just now: its end of file is reported by poll
                pass
            if link.buffered:  # answers read while the request waited for room
                self._read(worker, link)
                self._wakeup.wake()

    def poll(self) -> list[tuple[int, Any]]:
        self._take_deaths()
        for worker, link in enumerate(self._links):
            if link is not None:
                self._read(worker, link)
        answers, self._answers = self._answers, []
        return answers

    def interrupt(self) -> None:
        self._wakeup.wake()

    def nudge(self) -> None:
        self._wakeup.nudge()

    def take(self) -> list[tuple[int, Any]]:
        """What the loop's callbacks gathered (no reads)."""
        self._take_deaths()
        answers, self._answers = self._answers, []
        return answers

    async def wait(self, timeout: float | None) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._bind(loop)
        if not self._answers and not self._deaths:
            await self._wakeup.wait(loop, timeout)

    def wait_blocking(self, timeout: float | None) -> None:
        if self._answers or self._deaths:
            return
        if self._poller is None:
            self._poller = select.poll()
            self._poller.register(self._death_signal, select.POLLIN)
            for link in self._links:
                if link is not None:
                    self._poller.register(link.fileno(), select.POLLIN)
        events = self._poller.poll(None if timeout is None else timeout * 1000)
        if any(fd == self._death_signal.fileno() for fd, _ in events):
            self._drain_death_signal()

    def forget(self, worker: int) -> None:
        self._drop(worker)

    def close(self) -> None:
        self.closing = True
        for worker in range(len(self._links)):
            self._drop(worker)
        self._loop = None
        self._death_signal.close()
        self._death_signal_writer.close()

    def _read(self, worker: int, link: Channel) -> None:
        for frame in link.receive_ready():
            self._answers.append((worker, frame))
        if link.eof:
            self._drop(worker)
            self._answers.append(
                (worker, ActorDied("its Ray actor died or dropped its link (see its log)"))
            )

    def _on_readable(self, worker: int) -> None:
        link = self._links[worker]
        if link is not None:
            self._read(worker, link)
        self._wakeup.wake()

    def _on_closed(self, worker: int, link: Channel, call: Any) -> None:
        """In a Ray thread: the actor's ``closed`` call ended (it failed: the actor died)."""
        if self.closing or call.cancelled() or call.exception() is None:
            return
        self._deaths.append((worker, link, str(call.exception()).split("\n")[0]))
        try:
            self._death_signal_writer.send(b"\0")
        except OSError:
            pass

    def _on_death_signal(self) -> None:
        self._drain_death_signal()
        self._take_deaths()
        self._wakeup.wake()

    def _drain_death_signal(self) -> None:
        try:
            while self._death_signal.recv(4096):
                pass
        except OSError:  # drained (BlockingIOError), or closed
            pass

    def _take_deaths(self) -> None:
        if not self._deaths:
            return
        self._drain_death_signal()  # (its byte may also come later: drained then)
        while self._deaths:
            worker, link, message = self._deaths.pop(0)
            if self._links[worker] is link:  # not a link already lost, or an old actor's
                self._read(worker, link)  # what it said before dying
                if self._links[worker] is link:
                    self._drop(worker)
                    self._answers.append((worker, ActorDied(f"its Ray actor died: {message}")))

    def _drop(self, worker: int) -> None:
        link, self._links[worker] = self._links[worker], None
        if link is not None:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(link.fileno())
            link.close()
            self._poller = None

    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Watch every link from ``loop`` (and stop watching from the previous one)."""
        self._unbind()
        loop.add_reader(self._death_signal.fileno(), self._on_death_signal)
        for worker, link in enumerate(self._links):
            if link is not None:
                loop.add_reader(link.fileno(), self._on_readable, worker)
        self._loop = loop

    def _unbind(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._death_signal.fileno())
            for link in self._links:
                if link is not None:
                    self._loop.remove_reader(link.fileno())
        self._loop = None


class _Calls:
    """The ``calls`` transport: each request is an ``exchange`` actor call whose object
    ref the event loop awaits directly; an actor that owes results is asked for them
    when the agent is about to wait, not when a call returns (by then the agent usually
    has sent new actions, and that call asks for the rest too)."""

    def __init__(self, backend: RayBackend) -> None:
        self._backend = backend
        self._in_flight: dict[Any, int] = {}  # object ref -> worker
        self._calls = [0] * backend.num_workers  # exchange calls in flight, per actor
        self._futures: dict[Any, asyncio.Future[Any]] = {}
        self._interrupted: asyncio.Future[None] | None = None
        self._nudged = False  # a nudge while nothing waited: the next wait returns at once
        self.closing = False

    def interrupt(self) -> None:
        if self._interrupted is not None and not self._interrupted.done():
            self._interrupted.set_result(None)

    def nudge(self) -> None:
        interrupted = self._interrupted
        if interrupted is None:
            self._nudged = True
        elif not interrupted.get_loop().is_closed():
            interrupted.get_loop().call_soon_threadsafe(self.interrupt)

    def open(self, worker: int) -> None:
        self._calls[worker] = 0

    def send(self, worker: int, request: bytes) -> None:
        ref = self._backend._actors[worker].exchange.remote(request)
        self._in_flight[ref] = worker
        self._calls[worker] += 1

    def take(self) -> list[tuple[int, Any]]:
        """The awaited results (already fetched; no Ray call)."""
        return [
            self._take(ref, future.result())
            for ref, future in list(self._futures.items())
            if future.done()
        ]

    def poll(self) -> list[tuple[int, Any]]:
        self._ask_for_the_rest()
        answers = self.take()  # awaited results first, then whatever else Ray has ready
        if self._in_flight:
            ready, _ = ray.wait(list(self._in_flight), num_returns=len(self._in_flight), timeout=0)
            answers += [self._take(ref, _fetch(ref)) for ref in ready]
        return answers

    async def wait(self, timeout: float | None) -> None:
        self._ask_for_the_rest()
        if self._in_flight:
            for ref in self._in_flight:  # object refs are awaitable: one future each
                if ref not in self._futures:
                    self._futures[ref] = asyncio.ensure_future(_await(ref))
            self._interrupted = asyncio.get_running_loop().create_future()
            if self._nudged:  # (checked once the future is there: see nudge)
                self._nudged = False
                self._interrupted.set_result(None)
            try:
                await asyncio.wait(
                    [*self._futures.values(), self._interrupted],
                    timeout=timeout,
                    return_when=asyncio.FIRST_COMPLETED,
                )
            finally:
                self._interrupted = None

    def wait_blocking(self, timeout: float | None) -> None:
        self._ask_for_the_rest()
        if self._in_flight:
            ray.wait(list(self._in_flight), num_returns=1, timeout=timeout)

    def forget(self, worker: int) -> None:
        for ref in [r for r, w in self._in_flight.items() if w == worker]:
            del self._in_flight[ref]
            self._futures.pop(ref, None)

    def close(self) -> None:
        for future in self._futures.values():
            future.cancel()
        self._futures.clear()

    def _ask_for_the_rest(self) -> None:
        backend = self._backend
        for worker, owed in enumerate(backend._owed):
            if owed and not self._calls[worker] and worker not in backend._dead:
                self.send(worker, _ASK)

    def _take(self, ref: Any, answer: Any) -> tuple[int, Any]:
        worker = self._in_flight.pop(ref)
        self._futures.pop(ref, None)
        self._calls[worker] -= 1
        if isinstance(answer, ray.exceptions.RayActorError):
            answer = ActorDied(f"its Ray actor died: {answer}".split("\n")[0])
        return worker, answer


def this_node() -> str:
    """The Ray node id of this process (actors on it are linked through unix sockets)."""
    return ray.get_runtime_context().get_node_id()


def _spread(num_actors: int, actors_per_node: int) -> list[dict[str, Any]]:
    """Actor options placing ``actors_per_node`` actors on each alive node in turn (a
    preference: an actor rebuilt after its node died goes wherever Ray finds room)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if actors_per_node < 1:
        raise ValueError(f"actors_per_node must be at least 1, got {actors_per_node}")
    nodes = sorted(node["NodeID"] for node in ray.nodes() if node["Alive"])
    needed = -(-num_actors // actors_per_node)
    if needed > len(nodes):
        raise ValueError(
            f"{num_actors} actors at {actors_per_node} per node need {needed} nodes; the Ray "
            f"cluster has {len(nodes)} alive: add nodes, or raise actors_per_node"
        )
    return [
        {
            "scheduling_strategy": NodeAffinitySchedulingStrategy(
                nodes[a // actors_per_node], soft=True
            )
        }
        for a in range(num_actors)
    ]


async def _await(ref: Any) -> Any:
    try:
        return await ref
    except Exception as exc:  # classified by RayBackend._collect
        return exc


def _fetch(ref: Any) -> Any:
    try:
        return ray.get(ref)
    except Exception as exc:  # classified by RayBackend._collect
        return exc
