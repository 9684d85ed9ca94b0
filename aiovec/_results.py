"""Result assembly: what ``reset``, ``step``, ``recv`` and the calls hand back.

This module owns turning what the envs left in the shared buffers and the scheduler
(observations, rewards, flags, infos, replies, errors) into the values the public API
returns, and the one rule for failures: an env's error is raised once, by the call that
takes its result, and when a Gymnasium-style call (a lockstep step, a reset, a call)
raises it, every env that failed in that call is logged through ``gymnasium.logger``
the way ``AsyncVectorEnv`` logs it. It never submits commands, checks arguments or talks
to a backend: it reads the scheduler's queues and the buffers, nothing else.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple, cast

import gymnasium as gym
import numpy as np
from gymnasium import logger
from gymnasium.vector import AutoresetMode

from aiovec._infos import add_info, batch_infos
from aiovec._scheduler import Scheduler, Ticket, raise_alone
from aiovec._transport.buffers import Buffers
from aiovec._transport.by_value import own_copy
from aiovec._transport.protocol import Reply
from aiovec._transport.spaces import batch_values, copy_buffer, read_rows
from aiovec.errors import EnvError


class Batch(NamedTuple):
    """The results of the envs ``env_ids``: row ``i`` of every field belongs to ``env_ids[i]``.

    ``infos`` is in Gymnasium's vector format (arrays plus ``_key`` masks) over the batch.
    """

    observations: Any
    rewards: np.ndarray
    terminations: np.ndarray
    truncations: np.ndarray
    infos: dict[str, Any]
    env_ids: np.ndarray


StepResult = tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]


def log_failures(failures: Iterable[BaseException], raised: BaseException) -> None:
    """Log the env errors of one failed call as Gymnasium's ``AsyncVectorEnv`` does:
    each failed env's message and traceback, ``raised`` last (it is the one raised),
    then that it is raised. Errors that did not come from an env (a crashed worker, a
    timeout) are not logged: Gymnasium has nothing to log for them either; when such an
    error is the one raised, the env errors are logged without the closing line (the
    last one logged is not what is raised)."""
    ordered = [e for e in dict.fromkeys(failures) if e is not raised] + [raised]
    env_errors = [error for error in ordered if isinstance(error, EnvError)]
    for error in env_errors:
        logger.error(
            f"Received the following error from Worker-{error.env_index} - Shutting it down"
        )
        # As an argument, not as the message: gymnasium.logger formats the message with
        # %, and a '%' in the traceback would raise a TypeError in place of the env's error.
        logger.error("%s", error.worker_traceback or f"{error.exc_type}: {error.exc_message}\n")
    if isinstance(raised, EnvError):
        logger.error("Raising the last exception back to the main process.")


class Results:
    """Assembles results for one :class:`~aiovec.VecEnv`.

    Invariants: every result the scheduler queued is handed back exactly once (taken
    rows leave the ready-queue; rows of a failed batch not taken go back to it); an
    error is raised once and then forgotten; ``needs_reset[i]`` is true exactly while
    env ``i`` ended an episode under ``DISABLED`` autoreset and was not reset since;
    ``restart_counts[i]`` counts every rebuild of env ``i`` whose result was taken.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        num_envs: int,
        buffers: Buffers,
        single_observation_space: gym.Space[Any],
        autoreset_mode: AutoresetMode,
        observations_shared: bool,
    ) -> None:
        self._scheduler = scheduler
        self._buffers = buffers
        self._single_observation_space = single_observation_space
        self._disabled = autoreset_mode is AutoresetMode.DISABLED
        self._observations_shared = observations_shared
        self._num_envs = num_envs
        #: Envs that must be reset before their next step (``DISABLED`` mode only).
        self.needs_reset = np.zeros(num_envs, dtype=np.bool_)
        #: How many times each env was rebuilt after a failure (``on_failure="restart"``).
        self.restart_counts = np.zeros(num_envs, dtype=np.int64)
        #: Lockstep and reset infos as one dict per env, as each env returned it (for
        #: adapters to libraries whose infos are per env, like Stable-Baselines3's:
        #: Gymnasium's batched layout would convert values to the first env's type);
        #: set only for the adapter's own calls (see :meth:`per_env_infos`).
        self.infos_per_env = False

    # --- first-ready -------------------------------------------------------------------

    @contextlib.contextmanager
    def per_env_infos(self) -> Iterator[None]:
        """Infos as one dict per env for the calls made inside (an adapter's), and
        Gymnasium's batched infos again after, for everyone else using the vector env."""
        self.infos_per_env = True
        try:
            yield
        finally:
            self.infos_per_env = False

    def release_buffers(self) -> None:
        """Drop the result buffers (the vector env is closed: nothing is assembled again),
        so that their shared memory can be unmapped."""
        self.__dict__.pop("_buffers", None)

    def take_batch(self, limit: int) -> Batch:
        """Take up to ``limit`` ready results, oldest first, as a :class:`Batch`; or
        raise the first failed env's error (the other rows stay queued)."""
        scheduler = self._scheduler
        env_ids = scheduler.take_ready(limit)
        self.raise_first_error(env_ids)
        rows = np.array(env_ids, dtype=np.intp)
        buffers = self._buffers
        observations = (
            read_rows(buffers.observations, rows)
            if self._observations_shared
            else own_copy(  # a batch is the caller's: in-process envs keep writing theirs
                batch_values(
                    self._single_observation_space, [scheduler.observations[i] for i in env_ids]
                )
            )
        )
        rewards = buffers.rewards.take(rows)  # take: about twice as fast as indexing
        if scheduler.reward_dtype is not None:  # batched envs' own (float32 for CartPole)
            rewards = rewards.astype(scheduler.reward_dtype)
        return Batch(
            observations,
            rewards,
            buffers.terminations.take(rows),
            buffers.truncations.take(rows),
            self._collect_infos(env_ids),
            rows,
        )

    def raise_first_error(self, env_ids: list[int]) -> None:
        """If an env of ``env_ids`` failed, raise its error and requeue the others."""
        errors = self._scheduler.errors
        if not errors:
            return
        for env_id in env_ids:
            error = errors.get(env_id)
            if error is not None:
                # Every env this error stands for (the rows of a batched env) is answered
                # by it, once; the others go back to the ready-queue.
                failed = [e for e in env_ids if errors.get(e) is error]
                for failed_id in failed:
                    del errors[failed_id]
                    self._scheduler.infos.pop(failed_id, None)
                failed_set = set(failed)
                self._scheduler.give_back([e for e in env_ids if e not in failed_set])
                try:
                    raise_alone(error)
                finally:
                    del error  # see raise_alone

    # --- lockstep ----------------------------------------------------------------------

    def lockstep(self, env_ids: list[int], copy: bool) -> StepResult:
        """The results of a step of all envs (``env_ids``, in order) as ``step`` returns
        them, or the first env's error (the step fails as a whole; every failed env is
        logged, see :func:`log_failures`)."""
        scheduler = self._scheduler
        if scheduler.errors:
            # What failed in this step, looked up before the raise forgets the raised one.
            failures = [scheduler.errors[i] for i in env_ids if i in scheduler.errors]
            try:
                self.raise_first_error(env_ids)
            except BaseException as raised:
                log_failures(failures, raised)
                # A lockstep step fails as a whole: drop the other results and errors,
                # but count the envs rebuilt meanwhile (restart_counts stays true).
                scheduler.take_ready(self._num_envs)
                scheduler.errors.clear()
                self._count_restarts(env_ids, [scheduler.infos.pop(i, None) for i in env_ids])
                raise
            finally:
                del failures  # see raise_alone
        infos = self._collect_infos(env_ids)
        buffers = self._buffers
        reward_dtype = scheduler.reward_dtype  # batched envs' own (float32 for CartPole)
        rewards = buffers.rewards
        return (
            self.observations(copy),
            rewards.copy() if reward_dtype is None else rewards.astype(reward_dtype),
            buffers.terminations.copy(),
            buffers.truncations.copy(),
            infos,
        )

    def observations(self, copy: bool) -> Any:
        """Every env's latest observation, as a batch (a copy, or the buffers themselves)."""
        if not self._observations_shared:
            batch = batch_values(self._single_observation_space, self._scheduler.observations)
            # copy: the caller's own (an in-process env may change its objects in place)
            return own_copy(batch) if copy else batch
        buffers = self._buffers
        return copy_buffer(buffers.observations) if copy else buffers.observations

    # --- resets and calls ----------------------------------------------------------------

    def replies(self, tickets: list[Ticket]) -> list[tuple[Ticket, Reply]]:
        """``(ticket, reply)`` for control tickets that are all done; or raise the first
        failure (every env error among them logged, see :func:`log_failures`)."""
        failures: list[BaseException] = []
        for ticket in tickets:
            if ticket.failure is not None:
                failures.append(ticket.failure)
            failures.extend(ticket.errors[i] for i in ticket.env_ids if i in ticket.errors)
        if failures:
            log_failures(failures, failures[0])
            for ticket in tickets:  # envs rebuilt meanwhile were rebuilt all the same
                reply = ticket.reply
                if reply is not None and reply.infos is not None:
                    self._count_restarts(ticket.env_ids, reply.infos)
            for ticket in tickets:  # consumed by this raise: they must not keep the error
                ticket.failure = None
                ticket.errors.clear()
            first = failures[0]
            del failures  # see raise_alone
            try:
                raise_alone(first)
            finally:
                del first
        # done without a failure: each has its reply
        return [(ticket, cast(Reply, ticket.reply)) for ticket in tickets]

    def reset_infos(self, tickets: list[Ticket]) -> Any:
        """The batched infos of a reset whose tickets are all done (or its first failure);
        a list of one dict per env with :attr:`infos_per_env`."""
        num_envs = self._num_envs
        infos: dict[str, Any] = {}
        per_env: list[dict[str, Any]] = [{} for _ in range(num_envs)]
        if self._disabled:  # an env whose reset failed still needs one
            for ticket in tickets:
                failed = ticket.env_ids if ticket.failure is not None else list(ticket.errors)
                self.needs_reset[failed] = True
        for ticket, reply in self.replies(tickets):
            if reply.infos is not None:
                self._count_restarts(ticket.env_ids, reply.infos)
                for env_id, info in zip(ticket.env_ids, reply.infos):
                    if info and self.infos_per_env:
                        per_env[env_id] = info
                    elif info:
                        add_info(infos, info, env_id, num_envs)
        return per_env if self.infos_per_env else infos

    def call_values(self, env_ids: list[int], tickets: list[Ticket]) -> tuple[Any, ...]:
        """The values of a call whose tickets are all done, in ``env_ids`` order."""
        values: dict[int, Any] = {}
        for ticket, reply in self.replies(tickets):
            values.update(zip(ticket.env_ids, reply.values))
        return tuple(values[env_id] for env_id in env_ids)

    # --- shared pieces -------------------------------------------------------------------

    def _collect_infos(self, env_ids: list[int]) -> Any:
        """The infos of ``env_ids``' step results, batched (a list with
        :attr:`infos_per_env`); also marks the envs ``DISABLED`` mode must reset."""
        if self._disabled:
            buffers = self._buffers
            self.needs_reset[env_ids] = buffers.terminations[env_ids] | buffers.truncations[env_ids]
        infos = self._scheduler.infos
        if not infos and not self.infos_per_env:  # the common case: nothing to batch
            return {}
        # cast: under `or {}`, mypy picks the dict.pop overload that refuses None
        batch = [cast("dict[str, Any] | None", infos.pop(i, None)) or {} for i in env_ids]
        self._count_restarts(env_ids, batch)
        return batch if self.infos_per_env else batch_infos(batch)

    def _count_restarts(self, env_ids: list[int], infos: Sequence[dict[str, Any] | None]) -> None:
        """Count the envs whose info says they were rebuilt (``on_failure="restart"``)."""
        for env_id, info in zip(env_ids, infos):
            if info and info.get("restarted") is True:
                self.restart_counts[env_id] += 1
