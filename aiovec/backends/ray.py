"""Ray backend: groups of envs hosted in Ray actors, for more cores than one machine has.

Each actor runs an ``EnvHost`` over its group (several envs per actor, like a worker
process) and answers a command with one payload: the reply plus the result rows of its
envs as numpy arrays. The agent's event loop awaits the actors' object refs directly, so
first-ready works across actors without polling. A dead actor (``ray.kill``, a crashed
node) is reported like a dead worker process, and the restart policy rebuilds it.

aiovec calls ``ray.init`` only when Ray is not initialized yet (and then shuts it down
on ``close``); connect to a cluster with ``ray_options={"address": "ray://..."}`` or by
calling ``ray.init`` yourself first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import cloudpickle
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from aiovec._buffers import Buffers, build_buffers
from aiovec._host import EnvBuildError, EnvHost, build_envs, describe
from aiovec._protocol import Command, Reset, Step
from aiovec._spaces import read_rows, write_rows
from aiovec.backends._base import Backend, Message, WorkerExit

try:
    import ray
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "backend='ray' needs Ray: pip install 'aiovec[ray]' (or pip install ray)"
    ) from exc


class EnvActor:
    """The actor side: a group of envs, their own buffers, one payload per command."""

    def __init__(
        self,
        factories: bytes,
        autoreset_mode: str,
        max_restarts: int,
        restart_reason: str | None,
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

    def describe(self) -> Any:
        if self.build_error is not None:
            return self.build_error
        return [describe(env) for env in self.host.envs.values()]

    def attach(self, observation_space: spaces.Space, action_space: spaces.Space, n: int) -> None:
        self.host.attach(build_buffers(observation_space, action_space, n, np.zeros))

    def execute(self, command: Command, actions: Any) -> tuple[Any, Any]:
        """Run ``command``; ``actions`` are the action rows of its envs (shared spaces)."""
        buffers = self.host.buffers
        env_ids = command.env_ids
        if actions is not None:
            write_rows(buffers.actions, env_ids, actions)
        reply = self.host.execute(command)
        rows = None
        if isinstance(command, (Step, Reset)):
            observations = None
            if buffers.observations is not None:
                observations = read_rows(buffers.observations, env_ids)
            rows = (
                observations,
                buffers.rewards[env_ids],
                buffers.terminations[env_ids],
                buffers.truncations[env_ids],
            )
        return reply, rows

    def close(self) -> None:
        if self.host is not None:
            self.host.close()


class RayBackend(Backend):
    """``num_workers`` Ray actors, each hosting a contiguous group of envs."""

    can_restart = True

    def __init__(
        self,
        env_fns: Sequence[Callable[[], Any]],
        autoreset_mode: AutoresetMode,
        num_workers: int | None = None,
        max_restarts: int = 0,
        ray_options: dict[str, Any] | None = None,
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
        self._actor_options = options  # e.g. resources, scheduling_strategy
        self._actors: list[Any] = [None] * num_workers
        self._in_flight: dict[Any, tuple[int, Command]] = {}  # object ref -> (worker, command)
        self._futures: dict[Any, asyncio.Future] = {}
        self._dead: set[int] = set()
        self._inbox: list[Message] = []
        try:
            for worker in range(num_workers):
                self._start(worker)
            self.descriptions = [d for worker in range(num_workers) for d in self._describe(worker)]
        except BaseException:
            self.close(0)
            raise

    def _start(self, worker: int, restart_reason: str | None = None) -> None:
        self._actors[worker] = self._actor_class.options(**self._actor_options).remote(
            self._factories[worker], self._autoreset_mode.value, self._max_restarts, restart_reason
        )

    def _describe(self, worker: int) -> list[Any]:
        description = ray.get(self._actors[worker].describe.remote())
        if not isinstance(description, list):  # an ErrorInfo: a factory raised
            raise description.to_exception()
        return description

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
        ref = self._actors[worker].execute.remote(command, actions)
        self._in_flight[ref] = (worker, command)

    def _collect(self, ref: Any) -> None:
        worker, command = self._in_flight.pop(ref)
        self._futures.pop(ref, None)
        if worker in self._dead:
            return
        try:
            reply, rows = ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            self._dead.add(worker)
            for other in [r for r, (w, _) in self._in_flight.items() if w == worker]:
                del self._in_flight[other]
                self._futures.pop(other, None)
            self._inbox.append(
                (worker, WorkerExit(None, f"its Ray actor died: {exc}".split("\n")[0]))
            )
            return
        if rows is not None:
            observations, rewards, terminations, truncations = rows
            env_ids = command.env_ids
            if observations is not None:
                write_rows(self.buffers.observations, env_ids, observations)
            self.buffers.rewards[env_ids] = rewards
            self.buffers.terminations[env_ids] = terminations
            self.buffers.truncations[env_ids] = truncations
        self._inbox.append((worker, reply))

    def poll(self) -> list[Message]:
        if self._in_flight:
            ready, _ = ray.wait(list(self._in_flight), num_returns=len(self._in_flight), timeout=0)
            for ref in ready:
                self._collect(ref)
        messages, self._inbox = self._inbox, []
        return messages

    async def wait(self, timeout: float | None = None) -> list[Message]:
        if not self._inbox and self._in_flight:
            for ref in self._in_flight:  # object refs are awaitable: one future each
                if ref not in self._futures:
                    self._futures[ref] = asyncio.ensure_future(_await(ref))
            done, _ = await asyncio.wait(
                [self._futures[ref] for ref in self._in_flight],
                timeout=timeout,
                return_when=asyncio.FIRST_COMPLETED,
            )
            for ref in [r for r in list(self._in_flight) if self._futures.get(r) in done]:
                self._collect(ref)
        return self.poll()

    def wait_blocking(self, timeout: float | None = None) -> list[Message]:
        if not self._inbox and self._in_flight:
            ready, _ = ray.wait(list(self._in_flight), num_returns=1, timeout=timeout)
            for ref in ready:
                self._collect(ref)
        return self.poll()

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


async def _await(ref: Any) -> Any:
    try:
        return await ref
    except Exception as exc:  # collected (and classified) by _collect via ray.get
        return exc
