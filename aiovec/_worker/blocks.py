"""Batched envs ("blocks"): a ``gymnasium.vector.VectorEnv`` of ``k`` envs stepped in one call.

A vector env built with ``envs_per_block=k`` has ``num_envs / k`` blocks; block ``b``
owns the rows ``b*k .. b*k + k - 1`` of every shared buffer, and a worker hosts whole
blocks. :class:`BlockHost` executes :mod:`aiovec._transport.protocol` commands on them with the
same reply format as :class:`~aiovec._worker.host.EnvHost`, so backends, the scheduler and the
ready-queue treat a block's rows like any other envs.

Invariants:

- a step addresses whole blocks (the vector env refuses anything else before sending);
- a block autoresets itself, in its own ``metadata["autoreset_mode"]``: the vector env
  checks that this is the mode it was asked for;
- one failure of a block is one :class:`~aiovec._transport.protocol.ErrorInfo` that stands for
  all its rows (``ErrorInfo.env_ids``).
"""

from __future__ import annotations

import inspect
import math
import time
from collections.abc import Callable, Sequence
from functools import partial
from operator import methodcaller
from typing import Any, cast

import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv

from aiovec._transport.buffers import Buffers
from aiovec._transport.protocol import Call, EnvCommand, ErrorInfo, Reply, Reset, SetAttr, Step
from aiovec._transport.spaces import (
    batch_values,
    converted_exactly,
    copy_buffer,
    split_batch,
    write_rows,
)
from aiovec._worker.host import (
    EnvBuildError,
    EnvDescription,
    EnvHost,
    Flow,
    HostState,
    _close_quietly,
    _Unbuilt,
    as_env_error,
    build_envs,
    call_errors,
    describe,
    drive,
    drive_async,
    env_errors,
    error_info,
    failure_reason,
    restarted_info,
)
from aiovec._worker.registrations import shown


class BlockFactory:
    """A picklable ``() -> VectorEnv``: ``make(*args, num_envs=num_envs, **kwargs)``,
    then each of ``wrappers`` (vector wrappers) in order."""

    def __init__(
        self,
        make: Callable[..., VectorEnv],
        num_envs: int,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        wrappers: Sequence[Callable[[VectorEnv], VectorEnv]] = (),
    ) -> None:
        self.make, self.num_envs, self.args = make, num_envs, args
        self.kwargs, self.wrappers = kwargs or {}, tuple(wrappers)

    def __call__(self) -> VectorEnv:
        block = self.make(*self.args, num_envs=self.num_envs, **self.kwargs)
        for wrapper in self.wrappers:
            block = wrapper(block)
        return block

    def __repr__(self) -> str:
        target = getattr(self.make, "__qualname__", repr(self.make))
        arguments = [shown(a) for a in self.args] + [f"num_envs={self.num_envs}"]
        arguments += [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"{target}({', '.join(arguments)})"


def build_blocks(
    block_fns: dict[int, Callable[[], VectorEnv]],
    envs_per_block: int,
    async_blocks: bool = False,
) -> dict[int, VectorEnv]:
    """Call each block factory (keyed by the block's first row); check that each returns
    a ``VectorEnv`` of ``envs_per_block`` envs (whose ``step`` is a coroutine function
    only with ``async_blocks``: the hosts that await). On the first failure close what
    was built and raise :class:`~aiovec._worker.host.EnvBuildError`."""
    blocks: dict[int, VectorEnv] = {}
    for first_row, block_fn in block_fns.items():
        try:
            block = _checked_block(block_fn(), envs_per_block)
            blocks[first_row] = block
            if not async_blocks and inspect.iscoroutinefunction(block.step):
                raise TypeError(
                    f"{type(block).__name__}.step is a coroutine function (an async batched "
                    "env); async batched envs run on backend='coroutine'"
                )
        except call_errors() as exc:
            for built in blocks.values():
                _close_quietly(built)
            raise EnvBuildError(
                block_error(first_row, envs_per_block, "make", exc, keep_frames=True)
            ) from exc
    return blocks


def block_error(
    first_row: int, size: int, operation: str, exc: BaseException, keep_frames: bool = False
) -> ErrorInfo:
    """One error standing for every row of the block of ``size`` rows at ``first_row``
    (``keep_frames``: see :func:`~aiovec._worker.host.error_info`)."""
    last_row = first_row + size - 1
    operation = f"{operation}() of the batched env of envs {first_row}..{last_row}"
    info = error_info(first_row, operation, exc, keep_frames)
    info.env_ids = list(range(first_row, last_row + 1))
    return info


def _restarted_infos(info: Any, size: int, reason: str) -> list[dict[str, Any]]:
    """A rebuilt block's per-row infos (from its reset's batched ``info``), each saying
    that its row restarted and why."""
    row_infos = split_infos(info, size) or [{}] * size
    return [restarted_info(row_info, reason) for row_info in row_infos]


def _checked_block(block: Any, envs_per_block: int) -> VectorEnv:
    if not isinstance(block, VectorEnv):
        _close_quietly(block)
        raise TypeError(
            f"the batched env factory returned {type(block).__name__}, not a "
            "gymnasium.vector.VectorEnv; with vectorization_mode='vector_entry_point' (or "
            "envs_per_block) a factory is called as factory(num_envs=k, **env_kwargs) and "
            "must return a VectorEnv of k envs"
        )
    if block.num_envs != envs_per_block:
        _close_quietly(block)
        raise ValueError(
            f"the batched env factory returned a VectorEnv of {block.num_envs} envs, but "
            f"envs_per_block={envs_per_block}: it must honour its num_envs argument"
        )
    return block


def describe_block(block: VectorEnv) -> list[EnvDescription]:
    """The :class:`~aiovec._worker.host.EnvDescription` of each row of ``block`` (its single
    spaces; its metadata says its autoreset mode)."""
    metadata = dict(block.metadata)
    metadata.setdefault("autoreset_mode", AutoresetMode.NEXT_STEP)
    description = EnvDescription(
        block.single_observation_space,
        block.single_action_space,
        metadata,
        block.render_mode,
        getattr(block, "spec", None),
    )
    return [description] * block.num_envs


def build_host(
    env_fns: dict[int, Callable[[], Any]],
    autoreset_mode: AutoresetMode,
    max_restarts: int = 0,
    envs_per_block: int | None = None,
    async_blocks: bool = False,
) -> tuple[EnvHost | BlockHost, list[EnvDescription]]:
    """A host for ``env_fns`` (keyed by env id; with ``envs_per_block``, block
    factories keyed by their block's first row) and the description of each env.

    Raises:
        EnvBuildError: a factory raised (or returned something else than it must).
    """
    if envs_per_block is not None:
        blocks = build_blocks(env_fns, envs_per_block, async_blocks)
        descriptions = [d for block in blocks.values() for d in describe_block(block)]
        host: EnvHost | BlockHost = BlockHost(
            blocks, envs_per_block, block_fns=env_fns, max_restarts=max_restarts
        )
        return host, descriptions
    envs = build_envs(env_fns)
    host = EnvHost(envs, autoreset_mode, None, env_fns=env_fns, max_restarts=max_restarts)
    return host, [describe(env) for env in envs.values()]


class BlockHost(HostState):
    """Executes commands on blocks (keyed by their first row), whole blocks at a time.

    With ``block_fns`` and ``max_restarts > 0``, a block that raises in ``step`` is
    rebuilt, reset, and answers for each of its rows with the fresh observation,
    ``truncated=True`` and ``info["restarted"] = True``: the same contract as
    :class:`~aiovec._worker.host.EnvHost` for single envs.
    """

    #: Blocks are stepped one after the other by the serving thread (never in threads).
    threads = None

    def __init__(
        self,
        blocks: dict[int, VectorEnv],
        envs_per_block: int,
        buffers: Buffers | None = None,
        block_fns: dict[int, Callable[[], VectorEnv]] | None = None,
        max_restarts: int = 0,
    ) -> None:
        self.envs = blocks  # first row -> block (the name EnvHost's users read)
        self.envs_per_block = envs_per_block
        first = next(iter(blocks.values()))
        mode = first.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
        self._next_step = AutoresetMode(mode) is AutoresetMode.NEXT_STEP
        self._same_step = AutoresetMode(mode) is AutoresetMode.SAME_STEP
        self._block_fns = block_fns or {}
        self._max_restarts = max_restarts if block_fns else 0
        self._failures_in_a_row = dict.fromkeys(blocks, 0)
        self._restart_notices: dict[int, str] = {}  # first row -> why the block was rebuilt
        # First rows of restarted blocks whose next step is a reset (NEXT_STEP reports a
        # restart as a truncation, after which a step resets, as for single envs).
        self._owes_reset: set[int] = set()
        # First row -> (seed, options) of a whole reset that gave up (past max_restarts):
        # the reset answering the block's restart notice replays them, once.
        self._owed_resets: dict[int, tuple[Any, Any]] = {}
        self._observation_space = first.observation_space  # batched, for splitting
        self._single_action_space = first.single_action_space
        self._ranges: dict[tuple[int, int], list[int]] = {}  # (first, count) -> its rows
        #: The dtype of the rewards the blocks returned so far (as numpy would combine
        #: them; ``None`` before the first step or for non-array rewards), for the agent.
        self.reward_dtype: str | None = None
        #: The rows hosted, in order (a Step for all of them may travel without them).
        self.group = [
            first_row + offset for first_row in blocks for offset in range(envs_per_block)
        ]
        self._whole_group: list[tuple[int, Sequence[int]]] = [
            (first_row, range(index * envs_per_block, (index + 1) * envs_per_block))
            for index, first_row in enumerate(blocks)
        ]
        super().__init__(first.single_observation_space)
        if buffers is not None:
            self.attach(buffers)

    def attach(self, buffers: Buffers) -> None:
        """Use ``buffers`` for actions and results; required before the first command."""
        self.buffers = buffers

    # --- commands ---------------------------------------------------------------------------

    def execute(self, command: EnvCommand) -> Reply:
        """Run ``command`` on each of its blocks and describe the outcome."""
        started = time.perf_counter()
        if type(command) is Step:
            reply = self._step_blocks(command, self._blocks_of(command.env_ids))
        else:
            reply = self._execute_other(command)
        self._busy += time.perf_counter() - started
        reply.busy = self.take_busy()
        return reply

    def stream_step(self, send: Callable[[Reply], None], command: Step) -> None:
        """Step ``command``'s blocks one after the other, sending each block's results
        as soon as it is done (first-ready at block granularity)."""
        for first_row, positions in self._blocks_of(command.env_ids):
            started = time.perf_counter()
            reply = self._step_blocks(command, [(first_row, positions)])
            self._busy += time.perf_counter() - started
            reply.busy = self.take_busy()
            send(reply)

    async def execute_block_async(
        self, command: EnvCommand, first_row: int, positions: Sequence[int]
    ) -> Any:
        """Run ``command`` on one block, awaiting what an async batched env's methods
        return. A step gives the block's :class:`Reply`; another command gives the
        block's outcome for :meth:`other_reply` (per-row results, ``None``, or the
        exception the block raised)."""
        target = partial(self.envs.__getitem__, first_row)
        started = time.perf_counter()
        if type(command) is Step:
            outcome = await drive_async(self._step_flow(first_row, command, positions), target)
            self._busy += time.perf_counter() - started
            reply = self._step_blocks(command, [(first_row, positions)], [outcome])
            reply.busy = self.take_busy()
            return reply
        try:
            return await drive_async(self._other_flow(first_row, command, positions), target)
        except env_errors() as exc:
            return exc
        finally:
            self._busy += time.perf_counter() - started

    def other_reply(self, command: EnvCommand, outcomes: list[Any]) -> Reply:
        """The reply to a reset, call or set_attr whose blocks answered ``outcomes``
        (from :meth:`execute_block_async`, in the order of ``blocks_of``)."""
        reply = self._other_reply(command, self._blocks_of(command.env_ids), outcomes)
        reply.busy = self.take_busy()
        return reply

    def blocks_of(self, env_ids: list[int]) -> list[tuple[int, Sequence[int]]]:
        """``(first row, positions in env_ids of its rows)`` per block, in block order."""
        return self._blocks_of(env_ids)

    def _blocks_of(self, env_ids: list[int]) -> list[tuple[int, Sequence[int]]]:
        """``(first row, positions in env_ids of its rows)`` per block, in block order."""
        if env_ids is self.group:
            return self._whole_group
        size = self.envs_per_block
        first, count = env_ids[0], len(env_ids)
        if first % size == 0 and count % size == 0 and env_ids[-1] == first + count - 1:
            whole = self._ranges.get((first, count))
            if whole is None:
                whole = self._ranges[first, count] = list(range(first, first + count))
            if env_ids == whole:  # whole blocks, in order (a C-level comparison)
                return [
                    (first + start, range(start, start + size)) for start in range(0, count, size)
                ]
        positions: dict[int, list[int]] = {}
        for position, env_id in enumerate(env_ids):
            positions.setdefault(env_id - env_id % size, []).append(position)
        return sorted(positions.items())

    def _step_blocks(
        self,
        command: Step,
        blocks: list[tuple[int, Sequence[int]]],
        outcomes: list[BlockOutcome] | None = None,
    ) -> Reply:
        """The reply to ``command`` for ``blocks`` (stepped here, or already stepped:
        their ``outcomes``)."""
        size = self.envs_per_block
        infos: list[Any] | None = None  # built once a block has an info
        errors: list[ErrorInfo] = []
        progressed = False
        for index, (first_row, positions) in enumerate(blocks):
            if outcomes is not None:
                block_infos, failure, stepped = outcomes[index]
            else:
                block_infos, failure, stepped = self._drive_block(
                    first_row, self._step_flow(first_row, command, positions)
                )
            if block_infos is not None:
                if infos is None:
                    infos = [None] * (index * size)
                infos += block_infos
            elif infos is not None:
                infos += [None] * size
            if failure is not None:
                errors.append(failure)
            progressed = progressed or stepped
        if len(blocks) * size == len(command.env_ids) and type(blocks[0][1]) is range:
            env_ids = command.env_ids  # whole blocks in order: the rows as sent
        else:
            env_ids = [first + offset for first, _ in blocks for offset in range(size)]
        return Reply(
            seq=command.seq,
            env_ids=env_ids,
            infos=infos,
            observations=self.observations_of(env_ids),
            errors=errors or None,
            progressed=progressed,
            reward_dtype=self.reward_dtype,
        )

    # Every operation on a block is a *flow* (see aiovec._worker.host): a generator that yields
    # requests (functions of the block) and receives their results. ``_drive_block``
    # runs it here; ``execute_block_async`` awaits what async batched envs return. One
    # implementation of stepping, autoreset after restarts, and restarts for both.

    def _drive_block(self, first_row: int, flow: Flow) -> Any:
        return drive(flow, partial(self.envs.__getitem__, first_row))

    def _step_flow(self, first_row: int, command: Step, positions: Sequence[int]) -> Flow:
        """Step one block; returns its :data:`BlockOutcome`."""
        size = self.envs_per_block
        if len(positions) != size:
            error = ValueError(
                f"a step must address whole blocks: rows {first_row}..{first_row + size - 1}"
                f" form one batched env, but {len(positions)} of them were sent"
            )
            return None, self._error(first_row, "step", error), False
        reason = self._restart_notices.get(first_row)  # kept until a reset answers it
        actions = None
        if reason is None and first_row not in self._owes_reset:
            try:
                actions = self._block_actions(first_row, command, positions)
            except Exception as exc:  # batching the caller's actions: not the block's
                return None, self._error(first_row, "step", exc), False  # fault, no restart
        try:
            if reason is not None:  # the worker was rebuilt: answer with the fresh block
                return (yield from self._restarted_flow(first_row, reason)), None, False
            if first_row in self._owes_reset:
                self._owes_reset.discard(first_row)
                observations, info = _synchronous((yield _RESET), "reset")
                self._write(first_row, observations, 0.0, False, False)
                return split_infos(info, size), None, False
            result = _synchronous((yield methodcaller("step", actions)), "step")
            observations, rewards, terminations, truncations, info = result
            _check_one_per_row(
                size, rewards=rewards, terminations=terminations, truncations=truncations
            )
            self._write(first_row, observations, rewards, terminations, truncations)
            self._note_reward_dtype(rewards)
            self._failures_in_a_row[first_row] = 0
            return split_infos(info, size), None, True
        except env_errors() as exc:
            return (yield from self._recover_flow(first_row, exc))

    def _note_reward_dtype(self, rewards: Any) -> None:
        """Keep the dtype of a block's rewards (a numpy array of numbers), combined with
        the other blocks': the agent's results take it, as ``make_vec`` returns it."""
        dtype = getattr(rewards, "dtype", None)
        if dtype is None or dtype.kind not in "fiub" or dtype.str == self.reward_dtype:
            return
        known = self.reward_dtype
        self.reward_dtype = (dtype if known is None else np.result_type(known, dtype)).str

    def _block_actions(self, first_row: int, command: Step, positions: Sequence[int]) -> Any:
        """The block's batch of actions, in row order: a private copy (a block may keep
        its actions; the shared buffer is rewritten by the next send)."""
        size = self.envs_per_block
        if command.actions is None:  # in shared memory
            return copy_buffer(_rows(self.buffers.actions, slice(first_row, first_row + size)))
        by_row = {command.env_ids[p]: command.actions[p] for p in positions}
        values = [by_row[row] for row in range(first_row, first_row + size)]
        return stack_actions(self._single_action_space, values)

    def _write(
        self, first_row: int, observations: Any, rewards: Any, terminations: Any, truncations: Any
    ) -> None:
        """Write a block's results (rewards and flags: checked, one per row, or a
        scalar of aiovec's own for every row: a reset's 0.0/False)."""
        size = self.envs_per_block
        rows = slice(first_row, first_row + size)
        self._write_observations(first_row, observations)
        buffers = self.buffers
        buffers.rewards[rows] = rewards
        buffers.terminations[rows] = terminations
        buffers.truncations[rows] = truncations

    def _write_observations(self, first_row: int, observations: Any, mask: Any = None) -> None:
        size = self.envs_per_block
        if self._observations is not None:
            for offset, item in enumerate(split_batch(self._observation_space, observations)):
                if mask is None or mask[offset]:
                    self._observations[first_row + offset] = item
            return
        rows: Any = slice(first_row, first_row + size)
        try:
            _check_batch(self.buffers.observations, observations, size)
            if mask is not None:
                rows = [first_row + offset for offset in np.flatnonzero(mask)]
                observations = _rows(observations, np.flatnonzero(mask))
            write_rows(self.buffers.observations, rows, observations)
        except (ValueError, TypeError, KeyError, IndexError) as exc:
            raise ValueError(
                "the batched env returned observations that do not fit its "
                f"single_observation_space batched {size} times: {exc}"
            ) from None

    def _recover_flow(self, first_row: int, exc: BaseException) -> Flow:
        """Rebuild and reset the block after ``exc`` (restart policy), or report ``exc``."""
        try:
            infos = yield from self._rebuild_flow(first_row, exc)
        except env_errors() as final:
            return None, self._error(first_row, "step", final), False
        return infos, None, False

    def _rebuild_flow(
        self, first_row: int, exc: BaseException, answer: Callable[[str], Flow] | None = None
    ) -> Flow:
        """Rebuild the block after ``exc`` and answer with ``answer(reason)`` run on the
        new block (by default its reset, reported as a step that restarted its rows);
        raise the last failure when restarting is off or the block keeps failing."""
        if answer is None:
            answer = partial(self._restarted_flow, first_row)
        reason = failure_reason(exc)  # the failure that began the restart
        rebuilt = False  # a new block is installed (and not yet reset)
        self._failures_in_a_row[first_row] += 1
        while self._failures_in_a_row[first_row] <= self._max_restarts:
            try:
                yield _CLOSE
            except env_errors():
                pass  # a broken block may fail to close too
            # Rebuilding failing too counts as a failure.
            try:  # the factory alone: nothing closes this flow while it runs
                block = self._block_fns[first_row]()
                self.envs[first_row] = _checked_block(block, self.envs_per_block)
                rebuilt = True
            except call_errors() as failure:
                rebuilt = False
                exc = as_env_error(failure)
                # Never leave the closed block installed: the next command must not step it.
                self.envs[first_row] = cast(VectorEnv, _Unbuilt(exc))  # raises on use
                self._failures_in_a_row[first_row] += 1
                continue
            try:
                return (yield from answer(reason))
            except env_errors() as failure:
                exc = failure
                self._failures_in_a_row[first_row] += 1
        if rebuilt:  # but its reset failed: its next step tries the reset again (and
            # reports the restart) rather than stepping a block that was never reset
            self._restart_notices[first_row] = reason
        raise exc

    def _restarted_flow(self, first_row: int, reason: str) -> Flow:
        # After a reset that gave up, the caller's seeds and options, not a bare reset.
        owed = self._owed_resets.get(first_row)
        request = _RESET if owed is None else methodcaller("reset", seed=owed[0], options=owed[1])
        # SAME_STEP gives every ended episode its final observation: each row's last.
        rows = range(first_row, first_row + self.envs_per_block)
        finals = [self.last_observation(row) for row in rows] if self._same_step else None
        observations, info = _synchronous((yield request), "reset")
        self._write(first_row, observations, 0.0, False, True)
        self._restart_notices.pop(first_row, None)  # answered (kept while the reset fails)
        self._owed_resets.pop(first_row, None)
        if self._next_step:
            self._owes_reset.add(first_row)
        infos = _restarted_infos(info, self.envs_per_block, reason)
        if finals is not None:
            why = restarted_info({}, reason)  # why the episodes ended
            infos = [
                {"final_info": why, "final_obs": final, **row_info}
                for final, row_info in zip(finals, infos)
            ]
        return infos

    def _error(self, first_row: int, operation: str, exc: BaseException) -> ErrorInfo:
        return block_error(first_row, self.envs_per_block, operation, exc)

    def _execute_other(self, command: EnvCommand) -> Reply:
        blocks = self._blocks_of(command.env_ids)
        outcomes = []
        for first_row, positions in blocks:
            try:
                flow = self._other_flow(first_row, command, positions)
                outcome = self._drive_block(first_row, flow)
            except env_errors() as exc:
                outcome = exc
            outcomes.append(outcome)
        return self._other_reply(command, blocks, outcomes)

    def _other_flow(self, first_row: int, command: EnvCommand, positions: Sequence[int]) -> Flow:
        """Reset, call or set_attr on one block (its rows at ``positions`` of
        ``command``): per-row infos (reset) or values (call), indexed by offset in the
        block; raises what the block raised."""
        if isinstance(command, Reset):
            return (yield from self._reset_flow(first_row, command, positions))
        if isinstance(command, Call):
            return (yield from self._call_flow(first_row, command))
        if isinstance(command, SetAttr):
            self._set_attr_block(first_row, command, positions)
            return None
        raise TypeError(f"unexpected command {command!r}")

    def _other_reply(
        self,
        command: EnvCommand,
        blocks: list[tuple[int, Sequence[int]]],
        outcomes: list[Any],
    ) -> Reply:
        """The reply to a reset, call or set_attr, in ``command``'s env order, from each
        block's outcome (per-row results, or the exception it raised)."""
        env_ids = command.env_ids
        results: list[Any] = [None] * len(env_ids)
        errors: list[ErrorInfo] = []
        name = command.name if isinstance(command, (Call, SetAttr)) else "reset"
        for (first_row, positions), outcome in zip(blocks, outcomes):
            if isinstance(outcome, Exception):
                operation = "set_attr" if isinstance(command, SetAttr) else name
                errors.append(self._error(first_row, operation, outcome))
            elif outcome is not None:
                for position in positions:
                    results[position] = outcome[env_ids[position] - first_row]
        return self.control_reply(command, results, errors)

    def _reset_flow(self, first_row: int, command: Reset, positions: Sequence[int]) -> Flow:
        """Reset the block's rows at ``positions`` of ``command``: all of them, or (a
        partial reset) those in ``options["reset_mask"]``, which the block must support."""
        size = self.envs_per_block
        offsets = [command.env_ids[p] - first_row for p in positions]
        seeds = [command.seeds[p] for p in positions]
        options = command.options
        if command.per_env_options:
            chosen = [command.options[p] for p in positions]
            if any(not same_value(item, chosen[0]) for item in chosen[1:]):
                raise ValueError(
                    "reset options differ between envs of one batched env; a batched env "
                    "takes one options dict per block"
                )
            options = chosen[0]
        options = self.own_copy(options)
        whole = len(positions) == size
        seed: Any = None
        if any(s is not None for s in seeds):
            first_seed = seeds[0]  # may be None while another seed is not
            consecutive = first_seed is not None and all(
                s == first_seed + offset - offsets[0] for s, offset in zip(seeds, offsets)
            )
            # An int seeds the block as Gymnasium seeds a vector env (row i: seed + i).
            seed = seeds[0] if whole and consecutive else _seed_list(size, offsets, seeds)
        mask = None
        if not whole:
            mask = np.zeros(size, dtype=np.bool_)
            mask[offsets] = True
            options = {**(options or {}), "reset_mask": mask}
        reset = partial(self._reset_rows_flow, first_row, seed, options, mask, offsets)
        # A whole reset answers for a restart not yet reported (the worker was replaced,
        # this reset perhaps replayed on the new one): its infos carry the notice.
        reason = self._restart_notices.get(first_row) if whole else None
        try:
            return (yield from reset(reason))
        except env_errors() as exc:
            if not whole:  # a rebuilt block needs every row reset, not just these
                raise
            # Rebuilt and reset again with the same seeds and options (restart policy).
            try:
                return (yield from self._rebuild_flow(first_row, exc, reset))
            except env_errors():
                self._owed_resets[first_row] = (seed, options)  # see _restarted_flow
                raise

    def _reset_rows_flow(
        self,
        first_row: int,
        seed: Any,
        options: Any,
        mask: np.ndarray | None,
        offsets: list[int],
        restart_reason: str | None = None,
    ) -> Flow:
        """Reset the block (the rows of ``mask``, or all): per-row infos, flagged as
        restarted when ``restart_reason`` is given."""
        size = self.envs_per_block
        request = methodcaller("reset", seed=seed, options=options)
        observations, info = _synchronous((yield request), "reset")
        rows = slice(first_row, first_row + size)
        self._write_observations(first_row, observations, mask)
        if mask is None:
            self.buffers.terminations[rows] = False
            self.buffers.truncations[rows] = False
            self._owes_reset.discard(first_row)
            self._restart_notices.pop(first_row, None)  # answered
            self._owed_resets.pop(first_row, None)  # a new reset replaces one that gave up
        else:
            for offset in offsets:
                self.buffers.terminations[first_row + offset] = False
                self.buffers.truncations[first_row + offset] = False
        if restart_reason is None:
            return split_infos(info, size)
        return _restarted_infos(info, size, restart_reason)

    def _call_flow(self, first_row: int, command: Call) -> Flow:
        """One call on the block; each row gets its result, except for a per-env
        sequence of results (a vector env's ``render``, ``call``), which is split."""
        args, kwargs = self.own_copy(command.args or ()), self.own_copy(command.kwargs or {})
        if command.function is not None:
            function = command.function
            value = yield lambda block: function(block, *args, **kwargs)
        else:

            def call(block: Any) -> Any:
                attribute = getattr(block, command.name)
                return attribute(*args, **kwargs) if callable(attribute) else attribute

            value = yield call
        per_env = command.name in _PER_ENV_CALLS and isinstance(value, (list, tuple, np.ndarray))
        if per_env and len(value) == self.envs_per_block:  # e.g. frames, one per env
            return list(value)
        return [value] * self.envs_per_block

    def _set_attr_block(self, first_row: int, command: SetAttr, positions: Sequence[int]) -> None:
        values = [command.values[p] for p in positions]
        if any(not same_value(value, values[0]) for value in values[1:]):
            raise ValueError(
                f"set_attr({command.name!r}) gives envs of one batched env different "
                "values; a batched env has one attribute per block: give its rows one value"
            )
        setattr(self.envs[first_row], command.name, self.own_copy(values[0]))

    def notify_restart(self, reason: str, env_ids: list[int] | None = None) -> None:
        """The next step of each block of ``env_ids`` (default: all) reports a restart."""
        size = self.envs_per_block
        firsts = self.envs if env_ids is None else {e - e % size for e in env_ids}
        self._restart_notices.update(dict.fromkeys(firsts, reason))

    def close(self) -> None:
        """Close every block, ignoring their errors (closing must always finish)."""
        for block in self.envs.values():
            _close_quietly(block)


#: Calls whose result a vector env gives per env (split between the block's rows).
_PER_ENV_CALLS = frozenset({"render", "call", "get_attr"})


def _check_one_per_row(size: int, **values: Any) -> None:
    """Refuse a batched env's rewards or flags that are not one per row: a scalar (an
    ``np.any(dones)`` slip) is not spread over the block's rows."""
    for name, value in values.items():
        if np.shape(value) != (size,):
            raise ValueError(
                f"the batched env returned {name} of shape {np.shape(value)}, not "
                f"({size},): one per env"
            )


def split_infos(info: dict[str, Any], size: int) -> list[dict[str, Any]] | None:
    """A vector env's ``info`` dict (``key`` / ``_key`` mask pairs, nested dicts alike)
    as one dict per env, as its envs would have returned them; ``None`` for no info."""
    if not info:
        return None
    rows: list[dict[str, Any]] = [{} for _ in range(size)]
    for key, value in info.items():
        if key.startswith("_") and key[1:] in info:
            continue  # a mask, read with its key
        mask = info.get(f"_{key}")
        if mask is None:  # no mask: a per-env array, or one value for every env
            indices: Any = range(size)
        else:  # a mask and its values: one per row (Gymnasium's layout), or whose is which?
            for name, part in ((f"_{key}", mask), (key, value)):
                if not isinstance(part, dict) and np.shape(part)[:1] != (size,):
                    raise ValueError(
                        f"the batched env returned info {name!r} of shape "
                        f"{np.shape(part)}, not ({size},): one per env"
                    )
            indices = np.flatnonzero(mask)
        if isinstance(value, dict):
            nested = split_infos(value, size) or [{}] * size
            for index in indices:
                rows[index][key] = nested[index]
        elif isinstance(value, np.ndarray) and value.ndim > 0 and len(value) == size:
            for index in indices:
                rows[index][key] = value[index]
        else:
            for index in indices:
                rows[index][key] = value
    return rows


def stack_actions(space: spaces.Space[Any], values: list[Any]) -> Any:
    """One action per env as a block's batch, in the shape of the block's batched action
    space: numbers keep the dtype the caller gave them (as Gymnasium hands an env what
    the caller passed: whole-number floats for a discrete space stay floats), one number
    per env for a one-element space becomes its row; other values are batched as
    Gymnasium batches the space."""
    first = values[0]
    if isinstance(space, spaces.Dict) and isinstance(first, dict):
        return {key: stack_actions(space[key], [v[key] for v in values]) for key in space}
    if isinstance(space, spaces.Tuple) and isinstance(first, tuple):
        return tuple(
            stack_actions(sub, [v[index] for v in values]) for index, sub in enumerate(space)
        )
    if isinstance(space, _ARRAY_SPACES):
        batch = np.asarray(values)
        shape = (len(values), *cast("tuple[int, ...]", space.shape))
        if batch.shape != shape and batch.size == math.prod(shape):
            batch = batch.reshape(shape)  # [0.5, 0.25] for Box(0, 1, (1,)): its rows
        return batch
    if isinstance(first, (np.ndarray, np.generic)):
        return np.stack(values)
    return batch_values(space, values)


#: Spaces whose samples are numpy arrays of a fixed shape (batched by stacking rows).
_ARRAY_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)


#: What stepping one block gives: its per-row infos (or None), its error, and whether a
#: real step happened (not only a reset after a restart).
BlockOutcome = tuple[list[Any] | None, ErrorInfo | None, bool]

_RESET = methodcaller("reset")
_CLOSE = methodcaller("close")


def _synchronous(result: Any, method: str) -> Any:
    """``result``, unless it is an awaitable a blocking caller got from an async
    batched env: then a clear error (the coroutine backend awaits them)."""
    if inspect.isawaitable(result):
        getattr(result, "close", lambda: None)()  # never run: discard quietly
        raise TypeError(
            f"this batched env's {method}() is async (it returned {type(result).__name__}); "
            "async batched envs run on backend='coroutine'"
        )
    return result


def _check_batch(buffer: Any, batch: Any, size: int) -> None:
    """Raise ValueError unless ``batch`` has ``size`` rows of ``buffer``'s row shape and
    values its dtype holds as a single env's must (see
    :func:`~aiovec._transport.spaces.row_writer`; numpy would broadcast or wrap the
    rest); a dict's keys beyond the buffer's are left out."""
    if isinstance(buffer, dict):
        if not isinstance(batch, dict) or not set(buffer) <= set(batch):
            raise ValueError(f"expected a dict with keys {sorted(buffer)}, got {_kind(batch)}")
        for key, sub in buffer.items():
            _check_batch(sub, batch[key], size)
        return
    if isinstance(buffer, tuple):
        if not isinstance(batch, tuple) or len(batch) != len(buffer):
            raise ValueError(f"expected a tuple of {len(buffer)}, got {_kind(batch)}")
        for sub, item in zip(buffer, batch):
            _check_batch(sub, item, size)
        return
    array = batch if type(batch) is np.ndarray else np.asarray(batch)
    expected = (size, *buffer.shape[1:])
    if array.shape != expected:
        raise ValueError(f"expected shape {expected}, got shape {array.shape}")
    if array.dtype != buffer.dtype and not np.can_cast(array.dtype, buffer.dtype, "safe"):
        converted_exactly(array, batch, expected, buffer.dtype, f"a batch of {expected}")


def _kind(value: Any) -> str:
    return type(value).__name__


def _rows(batch: Any, rows: Any) -> Any:
    """The rows ``rows`` (a slice or indices) of a batch (arrays, dicts and tuples of them)."""
    if isinstance(batch, dict):
        return {key: _rows(item, rows) for key, item in batch.items()}
    if isinstance(batch, tuple):
        return tuple(_rows(item, rows) for item in batch)
    return batch[rows]


def _seed_list(size: int, offsets: list[int], seeds: list[Any]) -> list[Any]:
    full: list[Any] = [None] * size
    for offset, seed in zip(offsets, seeds):
        full[offset] = seed
    return full


def same_value(value: Any, other: Any) -> bool:
    """``value`` equals ``other`` (arrays element-wise); False when they cannot compare."""
    if value is other:
        return True
    try:
        if isinstance(value, dict) and isinstance(other, dict):  # e.g. options with arrays
            return value.keys() == other.keys() and all(
                same_value(item, other[key]) for key, item in value.items()
            )
        if isinstance(value, np.ndarray) or isinstance(other, np.ndarray):
            return bool(np.array_equal(value, other))
        return bool(value == other)
    except Exception:
        return False
