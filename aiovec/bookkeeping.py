"""Per-env bookkeeping for first-ready batches, where env ids arrive in changing order.

- :class:`EpisodeStatistics` keeps each env's running return, length and duration and
  reports episodes as they finish.
- :class:`TransitionAssembler` turns batches into per-env transitions
  ``(observation, action, reward, next_observation, terminated, truncated)`` and hands
  them out in fixed-size, time-ordered chunks: what an on-policy or replay learner needs.

Both understand the autoreset modes: with ``NEXT_STEP`` the result that follows the end
of an episode is the reset (reward 0), which belongs to no episode and makes no
transition; with ``SAME_STEP`` the final observation comes from ``infos["final_obs"]``;
with ``DISABLED`` call ``reset`` for the envs you reset. Built for one mode (``for_env``
takes the vector env's), they refuse batches of another with a ``ValueError``. A rebuilt
env's answer (``on_failure="restart"``) ends the old episode and makes no transition.
"""

from __future__ import annotations

import copy
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
from gymnasium.vector import AutoresetMode

from aiovec._checks import check_count, env_id_rows
from aiovec._episode_marks import autoreset_mode_of, check_autoreset_mode, info_mask
from aiovec.vector_env import Batch


class Episode(NamedTuple):
    """One finished episode of env ``env_id``."""

    env_id: int
    episode_return: float
    length: int
    duration: float  # seconds from its first to its last step result
    truncated: bool


class EpisodeStatistics:
    """Episode returns, lengths and durations per env, from first-ready batches.

    Example:
        >>> stats = EpisodeStatistics(num_envs=8)
        >>> for episode in stats.update(batch):        # doctest: +SKIP
        ...     print(episode.env_id, episode.episode_return)
    """

    def __init__(
        self, num_envs: int, autoreset_mode: AutoresetMode = AutoresetMode.NEXT_STEP
    ) -> None:
        self.num_envs = num_envs
        self.autoreset_mode = AutoresetMode(autoreset_mode)
        self.returns = np.zeros(num_envs)
        self.lengths = np.zeros(num_envs, dtype=np.int64)
        self._started = np.full(num_envs, np.nan)
        self._after_end = np.zeros(num_envs, dtype=bool)
        #: The most recent finished episodes (at most 1000).
        self.finished: deque[Episode] = deque(maxlen=1000)

    @classmethod
    def for_env(cls, env: Any) -> EpisodeStatistics:
        """Statistics for ``env`` (an ``aiovec.VecEnv`` or any Gymnasium vector env): its
        number of envs and autoreset mode."""
        return cls(env.num_envs, autoreset_mode_of(env) or AutoresetMode.NEXT_STEP)

    def reset(self, env_ids: Sequence[int] | None = None) -> None:
        """Start new episodes for ``env_ids`` (default: all), e.g. after ``reset()``."""
        rows = slice(None) if env_ids is None else np.asarray(env_ids)
        self.returns[rows] = 0.0
        self.lengths[rows] = 0
        self._started[rows] = np.nan
        self._after_end[rows] = False

    def update(self, batch: Batch) -> list[Episode]:
        """Account for one batch; return the episodes it finished.

        Raises:
            ValueError: the batch comes from a vector env autoresetting in another mode
                (nothing is counted).
        """
        now = time.monotonic()
        finished = []
        ends = np.asarray(batch.terminations | batch.truncations, dtype=np.bool_)
        restarted = info_mask(batch.infos, "restarted", len(ends))
        check_autoreset_mode(
            self.autoreset_mode,
            batch.infos,
            ends,
            restarted,
            self._after_end[batch.env_ids],
            type(self).__name__,
        )
        for row, env_id in enumerate(batch.env_ids.tolist()):
            if restarted[row]:
                # A rebuilt env's answer (on_failure="restart"), maybe in place of the
                # autoreset: the old episode ended with the failure (truncated, if it had
                # begun) and this result is no step of it.
                if not np.isnan(self._started[env_id]):
                    episode = Episode(
                        env_id,
                        float(self.returns[env_id]),
                        int(self.lengths[env_id]),
                        now - self._started[env_id],
                        True,
                    )
                    finished.append(episode)
                    self.finished.append(episode)
                self.reset([env_id])
                # NEXT_STEP: the answer is truncated=True, so a reset result follows.
                self._after_end[env_id] = self.autoreset_mode is AutoresetMode.NEXT_STEP
                continue
            if self._after_end[env_id]:
                self._after_end[env_id] = False
                if self.autoreset_mode is AutoresetMode.NEXT_STEP:
                    continue  # the autoreset result: no step of any episode
            if np.isnan(self._started[env_id]):
                self._started[env_id] = now
            self.returns[env_id] += batch.rewards[row]
            self.lengths[env_id] += 1
            if ends[row]:
                episode = Episode(
                    env_id,
                    float(self.returns[env_id]),
                    int(self.lengths[env_id]),
                    now - self._started[env_id],
                    bool(batch.truncations[row] and not batch.terminations[row]),
                )
                finished.append(episode)
                self.finished.append(episode)
                self.reset([env_id])
                self._after_end[env_id] = True
        return finished


class Chunk(NamedTuple):
    """``length`` consecutive transitions of each env in ``env_ids``: every field has
    shape ``(len(env_ids), length, ...)`` (observations keep their Dict/Tuple nesting).

    ``episode_starts`` is True where a transition's observation is the first of an
    episode: after :meth:`TransitionAssembler.reset`, an episode's end, or a restart
    (``on_failure="restart"``). A transition never continues from the one before it
    there, though neither of that one's end flags may be set (a reset mid-episode, a
    failure): cut returns, GAE and n-step sums at these marks, as
    :meth:`aiovec.ReplayBuffer.add_chunk` does (SB3's ``episode_starts``).
    """

    env_ids: np.ndarray
    observations: Any
    actions: Any
    rewards: np.ndarray
    next_observations: Any
    terminations: np.ndarray
    truncations: np.ndarray
    episode_starts: np.ndarray


class TransitionAssembler:
    """Builds per-env transitions from ``send``/``recv`` traffic, in each env's own order.

    Call :meth:`reset` with the observations of a reset, :meth:`sent` with what you
    pass to ``send``, and :meth:`received` with every batch ``recv`` returns; then
    :meth:`take` hands out chunks of ``length`` transitions per env, oldest first.

    Each result must follow a :meth:`sent` of its env's action (a ``RuntimeError``
    otherwise: it would pair with an older action), and come from a vector env
    autoresetting in ``autoreset_mode`` (a ``ValueError`` otherwise; :meth:`for_env`
    takes the env's). Both are checked before anything of the batch is recorded.

    It keeps copies of what it is given: refilling one action array every step, or a
    ``copy=False`` vector env overwriting its result buffers, changes no transition.
    Observations and actions are batches of arrays (Box, Discrete, MultiBinary,
    MultiDiscrete spaces, and Dicts/Tuples of them); Text, Graph and Sequence spaces,
    which batch as one item per env, are refused with a ``TypeError``.
    """

    def __init__(
        self, num_envs: int, autoreset_mode: AutoresetMode = AutoresetMode.NEXT_STEP
    ) -> None:
        self.num_envs = num_envs
        self.autoreset_mode = AutoresetMode(autoreset_mode)
        self._observation: list[Any] = [None] * num_envs
        self._action: list[Any] = [None] * num_envs
        self._after_end = [False] * num_envs
        self._has_action = [False] * num_envs  # sent() since its last result
        # The env's next transition starts an episode (see Chunk.episode_starts).
        self._starts_episode = [True] * num_envs
        self._transitions: list[deque[tuple[Any, ...]]] = [deque() for _ in range(num_envs)]

    @classmethod
    def for_env(cls, env: Any) -> TransitionAssembler:
        """An assembler for ``env`` (an ``aiovec.VecEnv`` or any Gymnasium vector env):
        its number of envs and autoreset mode."""
        return cls(env.num_envs, autoreset_mode_of(env) or AutoresetMode.NEXT_STEP)

    def reset(self, observations: Any, env_ids: Sequence[int] | None = None) -> None:
        """Record reset observations (a batch, in the order of ``env_ids``, default all).

        ``env_ids`` are checked as :meth:`aiovec.ReplayBuffer.reset` checks them
        (distinct ids in range, not a boolean mask), and the batch split by env, before
        anything is recorded."""
        ids = self._ids(env_ids)
        rows = [_row(observations, row, len(ids)) for row in range(len(ids))]
        for env_id, observation in zip(ids, rows):
            self._observation[env_id] = observation
            self._after_end[env_id] = False
            self._starts_episode[env_id] = True

    def sent(self, actions: Any, env_ids: Sequence[int] | None = None) -> None:
        """Record the actions sent to ``env_ids`` (default all), in that order; checked
        as :meth:`reset` checks its arguments, before anything is recorded."""
        ids = self._ids(env_ids)
        rows = [_row(actions, row, len(ids)) for row in range(len(ids))]
        for env_id, action in zip(ids, rows):
            self._action[env_id] = action
            self._has_action[env_id] = True

    def _ids(self, env_ids: Sequence[int] | np.ndarray | None) -> list[int]:
        if env_ids is None:
            return list(range(self.num_envs))
        # The replay buffer's checks and messages: a -1 would record env num_envs - 1.
        ids: list[int] = env_id_rows(env_ids, self.num_envs).tolist()
        return ids

    def received(self, batch: Batch) -> None:
        """Turn a batch of results into transitions.

        Raises:
            ValueError: the batch comes from a vector env autoresetting in another mode.
            RuntimeError: an env's result completes a step whose action :meth:`sent`
                was not given.
        """
        final_observations: Any = batch.infos.get("final_obs")  # set where _final_obs is
        final_mask = batch.infos.get("_final_obs")
        env_ids = batch.env_ids.tolist()
        ends = np.asarray(batch.terminations | batch.truncations, dtype=np.bool_)
        restarted = info_mask(batch.infos, "restarted", len(env_ids))
        after_end = np.array([self._after_end[env_id] for env_id in env_ids], dtype=np.bool_)
        check_autoreset_mode(
            self.autoreset_mode, batch.infos, ends, restarted, after_end, type(self).__name__
        )
        next_step = self.autoreset_mode is AutoresetMode.NEXT_STEP
        unsent = [
            env_id
            for row, env_id in enumerate(env_ids)
            if not restarted[row]
            and not (self._after_end[env_id] and next_step)
            and not self._has_action[env_id]
        ]
        if unsent:
            raise RuntimeError(
                f"envs {unsent} returned results for which no action was recorded: call "
                "assembler.sent(actions, env_ids) with what you pass to send()/step()"
            )
        for row, env_id in enumerate(env_ids):
            observation = _row(batch.observations, row, len(env_ids))
            self._has_action[env_id] = False  # each action completes one result
            if restarted[row]:
                # A rebuilt env (on_failure="restart") answers with its new episode's first
                # observation (truncated=True), maybe in place of the autoreset: no
                # transition from the old env into it. NEXT_STEP: a reset result follows.
                self._observation[env_id] = observation
                self._after_end[env_id] = True
                self._starts_episode[env_id] = True
                continue
            if self._after_end[env_id] and next_step:
                self._after_end[env_id] = False  # the autoreset: a new episode starts here
                self._observation[env_id] = observation
                continue
            terminated, truncated = bool(batch.terminations[row]), bool(batch.truncations[row])
            next_observation = observation
            if final_mask is not None and final_mask[row]:  # SAME_STEP: obs is the reset's
                next_observation = _own(final_observations[row])
            self._transitions[env_id].append(
                (
                    self._observation[env_id],
                    self._action[env_id],
                    float(batch.rewards[row]),
                    next_observation,
                    terminated,
                    truncated,
                    self._starts_episode[env_id],
                )
            )
            self._observation[env_id] = observation
            self._after_end[env_id] = terminated or truncated
            self._starts_episode[env_id] = terminated or truncated

    def available(self) -> np.ndarray:
        """How many transitions each env has waiting."""
        return np.array([len(queue) for queue in self._transitions])

    def take(self, length: int, env_ids: Sequence[int] | None = None) -> Chunk | None:
        """The oldest ``length`` transitions (at least 1) of each env in ``env_ids``
        (default: every env that has that many), removed from the assembler; ``None`` if
        no env has enough. Nothing is removed unless every argument checks out (``env_ids``
        as in :meth:`sent`) and each env in ``env_ids`` has ``length`` transitions."""
        # A chunk of 0 transitions would have no rows to take its fields' shapes from.
        check_count("length", length, 1)
        if env_ids is None:
            env_ids = [i for i in range(self.num_envs) if len(self._transitions[i]) >= length]
        else:
            env_ids = self._ids(env_ids)
            short = [i for i in env_ids if len(self._transitions[i]) < length]
            if short:
                raise ValueError(f"envs {short} have fewer than {length} transitions")
        if not env_ids:
            return None
        per_env = [[self._transitions[i].popleft() for _ in range(length)] for i in env_ids]
        fields = list(zip(*[list(zip(*steps)) for steps in per_env]))
        observations, actions, rewards, next_observations, terms, truncs, starts = (
            _stack([_stack(list(items)) for items in field]) for field in fields
        )
        return Chunk(
            np.asarray(env_ids),
            observations,
            actions,
            np.asarray(rewards),
            next_observations,
            np.asarray(terms),
            np.asarray(truncs),
            np.asarray(starts, dtype=np.bool_),
        )


def _row(batch: Any, row: int, rows: int) -> Any:
    """Row ``row`` of a batch of ``rows``, as a copy of its own: a transition must keep
    what was sent or received at its step, whatever the caller's action array (refilled
    each step) or a ``copy=False`` vector env's result buffers hold later.

    Raises:
        TypeError: a part of the batch is no batch of ``rows`` (a Text, Graph or
            Sequence space's, which batch as one item per env, not as arrays).
    """
    if isinstance(batch, dict):
        return {key: _row(value, row, rows) for key, value in batch.items()}
    if isinstance(batch, tuple):
        return tuple(_row(value, row, rows) for value in batch)
    if isinstance(batch, (str, bytes)) or _length(batch) != rows:
        length = _length(batch)
        shown = repr(batch) if length is None else f"{type(batch).__name__} of length {length}"
        raise TypeError(
            f"TransitionAssembler takes batches of {rows} rows: arrays (lists, tensors) for Box, "
            "Discrete, MultiBinary and MultiDiscrete spaces, and Dicts/Tuples of them; got "
            f"a {shown} (Text, Graph and Sequence spaces are not supported)"
        )
    return _own(batch[row])


def _length(batch: Any) -> int | None:
    """How many rows ``batch`` has (an array, a list, a tensor); ``None`` if it is no
    sequence (a scalar, a 0-d array)."""
    try:
        return len(batch)
    except TypeError:
        return None


def _own(value: Any) -> Any:
    """A copy of ``value`` that nothing else changes: its arrays (maybe views of a
    buffer) and lists (a caller's, refilled in place) are copied, as is any other
    mutable object in it that can be; one that cannot (it holds a lock, a tensor in an
    autograd graph) is kept as given. Lists and tuples come back as plain ones
    (a named tuple as itself), dicts as plain dicts: they are stacked later."""
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, dict):
        return {key: _own(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_own(item) for item in value]
    if isinstance(value, tuple):
        items = (_own(item) for item in value)
        return value._make(items) if hasattr(value, "_make") else tuple(items)
    if isinstance(value, (int, float, bool, complex, str, bytes, np.generic)) or value is None:
        return value  # immutable: nothing to copy
    try:
        return copy.deepcopy(value)
    except Exception:
        return value


def _stack(items: list[Any]) -> Any:
    first = items[0]
    if isinstance(first, dict):
        return {key: _stack([item[key] for item in items]) for key in first}
    if isinstance(first, tuple):
        return tuple(_stack([item[i] for item in items]) for i in range(len(first)))
    return np.stack([np.asarray(item) for item in items])
