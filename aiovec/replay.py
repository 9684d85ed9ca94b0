"""Replay buffers written straight from vector-env results, first-ready or lockstep.

:class:`ReplayBuffer` keeps a fixed number of transitions in numpy arrays laid out from
the envs' single observation and action spaces, and samples contiguous batches.
:class:`PrioritizedReplayBuffer` samples in proportion to priorities kept in a sum-tree
(Schaul et al., 2016). Both are fed the way :class:`aiovec.TransitionAssembler` is:
the observations of a reset, the actions sent, and every :class:`aiovec.Batch` received
(or a lockstep ``step``'s results), so env ids may arrive in any order and no transition
ever crosses an episode boundary, in all three autoreset modes. Everything is
vectorized: a batch costs a few numpy operations, whatever its size.

n-step returns are computed when sampling, by following each transition's link to the
same env's next one (links die with the slot they point to, so overwritten data is never
mixed in).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple, cast

import numpy as np
import numpy.typing as npt
from gymnasium import spaces
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import create_empty_array

from aiovec._checks import env_id_rows
from aiovec._episode_marks import autoreset_mode_of, check_autoreset_mode, info_mask
from aiovec._transport.spaces import batch_checker, is_shareable, read_rows, write_rows

#: Version of the ``.npz`` layout written by :meth:`ReplayBuffer.save`. Format 2 escapes
#: "." (and "%") in Dict keys, so each leaf has a name of its own; format 1 joined keys
#: as they were (``{"a.b": ..}`` and ``{"a": {"b": ..}}`` both ``observations.a.b``).
FORMAT_VERSION = 2
#: The formats :meth:`ReplayBuffer.load` reads.
_READABLE_FORMATS = (1, 2)
#: What :meth:`ReplayBuffer.save` writes: plain arrays, and batches laid out from a space.
_SAVED_ARRAYS = (
    "rewards",
    "terminations",
    "truncations",
    "successors",
    "stamps",
    "_has_observation",
    "_has_action",
    "_after_end",
    "_last_slot",
    "_last_stamp",
)
_SAVED_BATCHES = (
    "observations",
    "next_observations",
    "actions",
    "_last_observations",
    "_last_actions",
)


#: What a buffer's rewards may be stored as (what torch holds, native byte order).
_REWARD_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


class Sample(NamedTuple):
    """A batch of transitions, row ``i`` of every field from the same transition.

    ``rewards`` is the discounted sum of up to ``n_step`` rewards, ``next_observations``
    the observation that follows the last of them and ``discounts`` the factor to apply
    to a value estimate of it: ``gamma ** k`` for ``k`` steps taken, and 0 when the
    episode terminated within them (bootstrap with
    ``rewards + discounts * value(next_observations)``). ``weights`` are the
    importance-sampling weights (ones for uniform sampling); ``indices`` identify the
    transitions for :meth:`PrioritizedReplayBuffer.update_priorities`.
    """

    observations: Any
    actions: Any
    rewards: Any
    next_observations: Any
    terminations: Any
    truncations: Any
    discounts: Any
    weights: Any
    indices: np.ndarray


class ReplayBuffer:
    """Uniform replay of the last ``capacity`` transitions of ``num_envs`` envs.

    Feed it with :meth:`reset` (observations of a reset), :meth:`sent` (the actions
    passed to ``send``/``step``) and :meth:`received` (every batch of results), or with
    ready-made transitions through :meth:`add`. Guarantees: a transition pairs an
    observation with the action sent from it and the env's next result; the result
    that an autoreset produces (``NEXT_STEP``) starts a new episode and makes no
    transition; with ``SAME_STEP`` the episode's last transition ends at
    ``infos["final_obs"]``. Rewards, their n-step sums and discounts are of
    ``reward_dtype`` (float32 by default, as Stable-Baselines3's buffers; ``np.float64``
    keeps rewards that float32 would round).

    Example:
        >>> import aiovec
        >>> envs = aiovec.make("CartPole-v1", 4, backend="inline")
        >>> buffer = aiovec.ReplayBuffer.for_env(envs, capacity=1000)
        >>> observations, _ = envs.reset(seed=0)
        >>> buffer.reset(observations)
        >>> for _ in range(5):  # too few steps for a CartPole episode to end
        ...     actions = envs.action_space.sample()
        ...     buffer.sent(actions)
        ...     _ = buffer.received(envs.step(actions))
        >>> len(buffer)
        20
        >>> buffer.sample(8, rng=0).observations.shape
        (8, 4)
        >>> envs.close()
    """

    def __init__(
        self,
        capacity: int,
        observation_space: spaces.Space[Any],
        action_space: spaces.Space[Any],
        *,
        num_envs: int = 1,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        n_step: int = 1,
        gamma: float = 0.99,
        reward_dtype: npt.DTypeLike = np.float32,
    ) -> None:
        if reward_dtype is None or np.dtype(reward_dtype) not in _REWARD_DTYPES:
            raise TypeError(
                f"reward_dtype must be np.float32 (the default) or np.float64 (for rewards "
                f"float32 would round), got {reward_dtype!r}"
            )
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        if n_step < 1:
            raise ValueError(f"n_step must be at least 1, got {n_step}")
        if num_envs < 1:
            raise ValueError(f"num_envs must be at least 1, got {num_envs}")
        for name, space in (("observation", observation_space), ("action", action_space)):
            if not is_shareable(space):
                raise TypeError(
                    f"the {name} space {space} has no fixed-size array form; a replay buffer "
                    "stores Box, Discrete, MultiDiscrete, MultiBinary and Dict/Tuple of them"
                )
        self.capacity = int(capacity)
        self.observation_space, self.action_space = observation_space, action_space
        self.num_envs = int(num_envs)
        self.autoreset_mode = AutoresetMode(autoreset_mode)
        self.n_step, self.gamma = int(n_step), float(gamma)
        self.observations = create_empty_array(observation_space, capacity, fn=np.zeros)
        self.next_observations = create_empty_array(observation_space, capacity, fn=np.zeros)
        self.actions = create_empty_array(action_space, capacity, fn=np.zeros)
        self.rewards = np.zeros(capacity, dtype=reward_dtype)
        self.terminations = np.zeros(capacity, dtype=np.bool_)
        self.truncations = np.zeros(capacity, dtype=np.bool_)
        # The same env's next transition (-1: none yet, or the episode ended), and the
        # insertion count of each slot, so a link to an overwritten slot is recognised.
        self.successors = np.full(capacity, -1, dtype=np.int64)
        self.stamps = np.full(capacity, -1, dtype=np.int64)
        self.inserted = 0  # transitions ever added: the next one's stamp
        # Per env: the observation and action a result will complete, and its last slot.
        self._last_observations = create_empty_array(observation_space, num_envs, fn=np.zeros)
        self._last_actions = create_empty_array(action_space, num_envs, fn=np.zeros)
        self._has_observation = np.zeros(num_envs, dtype=np.bool_)
        self._has_action = np.zeros(num_envs, dtype=np.bool_)
        self._check_actions = batch_checker(action_space)
        self._check_observations = batch_checker(observation_space, "observations")
        self._check_next_observations = batch_checker(observation_space, "next_observations")
        self._after_end = np.zeros(num_envs, dtype=np.bool_)
        self._last_slot = np.full(num_envs, -1, dtype=np.int64)
        self._last_stamp = np.full(num_envs, -1, dtype=np.int64)

    @classmethod
    def for_env(cls, env: Any, capacity: int, **kwargs: Any) -> ReplayBuffer:
        """A buffer laid out for ``env`` (an ``aiovec.VecEnv`` or any Gymnasium vector
        env): its single spaces, number of envs and autoreset mode."""
        kwargs.setdefault("num_envs", env.num_envs)
        mode = autoreset_mode_of(env)
        if mode is not None:
            kwargs.setdefault("autoreset_mode", mode)
        return cls(capacity, env.single_observation_space, env.single_action_space, **kwargs)

    def __len__(self) -> int:
        return min(self.inserted, self.capacity)

    # --- feeding from a vector env ------------------------------------------------------

    def reset(self, observations: Any, env_ids: Sequence[int] | np.ndarray | None = None) -> None:
        """Record the observations of a reset of ``env_ids`` (default: all, in order)."""
        rows = self._rows(env_ids)
        count = len(np.asarray(_first_leaf(observations)))
        if count != len(rows):
            raise ValueError(
                f"{count} observations for {len(rows)} env ids: give the reset observations "
                "of exactly these envs, in the same order"
            )
        checked, _ = self._check_observations(observations, len(rows))
        write_rows(self._last_observations, rows, checked)
        self._has_observation[rows] = True
        self._after_end[rows] = False
        self._last_slot[rows] = -1

    def sent(self, actions: Any, env_ids: Sequence[int] | np.ndarray | None = None) -> None:
        """Record the actions sent to ``env_ids`` (default: all, in order)."""
        rows = self._rows(env_ids)
        # The vector env's own checks: shape per env, dtype, Discrete ranges.
        checked, _ = self._check_actions(actions, len(rows))
        write_rows(self._last_actions, rows, checked)
        self._has_action[rows] = True

    def received(self, result: Any) -> int:
        """Add the transitions completed by ``result``: an :class:`aiovec.Batch` from
        ``recv`` (any env ids, any order), or the ``(observations, rewards,
        terminations, truncations, infos)`` of a lockstep ``step``. Returns how many
        transitions were added."""
        if isinstance(result, tuple) and len(result) == 5:
            observations, rewards, terminations, truncations, infos = result
            env_ids = np.arange(self.num_envs)
        else:
            observations, rewards = result.observations, result.rewards
            terminations, truncations = result.terminations, result.truncations
            infos, env_ids = result.infos, np.asarray(result.env_ids)
        terminations = np.asarray(terminations, dtype=np.bool_)
        truncations = np.asarray(truncations, dtype=np.bool_)
        if not self._has_observation[env_ids].all():
            missing = env_ids[~self._has_observation[env_ids]].tolist()
            raise RuntimeError(
                f"envs {missing} returned results before any reset was recorded: call "
                "buffer.reset(observations) with the observations of reset() first"
            )
        # A NEXT_STEP autoreset result starts a new episode: no transition.
        makes_transition = ~self._after_end[env_ids]
        if self.autoreset_mode is not AutoresetMode.NEXT_STEP:
            makes_transition[:] = True
        # A rebuilt env (on_failure="restart") answers with its new first observation.
        restarted = info_mask(infos, "restarted", len(env_ids))
        check_autoreset_mode(
            self.autoreset_mode,
            infos,
            terminations | truncations,
            restarted,
            self._after_end[env_ids],
            type(self).__name__,
        )
        makes_transition &= ~restarted
        rows = np.flatnonzero(makes_transition)
        unsent = env_ids[rows][~self._has_action[env_ids[rows]]]
        if unsent.size:
            raise RuntimeError(
                f"envs {unsent.tolist()} returned results for which no action was recorded: "
                "call buffer.sent(actions, env_ids) with what you pass to send()/step()"
            )
        next_observations = observations
        final_mask = infos.get("_final_obs") if isinstance(infos, dict) else None
        if final_mask is not None and np.any(final_mask):
            # SAME_STEP: the episode's last observation is in final_obs, not observations.
            next_observations = _with_final(
                self.observation_space, observations, infos["final_obs"], final_mask
            )
        added = 0
        if rows.size:
            ids = env_ids[rows]
            added = self._insert(
                ids,
                read_rows(self._last_observations, ids),
                read_rows(self._last_actions, ids),
                np.asarray(rewards)[rows],
                read_rows(next_observations, rows),
                terminations[rows],
                truncations[rows],
            )
        write_rows(self._last_observations, env_ids, observations)
        self._has_action[env_ids] = False  # each action completes one result
        # A restart answers truncated=True: with NEXT_STEP its next result is a reset too.
        ended = terminations | truncations
        self._after_end[env_ids] = ended
        self._last_slot[env_ids[ended | restarted]] = -1  # no link across episodes
        return added

    def add(
        self,
        observations: Any,
        actions: Any,
        rewards: Any,
        next_observations: Any,
        terminations: Any,
        truncations: Any,
        env_ids: Sequence[int] | np.ndarray | None = None,
        episode_starts: Any = None,
    ) -> None:
        """Add ready-made transitions, one row per transition in every field.

        The rows of ``rewards`` (a 1-D array) are the transitions: every other field
        (each leaf of Dict/Tuple observations, and ``env_ids`` and ``episode_starts``
        when given) must have as many rows, never one to broadcast. Observations and
        actions are checked as :meth:`reset` and :meth:`sent` check them (shape, kind of
        numbers, a discrete space's range), env ids as :meth:`sent` does except that
        they may repeat. Everything is checked before anything is written: a refused
        call (ValueError or TypeError naming the field) leaves the buffer as it was.

        Give ``env_ids`` (which env each row came from, in time order per env) to link
        consecutive transitions for n-step returns; a row whose ``episode_starts`` is
        True (its observation begins an episode: after a reset or a restart) is never
        linked to its env's previous transition."""
        rewards = np.asarray(rewards)
        if rewards.ndim != 1:
            raise ValueError(
                f"rewards must be a 1-D array, one reward per transition (its rows are the "
                f"transitions), got shape {rewards.shape}"
            )
        if rewards.dtype.kind not in "biuf":
            raise TypeError(f"rewards must be numbers, got dtype {rewards.dtype}")
        count = len(rewards)
        # Row counts first, every field: the clearest message for a misaligned batch.
        _check_rows(self.observation_space, observations, count, "observations")
        _check_rows(self.action_space, actions, count, "actions")
        _check_rows(self.observation_space, next_observations, count, "next_observations")
        flags = {"terminations": terminations, "truncations": truncations}
        if episode_starts is not None:
            flags["episode_starts"] = episode_starts
        if env_ids is not None:
            flags["env_ids"] = env_ids
        for name, flag in flags.items():
            _check_rows(None, flag, count, name)
            if np.ndim(flag) != 1:
                raise ValueError(
                    f"{name} has shape {np.shape(flag)} for {count} transitions: give one "
                    "value per transition"
                )
        checked_observations, _ = self._check_observations(observations, count)
        checked_actions, _ = self._check_actions(actions, count)
        checked_next, _ = self._check_next_observations(next_observations, count)
        ids = None if env_ids is None else env_id_rows(env_ids, self.num_envs, distinct=False)
        self._insert(
            ids,
            _arrays(checked_observations),
            _arrays(checked_actions),
            rewards,
            _arrays(checked_next),
            np.asarray(terminations, dtype=np.bool_),
            np.asarray(truncations, dtype=np.bool_),
            None if episode_starts is None else np.asarray(episode_starts, dtype=np.bool_),
        )

    def add_chunk(self, chunk: Any) -> None:
        """Add a :class:`aiovec.TransitionAssembler` chunk (``(envs, length, ...)``
        fields), linked per env for n-step returns, never across the chunk's
        ``episode_starts`` (a reset or restart mid-episode)."""
        num_envs, length = np.asarray(chunk.rewards).shape[:2]
        # Time-major rows keep each env's transitions in order, interleaved across envs.
        env_ids = np.tile(np.asarray(chunk.env_ids), length)
        starts = getattr(chunk, "episode_starts", None)  # a chunk built by hand may have none

        def rows(field: Any) -> Any:
            if isinstance(field, dict):
                return {key: rows(value) for key, value in field.items()}
            if isinstance(field, tuple):
                return tuple(rows(value) for value in field)
            array = np.asarray(field)
            return np.swapaxes(array, 0, 1).reshape(num_envs * length, *array.shape[2:])

        self.add(
            rows(chunk.observations),
            rows(chunk.actions),
            rows(chunk.rewards),
            rows(chunk.next_observations),
            rows(chunk.terminations),
            rows(chunk.truncations),
            env_ids=env_ids,
            episode_starts=None if starts is None else rows(starts),
        )

    def _insert(
        self,
        env_ids: np.ndarray | None,
        observations: Any,
        actions: Any,
        rewards: np.ndarray,
        next_observations: Any,
        terminations: np.ndarray,
        truncations: np.ndarray,
        episode_starts: np.ndarray | None = None,
    ) -> int:
        count = len(rewards)
        if count > self.capacity:  # only the newest fit
            keep = slice(count - self.capacity, count)
            env_ids = None if env_ids is None else env_ids[keep]
            episode_starts = None if episode_starts is None else episode_starts[keep]
            observations, actions = read_rows(observations, keep), read_rows(actions, keep)
            next_observations = read_rows(next_observations, keep)
            rewards, terminations, truncations = (
                rewards[keep],
                terminations[keep],
                truncations[keep],
            )
            self.inserted += count - self.capacity
            count = self.capacity
        slots = (self.inserted + np.arange(count)) % self.capacity
        stamps = self.inserted + np.arange(count)
        write_rows(self.observations, slots, observations)
        write_rows(self.actions, slots, actions)
        write_rows(self.next_observations, slots, next_observations)
        self.rewards[slots] = rewards
        self.terminations[slots] = terminations
        self.truncations[slots] = truncations
        self.successors[slots] = -1
        self.stamps[slots] = stamps
        if env_ids is not None:
            self._link(env_ids, slots, stamps, terminations | truncations, episode_starts)
        self.inserted += count
        self._inserted_slots(slots)
        return count

    def _link(
        self,
        env_ids: np.ndarray,
        slots: np.ndarray,
        stamps: np.ndarray,
        ended: np.ndarray,
        starts: np.ndarray | None,
    ) -> None:
        """Point each env's previous transition at its next one (rows of one env are in
        time order), as long as the previous one is still stored and the next one does
        not start an episode (``starts``)."""
        previous_slot = np.empty_like(slots)
        previous_stamp = np.empty_like(stamps)
        # Within this batch, an env's previous transition is its previous row here.
        order = np.argsort(env_ids, kind="stable")
        sorted_ids = env_ids[order]
        first = np.ones(len(order), dtype=np.bool_)
        first[1:] = sorted_ids[1:] != sorted_ids[:-1]
        previous_in_batch = np.empty_like(order)
        previous_in_batch[1:] = order[:-1]
        from_batch = order[~first]
        previous_slot[from_batch] = slots[previous_in_batch[~first]]
        previous_stamp[from_batch] = stamps[previous_in_batch[~first]]
        ended_before = np.zeros(len(order), dtype=np.bool_)
        ended_before[from_batch] = ended[previous_in_batch[~first]]
        from_before = order[first]
        previous_slot[from_before] = self._last_slot[env_ids[from_before]]
        previous_stamp[from_before] = self._last_stamp[env_ids[from_before]]
        valid = (previous_slot >= 0) & ~ended_before
        if starts is not None:
            valid &= ~starts
        valid[valid] = self.stamps[previous_slot[valid]] == previous_stamp[valid]
        self.successors[previous_slot[valid]] = slots[valid]
        # Each env's last row in the batch becomes its last slot (none after an end).
        last = np.ones(len(order), dtype=np.bool_)
        last[:-1] = sorted_ids[1:] != sorted_ids[:-1]
        final_rows = order[last]
        self._last_slot[env_ids[final_rows]] = np.where(ended[final_rows], -1, slots[final_rows])
        self._last_stamp[env_ids[final_rows]] = stamps[final_rows]

    def _inserted_slots(self, slots: np.ndarray) -> None:
        """Hook for subclasses: ``slots`` were just (over)written."""

    # --- sampling -----------------------------------------------------------------------

    def sample(
        self,
        batch_size: int,
        rng: np.random.Generator | int | None = None,
        device: Any = None,
    ) -> Sample:
        """``batch_size`` transitions drawn uniformly (with replacement), as contiguous
        arrays; with ``device`` (e.g. ``"cpu"``, ``"cuda"``), as torch tensors there,
        each field moved in one copy."""
        size = len(self)
        if size == 0:
            raise ValueError("the replay buffer is empty: add transitions before sampling")
        generator = np.random.default_rng(rng)
        indices = generator.integers(0, size, batch_size)
        slots = self._slots_of(indices)
        return self._gather(slots, np.ones(batch_size, dtype=np.float32), device)

    def _slots_of(self, indices: np.ndarray) -> np.ndarray:
        """Slots of the ``indices``-th stored transitions (any order is uniform)."""
        return indices

    def _gather(self, slots: np.ndarray, weights: np.ndarray, device: Any) -> Sample:
        rewards = self.rewards.take(slots)
        terminations = self.terminations.take(slots)
        truncations = self.truncations.take(slots)
        discounts = np.full(len(slots), self.gamma, dtype=rewards.dtype)
        last = slots
        if self.n_step > 1:
            # Follow each transition's links while its episode goes on.
            scale = np.ones(len(slots), dtype=rewards.dtype)
            alive = ~(terminations | truncations)
            for _ in range(self.n_step - 1):
                successor = self.successors[last]
                step = alive & (successor >= 0)
                if not step.any():
                    break
                scale[step] *= self.gamma
                following = successor[step]
                rewards[step] += scale[step] * self.rewards.take(following)
                last = last.copy()
                last[step] = following
                terminations[step] = self.terminations.take(following)
                truncations[step] = self.truncations.take(following)
                discounts[step] *= self.gamma
                alive = step & ~(terminations | truncations)
        discounts[terminations] = 0.0
        sample = Sample(
            read_rows(self.observations, slots),
            read_rows(self.actions, slots),
            rewards,
            read_rows(self.next_observations, last),
            terminations,
            truncations,
            discounts,
            weights,
            slots,
        )
        return sample if device is None else to_torch(sample, device)

    # --- saving -------------------------------------------------------------------------

    def save(self, path: str | Path) -> None:
        """Write the buffer (contents, links, feeding state) to ``path`` (``.npz``), to
        resume with :meth:`load`."""
        arrays = {
            "format_version": np.array(FORMAT_VERSION),
            "kind": np.array(type(self).__name__),
            "capacity": np.array(self.capacity),
            "num_envs": np.array(self.num_envs),
            "autoreset_mode": np.array(self.autoreset_mode.value),
            "n_step": np.array(self.n_step),
            "gamma": np.array(self.gamma),
            "inserted": np.array(self.inserted),
        }
        for name in _SAVED_ARRAYS:
            arrays[name] = getattr(self, name)
        for name in _SAVED_BATCHES:
            _flatten(arrays, name, getattr(self, name), name)
        arrays.update(self._extra_state())
        with open(path, "wb") as file:  # exactly this path: np.savez would append .npz
            # cast: numpy's stub reads a key of **arrays as its allow_pickle: bool
            np.savez(file, **cast("dict[str, Any]", arrays))

    def _extra_state(self) -> dict[str, np.ndarray]:
        return {}

    @classmethod
    def load(
        cls, path: str | Path, observation_space: spaces.Space[Any], action_space: spaces.Space[Any]
    ) -> ReplayBuffer:
        """A buffer saved by :meth:`save`, for the same spaces (files of every earlier
        format too, but for a format-1 file that stored two leaves of a Dict under one
        name, which lost one of them: a ``ValueError`` names it)."""
        with np.load(path, allow_pickle=False) as data:
            version = int(data["format_version"])
            if version not in _READABLE_FORMATS:
                raise ValueError(
                    f"{path} is replay-buffer format {version}; this aiovec reads formats "
                    f"{', '.join(map(str, _READABLE_FORMATS))}: load it with the aiovec that "
                    "saved it"
                )
            if str(data["kind"]) != cls.__name__:
                raise ValueError(f"{path} holds a {data['kind']}, not a {cls.__name__}")
            buffer = cls(
                int(data["capacity"]),
                observation_space,
                action_space,
                num_envs=int(data["num_envs"]),
                autoreset_mode=str(data["autoreset_mode"]),
                n_step=int(data["n_step"]),
                gamma=float(data["gamma"]),
                reward_dtype=data["rewards"].dtype,
                **cls._load_options(data),
            )
            buffer.inserted = int(data["inserted"])
            for name in _SAVED_ARRAYS:
                target = getattr(buffer, name)
                if data[name].shape != target.shape:
                    raise ValueError(f"{path}: {name} has shape {data[name].shape}")
                target[...] = data[name]
            for name in _SAVED_BATCHES:
                names: dict[str, str] = {}  # saved name -> leaf path, to see a format-1 clash
                _unflatten(data, name, getattr(buffer, name), version, names, name)
            buffer._restore(data)
        return buffer

    @classmethod
    def _load_options(cls, data: Any) -> dict[str, Any]:
        return {}

    def _restore(self, data: Any) -> None:
        pass

    def _rows(self, env_ids: Sequence[int] | np.ndarray | None) -> Any:
        if env_ids is None:
            return np.arange(self.num_envs)
        return env_id_rows(env_ids, self.num_envs)


class PrioritizedReplayBuffer(ReplayBuffer):
    """Proportional prioritized replay (Schaul et al., 2016) on a numpy sum-tree.

    A transition is drawn with probability ``p_i ** alpha / sum_k p_k ** alpha``; new
    transitions get the highest priority seen so far, so each is replayed at least
    once soon. Samples carry importance-sampling ``weights``
    ``(N * P(i)) ** -beta`` scaled so that the largest possible is 1, with ``beta``
    annealed linearly from ``beta`` to 1 over ``beta_steps`` calls to :meth:`sample`.
    Sampling and updating cost O(batch_size * log(capacity)).
    """

    def __init__(
        self,
        capacity: int,
        observation_space: spaces.Space[Any],
        action_space: spaces.Space[Any],
        *,
        alpha: float = 0.6,
        beta: float = 0.4,
        beta_steps: int = 100_000,
        epsilon: float = 1e-6,
        **kwargs: Any,
    ) -> None:
        super().__init__(capacity, observation_space, action_space, **kwargs)
        if alpha < 0 or not 0 <= beta <= 1:
            raise ValueError(f"need alpha >= 0 and 0 <= beta <= 1, got {alpha}, {beta}")
        self.alpha, self.beta_start, self.beta_steps = float(alpha), float(beta), int(beta_steps)
        self.epsilon = float(epsilon)
        self.samples_drawn = 0
        self.max_priority = 1.0
        self._leaves = 1 << max(int(np.ceil(np.log2(self.capacity))), 0)
        self._sums = np.zeros(2 * self._leaves, dtype=np.float64)
        self._mins = np.full(2 * self._leaves, np.inf, dtype=np.float64)

    @property
    def beta(self) -> float:
        """The current importance-sampling exponent (annealed towards 1)."""
        progress = min(self.samples_drawn / max(self.beta_steps, 1), 1.0)
        return self.beta_start + progress * (1.0 - self.beta_start)

    def _inserted_slots(self, slots: np.ndarray) -> None:
        # New slots are one run, or two where the ring wraps: updated level by level
        # with slices, much cheaper than scattered nodes.
        value = self.max_priority**self.alpha
        breaks = np.flatnonzero(np.diff(slots) != 1) + 1
        runs = np.split(slots, breaks) if breaks.size else [slots]
        for run in runs:
            if len(run):
                self._set_run(int(run[0]), len(run), value)

    def update_priorities(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        """Set the priorities of the sampled transitions ``indices``: their TD errors
        (each counts by its magnitude: a negative one as its absolute value), plus
        ``epsilon``; they must be finite.

        ``indices`` name slots of the ring: once the buffer has wrapped past a sampled
        transition, its index names the transition that replaced it (as in other
        prioritized replays), so update soon after sampling."""
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        priorities = np.abs(np.asarray(priorities, dtype=np.float64)).reshape(-1)
        if indices.shape != priorities.shape:
            raise ValueError(
                f"{len(indices)} indices but {len(priorities)} priorities: give one each"
            )
        if not np.isfinite(priorities).all():
            raise ValueError("priorities must be finite (a NaN TD error would poison the tree)")
        if indices.size and (indices.min() < 0 or indices.max() >= len(self)):
            raise ValueError(f"indices must be in 0..{len(self) - 1}")
        if not indices.size:
            return
        priorities = priorities + self.epsilon
        self.max_priority = max(self.max_priority, float(priorities.max(initial=0.0)))
        self._set(indices, priorities**self.alpha)

    def _set(self, slots: np.ndarray, values: np.ndarray) -> None:
        """Set leaves ``slots`` to ``values`` and recompute their ancestors. Repeated
        nodes are recomputed more than once to the same value, which costs less
        than removing the repeats at every level."""
        sums, mins = self._sums, self._mins
        nodes = slots + self._leaves
        sums[nodes] = values
        mins[nodes] = values
        nodes = nodes >> 1
        while True:
            left = nodes << 1
            sums[nodes] = sums.take(left) + sums.take(left + 1)
            mins[nodes] = np.minimum(mins.take(left), mins.take(left + 1))
            if nodes[0] <= 1:  # every node is on the same level: this was the root
                break
            nodes >>= 1

    def _set_run(self, first: int, count: int, value: float) -> None:
        """Set the ``count`` leaves from slot ``first`` on to ``value``."""
        sums, mins = self._sums, self._mins
        low, high = first + self._leaves, first + count - 1 + self._leaves
        sums[low : high + 1] = value
        mins[low : high + 1] = value
        while low > 1:
            low, high = low >> 1, high >> 1
            left, right = slice(2 * low, 2 * high + 2, 2), slice(2 * low + 1, 2 * high + 2, 2)
            np.add(sums[left], sums[right], out=sums[low : high + 1])
            np.minimum(mins[left], mins[right], out=mins[low : high + 1])

    def sample(
        self,
        batch_size: int,
        rng: np.random.Generator | int | None = None,
        device: Any = None,
    ) -> Sample:
        """``batch_size`` transitions drawn in proportion to their priorities (one from
        each of ``batch_size`` equal slices of the total), with their weights."""
        if len(self) == 0:
            raise ValueError("the replay buffer is empty: add transitions before sampling")
        generator = np.random.default_rng(rng)
        total = self._sums[1]
        if total <= 0:
            raise ValueError(
                "every priority is 0 (epsilon=0 and zero TD errors): nothing can be drawn in "
                "proportion to them; give the buffer an epsilon > 0 or update a priority"
            )
        if batch_size:
            segment = total / batch_size  # one draw from each of batch_size equal slices
            slots = self._descend((np.arange(batch_size) + generator.random(batch_size)) * segment)
        else:
            slots = np.zeros(0, dtype=np.int64)
        probabilities = self._sums[slots + self._leaves] / total
        beta = self.beta
        smallest = self._mins[1] / total
        if smallest <= 0:  # a zero priority (epsilon=0): scale by this batch's largest
            smallest = probabilities.min(initial=np.inf)
        weights = (probabilities / smallest) ** -beta  # == (N P)^-beta / (N P_min)^-beta
        self.samples_drawn += 1
        return self._gather(slots, weights.astype(np.float32), device)

    def _descend(self, targets: np.ndarray) -> np.ndarray:
        nodes = np.ones(len(targets), dtype=np.int64)
        targets = targets.copy()
        while nodes[0] < self._leaves:
            left = 2 * nodes
            left_sums = self._sums.take(left)
            go_right = targets > left_sums
            targets -= np.where(go_right, left_sums, 0.0)
            nodes = left + go_right
        slots = nodes - self._leaves
        # Rounding can land past the last stored transition: clamp to a stored one.
        return np.minimum(slots, len(self) - 1)

    def _extra_state(self) -> dict[str, np.ndarray]:
        return {
            "alpha": np.array(self.alpha),
            "beta": np.array(self.beta_start),
            "beta_steps": np.array(self.beta_steps),
            "epsilon": np.array(self.epsilon),
            "samples_drawn": np.array(self.samples_drawn),
            "max_priority": np.array(self.max_priority),
            "tree_sums": self._sums,
            "tree_mins": self._mins,
        }

    @classmethod
    def _load_options(cls, data: Any) -> dict[str, Any]:
        return {
            "alpha": float(data["alpha"]),
            "beta": float(data["beta"]),
            "beta_steps": int(data["beta_steps"]),
            "epsilon": float(data["epsilon"]),
        }

    def _restore(self, data: Any) -> None:
        self.samples_drawn = int(data["samples_drawn"])
        self.max_priority = float(data["max_priority"])
        self._sums[...] = data["tree_sums"]
        self._mins[...] = data["tree_mins"]


def to_torch(value: Any, device: Any = None) -> Any:
    """``value`` (arrays, nested in dicts, tuples or a :class:`Sample`) as torch tensors.

    Without ``device`` (or with ``"cpu"`` for arrays already in memory) the tensors share
    memory with the arrays (``torch.from_numpy``, no copy): a view of
    ``VecEnv.step``'s observations with ``copy=False`` sees every later step. With a
    device, each array is moved in one copy. torch is imported only here.
    """
    import torch

    def convert(item: Any) -> Any:
        if isinstance(item, np.ndarray):
            if item.dtype == object:  # e.g. final_obs: nothing torch can hold, left as is
                return item
            if not item.flags.writeable or any(stride < 0 for stride in item.strides):
                item = np.ascontiguousarray(item) if item.flags.writeable else item.copy()
            tensor = torch.from_numpy(item)
            return tensor if device is None else tensor.to(device, non_blocking=True)
        if isinstance(item, Sample):
            return Sample._make([*(convert(field) for field in item[:-1]), item.indices])
        if isinstance(item, dict):
            return {key: convert(sub) for key, sub in item.items()}
        if isinstance(item, tuple):
            converted = [convert(sub) for sub in item]
            return type(item)(*converted) if hasattr(item, "_fields") else tuple(converted)
        return item

    return convert(value)


def _first_leaf(batch: Any) -> Any:
    """The first array of a (possibly Dict/Tuple-nested) batch."""
    while isinstance(batch, (dict, tuple)) and not isinstance(batch, np.ndarray):
        batch = next(iter(batch.values())) if isinstance(batch, dict) else batch[0]
    return batch


def _check_rows(space: spaces.Space[Any] | None, batch: Any, count: int, path: str) -> None:
    """Raise ValueError unless every leaf of ``batch`` (laid out as ``space``; ``None``:
    one array) has ``count`` rows. Leaves the space lacks, or a batch not shaped like the
    space, are left to the space's own checker (it names what is wrong)."""
    if isinstance(space, spaces.Dict) and isinstance(batch, dict):
        for key, sub in space.spaces.items():
            if key in batch:
                _check_rows(sub, batch[key], count, f"{path}[{key!r}]")
        return
    if isinstance(space, spaces.Tuple) and isinstance(batch, (tuple, list)):
        for index, (sub, item) in enumerate(zip(space.spaces, batch)):
            _check_rows(sub, item, count, f"{path}[{index}]")
        return
    try:
        rows = len(batch)
    except TypeError:  # a scalar, a 0-d array
        raise ValueError(
            f"{path} has no rows (a {type(batch).__name__}) for {count} transitions (the rows "
            "of rewards): give every field one row per transition"
        ) from None
    if rows != count:
        raise ValueError(
            f"{path} has {rows} row{'' if rows == 1 else 's'} for {count} transitions (the "
            "rows of rewards): give every field one row per transition"
        )


def _arrays(batch: Any) -> Any:
    """A checked batch with numpy arrays for leaves (the checker keeps a caller's list)."""
    if isinstance(batch, dict):
        return {key: _arrays(value) for key, value in batch.items()}
    if isinstance(batch, tuple):
        return tuple(_arrays(value) for value in batch)
    return np.asarray(batch)


def _with_final(space: spaces.Space[Any], observations: Any, finals: Any, mask: Any) -> Any:
    """``observations`` with the rows of ``mask`` replaced by ``final_obs``'s."""
    rows = np.flatnonzero(mask)
    merged = read_rows(observations, np.arange(len(mask)))  # a copy to write into
    for row in rows:
        write_rows(merged, [row], _stack_one(space, finals[row]))
    return merged


def _stack_one(space: spaces.Space[Any], value: Any) -> Any:
    """One observation as a batch of one row."""
    if isinstance(space, spaces.Dict):
        return {key: _stack_one(sub, value[key]) for key, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(_stack_one(sub, item) for sub, item in zip(space.spaces, value))
    return np.asarray(value, dtype=space.dtype)[None]


def _saved_key(key: Any, version: int = FORMAT_VERSION) -> str:
    """A Dict key as a part of a saved name, where "." joins the parts: from format 2 on,
    "%" and "." in it are escaped (percent-encoded), so no two paths share a name."""
    text = str(key)
    return text if version < 2 else text.replace("%", "%25").replace(".", "%2E")


def _flatten(arrays: dict[str, np.ndarray], name: str, buffer: Any, path: str) -> None:
    """Add each leaf array of ``buffer`` to ``arrays`` under its saved name."""
    if isinstance(buffer, np.ndarray):
        if name in arrays:  # only Dict keys that print alike (0 and "0") get here
            raise ValueError(
                f"cannot save {path}: its name in the file, {name!r}, is taken by another leaf "
                "of the space (Dict keys that print alike, such as 0 and '0'); give the Dict "
                "keys distinct strings"
            )
        arrays[name] = buffer
    elif isinstance(buffer, dict):
        for key, sub in buffer.items():
            _flatten(arrays, f"{name}.{_saved_key(key)}", sub, f"{path}[{key!r}]")
    else:
        for index, sub in enumerate(buffer):
            _flatten(arrays, f"{name}.{index}", sub, f"{path}[{index}]")


def _unflatten(
    data: Any, name: str, buffer: Any, version: int, names: dict[str, str], path: str
) -> None:
    """Fill ``buffer``'s leaves from their saved names in a file of format ``version``."""
    if isinstance(buffer, np.ndarray):
        if name in names:  # format 1: two leaves written under one name, one overwritten
            raise ValueError(
                f"this file (replay-buffer format {version}) holds one array, {name!r}, for "
                f"both {names[name]} and {path}: one of them was lost when it was saved (Dict "
                "keys with '.'); it cannot be loaded, save such a buffer with this aiovec"
            )
        names[name] = path
        if data[name].shape != buffer.shape:
            raise ValueError(f"{name} has shape {data[name].shape}, expected {buffer.shape}")
        buffer[...] = data[name]
    elif isinstance(buffer, dict):
        for key, sub in buffer.items():
            _unflatten(
                data, f"{name}.{_saved_key(key, version)}", sub, version, names, f"{path}[{key!r}]"
            )
    else:
        for index, sub in enumerate(buffer):
            _unflatten(data, f"{name}.{index}", sub, version, names, f"{path}[{index}]")
