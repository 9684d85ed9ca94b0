"""First-ready bookkeeping gives the same per-env transitions and episodes as lockstep."""

from __future__ import annotations

import random

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import aiovec
from aiovec.bookkeeping import EpisodeStatistics, TransitionAssembler

NUM_ENVS = 4
MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP]


def action_for(env_id: int, step: int) -> int:
    """A fixed pseudo-random action sequence per env, whatever the stepping order."""
    return (env_id * 7919 + step * 104729) % 5 % 2


async def lockstep(mode, steps: int):
    assembler, stats = TransitionAssembler(NUM_ENVS, mode), EpisodeStatistics(NUM_ENVS, mode)
    async with aiovec.make("CartPole-v1", NUM_ENVS, backend="inline", autoreset_mode=mode) as venv:
        observations, _ = await venv.areset(seed=1)
        assembler.reset(observations)
        episodes = []
        for step in range(steps):
            actions = np.array([action_for(i, step) for i in range(NUM_ENVS)])
            assembler.sent(actions)
            result = await venv.astep(actions)
            batch = aiovec.Batch(*result, env_ids=np.arange(NUM_ENVS))
            assembler.received(batch)
            episodes += stats.update(batch)
    return assembler, episodes


async def first_ready(mode, steps: int):
    assembler, stats = TransitionAssembler(NUM_ENVS, mode), EpisodeStatistics(NUM_ENVS, mode)
    rng = random.Random(5)
    async with aiovec.make(
        "CartPole-v1", NUM_ENVS, backend="process", num_workers=2, autoreset_mode=mode
    ) as venv:
        observations, _ = await venv.areset(seed=1)
        assembler.reset(observations)
        sent, idle, episodes = [0] * NUM_ENVS, set(range(NUM_ENVS)), []
        while min(sent) < steps or len(idle) < NUM_ENVS:
            ready = [i for i in sorted(idle) if sent[i] < steps]
            if ready and rng.random() < 0.5:
                chosen = rng.sample(ready, rng.randint(1, len(ready)))
                actions = np.array([action_for(i, sent[i]) for i in chosen])
                assembler.sent(actions, chosen)
                venv.send(actions, chosen)
                for i in chosen:
                    sent[i] += 1
                idle -= set(chosen)
            elif len(idle) < NUM_ENVS:
                batch = await venv.recv(max_envs=rng.randint(1, NUM_ENVS))
                assembler.received(batch)
                episodes += stats.update(batch)
                idle |= set(batch.env_ids.tolist())
    return assembler, episodes


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
async def test_first_ready_transitions_match_lockstep(mode):
    expected, expected_episodes = await lockstep(mode, 150)
    actual, actual_episodes = await first_ready(mode, 150)
    assert actual.available().tolist() == expected.available().tolist()
    length = int(expected.available().min())
    assert length > 100
    a, e = actual.take(length), expected.take(length)
    for field in a._fields:
        np.testing.assert_array_equal(getattr(a, field), getattr(e, field), err_msg=field)
    assert a.observations.shape == (NUM_ENVS, length, 4)

    # episodes: same per env (order across envs differs in first-ready mode)
    def by_env(episodes):
        return sorted((ep.env_id, ep.episode_return, ep.length) for ep in episodes)

    assert by_env(actual_episodes) == by_env(expected_episodes)
    assert len(expected_episodes) > 4
    assert all(ep.episode_return == ep.length for ep in expected_episodes)  # CartPole: +1/step


def test_chunks_are_time_ordered_and_removed():
    assembler = TransitionAssembler(2)
    assembler.reset(np.array([[0.0], [10.0]]))
    for step in range(1, 6):
        assembler.sent(np.array([step, step]))
        batch = aiovec.Batch(
            np.array([[float(step)], [10.0 + step]]),
            np.ones(2),
            np.zeros(2, bool),
            np.zeros(2, bool),
            {},
            np.array([0, 1]),
        )
        assembler.received(batch)
    chunk = assembler.take(3)
    assert chunk.observations[:, :, 0].tolist() == [[0, 1, 2], [10, 11, 12]]
    assert chunk.next_observations[:, :, 0].tolist() == [[1, 2, 3], [11, 12, 13]]
    assert chunk.actions.tolist() == [[1, 2, 3], [1, 2, 3]]
    assert assembler.available().tolist() == [2, 2]
    assert assembler.take(3) is None
    with pytest.raises(ValueError, match="fewer than 3"):
        assembler.take(3, env_ids=[0])


def test_episode_statistics_match_record_episode_statistics():
    envs = gym.wrappers.vector.RecordEpisodeStatistics(
        aiovec.make("CartPole-v1", 3, backend="inline")
    )
    stats = EpisodeStatistics(3)
    envs.reset(seed=0)
    expected, actual = [], []
    for step in range(300):
        result = envs.step(np.array([step % 2, 0, 1]))
        infos = result[4]
        if "episode" in infos:
            for i in np.flatnonzero(infos["_episode"]):
                expected.append(
                    (int(i), float(infos["episode"]["r"][i]), int(infos["episode"]["l"][i]))
                )
        actual += [
            (ep.env_id, ep.episode_return, ep.length)
            for ep in stats.update(aiovec.Batch(*result[:4], infos, np.arange(3)))
        ]
    envs.close()
    assert actual == expected and len(actual) > 5


@pytest.mark.parametrize("mode", ["NextStep", "SameStep"])
def test_assembler_makes_no_transition_across_a_restart(mode):
    import aiovec
    from tests.faulty import FaultyEnv

    env_fns = [lambda i=i: FaultyEnv(i, at_step=3 if i == 0 else 10**9) for i in range(2)]
    with aiovec.VecEnv(env_fns, backend="inline", on_failure="restart", autoreset_mode=mode) as v:
        assembler = aiovec.TransitionAssembler(2, mode)
        observations, _ = v.reset(seed=0)
        assembler.reset(observations)
        for _ in range(6 if mode == "NextStep" else 5):
            actions = np.zeros(2, dtype=np.int64)
            assembler.sent(actions)
            observations, rewards, terminated, truncated, infos = v.step(actions)
            assembler.received(
                aiovec.Batch(observations, rewards, terminated, truncated, infos, np.arange(2))
            )
    chunk = assembler.take(4, env_ids=[0])
    counts = chunk.observations[0, :, 1], chunk.next_observations[0, :, 1]
    np.testing.assert_array_equal(counts[1], counts[0] + 1)  # never old env -> new env


@pytest.mark.parametrize("mode", ["NextStep", "SameStep"])
def test_episode_statistics_end_an_episode_at_a_restart_without_counting_it(mode):
    import aiovec
    from tests.faulty import FaultyEnv

    env_fns = [lambda i=i: FaultyEnv(i, at_step=3 if i == 0 else 10**9) for i in range(2)]
    with aiovec.VecEnv(env_fns, backend="inline", on_failure="restart", autoreset_mode=mode) as v:
        statistics = EpisodeStatistics(2, mode)
        v.reset(seed=0)
        episodes = []
        for _ in range(6 if mode == "NextStep" else 5):
            observations, rewards, terminated, truncated, infos = v.step(np.zeros(2, np.int64))
            batch = aiovec.Batch(observations, rewards, terminated, truncated, infos, np.arange(2))
            episodes += statistics.update(batch)
    # Env 0's first episode: its two real steps (rewards 1 and 2), cut by the failure.
    assert [(e.env_id, e.episode_return, e.length, e.truncated) for e in episodes] == [
        (0, 3.0, 2, True)
    ]
    # The rebuilt env's episode counts from its own first step.
    assert statistics.lengths[0] == 2 and statistics.returns[0] == 3.0


@pytest.mark.parametrize("backend", ["inline", "process"])
async def test_assembler_keeps_what_was_sent_and_received_not_views_of_reused_buffers(backend):
    """A loop refilling one action array, on a vector env with ``copy=False`` (whose
    results are views of buffers the next step overwrites): every transition still holds
    the actions sent and the observations received at its own step."""
    num_envs = 2
    env = aiovec.make("Pendulum-v1", num_envs, backend=backend, copy=False)
    reference = aiovec.make("Pendulum-v1", num_envs, backend="inline")
    assembler = TransitionAssembler(num_envs)
    observations, _ = await env.areset(seed=0)
    expected_observations = [reference.reset(seed=0)[0].copy()]
    assembler.reset(observations)
    actions = np.zeros((num_envs, 1), np.float32)  # one buffer, refilled every step
    for step in range(3):
        actions[:] = step / 4
        assembler.sent(actions)
        env.send(actions)
        assembler.received(await env.recv(min_envs=num_envs))
        expected_observations.append(reference.step(actions)[0].copy())
    actions[:] = 1.5
    await env.astep(np.zeros((num_envs, 1), np.float32))  # overwrites the result buffers
    chunk = assembler.take(3)
    assert chunk.actions[:, :, 0].tolist() == [[0.0, 0.25, 0.5]] * num_envs
    for step in range(3):
        np.testing.assert_allclose(chunk.observations[:, step], expected_observations[step])
        np.testing.assert_allclose(
            chunk.next_observations[:, step], expected_observations[step + 1]
        )
    env.close()
    reference.close()


async def test_assembler_keeps_a_copy_of_actions_given_as_nested_lists():
    """Actions given as a list of per-env lists (SB3's way), refilled in place by the
    caller after each send: every transition holds the action of its own step."""
    num_envs = 2
    env = aiovec.make("Pendulum-v1", num_envs, backend="inline")
    assembler = TransitionAssembler(num_envs)
    observations, _ = await env.areset(seed=0)
    assembler.reset(observations)
    actions = [[0.0] for _ in range(num_envs)]  # refilled in place every step
    for step in range(3):
        for row in actions:
            row[0] = step / 4
        assembler.sent(actions)
        env.send(np.asarray(actions, np.float32))
        assembler.received(await env.recv(min_envs=num_envs))
    for row in actions:
        row[0] = 1.5
    chunk = assembler.take(3)
    assert chunk.actions[:, :, 0].tolist() == [[0.0, 0.25, 0.5]] * num_envs
    env.close()


def test_assembler_takes_any_action_it_took_before_copies_were_kept():
    """Named tuples, list subclasses and objects that cannot be copied (they hold a
    lock) are accepted as actions: copied where they can be, kept as given otherwise."""
    import collections
    import threading

    Pair = collections.namedtuple("Pair", "x y")

    class TwoItems(list):
        def __init__(self, first, second):
            super().__init__([first, second])

    class Locked:
        def __init__(self, value):
            self.value, self.lock = value, threading.Lock()

    locked = [Locked(1), Locked(2)]
    for actions in ([Pair(1, 2), Pair(3, 4)], [TwoItems(1, 2), TwoItems(3, 4)], locked):
        chunk = _one_transition_each(actions)
        assert len(chunk.actions) == 2
    assert chunk.actions[:, 0].tolist() == locked  # kept as given: not copyable


def _one_transition_each(actions):
    """The chunk of one step of two envs that were sent ``actions``."""
    assembler = TransitionAssembler(2)
    assembler.reset(np.zeros((2, 3)))
    assembler.sent(actions)
    rewards, flags = np.ones(2), np.zeros(2, bool)
    assembler.received(aiovec.Batch(np.ones((2, 3)), rewards, flags, flags, {}, np.arange(2)))
    return assembler.take(1)


def test_assembler_refuses_batches_it_cannot_split_by_env_with_a_clear_error():
    """A Text space's batch (a tuple of strings, one per env) is not a batch of arrays:
    a TypeError names what is supported, instead of splitting the strings by letter."""
    assembler = TransitionAssembler(2)
    with pytest.raises(TypeError, match="Text, Graph and Sequence spaces are not supported"):
        assembler.reset(("ab", "cd"))
    assembler.reset(np.zeros((2, 3)))
    with pytest.raises(TypeError, match="batches of 2 rows"):
        assembler.sent(np.zeros(3))  # one row short of a batch of two


def test_assembler_takes_tensors_ranges_and_memoryviews_as_batches():
    """Anything with one row per env is a batch: a policy's torch tensor, a range, a
    memoryview, as before the assembler checked its batches."""
    torch = pytest.importorskip("torch")
    for actions in (torch.tensor([1, 0]), range(2), memoryview(np.array([1, 0]))):
        chunk = _one_transition_each(actions)
        assert np.asarray(chunk.actions).reshape(2).tolist() in ([1, 0], [0, 1])
    with pytest.raises(TypeError, match="batches of 1 rows"):
        TransitionAssembler(1).sent(np.array(1))  # a 0-d array: no row to take


# --- episode boundaries that no end flag marks: restarts and resets mid-episode ------------


class Chain(gym.Env):
    """Observation ``[env, episode, t]``, reward ``1 + t + 10 * episode``; episodes of
    ``3 + env`` steps, terminated for even episodes and truncated for odd ones.
    ``fail_reset_after`` / ``fail_step_at``: raise once (per ``failed``, shared by every
    rebuild) in the reset that follows that episode, or at step ``(episode, t)``."""

    observation_space = gym.spaces.Box(-1e6, 1e6, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, env_id, failed, fail_reset_after=None, fail_step_at=None, first=0):
        self.env_id, self.failed = env_id, failed
        self.fail_reset_after, self.fail_step_at = fail_reset_after, fail_step_at
        self.episode, self.t = first - 1, 0

    def _observation(self):
        return np.array([self.env_id, self.episode, self.t], np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if self.episode == self.fail_reset_after and not self.failed:
            self.failed.append(True)
            raise RuntimeError("the autoreset failed")
        self.episode, self.t = self.episode + 1, 0
        return self._observation(), {}

    def step(self, action):
        if (self.episode, self.t) == self.fail_step_at and not self.failed:
            self.failed.append(True)
            raise RuntimeError("the step failed")
        reward = 1.0 + self.t + 10 * self.episode
        self.t += 1
        done = self.t >= 3 + self.env_id
        return (
            self._observation(),
            reward,
            done and self.episode % 2 == 0,
            done and self.episode % 2 == 1,
            {},
        )


def _chain_fns(num_envs, **failure):
    """Env 0 fails as ``failure`` says (once); its rebuilds number episodes from 10."""
    failed: list = []
    built = [0] * num_envs

    def make(env_id):
        built[env_id] += 1
        first = 0 if built[env_id] == 1 else 10
        kwargs = failure if env_id == 0 else {}
        return Chain(env_id, failed, first=first, **kwargs)

    return [lambda i=i: make(i) for i in range(num_envs)]


def _feed(mode, steps, reset_at=None, **failure):
    """Step two chain envs in lockstep, feeding an assembler, episode statistics and a
    replay buffer through received(); reset every env mid-episode at step ``reset_at``."""
    fns = _chain_fns(2, **failure)
    with aiovec.VecEnv(fns, backend="inline", on_failure="restart", autoreset_mode=mode) as venv:
        assembler = TransitionAssembler.for_env(venv)
        statistics = EpisodeStatistics.for_env(venv)
        buffer = aiovec.ReplayBuffer.for_env(venv, 1000, n_step=3, gamma=0.5)
        observations, _ = venv.reset(seed=0)
        assembler.reset(observations)
        buffer.reset(observations)
        episodes = []
        for step in range(steps):
            if step == reset_at:
                observations, _ = venv.reset()
                assembler.reset(observations)
                buffer.reset(observations)
                statistics.reset()
            actions = np.zeros(2, np.int64)
            assembler.sent(actions)
            buffer.sent(actions)
            result = venv.step(actions)
            observations = result[0]
            batch = aiovec.Batch(*result, np.arange(2))
            assembler.received(batch)
            buffer.received(result)
            episodes += statistics.update(batch)
    return assembler, statistics, buffer, episodes


def _n_step_table(buffer):
    """Every stored transition's n-step view: (obs, n-step reward, next obs, discount)."""
    size = len(buffer)
    sample = buffer._gather(np.arange(size), np.ones(size, np.float32), None)
    return sorted(
        (
            tuple(sample.observations[i].tolist()),
            float(sample.rewards[i]),
            tuple(sample.next_observations[i].tolist()),
            float(sample.discounts[i]),
        )
        for i in range(size)
    )


FAILURES = {
    "a step fails mid-episode": {"fail_step_at": (1, 1)},
    "the autoreset fails": {"fail_reset_after": 0},
    "reset mid-episode": {"reset_at": 4},
}


@pytest.mark.parametrize("case", list(FAILURES))
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_add_chunk_links_no_transitions_across_restarts_and_resets(mode, case):
    """A chunk marks where each env's episodes start, so add_chunk never links the last
    transition before a restart or a mid-episode reset to the first after it: its
    n-step returns are those of the same traffic fed through received()."""
    options = dict(FAILURES[case])
    reset_at = options.pop("reset_at", None)
    assembler, _, direct, _ = _feed(mode, 14, reset_at=reset_at, **options)
    chunked = aiovec.ReplayBuffer(
        1000,
        direct.observation_space,
        direct.action_space,
        num_envs=2,
        autoreset_mode=mode,
        n_step=3,
        gamma=0.5,
    )
    taken = int(assembler.available().min())
    assert taken >= 8
    chunk = assembler.take(taken)
    chunked.add_chunk(chunk)

    starts = chunk.episode_starts
    assert starts.shape == chunk.rewards.shape and starts.dtype == np.bool_
    # an episode's first observation has t == 0: after reset(), an end, or a restart
    np.testing.assert_array_equal(starts, chunk.observations[:, :, 2] == 0)

    # Transitions whose 3 steps all lie in the chunk (or end an episode before) must
    # have the n-step view the received() path gives them.
    ends = chunk.terminations | chunk.truncations
    complete = set()
    for env in range(2):
        for k in range(taken):
            window = range(k, min(k + 3, taken))
            if k + 2 < taken or any(ends[env, j] for j in window):
                complete.add(tuple(chunk.observations[env, k].tolist()))
    expected = [row for row in _n_step_table(direct) if row[0] in complete]
    actual = [row for row in _n_step_table(chunked) if row[0] in complete]
    assert len(actual) == len(complete) >= 12
    assert actual == expected


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_a_restart_in_place_of_the_autoreset_is_no_step(mode):
    """Env 0's reset after its first episode fails and the env is rebuilt: its answer
    (the new env's first observation) is no step, so no transition comes from it and the
    next episode's length counts only its own steps."""
    assembler, _, _, episodes = _feed(mode, 12, fail_reset_after=0)
    chunk = assembler.take(int(assembler.available()[0]), [0])
    rewards = chunk.rewards[0].tolist()
    env_0 = [(e.episode_return, e.length) for e in episodes if e.env_id == 0]
    if mode is AutoresetMode.NEXT_STEP:
        # episode 0 whole; the restart answers with the rebuilt env's episode 10, which
        # ends it (truncated), and the reset that follows starts episode 11
        assert rewards[:6] == [1.0, 2.0, 3.0, 111.0, 112.0, 113.0]
        assert env_0[:2] == [(6.0, 3), (336.0, 3)]
    else:  # the reset inside episode 0's last step fails: that step is lost
        assert rewards[:5] == [1.0, 2.0, 101.0, 102.0, 103.0]
        assert env_0[:2] == [(3.0, 2), (306.0, 3)]
    # every transition steps within one episode
    np.testing.assert_array_equal(chunk.next_observations[0, :, 1], chunk.observations[0, :, 1])
    np.testing.assert_array_equal(chunk.next_observations[0, :, 2], chunk.observations[0, :, 2] + 1)


@pytest.mark.parametrize("reader", ["assembler", "statistics", "replay"])
@pytest.mark.parametrize(
    ("built_for", "env_mode"),
    [
        (AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP),
        (AutoresetMode.SAME_STEP, AutoresetMode.NEXT_STEP),
        (AutoresetMode.DISABLED, AutoresetMode.SAME_STEP),
        (AutoresetMode.DISABLED, AutoresetMode.NEXT_STEP),
    ],
    ids=lambda m: m.value,
)
def test_batches_of_another_autoreset_mode_are_refused(reader, built_for, env_mode):
    """Fed the batches of a vector env that autoresets in another mode than it was built
    for, each reader raises a ValueError naming both modes and for_env, instead of
    silently dropping or inventing steps; nothing is recorded from that batch."""
    with aiovec.VecEnv(_chain_fns(2), backend="inline", autoreset_mode=env_mode) as venv:
        observations, _ = venv.reset(seed=0)
        readers = {
            "assembler": TransitionAssembler(2, built_for),
            "statistics": EpisodeStatistics(2, built_for),
            "replay": aiovec.ReplayBuffer(
                100,
                venv.single_observation_space,
                venv.single_action_space,
                num_envs=2,
                autoreset_mode=built_for,
            ),
        }
        target = readers[reader]
        if reader != "statistics":
            target.reset(observations)
        with pytest.raises(ValueError, match=f"(?s){built_for.name}.*{env_mode.name}.*for_env"):
            for _ in range(4):  # env 0's episode ends at the third step
                actions = np.zeros(2, np.int64)
                if reader != "statistics":
                    target.sent(actions)
                batch = aiovec.Batch(*venv.step(actions), np.arange(2))
                if reader == "statistics":
                    before = target.lengths.copy()
                    target.update(batch)
                elif reader == "assembler":
                    before = target.available()
                    target.received(batch)
                else:
                    before = len(target)
                    target.received(batch)
    after = {
        "statistics": lambda: target.lengths,
        "assembler": lambda: target.available(),
        "replay": lambda: len(target),
    }
    np.testing.assert_array_equal(after[reader](), before)


def test_assembler_refuses_a_result_whose_action_was_not_recorded():
    """A result of an env whose action was not given to sent() would pair with the
    previous step's action: a RuntimeError says to call sent(), and nothing is added."""
    assembler = TransitionAssembler(2)
    assembler.reset(np.zeros((2, 3)))
    assembler.sent(np.array([1, 1]))
    rewards, flags = np.ones(2), np.zeros(2, bool)
    assembler.received(aiovec.Batch(np.ones((2, 3)), rewards, flags, flags, {}, np.arange(2)))
    assembler.sent(np.array([0]), [0])
    with pytest.raises(RuntimeError, match=r"envs \[1\].*sent\(actions, env_ids\)"):
        assembler.received(aiovec.Batch(np.ones((2, 3)), rewards, flags, flags, {}, np.arange(2)))
    assert assembler.available().tolist() == [1, 1]


def test_readers_built_for_an_env_take_its_autoreset_mode():
    for mode in MODES:
        envs = gym.wrappers.vector.RecordEpisodeStatistics(
            aiovec.make("CartPole-v1", 2, backend="inline", autoreset_mode=mode)
        )
        assert TransitionAssembler.for_env(envs).autoreset_mode is mode
        assert EpisodeStatistics.for_env(envs).autoreset_mode is mode
        assert TransitionAssembler.for_env(envs).num_envs == 2
        envs.close()


BAD_ENV_IDS = [
    ([-1], [3], ValueError, r"env_ids must be ids in 0\.\.3"),
    ([4], [3], ValueError, r"env_ids must be ids in 0\.\.3"),
    (np.array([False, True, False, True]), [1, 2], TypeError, "flatnonzero"),
    ([True, False], [1, 2], TypeError, "flatnonzero"),
    ([2, 2], [1, 4], ValueError, r"duplicates: \[2\]"),
    ([1.7], [2], TypeError, "1-D sequence of ints"),
    (np.array([[0, 1]]), [[1, 2]], TypeError, "1-D sequence of ints"),
]


@pytest.mark.parametrize("env_ids, rows, error, message", BAD_ENV_IDS)
def test_assembler_refuses_env_ids_the_replay_buffer_refuses_and_records_nothing(
    env_ids, rows, error, message
):
    # The same checks and messages as ReplayBuffer.sent/reset, before any env's state moves.
    assembler = TransitionAssembler(NUM_ENVS)
    buffer = aiovec.ReplayBuffer(8, gym.spaces.Box(-1, 1, (1,)), gym.spaces.Discrete(5), num_envs=4)
    observations = np.arange(NUM_ENVS, dtype=np.float32)[:, None]
    assembler.reset(observations)
    buffer.reset(observations)
    assembler.sent(np.zeros(NUM_ENVS, np.int64))
    before = (list(assembler._observation), list(assembler._action), list(assembler._has_action))
    for call in ("sent", "reset"):
        batch = np.array(rows, np.float32 if call == "reset" else np.int64)
        with pytest.raises(error, match=message) as replay_error:
            getattr(buffer, call)(batch, env_ids)
        with pytest.raises(error, match=message) as assembler_error:
            getattr(assembler, call)(batch, env_ids)
        assert str(assembler_error.value) == str(replay_error.value)
    after = (list(assembler._observation), list(assembler._action), list(assembler._has_action))
    assert after == before


def test_assembler_take_refuses_a_length_below_one_and_bad_env_ids():
    assembler = TransitionAssembler(2)
    _one_transition_each_of(assembler, 2)
    for length, error in ((0, ValueError), (-2, ValueError), (1.5, TypeError), (True, TypeError)):
        with pytest.raises(error, match=r"length must be an int >= 1"):
            assembler.take(length)
    with pytest.raises(ValueError, match=r"env_ids must be ids in 0\.\.1"):
        assembler.take(1, [-1])
    with pytest.raises(ValueError, match="duplicates"):
        assembler.take(1, [0, 0])
    assert assembler.available().tolist() == [1, 1]  # nothing was taken by a refused call
    chunk = assembler.take(1, np.array([1]))
    assert chunk.env_ids.tolist() == [1] and assembler.available().tolist() == [1, 0]


def _one_transition_each_of(assembler, num_envs):
    ids = np.arange(num_envs)
    assembler.reset(np.zeros((num_envs, 1), np.float32))
    assembler.sent(np.zeros(num_envs, np.int64))
    zeros = np.zeros(num_envs, bool)
    assembler.received(
        aiovec.Batch(np.ones((num_envs, 1)), np.ones(num_envs), zeros, zeros, {}, ids)
    )
