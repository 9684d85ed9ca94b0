"""``VecEnv``: N envs as one batched ``gymnasium.vector.VectorEnv``, with an async core.

The async methods (:meth:`VecEnv.areset`, :meth:`VecEnv.astep`, :meth:`VecEnv.send`,
:meth:`VecEnv.recv`) are the implementation; the synchronous Gymnasium API drives the
same coroutines with waits that block in the kernel instead of awaiting a loop.

This module owns the public API: it checks a call's arguments (the checks themselves
live in :mod:`aiovec._checks`), submits commands through the scheduler (never a
backend's internals) and hands back what :mod:`aiovec._results` assembles. Gymnasium's
split calls (``*_async``/``*_wait``) are the mixin of :mod:`aiovec._split_calls`.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable, Coroutine, Mapping, Sequence
from functools import partial
from typing import Any, TypeVar, cast

import gymnasium as gym
import numpy as np
from gymnasium import logger
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from aiovec._auto import backend_for_async_envs
from aiovec._checks import (
    FOREVER,
    block_autoreset_mode,
    brief,
    check_count,
    check_max_envs,
    check_name,
    check_one_value_per_block,
    check_seconds,
    check_whole_blocks,
    env_seeds,
    refuse_custom_worker,
    reset_mask_ids,
    resolve_env_ids,
    take_reset_mask,
)
from aiovec._construction import (
    check_envs_per_block,
    check_factories,
    check_numbers,
    plan_backend,
)
from aiovec._loop import check_blocking_call
from aiovec._results import Batch, Results
from aiovec._scheduler import BUSY, IDLE, Scheduler, Ticket
from aiovec._split_calls import SplitCalls
from aiovec._stats import Stats
from aiovec._transport.protocol import Call, Reply, Reset, SetAttr, Step
from aiovec._transport.spaces import (
    batch_checker,
    check_gymnasium_shareable,
    check_observation_mode,
    is_shareable,
    observation_spaces,
    split_batch,
    write_rows,
)
from aiovec._worker.host import EnvDescription
from aiovec.backends import (
    REGISTRY,
    Hosting,
    backend_options,
    build_backend,
    refuse_options_not_taken,
)
from aiovec.backends._base import AsyncEnvsHereError, Backend
from aiovec.errors import (
    ClosedError,
    EnvBusyError,
    NeedsResetError,
    NothingInFlightError,
)

__all__ = ["Batch", "VecEnv"]

#: Names ``call`` refuses, as AsyncVectorEnv does: the envs would reset or step behind
#: the vector env's back (no autoreset, no buffers), or close under it.
_RESERVED_CALLS = frozenset({"reset", "step", "close", "_setattr", "_check_spaces"})

#: This process's id, kept current in forked children: every send and recv checks it,
#: and reading it is cheaper than asking the kernel each time.
_this_pid = os.getpid()


def _after_fork_in_child() -> None:
    global _this_pid
    _this_pid = os.getpid()


os.register_at_fork(after_in_child=_after_fork_in_child)

_Method = TypeVar("_Method", bound=Callable[..., Any])
_T = TypeVar("_T")


def _no_check() -> None:
    """For a call whose arguments are checked already."""


def _sync_name(coroutine: Coroutine[Any, Any, Any]) -> str:
    """The synchronous call that ran ``coroutine`` (``astep`` -> ``step``,
    ``_step_wait`` -> ``step_wait``), for messages."""
    name: str = getattr(coroutine, "__name__", "a call")
    if name.startswith("_"):
        return name[1:]
    return name[1:] if name.startswith("a") and hasattr(VecEnv, name[1:]) else name


def _timed(method: _Method) -> _Method:
    """Mark ``method`` (a public call) as a call into the vector env: its time counts in
    :meth:`VecEnv.stats`, and a call from a second thread meanwhile is refused."""
    if inspect.iscoroutinefunction(method):

        @functools.wraps(method)
        async def timed_coroutine(self: VecEnv, *args: Any, **kwargs: Any) -> Any:
            scheduler = self._scheduler
            calls, failed = scheduler.calls, True  # (see Scheduler.leave)
            try:
                scheduler.enter_call()
                result = await method(self, *args, **kwargs)
                failed = False
            finally:
                scheduler.leave(calls)
                self._close_if_asked_meanwhile(raise_closed=not failed)
            return result

        return cast(_Method, timed_coroutine)

    @functools.wraps(method)
    def timed(self: VecEnv, *args: Any, **kwargs: Any) -> Any:
        scheduler = self._scheduler
        calls, failed = scheduler.calls, True  # (see Scheduler.leave)
        try:
            scheduler.enter_call()
            result = method(self, *args, **kwargs)
            failed = False
        finally:
            scheduler.leave(calls)
            self._close_if_asked_meanwhile(raise_closed=not failed)
        return result

    return cast(_Method, timed)


class VecEnv(SplitCalls, VectorEnv):
    """Runs ``len(env_fns)`` environments as one vector env.

    A drop-in ``gymnasium.vector.VectorEnv``: ``reset``, ``step``, ``close``, ``call``,
    ``get_attr``, ``set_attr``, ``render`` and the three autoreset modes behave as in
    ``gymnasium.vector.AsyncVectorEnv``. On top of that it can be driven from asyncio,
    either in lockstep (``areset``/``astep``) or first-ready (``send``/``recv``).

    ``AsyncVectorEnv``'s arguments may be passed by position, in its order
    (``env_fns, shared_memory, copy, context, daemon, worker, observation_mode,
    autoreset_mode, max_concurrency``); aiovec's own are keywords.

    Args:
        env_fns: one callable per env, each returning a new ``gymnasium.Env``. For the
            process backend they are sent to the workers with cloudpickle, so lambdas
            and closures work.
        backend: ``"auto"`` (probe one env for a few milliseconds and choose, see
            :func:`aiovec.make`), ``"process"`` (envs in worker processes, data in shared memory),
            ``"inline"`` (envs in this process, no IPC), ``"coroutine"`` (async envs,
            :class:`aiovec.AsyncEnv`, as tasks on the event loop) or ``"ray"`` (envs in
            Ray actors, ``num_workers`` of them; see ``ray_options``).
        num_workers: worker processes for the process backend; default one per CPU core
            (at most one per env). Envs are split into contiguous, even groups.
        copy: return copies of the observation buffers (``True``) or zero-copy views
            that the next step overwrites (``False``; applies to whole-batch results).
        autoreset_mode: Gymnasium's autoreset mode (``NEXT_STEP``, ``SAME_STEP`` or
            ``DISABLED``), as the enum or its string value. Default: ``NEXT_STEP``, or
            with ``envs_per_block`` the batched envs' own mode (which, if given, this
            must equal: a batched env autoresets itself).
        context: how worker processes start. Default (``None`` or ``"zygote"``, on
            Linux): forked by aiovec's zygote, a fresh interpreter that has imported
            numpy, gymnasium and aiovec and never imports your ``__main__`` (no
            ``if __name__ == "__main__":`` guard needed; ``python -c``, stdin and
            notebooks work; workers die with the agent). ``"spawn"``,
            ``"forkserver"`` or ``"fork"`` use multiprocessing's start methods instead
            (the first two import the main module in every worker).
        close_timeout: seconds :meth:`close` waits for workers before killing them.
        inline_envs: process backend only: how many envs (the last ones) this process
            steps itself while the workers step the rest. On few cores this hides a
            cross-core wake-up per step in lockstep; their steps block the event loop,
            so keep it 0 for envs that wait (sleep, IO).
        spin: seconds a waiting side polls before sleeping (process backend). Default:
            200 µs for workers and 500 µs for this process when there are more cores
            than workers, else 0 (spinning only pays while a core would otherwise
            idle); this process also spins once fewer workers than cores step their
            envs in turn (workers stepping envs that mostly wait in threads hardly use
            a core). Each side times its waits both ways and spins only while that
            is faster than sleeping at once (another process wanting the core, say,
            makes spinning lose: it then mostly stops), never through waits averaging
            longer than the window, and only for a message that may end the wait (a
            lockstep step: its last env's reply). A spin inside ``await`` gives the
            event loop a turn every 50 µs, so other tasks keep running.
        on_failure: ``"raise"`` reports a failing env (exception, crash, timeout) as an
            error; ``"restart"`` rebuilds it from its factory instead: that env's result
            is then a fresh reset observation with ``truncated=True``, reward 0 and
            ``info["restarted"] = True`` (with ``info["restart_reason"]``), so training
            goes on; a failed reset is retried on the rebuilt env with the same seed
            and options, its info saying so (past ``max_restarts`` it raises, and the
            env's next step replays that reset: bare when its worker died each time).
            Counted in :attr:`restart_counts`.
        max_restarts: with ``on_failure="restart"``, how many failures in a row an env
            (or a worker) may have before the error is raised after all.
        ray_options: Ray backend: ``address`` (for ``ray.init``, used only when Ray is not
            initialized yet), ``num_cpus`` per actor (default 1), ``init_kwargs``,
            ``concurrent_envs`` (step an actor's envs concurrently, answering first-ready:
            default ``None`` finds from their first steps whether they mostly wait; async
            envs always are),
            ``actors_per_node`` (fill the alive nodes in turn with that many actors each),
            ``transport`` (``"link"``: a direct connection to each actor, the default;
            ``"calls"``: one Ray actor call per request, the default under Ray Client),
            and any other actor option (``resources``, ``scheduling_strategy``, ...).
        step_timeout: seconds an env may take to answer a command; past that
            :class:`aiovec.StepTimeoutError` names the late envs. Async envs (coroutine
            backend, or async envs in worker processes or Ray actors) have the late
            env's command cancelled alone (with ``"restart"``: that env is rebuilt) while the other
            envs go on; a worker whose loop is blocked is killed a grace period later.
            Blocking envs cannot be interrupted from inside: the process and Ray
            backends kill the late env's worker (with ``"restart"``: rebuild it). The
            bound is each env's: a worker stepping k envs one after another has k times
            ``step_timeout`` for a command to all of them.

        concurrent_envs: process backend: whether a worker steps its blocking envs
            concurrently, a thread each, answering first-ready (``True``), or one after
            the other (``False``). Default ``None``: a worker of several envs times its
            steps (each env's first one left out) and goes concurrent when they
            mostly wait (sleep, IO); computing envs are timed again now and then.
            CPU-bound envs gain nothing from threads. Async envs are always concurrent.
        max_concurrency: at most this many envs run a command (step, reset, ...) at
            the same time, as in ``gymnasium.vector.AsyncVectorEnv``: the process
            backend then uses that many workers (fewer if ``num_workers`` says so), each
            stepping its envs one after the other. ``None``: no limit.
        startup_timeout: process and Ray backends: seconds a worker may take to build its envs
            (at construction, and when it is rebuilt under ``on_failure="restart"``);
            past that it is killed and :class:`aiovec.StartupTimeoutError` names the
            envs. Default 5 minutes (generous: simulators can be slow to start);
            ``None`` waits forever.
        observation_mode: how the envs' observation spaces are batched, as in
            ``gymnasium.vector.AsyncVectorEnv``: ``"same"`` (every env's space must equal
            env 0's), ``"different"`` (spaces may differ, e.g. in bounds, but must share
            shape and dtype: ``observation_space`` is ``batch_differing_spaces`` of
            them) or a ``(observation_space, single_observation_space)`` tuple of your
            own, whose single space the envs' spaces must match in shape and dtype.
            ``single_observation_space`` is env 0's in the first two.
        shared_memory: accepted for ``AsyncVectorEnv`` code. aiovec always keeps
            observations in shared memory where the space allows and sends the rest by
            value, so the results are the same either way; ``True`` also refuses, as
            Gymnasium does, an observation space Gymnasium could not share (a custom
            space: ``ValueError``; Graph/Sequence: ``TypeError``).
        daemon: as in ``AsyncVectorEnv``: with ``context="fork"``, ``"spawn"`` or
            ``"forkserver"``, whether the workers are daemonic multiprocessing processes
            (``False`` lets an env start processes of its own). aiovec's own workers
            (the default context) may always start processes. Either way every worker
            dies with this process.
        worker: ``AsyncVectorEnv``'s custom worker function: refused with a
            ``ValueError`` (aiovec's workers do not run Gymnasium's pipe protocol).
        envs_per_block: batched envs. With ``envs_per_block=k`` each of ``env_fns``
            returns a ``gymnasium.vector.VectorEnv`` of ``k`` envs (a *block*, stepped in
            one call), and the vector env has ``len(env_fns) * k`` rows; block ``b`` is
            rows ``b*k .. b*k+k-1``. Every backend (async batched envs, whose ``step``
            and ``reset`` are coroutines, on ``"coroutine"``). A worker hosts whole
            blocks; ``send`` takes whole blocks, ``recv`` returns whole blocks
            (``max_envs`` rounds down to a multiple of ``k``, at least one block);
            ``call``/``get_attr`` run once per block (each row gets the result, a
            per-env sequence from ``render`` is split); ``set_attr`` sets one value per
            block. See :func:`aiovec.make` (``vectorization_mode="vector_entry_point"``).

    Raises:
        aiovec.EnvError: an env factory raised (names the env index).
        aiovec.FactoryPicklingError: a factory cannot be sent to a worker.
        RuntimeError: the envs' observation spaces do not fit ``observation_mode``, or
            their action spaces differ.
        ValueError / TypeError: an invalid ``observation_mode``, or (``"different"``)
            spaces that ``batch_differing_spaces`` cannot batch; ``worker=``; a space
            ``shared_memory=True`` cannot share.
    """

    #: True until construction succeeds, so close() and __del__ of a half-built env do nothing.
    closed: bool = True
    _pending_dropped_quietly = False
    #: What closed the env when not the user's close() (said by later calls' ClosedError).
    _closed_by: str | None = None
    #: close()'s arguments, when it was called while this thread ran the env's code.
    _deferred_close: dict[str, Any] | None = None
    _closing = False  # close() is running (a close() within it does nothing)

    def __init__(
        self,
        # each returns a gymnasium.Env, an aiovec.AsyncEnv, or (envs_per_block) a VectorEnv
        env_fns: Sequence[Callable[[], Any]],
        # AsyncVectorEnv's arguments, in its order (code passing them by position works)
        shared_memory: bool | None = None,
        copy: bool = True,
        context: str | None = None,
        daemon: bool = True,
        worker: Callable[..., None] | None = None,
        observation_mode: str | tuple[gym.Space[Any], gym.Space[Any]] = "same",
        autoreset_mode: AutoresetMode | str | None = None,
        max_concurrency: int | None = None,
        *,
        backend: str = "process",
        num_workers: int | None = None,
        close_timeout: float = 5.0,
        inline_envs: int = 0,
        spin: float | None = None,
        on_failure: str = "raise",
        max_restarts: int = 3,
        step_timeout: float | None = None,
        ray_options: dict[str, Any] | None = None,
        concurrent_envs: bool | None = None,
        startup_timeout: float | None = 300.0,
        envs_per_block: int | None = None,
    ) -> None:
        self.observation_mode = check_observation_mode(observation_mode)
        #: Rows per batched env (``None``: single envs); ``num_envs`` is a multiple of it.
        self.envs_per_block = check_envs_per_block(envs_per_block)
        batched = self.envs_per_block is not None
        block_size = self.envs_per_block or 1
        if worker is not None:
            refuse_custom_worker(worker)
        times = check_numbers(
            num_workers=num_workers,
            inline_envs=inline_envs,
            max_restarts=max_restarts,
            step_timeout=step_timeout,
            close_timeout=close_timeout,
            startup_timeout=startup_timeout,
            spin=spin,
        )
        step_timeout, startup_timeout = times["step_timeout"], times["startup_timeout"]
        close_timeout, spin = cast(float, times["close_timeout"]), times["spin"]  # not None
        env_fns = check_factories(env_fns)
        requested_backend = backend
        if backend in REGISTRY:  # named by the user ("auto" picks one to suit the options)
            refuse_options_not_taken(
                backend,
                num_workers=num_workers,
                inline_envs=inline_envs,
                concurrent_envs=concurrent_envs,
                spin=spin,
                ray_options=ray_options,
            )
        plan = plan_backend(
            backend,
            env_fns,
            envs_per_block=self.envs_per_block,
            num_workers=num_workers,
            inline_envs=inline_envs,
            concurrent_envs=concurrent_envs,
            on_failure=on_failure,
            max_restarts=max_restarts,
            step_timeout=step_timeout,
            max_concurrency=max_concurrency,
            startup_timeout=startup_timeout,
        )
        backend, inline_envs = plan.backend, plan.inline_envs
        self.max_concurrency = max_concurrency
        requested_mode = None if autoreset_mode is None else AutoresetMode(autoreset_mode)
        self.autoreset_mode = requested_mode or AutoresetMode.NEXT_STEP
        self.num_envs = len(env_fns) * block_size
        self.copy = copy
        self.close_timeout = close_timeout
        self._pending = None  # for the *_async/*_wait methods (see aiovec._split_calls)

        hosting = Hosting(
            env_fns,
            self.autoreset_mode,
            max_restarts=plan.max_restarts,
            envs_per_block=self.envs_per_block,
            step_timeout=step_timeout,
            isolated=requested_backend == "auto",
        )

        def build(backend: str, num_workers: int | None, inline_envs: int) -> Backend:
            options = backend_options(
                backend,
                num_workers=num_workers,
                context=context,
                spin=spin,
                inline_envs=inline_envs,
                concurrent_envs=plan.concurrent_envs,
                startup_timeout=startup_timeout,
                ray_options=ray_options,
                daemon=daemon,
            )
            return build_backend(backend, hosting, options)

        try:
            self._backend: Backend = build(backend, plan.num_workers, inline_envs)
        except AsyncEnvsHereError:
            if requested_backend != "auto":
                raise
            # "auto" probed the first factory, a blocking env; a later one is async.
            fallback = backend_for_async_envs(len(env_fns))
            backend, inline_envs = fallback["backend"], 0
            self._backend = build(backend, num_workers or fallback.get("num_workers"), 0)
        # From here on the backend is up: an error, or a Ctrl-C landing anywhere before
        # construction is done, closes it (workers, descriptors, shared memory).
        try:
            self.backend = backend
            #: Worker processes (process backend) or actors (Ray); 0 when envs run here.
            self.num_workers = self._backend.num_workers
            #: How many envs this process steps itself.
            self.inline_envs = {"process": inline_envs, "ray": 0}.get(backend, self.num_envs)
            # What AsyncVectorEnv code reads back (``envs.env_fns[0]()`` builds an eval env).
            #: The factories as given (one per env, or per batched env).
            self.env_fns = env_fns
            #: Whether observations may travel through shared memory (``False``: by value).
            self.shared_memory = shared_memory is not False
            #: The start method asked for (``None``: aiovec's default workers).
            self.context = context
            #: As given; workers always die with this process (see the README).
            self.daemon = daemon
            self._owner_pid = os.getpid()  # the process that may drive the workers
            # Env id -> resets of it whose observations an areset has yet to take: a step
            # or reset sent meanwhile would overwrite them in shared memory.
            self._resetting: dict[int, int] = {}
            if batched:
                self.autoreset_mode = block_autoreset_mode(
                    self._backend.descriptions, requested_mode
                )
            self._set_spaces(self._backend.descriptions)
            if shared_memory:
                check_gymnasium_shareable(self.single_observation_space)
            self._buffers = self._backend.attach(
                self.single_observation_space, self.single_action_space
            )
            self._scheduler = Scheduler(
                self._backend,
                self.num_envs,
                restart=on_failure == "restart",
                max_restarts=plan.max_restarts,
                step_timeout=None if self._backend.enforces_step_timeout else step_timeout,
            )
            self.on_failure = on_failure
            self._check_actions = batch_checker(self.single_action_space)
            self._results = Results(
                self._scheduler,
                self.num_envs,
                self._buffers,
                self.single_observation_space,
                self.autoreset_mode,
                observations_shared=is_shareable(self.single_observation_space),
            )
            #: How many restarts each env reported after a failure (``on_failure="restart"``;
            #: one whose replacement had to be built again counts once).
            self.restart_counts = self._results.restart_counts
            self._needs_reset = self._results.needs_reset  # DISABLED mode: reset before stepping
            self._steps_in_place = self._backend.completes_inline
        except BaseException:
            self._backend.close(0)
            raise
        self.closed = False

    def _set_spaces(self, descriptions: list[EnvDescription]) -> None:
        first = descriptions[0]
        action_space, metadata, render_mode = first.action_space, first.metadata, first.render_mode
        self.single_observation_space, self.observation_space = observation_spaces(
            self.observation_mode, [description.observation_space for description in descriptions]
        )
        for index, act_space in enumerate(d.action_space for d in descriptions):
            if act_space != action_space:
                raise RuntimeError(
                    f"Some environments have an action space different from `{action_space}`. "
                    "In order to batch actions, the action spaces from all environments must "
                    f"be equal. (env {index} has action_space {act_space})"
                )
        self.single_action_space = action_space
        self.action_space = batch_space(action_space, self.num_envs)
        self.metadata = dict(metadata)
        self.metadata["autoreset_mode"] = self.autoreset_mode
        self.render_mode = render_mode

    # --- async API: lockstep ------------------------------------------------------------------

    @_timed
    async def areset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | Sequence[dict[str, Any] | None] | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        """Reset the envs (all, or those in ``options["reset_mask"]``) and return
        ``(observations, infos)`` for the whole batch, like ``gymnasium`` ``reset``.

        ``options`` is one dict for every env (as in Gymnasium) or a list with one dict
        (or ``None``) per env, for per-env reset options.

        Raises:
            aiovec.EnvBusyError: an env to reset still has a step in flight or unread.
            aiovec.EnvError: an env raised in ``reset`` (names the env).
        """
        await self._before_async_call("areset", partial(self._reset_plan, seed, options))
        tickets = self._reset_submit(seed, options)
        env_ids = [env_id for ticket in tickets for env_id in ticket.env_ids]
        resetting = self._resetting
        for env_id in env_ids:
            resetting[env_id] = resetting.get(env_id, 0) + 1
        try:
            return await self._reset_wait(tickets)
        finally:  # taken, failed or given up: a step may follow
            for env_id in env_ids:
                if resetting[env_id] == 1:
                    del resetting[env_id]
                else:
                    resetting[env_id] -= 1

    @_timed
    async def astep(
        self, actions: Any
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every env with ``actions`` (a batch of the ``action_space``) and return
        ``(observations, rewards, terminations, truncations, infos)`` for the whole batch.

        If the awaiting task is cancelled, the steps still complete and their results
        can be collected with :meth:`recv`.
        """
        await self._before_async_call("astep", partial(self._check_actions, actions, self.num_envs))
        return await self._step_wait(self._send(actions, None, stream=False))

    # --- async API: first-ready ---------------------------------------------------------------

    @_timed
    def send(self, actions: Any, env_ids: Sequence[int] | np.ndarray | None = None) -> None:
        """Start stepping the envs ``env_ids`` (default: all) with ``actions``; returns at once.

        ``actions`` holds one action per env id, in the same order (a batch of the single
        action space with ``len(env_ids)`` rows). Nothing is sent unless every check passes.

        Raises:
            aiovec.EnvBusyError: an env has an action in flight or an unread result.
            ValueError / TypeError: bad env ids, or actions of the wrong shape, dtype or
                range for the action space.
            aiovec.ClosedError: the vector env is closed.
        """
        self._refuse_while_pending("send")  # a pending call's results are its *_wait's
        if env_ids is None or not self._send_one(actions, env_ids):
            self._send(actions, env_ids, stream=True)

    def _send_one(self, actions: Any, env_ids: Any) -> bool:
        """:meth:`send` to one env whose every check passes at a glance (first-ready one
        env at a time, the hot loop): sent, and ``True``. ``False`` (nothing done) for
        anything else, which the general path checks, refuses or sends."""
        if type(env_ids) is np.ndarray:
            if env_ids.shape != (1,) or env_ids.dtype.kind not in "iu":
                return False
            env_id = int(env_ids[0])
        elif (type(env_ids) is list or type(env_ids) is tuple) and len(env_ids) == 1:
            env_id = env_ids[0]
            if type(env_id) is not int:
                return False
        else:
            return False
        scheduler = self._scheduler
        if (
            not 0 <= env_id < self.num_envs
            or scheduler.state[env_id] != IDLE
            or self._resetting
            or scheduler.dead_workers
            or self.envs_per_block is not None
            or self._needs_reset[env_id]
            or self.closed
            or (self._owner_pid != _this_pid and self.num_workers)
        ):
            return False
        batch, exact = self._check_actions(actions, 1)  # raises as the general path would
        if exact:
            write_rows(self._buffers.actions, slice(env_id, env_id + 1), batch)
            by_value = None
        else:  # by value, as the caller passed it (see _step_commands)
            by_value = split_batch(self.action_space, batch)
        scheduler.submit([env_id], lambda seq, group: Step(seq, group, by_value, True), True)
        return True

    @_timed
    def _submitted(self, submit: Callable[[], _T]) -> _T:
        """``submit()`` (a split call's sending half) as a call into the vector env: its
        time counts in :meth:`stats`, and another thread's call meanwhile is refused."""
        return submit()

    def _send(self, actions: Any, env_ids: Any, stream: bool) -> list[Ticket]:
        env_ids, make_step = self._step_commands(actions, env_ids, stream)
        return self._scheduler.submit(env_ids, make_step, is_step=True)

    def _step_commands(
        self, actions: Any, env_ids: Any, stream: bool
    ) -> tuple[list[int], Callable[[int, list[int]], Step]]:
        """Check a step of ``env_ids`` with ``actions`` and write what travels in shared
        memory: ``(env ids, make_step(seq, group))`` building each worker's command.
        Raises before anything is written when a check fails."""
        self._check_open("send")
        # With a step_timeout, a worker stepping its envs in turn also answers each slow
        # env as it is done, so that a timeout names only the envs still owing theirs.
        stream = stream or self._scheduler.step_timeout is not None
        env_ids, rows = self._resolve_env_ids(env_ids)
        if self.envs_per_block is not None and rows != slice(None):
            self._check_whole_blocks(env_ids, "send actions to")
        scheduler = self._scheduler
        self._check_idle(env_ids, "send actions to")
        scheduler.check_alive(env_ids)
        if self.autoreset_mode is AutoresetMode.DISABLED and self._needs_reset[env_ids].any():
            done = [int(i) for i in np.asarray(env_ids)[self._needs_reset[env_ids]]]
            raise NeedsResetError(
                f"envs {done} ended their episode and autoreset_mode is DISABLED: reset them "
                "first with reset(options={'reset_mask': mask})"
            )
        batch, exact = self._check_actions(actions, len(env_ids))
        if exact:  # every array has its space's dtype (so the space is shareable)
            write_rows(self._buffers.actions, rows, batch)

            def make_step(seq: int, group: list[int]) -> Step:
                return Step(seq, group, None, stream)
        else:
            # By value: parts that have no shared buffer, or arrays of another dtype than
            # the space's, which the envs receive as the caller passed them (as in Gymnasium).
            per_env_actions = dict(zip(env_ids, split_batch(self.action_space, batch)))

            def make_step(seq: int, group: list[int]) -> Step:
                return Step(seq, group, [per_env_actions[i] for i in group], stream)

        return env_ids, make_step

    @_timed
    async def recv(
        self, max_envs: int | None = None, *, min_envs: int = 1, timeout: float | None = None
    ) -> Batch:
        """Wait for the first envs to finish and return their results as a :class:`Batch`.

        Returns as soon as ``min_envs`` results are ready (or every env in flight has
        finished, if fewer are in flight), with at most ``max_envs`` results (default:
        all that are ready), oldest first. Every sent action yields exactly one result.

        Raises:
            aiovec.NothingInFlightError: no env has an action in flight or unread.
            ValueError: ``min_envs`` above ``max_envs`` (for batched envs, above
                ``max_envs`` rounded down to whole blocks), before anything waits.
            TimeoutError: ``timeout`` seconds passed first; nothing is lost, a later
                ``recv`` returns those results.
            aiovec.EnvError / aiovec.WorkerCrashedError: an env of the batch failed; the
                other results stay queued for the next ``recv``.
        """
        self._check_open("recv")
        self._refuse_while_pending("recv")  # step_async's results are step_wait's
        check_max_envs(max_envs)
        check_count("min_envs", min_envs, 1)
        if max_envs is not None and min_envs > max_envs:
            raise ValueError(
                f"min_envs={min_envs} is more than max_envs={max_envs}: recv would wait for "
                "results it cannot return"
            )
        if max_envs is not None and min_envs > self._batch_limit(max_envs):
            raise ValueError(
                f"min_envs={min_envs} and max_envs={max_envs} cannot both hold with "
                f"{self.envs_per_block} envs per block: results come in whole blocks, so "
                f"at most {self._batch_limit(max_envs)} envs; make max_envs a multiple of "
                f"{self.envs_per_block} at or above min_envs"
            )
        scheduler = self._scheduler
        queue = scheduler.ready_queue

        def enough_ready() -> bool:
            # Only step results can come: resets and calls in flight are not waited for.
            # Re-checked on every change, so results taken by another task, or envs
            # failing, can never leave this waiting for something that cannot come.
            ready = len(queue)
            outstanding = ready + scheduler.num_stepping
            if outstanding == 0:
                raise NothingInFlightError(
                    "recv() would wait forever: no env has a step in flight or a result "
                    "waiting; call send(actions, env_ids) first"
                )
            return ready >= min(min_envs, outstanding)

        def one_result_short() -> bool:  # the next result may be the last one awaited
            ready = len(queue)
            return min(min_envs, ready + scheduler.num_stepping) - ready <= 1

        enough_ready()  # fail at once when there is nothing to wait for
        await scheduler.wait_until(enough_ready, timeout, one_result_short)
        return self._take_batch(max_envs)

    @_timed
    def recv_nowait(self, max_envs: int | None = None) -> Batch | None:
        """The results that are ready now (at most ``max_envs``), or ``None`` if none is."""
        self._check_open("recv")
        self._refuse_while_pending("recv_nowait")  # step_async's results are step_wait's
        check_max_envs(max_envs)
        self._scheduler.dispatch(self._backend.poll())
        if not self._scheduler.ready_queue:
            return None
        return self._take_batch(max_envs)

    def _take_batch(self, max_envs: int | None) -> Batch:
        return self._results.take_batch(self._batch_limit(max_envs or self.num_envs))

    def _batch_limit(self, max_envs: int) -> int:
        """The most envs a batch of at most ``max_envs`` holds: whole blocks for batched
        envs (the ready-queue holds whole blocks), at least one."""
        if self.envs_per_block is None:
            return max_envs
        return max(max_envs - max_envs % self.envs_per_block, self.envs_per_block)

    # --- shared pieces of lockstep stepping and resetting -----------------------------------

    async def _step_wait(
        self, tickets: list[Ticket], timeout: float | None = None
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        scheduler = self._scheduler
        await scheduler.wait_for_tickets(tickets, timeout)
        env_ids = scheduler.take_ready(self.num_envs)
        # Every env (the usual case): env id order without sorting thousands of ids.
        ordered = scheduler.all_env_ids if len(env_ids) == self.num_envs else sorted(env_ids)
        return self._results.lockstep(ordered, self.copy)

    def _step_in_place(
        self, actions: Any
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """:meth:`step` for a backend that completes commands inline, while no env has
        anything in flight or unread: the same checks and results without the
        ready-queue (the lockstep fast path)."""
        scheduler = self._scheduler
        calls, owned_sync, failed = scheduler.calls, scheduler.holds_sync(), True
        try:
            scheduler.enter_sync()
            scheduler.enter_call()
            env_ids, make_step = self._step_commands(actions, None, stream=False)
            scheduler.step_in_place(make_step(scheduler.next_seq(), env_ids))
            result = self._results.lockstep(env_ids, self.copy)
            failed = False
            return result
        except KeyboardInterrupt:
            self._close_on_ctrl_c("step")
            raise
        finally:  # whatever was entered, even if a Ctrl-C landed in the entering
            scheduler.leave(calls, owned_sync)
            self._close_if_asked_meanwhile(raise_closed=not failed)

    def _close_if_asked_meanwhile(self, raise_closed: bool = True) -> None:
        """At the end of a call: if close() was asked for while this thread ran the
        vector env's code (see :meth:`close`), close now that none of it runs, and raise
        (``raise_closed``: not when the call is raising something else already).

        Raises:
            aiovec.ClosedError: it was.
        """
        if self._deferred_close is None or self._scheduler.active:
            return
        self._close_deferred()
        if raise_closed:
            raise ClosedError(
                reason="the vector env was closed while this call ran (close() from a signal "
                "handler, or from an env's own code): it closed when the call returned"
            )

    def _close_on_ctrl_c(self, call: str) -> None:
        """A Ctrl-C landed in the blocking ``call``: close now, and say so later. Its
        workers are stopped rather than left running; envs in this process were cut
        mid-call, and their bookkeeping with them."""
        self._close_now({"timeout": 0})  # (the interrupted code is left: nothing runs)
        stops = "stops its workers at once" if self.num_workers else "cuts its envs mid-call"
        self._closed_by = f"a Ctrl-C (KeyboardInterrupt) during {call}(), which {stops}"

    def _reset_submit(
        self,
        seed: int | Sequence[int | None] | None,
        options: Any,  # a dict, or one dict (or None) per env: told apart below
    ) -> list[Ticket]:
        self._check_open("reset")
        env_ids, make_reset = self._reset_plan(seed, options)
        self._check_idle(env_ids, "reset")
        self._scheduler.check_alive(env_ids)
        tickets = self._scheduler.submit(env_ids, make_reset, is_step=False)
        self._needs_reset[env_ids] = False
        take_reset_mask(options)
        return tickets

    def _reset_plan(
        self, seed: int | Sequence[int | None] | None, options: Any
    ) -> tuple[list[int], Callable[[int, list[int]], Reset]]:
        """Check a reset's arguments: ``(the env ids to reset, make_reset(seq, group))``
        building each worker's command. Reads and changes no state."""
        seeds = env_seeds(seed, self.num_envs)
        env_ids = self._scheduler.all_env_ids
        per_env = isinstance(options, (list, tuple))
        if per_env:
            if len(options) != self.num_envs:
                raise ValueError(
                    f"per-env options must have one dict per env ({self.num_envs}), "
                    f"got {len(options)}"
                )
            if any(isinstance(entry, Mapping) and "reset_mask" in entry for entry in options):
                raise ValueError(
                    "reset_mask in per-env options: each dict is its env's own, so it "
                    "would reach the envs and every env would be reset; to reset some "
                    "envs, give one dict: reset(options={'reset_mask': mask, ...})"
                )
        elif isinstance(options, Mapping):
            options = dict(options)  # never modify the caller's dict
            if "reset_mask" in options:
                env_ids = reset_mask_ids(options.pop("reset_mask"), self.num_envs)
                if self.autoreset_mode is not AutoresetMode.DISABLED:
                    # Only DISABLED mode obliges a vector env to honour reset_mask.
                    self._check_whole_blocks(env_ids, "reset")

        def make_reset(seq: int, group: list[int]) -> Reset:
            group_options = [options[i] for i in group] if per_env else options
            return Reset(seq, group, [seeds[i] for i in group], group_options, per_env)

        return env_ids, make_reset

    async def _reset_wait(
        self, tickets: list[Ticket], timeout: float | None = None
    ) -> tuple[Any, dict[str, Any]]:
        await self._scheduler.wait_for_tickets(tickets, timeout)
        infos = self._results.reset_infos(tickets)
        return self._results.observations(self.copy), infos

    async def _wait_tickets(
        self, tickets: list[Ticket], timeout: float | None
    ) -> list[tuple[Ticket, Reply]]:
        """Wait for control tickets; raise the first failure, else return (ticket, reply)."""
        await self._scheduler.wait_for_tickets(tickets, timeout)
        return self._results.replies(tickets)

    # --- calls and attributes -------------------------------------------------------------

    @_timed
    async def acall(
        self, name: str, *args: Any, env_ids: Sequence[int] | None = None, **kwargs: Any
    ) -> tuple[Any, ...]:
        """Call method ``name`` (or read attribute ``name``) on every env, or on ``env_ids``
        only (the others may keep stepping); one result per env, in ``env_ids`` order.

        ``env_ids`` is reserved: it is not passed on to the method.
        """
        await self._before_async_call("acall", partial(self._check_call_name, name))
        return await self._call_wait(*self._call_submit(name, args, kwargs, env_ids))

    @_timed
    async def aapply(
        self,
        function: Callable[..., Any],
        *args: Any,
        env_ids: Sequence[int] | None = None,
        **kwargs: Any,
    ) -> tuple[Any, ...]:
        """Run ``function(env, *args, **kwargs)`` where each env lives; one result per env.

        ``function`` is sent to the workers with cloudpickle (lambdas work), and its
        results come back by value. Useful for checks such as ``isinstance`` on wrappers.
        """
        name = getattr(function, "__name__", "function")
        await self._before_async_call("aapply", _no_check)
        return await self._call_wait(*self._call_submit(name, args, kwargs, env_ids, function))

    def _call_submit(
        self,
        name: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        env_ids: Sequence[int] | None = None,
        function: Callable[..., Any] | None = None,
    ) -> tuple[list[int], list[Ticket]]:
        self._check_open(f"call {name!r}")
        if function is None:
            self._check_call_name(name)
        ids, _ = self._resolve_env_ids(env_ids)
        self._scheduler.check_alive(ids)
        tickets = self._scheduler.submit(
            ids,
            lambda seq, group: Call(seq, group, name, args, kwargs, function),
            is_step=False,
        )
        return ids, tickets

    @staticmethod
    def _check_call_name(name: str) -> None:
        check_name(name, "call")
        if name in _RESERVED_CALLS:  # AsyncVectorEnv's refusal, word for word
            raise ValueError(
                f"Trying to call function `{name}` with `call`, use `{name}` directly instead."
            )

    async def _call_wait(
        self, env_ids: list[int], tickets: list[Ticket], timeout: float | None = None
    ) -> tuple[Any, ...]:
        """The call results, in the order of ``env_ids``."""
        await self._scheduler.wait_for_tickets(tickets, timeout)
        return self._results.call_values(env_ids, tickets)

    @_timed
    async def aset_attr(self, name: str, values: Any, env_ids: Sequence[int] | None = None) -> None:
        """Set attribute ``name`` on every env (or on ``env_ids``): ``values`` has one
        entry per env (a list or tuple), or is one value for all."""
        self._check_open(f"set_attr {name!r}")
        check_name(name, "set_attr")
        ids, _ = self._resolve_env_ids(env_ids)
        if not isinstance(values, (list, tuple)):
            values = [values] * len(ids)
        if len(values) != len(ids):
            raise ValueError(
                "Values must be a list or tuple with length equal to the number of environments. "
                f"Got `{len(values)}` values for {len(ids)} environments."
            )
        self._check_whole_blocks(ids, f"set_attr {name!r} on")
        by_env = dict(zip(ids, values))
        check_one_value_per_block(by_env, self.envs_per_block, name)
        await self._before_async_call("aset_attr", _no_check)  # its checks are done
        self._scheduler.check_alive(ids)
        tickets = self._scheduler.submit(
            ids,
            lambda seq, group: SetAttr(seq, group, name, [by_env[i] for i in group]),
            is_step=False,
        )
        await self._wait_tickets(tickets, None)

    # Gymnasium's split calls (aiovec._split_calls), as calls into the vector env: a call
    # from a second thread meanwhile is refused, and a close() from a signal handler
    # waits for them to return.
    reset_async = _timed(SplitCalls.reset_async)
    step_async = _timed(SplitCalls.step_async)
    call_async = _timed(SplitCalls.call_async)

    # --- the synchronous Gymnasium API --------------------------------------------------------

    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | Sequence[dict[str, Any] | None] | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        """Reset all envs (or ``options["reset_mask"]``); see :meth:`areset`."""
        self._blocking_call("reset", "areset")
        self._begin("reset", synchronous=True)
        return cast(
            "tuple[Any, dict[str, Any]]",
            self._lockstep("reset", partial(self._reset_submit, seed, options)),
        )

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every env; see :meth:`astep`."""
        self._blocking_call("step", "astep")
        self._begin("step", synchronous=True)
        scheduler = self._scheduler
        if self._steps_in_place and not scheduler.num_busy and not scheduler.ready_queue:
            return self._step_in_place(actions)
        return cast(
            "tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]",
            self._lockstep("step", partial(self._send, actions, None, stream=False)),
        )

    def call(
        self, name: str, *args: Any, env_ids: Sequence[int] | None = None, **kwargs: Any
    ) -> tuple[Any, ...]:
        """Call ``name`` on every env or on ``env_ids`` (or read it, if not callable);
        see :meth:`acall`."""
        self._blocking_call("call", "acall")
        self._begin("call", synchronous=True)
        return cast(
            "tuple[Any, ...]",
            self._lockstep("call", partial(self._call_submit, name, args, kwargs, env_ids)),
        )

    def apply(
        self,
        function: Callable[..., Any],
        *args: Any,
        env_ids: Sequence[int] | None = None,
        **kwargs: Any,
    ) -> tuple[Any, ...]:
        """Run ``function(env, *args, **kwargs)`` on each env; see :meth:`aapply`."""
        self._blocking_call("apply", "aapply")
        return self._run(self.aapply(function, *args, env_ids=env_ids, **kwargs))

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """The attribute ``name`` of every env."""
        return self.call(name)

    def set_attr(self, name: str, values: Any, env_ids: Sequence[int] | None = None) -> None:
        """Set attribute ``name`` on every env (or ``env_ids``); see :meth:`aset_attr`."""
        self._blocking_call("set_attr", "aset_attr")
        self._begin("set_attr", synchronous=True)
        self._run(self.aset_attr(name, values, env_ids))

    def render(self) -> tuple[Any, ...] | None:
        """The frames rendered by every env."""
        return self.call("render")

    def stats(self) -> Stats:
        """Where this vector env's time went since it was built: env-steps, time in the
        envs, aiovec's own time in this process, time spent waiting, recent step
        latencies, ready-queue depth, event-loop lag and restarts (see
        :class:`aiovec.Stats`). Always on, and cheap: a few additions per command.
        Works after :meth:`close` too (the final counts).

        Example:
            >>> import aiovec
            >>> with aiovec.make("CartPole-v1", 4, backend="inline") as envs:
            ...     _ = envs.reset(seed=0)
            ...     before = envs.stats()
            ...     for _ in range(100):
            ...         _ = envs.step(envs.action_space.sample())
            ...     window = envs.stats() - before
            >>> window.env_steps
            400
            >>> sorted(window.per_env_step())
            ['agent', 'env', 'wait', 'wall']
        """
        return self._scheduler.stats.snapshot(
            env_restarts=int(self.restart_counts.sum()),
            worker_restarts=sum(self._scheduler.worker_restarts),
        )

    @property
    def worker_restarts(self) -> tuple[int, ...]:
        """How many times each worker (process, actor, or async env) was replaced after
        it crashed or timed out (``on_failure="restart"``); :attr:`restart_counts`
        counts per env."""
        return tuple(self._scheduler.worker_restarts)

    # One per env, as gymnasium's AsyncVectorEnv has them (VectorEnv types them singular).
    @property
    def np_random_seed(self) -> tuple[int, ...]:  # type: ignore[override]
        """The seed of each env's random generator."""
        return self.get_attr("np_random_seed")

    @property  # type: ignore[misc]  # read-only: one generator per env, see above
    def np_random(self) -> tuple[np.random.Generator, ...]:  # type: ignore[override]
        """Each env's random generator (copies: changing them does not affect the envs)."""
        return self.get_attr("np_random")

    # Gymnasium AsyncVectorEnv's split calls, for code written against it.

    def _blocking_call(self, method: str, async_method: str) -> None:
        """Checks before a synchronous call (see :func:`aiovec._loop.check_blocking_call`);
        on a closed vector env, that it is closed (the call would not block)."""
        self._check_open(method)
        check_blocking_call(method, async_method, deadlocks=self.backend == "coroutine")
        self._scheduler.check_sync_call()

    # --- lifecycle ------------------------------------------------------------------------

    def _run(self, coroutine: Coroutine[Any, Any, _T], call: str | None = None) -> _T:
        """Run one of the async methods to completion from synchronous code: the
        blocking ``call`` (default: the one named after the coroutine).

        In blocking mode every wait blocks in the kernel, so the coroutine never
        suspends and needs no event loop: the synchronous API is the async code path,
        minus the cost of a loop turn per call.
        """
        scheduler = self._scheduler
        calls, owned_sync, failed = scheduler.calls, scheduler.holds_sync(), True
        try:
            try:
                scheduler.enter_sync()
                scheduler.enter_call()
            except BaseException:
                coroutine.close()  # never started
                raise
            coroutine.send(None)
        except StopIteration as finished:
            value: _T = finished.value  # what the coroutine returned
            failed = False
            return value
        except KeyboardInterrupt:
            self._close_on_ctrl_c(call or _sync_name(coroutine))
            raise
        finally:  # whatever was entered, even if a Ctrl-C landed in the entering
            scheduler.leave(calls, owned_sync)
            self._close_if_asked_meanwhile(raise_closed=not failed)
        coroutine.close()
        raise AssertionError("a coroutine suspended in blocking mode")

    def close_extras(self, timeout: float | None = None, terminate: bool = False, **_: Any) -> None:
        """Stop the workers (waiting up to ``timeout``, default ``close_timeout``, then
        killing them) and release shared memory. Idempotent. Called directly (not by
        :meth:`close`, which marks the env closed after it, as Gymnasium's does), it is
        a whole :meth:`close`: later calls raise ``ClosedError``."""
        if not self._closing:
            self.close(timeout=timeout, terminate=terminate)
            return
        timeout = check_seconds("timeout", timeout, negative_ok=True, unlimited=FOREVER)
        if terminate:
            timeout = 0
        self._close_begins()
        try:
            self._backend.close(self.close_timeout if timeout is None else timeout)
        finally:
            self._close_ends()

    def _close_begins(self) -> None:
        """What a close does before stopping the backend (:meth:`close_extras`, :meth:`aclose`)."""
        # A call whose *_wait timed out is not waited for (AsyncVectorEnv is idle then).
        quiet = self._pending_dropped_quietly or self._pending_timed_out
        if self._pending is not None and not quiet:
            logger.warn(
                f"Calling `close` while waiting for a pending call to `{self._pending[0]}` "
                "to complete."
            )
        self._pending = None
        self._scheduler.close()  # tasks still awaiting this env raise ClosedError

    def _close_ends(self) -> None:
        """What a close does once the backend has stopped, however it ended."""
        # The shared arrays' region is unmapped once nothing refers to them: now, not
        # when this closed env is collected (zero-copy results a caller kept hold it
        # until they go).
        self.__dict__.pop("_buffers", None)
        self._results.release_buffers()
        self._scheduler.forget_failures()

    def close(self, **kwargs: Any) -> None:
        """Close the envs and release every process and shared segment. Idempotent.

        Raises:
            RuntimeError: a call from another thread is in progress (nothing was done:
                a vector env belongs to one thread at a time).
        """
        if getattr(self, "closed", True) or self._closing:  # (a close within close: done)
            return
        scheduler = self._scheduler
        busy_here = scheduler.active  # (in this thread: another thread's is refused next)
        calls = scheduler.calls  # (see Scheduler.leave)
        try:
            scheduler.enter_call()  # refused while another thread is in a call
            if busy_here:
                # Called from a signal handler (or an env's own code) while this thread
                # runs the vector env's code, whose state must not change under it: the
                # close happens at that call's next wait, or when it returns (each
                # raising ClosedError); other tasks' waits do it at once.
                self._deferred_close = kwargs
                scheduler.close_requested = self._close_deferred
                scheduler.wake_waiters()
                return
            self._close_now(kwargs)
        finally:
            scheduler.leave(calls)

    def _close_deferred(self) -> None:
        self._close_now(self._deferred_close or {})

    def _close_now(self, kwargs: dict[str, Any]) -> None:
        """Close; ``closed`` is never set with workers left running: a close cut short
        (a Ctrl-C, a bad argument) stops whatever is left at once, then raises."""
        self._deferred_close = self._scheduler.close_requested = None
        try:
            self._closing = True
            self.close_extras(**kwargs)
        except BaseException:
            self._stop_at_once()
            raise
        finally:
            self.closed = True
            self._closing = False

    def _stop_at_once(self) -> None:
        """Kill what a cut-short close left (the backend's close is idempotent), even if
        another Ctrl-C lands meanwhile (it is raised once this is done)."""
        interrupted: KeyboardInterrupt | None = None
        for _ in range(3):  # each try gets further; a close of nothing left is a no-op
            try:
                self._scheduler.close()
                self._backend.close(0)
                self._close_ends()
                break
            except KeyboardInterrupt as exc:
                interrupted = exc
        if interrupted is not None:
            raise interrupted

    def __enter__(self) -> VecEnv:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    async def __aenter__(self) -> VecEnv:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """:meth:`close` from a coroutine: async envs are closed (awaited) before it
        returns, also when a :meth:`close` on this loop came first."""
        if getattr(self, "closed", True):
            waiting = getattr(getattr(self, "_backend", None), "wait_closed", None)
            if waiting is not None:
                await waiting()
            return
        closing = getattr(self._backend, "aclose", None)
        if closing is None or self._closing:  # (a close within close: done)
            self.close()
            return
        scheduler = self._scheduler
        calls = scheduler.calls  # (see Scheduler.leave)
        try:
            scheduler.enter_call()  # refused while another thread is in a call
            self._closing = True
            self._close_begins()
            try:
                await closing(self.close_timeout)
            finally:
                self._close_ends()
        except BaseException:  # cut short (cancelled, a Ctrl-C): nothing left running
            if self._closing:
                self._stop_at_once()
            raise
        finally:
            if self._closing:
                self.closed = True
            self._closing = False
            scheduler.leave(calls)

    def __del__(self) -> None:
        if not getattr(self, "closed", True):
            self._pending_dropped_quietly = True  # nobody to warn at garbage collection
            self.close(terminate=True)

    def __reduce__(self) -> Any:
        # Pickling, copy.copy and copy.deepcopy all come here: say why, not that a lock
        # deep inside cannot be pickled.
        raise TypeError(
            "a VecEnv cannot be pickled or copied: it owns worker processes, shared memory "
            "and an event loop's state. Pickle or copy what builds it instead (the env "
            "factories, or aiovec.make's arguments) and create a new VecEnv from them"
        )

    def __repr__(self) -> str:
        name = f"{self.spec.id}, " if self.spec is not None else ""
        blocks = "" if self.envs_per_block is None else f", envs_per_block={self.envs_per_block}"
        return f"VecEnv({name}num_envs={self.num_envs}, backend={self.backend!r}{blocks})"

    # --- checks -----------------------------------------------------------------------------

    def _check_open(self, operation: str) -> None:
        if self.closed:
            raise ClosedError(operation, closed_by=self._closed_by)
        if self._owner_pid != _this_pid and self.num_workers:
            # A forked child would drive the parent's workers, and both could then wait
            # for replies the other one took: refused, not a hang.
            raise RuntimeError(
                f"{operation}: this VecEnv's workers belong to process {self._owner_pid}; "
                f"a forked child (pid {os.getpid()}) cannot use them. Build a new VecEnv "
                "in the child (e.g. from envs.env_fns); closing the inherited one is fine"
            )

    def _check_idle(self, env_ids: Sequence[int], operation: str) -> None:
        if self._resetting:
            resetting = [i for i in env_ids if i in self._resetting]
            if resetting:
                raise EnvBusyError(
                    f"cannot {operation} envs {brief(resetting)}: their reset is still in "
                    "flight, and would return what this sent wrote in its place; await "
                    "areset() first"
                )
        scheduler = self._scheduler
        if not scheduler.num_stepping and not scheduler.ready_queue:
            return
        state = scheduler.state
        busy = [i for i in env_ids if state[i] != IDLE]
        if busy:
            in_flight = [i for i in busy if state[i] == BUSY]
            unread = [i for i in busy if state[i] != BUSY]
            detail = []
            if in_flight:
                detail.append(f"envs {brief(in_flight)} still have an action in flight")
            if unread:
                detail.append(f"envs {brief(unread)} have a result not yet taken by recv()")
            raise EnvBusyError(
                f"cannot {operation} these envs: {'; '.join(detail)}. "
                "Collect their results with recv() (or recv_nowait()) first."
            )

    def _check_whole_blocks(self, env_ids: list[int], operation: str) -> None:
        check_whole_blocks(env_ids, self.envs_per_block, operation)

    def _resolve_env_ids(self, env_ids: Any) -> tuple[list[int], Any]:
        """``(env_ids as a list, the matching row index for buffers)``."""
        if env_ids is None:
            return self._scheduler.all_env_ids, slice(None)
        ids = resolve_env_ids(env_ids, self.num_envs)
        return ids, ids
