"""Ray backend: groups of envs hosted in Ray actors, for more cores than one machine has.

Each actor runs an ``EnvHost`` over its group (several envs per actor, like a worker
process). The agent talks to an actor through one method, ``exchange``: it carries a
command (if any) and returns the replies and result rows (numpy arrays) of whatever
envs finished, as one msgpack payload. Envs that mostly wait are stepped concurrently
inside the actor, so its fast envs answer while slow ones still run; an actor owing
results always has an ``exchange`` call in flight to answer with. The agent's event
loop awaits the actors' object refs directly, so first-ready works across actors
without polling. A dead actor (``ray.kill``, a crashed node) is reported like a dead
worker process, and the restart policy rebuilds it.

aiovec calls ``ray.init`` only when Ray is not initialized yet (and then shuts it down
on ``close``); connect to a cluster with ``ray_options={"address": "ray://..."}`` or by
calling ``ray.init`` yourself first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Union

import cloudpickle
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from aiovec._async_server import AsyncEnvServer
from aiovec._auto import WAITING_CPU_SHARE, probe_step_time
from aiovec._buffers import Buffers, build_buffers
from aiovec._host import EnvBuildError, EnvHost, build_envs, describe
from aiovec._protocol import (
    Command,
    Reply,
    Reset,
    Step,
    decoder,
    encode,
    to_wire,
    wire_command,
    wire_reply,
)
from aiovec._spaces import read_rows, write_rows
from aiovec.async_env import AsyncEnv
from aiovec.backends._base import Backend, Message, WorkerExit

try:
    import ray
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "backend='ray' needs Ray: pip install 'aiovec[ray]' (or pip install ray)"
    ) from exc


_request_decoder = decoder(tuple[Union[Command, None], Any])
_answer_decoder = decoder(list[tuple[Reply, Any]])


class EnvActor:
    """The actor side: a group of envs, their own buffers, results as numpy payloads.

    Envs that mostly wait (async envs, or blocking envs that sleep or do IO, found by a
    short probe) run concurrently, each as a task of the actor's event loop (blocking
    ones in a thread each), and :meth:`exchange` hands back whichever envs finished.
    CPU-bound envs are stepped one after the other, a command at a time.
    """

    def __init__(
        self,
        factories: bytes,
        autoreset_mode: str,
        max_restarts: int,
        restart_reason: str | None,
        concurrent: bool | None = None,
        step_timeout: float | None = None,
    ) -> None:
        env_fns = cloudpickle.loads(factories)
        try:
            envs = build_envs(env_fns)
        except EnvBuildError as exc:
            self.build_error = exc.info
            self.host = None
            return
        self.build_error = None
        self.host = EnvHost(
            envs, AutoresetMode(autoreset_mode), None, env_fns=env_fns, max_restarts=max_restarts
        )
        if restart_reason is not None:
            self.host.notify_restart(restart_reason)
        self._server: AsyncEnvServer | None = None
        #: Async envs only: a late env's command is cancelled here, alone. (An env stepped
        #: in a thread cannot be interrupted: the agent kills the actor instead.)
        self.cancels_late_envs = all(isinstance(env, AsyncEnv) for env in envs.values())
        if any(isinstance(env, AsyncEnv) for env in envs.values()):
            concurrent = True  # async envs can only be stepped on an event loop
        elif concurrent is None:
            concurrent = _mostly_waiting(next(iter(env_fns.values())))
        if concurrent:
            if not self.cancels_late_envs:
                self.host.threads = ThreadPoolExecutor(len(envs), "aiovec-env")
            self._server = AsyncEnvServer(
                self.host,
                emit=self._finished,
                step_timeout=step_timeout if self.cancels_late_envs else None,
            )
        self._outbox: list[tuple[Reply, Any]] = []
        self._owed = 0  # env commands submitted and not answered yet
        # seq -> [whether its replies carry result rows, env ids still to answer]
        self._unanswered: dict[int, list] = {}
        self._progress: asyncio.Event | None = None

    def describe(self) -> Any:
        """The envs' descriptions and whether late envs are cancelled here (or the error
        of the factory that raised)."""
        if self.build_error is not None:
            return self.build_error
        return [describe(env) for env in self.host.envs.values()], self.cancels_late_envs

    def attach(self, observation_space: spaces.Space, action_space: spaces.Space, n: int) -> None:
        self.host.attach(build_buffers(observation_space, action_space, n, np.zeros))

    async def exchange(self, request: bytes) -> bytes:
        """Start the request's command, if any (with the action rows of its envs, for
        shared spaces), then return ``(reply, result rows)`` of whatever finished,
        waiting for at least one while any command is unanswered. Requests and answers
        travel as msgpack bytes: Ray moves bytes for half the cost of pickled objects."""
        command, actions = _request_decoder.decode(request)
        finished = await self._exchange(command, actions)
        return encode([(wire_reply(reply), to_wire(rows)) for reply, rows in finished])

    async def _exchange(self, command: Command | None, actions: Any) -> list[tuple[Reply, Any]]:
        if command is not None:
            if actions is not None:
                write_rows(self.host.buffers.actions, command.env_ids, actions)
            if self._server is None:  # one after the other: the whole command now
                reply = self.host.execute(command)
                carries_rows = isinstance(command, (Step, Reset))
                return [(reply, self._rows(reply.env_ids) if carries_rows else None)]
            self._owed += len(command.env_ids)
            self._unanswered[command.seq] = [
                isinstance(command, (Step, Reset)),
                len(command.env_ids),
            ]
            self._server.submit(command, asyncio.get_running_loop())
        if self._progress is None:
            self._progress = asyncio.Event()
        while not self._outbox and self._owed:
            self._progress.clear()
            await self._progress.wait()
        finished, self._outbox = self._outbox, []
        return finished

    def _finished(self, reply: Reply) -> None:
        self._owed -= len(reply.env_ids)
        carries_rows, unanswered = entry = self._unanswered[reply.seq]
        entry[1] = unanswered = unanswered - len(reply.env_ids)
        if not unanswered:
            del self._unanswered[reply.seq]
        self._outbox.append((reply, self._rows(reply.env_ids) if carries_rows else None))
        if self._progress is not None:
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

    async def close(self) -> None:
        if self.host is None:
            return
        if self._server is not None:
            await self._server.aclose(timeout=5.0)
        else:
            self.host.close()
        if self.host.threads is not None:
            self.host.threads.shutdown(wait=False, cancel_futures=True)


def _mostly_waiting(env_fn: Callable[[], Any]) -> bool:
    """Whether envs made by ``env_fn`` spend their steps waiting rather than computing
    (so that they overlap when stepped concurrently)."""
    try:
        _, cpu_share = probe_step_time(env_fn)
    except Exception:
        return False  # the real commands will report what is wrong
    return cpu_share < WAITING_CPU_SHARE


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
    ) -> None:
        options = dict(ray_options or {})
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            ray.init(
                address=options.pop("address", None),
                include_dashboard=False,
                log_to_driver=options.pop("log_to_driver", False),
                **options.pop("init_kwargs", {}),
            )
        num_envs = len(env_fns)
        if num_workers is None:
            num_workers = min(num_envs, int(ray.available_resources().get("CPU", 1)) or 1)
        if not 1 <= num_workers <= num_envs:
            raise ValueError(f"num_workers must be between 1 and {num_envs}, got {num_workers}")
        self.groups = [g.tolist() for g in np.array_split(np.arange(num_envs), num_workers)]
        self.num_workers = num_workers
        self._factories = [
            cloudpickle.dumps({i: env_fns[i] for i in group}) for group in self.groups
        ]
        self._autoreset_mode = autoreset_mode
        self._max_restarts = max_restarts
        self._actor_class = ray.remote(num_cpus=options.pop("num_cpus", 1))(EnvActor)
        self._concurrent = options.pop("concurrent_envs", None)
        actors_per_node = options.pop("actors_per_node", None)
        self._actor_options = options  # the rest: resources, scheduling_strategy, ...
        self._actors: list[Any] = [None] * num_workers
        self._in_flight: dict[Any, int] = {}  # object ref -> worker
        self._owed = [0] * num_workers  # env commands each actor has not answered yet
        self._calls = [0] * num_workers  # exchange calls in flight, per actor
        self._futures: dict[Any, asyncio.Future] = {}
        self._dead: set[int] = set()
        self._inbox: list[Message] = []
        self._placement: list[dict[str, Any]] = [{}] * num_workers
        self._step_timeout = step_timeout
        self._cancelling: set[int] = set()  # actors that cancel their late (async) envs
        try:
            if actors_per_node is not None:
                self._placement = _spread(num_workers, actors_per_node)
            for worker in range(num_workers):
                self._start(worker)
            self.descriptions = [d for worker in range(num_workers) for d in self._describe(worker)]
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
        )
        self._owed[worker] = self._calls[worker] = 0

    def _describe(self, worker: int) -> list[Any]:
        description = ray.get(self._actors[worker].describe.remote())
        if not isinstance(description, tuple):  # an ErrorInfo: a factory raised
            raise description.to_exception()
        descriptions, cancels_late_envs = description
        if cancels_late_envs:
            self._cancelling.add(worker)
        return descriptions

    def cancels_late_envs(self, worker: int) -> bool:
        return worker in self._cancelling

    def attach(self, observation_space: spaces.Space, action_space: spaces.Space) -> Buffers:
        self._spaces = (observation_space, action_space, len(self.descriptions))
        ray.get([actor.attach.remote(*self._spaces) for actor in self._actors])
        self.buffers = build_buffers(observation_space, action_space, self._spaces[2], np.zeros)
        return self.buffers

    # --- commands and results -------------------------------------------------------------

    def submit(self, worker: int, command: Command) -> None:
        actions = None
        if isinstance(command, Step) and command.actions is None:
            actions = read_rows(self.buffers.actions, command.env_ids)
        self._owed[worker] += len(command.env_ids)
        self._call(worker, command, actions)

    def _call(self, worker: int, command: Command | None, actions: Any) -> None:
        request = encode((None if command is None else wire_command(command), to_wire(actions)))
        ref = self._actors[worker].exchange.remote(request)
        self._in_flight[ref] = worker
        self._calls[worker] += 1

    def _collect(self, ref: Any, finished: Any) -> None:
        """Apply what call ``ref`` returned (``finished``, or the exception it raised)."""
        worker = self._in_flight.pop(ref)
        self._futures.pop(ref, None)
        if worker in self._dead:
            return
        self._calls[worker] -= 1
        if isinstance(finished, ray.exceptions.RayActorError):
            exc = finished
            self._dead.add(worker)
            for other in [r for r, w in self._in_flight.items() if w == worker]:
                del self._in_flight[other]
                self._futures.pop(other, None)
            self._inbox.append(
                (worker, WorkerExit(None, f"its Ray actor died: {exc}".split("\n")[0]))
            )
            return
        if isinstance(finished, BaseException):
            raise finished  # not the envs' fault: aiovec's own actor code failed
        for reply, rows in _answer_decoder.decode(finished):
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

    def _ask_for_the_rest(self) -> None:
        """Make sure every actor that owes results has a call to answer them with.

        Done when the agent is about to wait, not when a call returns: by then the
        agent usually has sent new actions, and that call asks for the rest too."""
        for worker, owed in enumerate(self._owed):
            if owed and not self._calls[worker] and worker not in self._dead:
                self._call(worker, None, None)

    def poll(self) -> list[Message]:
        self._ask_for_the_rest()
        return self._drain()

    def _drain(self) -> list[Message]:
        # Awaited results first (already fetched), then whatever else Ray has ready.
        for ref in [ref for ref, future in self._futures.items() if future.done()]:
            self._collect(ref, self._futures[ref].result())
        if self._in_flight:
            ready, _ = ray.wait(list(self._in_flight), num_returns=len(self._in_flight), timeout=0)
            for ref in ready:
                self._collect(ref, _fetch(ref))
        messages, self._inbox = self._inbox, []
        return messages

    async def wait(self, timeout: float | None = None) -> list[Message]:
        self._ask_for_the_rest()
        if not self._inbox and self._in_flight:
            for ref in self._in_flight:  # object refs are awaitable: one future each
                if ref not in self._futures:
                    self._futures[ref] = asyncio.ensure_future(_await(ref))
            await asyncio.wait(
                list(self._futures.values()), timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
        return self._drain()

    def wait_blocking(self, timeout: float | None = None) -> list[Message]:
        self._ask_for_the_rest()
        if not self._inbox and self._in_flight:
            ray.wait(list(self._in_flight), num_returns=1, timeout=timeout)
        return self._drain()

    # --- failures -----------------------------------------------------------------------------

    def kill(self, worker: int) -> None:
        if worker not in self._dead:
            ray.kill(self._actors[worker], no_restart=True)

    def restart(self, worker: int, reason: str) -> None:
        self._start(worker, restart_reason=reason)
        self._describe(worker)
        ray.get(self._actors[worker].attach.remote(*self._spaces))
        self._dead.discard(worker)

    # --- shutdown -------------------------------------------------------------------------

    def close(self, timeout: float) -> None:
        for future in self._futures.values():
            future.cancel()
        self._futures.clear()
        actors = [actor for actor in self._actors if actor is not None]
        if timeout and actors:
            closing = [
                actor.close.remote() for w, actor in enumerate(actors) if w not in self._dead
            ]
            ray.wait(closing, num_returns=len(closing), timeout=timeout)
        for actor in actors:
            ray.kill(actor, no_restart=True)
        self._dead.update(range(len(self._actors)))
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()


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
    except Exception as exc:  # classified by _collect
        return exc


def _fetch(ref: Any) -> Any:
    try:
        return ray.get(ref)
    except Exception as exc:  # classified by _collect
        return exc
