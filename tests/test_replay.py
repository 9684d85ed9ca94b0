"""Replay buffers: transitions rebuilt from first-ready and lockstep results, every
autoreset mode and supported space; the sum-tree's sampling law; n-step returns;
saving and loading; torch views."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

import aiovec
from aiovec.replay import PrioritizedReplayBuffer, ReplayBuffer, to_torch
from tests.envs import CounterEnv, SpacesEnv

MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED]


class EpisodicCounter(CounterEnv):
    """Observation ``[env_index, count]``; episodes of ``length`` steps (terminated),
    so every transition can be checked: ``next = obs + 1`` within an episode."""

    def __init__(self, env_index: int = 0, length: int = 3) -> None:
        super().__init__(env_index)
        self.length = length

    def step(self, action):
        observation, reward, _, _, info = super().step(action)
        return observation, reward, self.count >= self.length, False, info


def _check_transitions(buffer: ReplayBuffer, lengths: dict[int, int]) -> None:
    stored = len(buffer)
    observations = buffer.observations[:stored]
    next_observations = buffer.next_observations[:stored]
    env_ids = observations[:, 0].astype(int)
    # The next observation is always the same env's, one step later, never a reset.
    np.testing.assert_array_equal(next_observations[:, 0], observations[:, 0])
    np.testing.assert_array_equal(next_observations[:, 1], observations[:, 1] + 1)
    np.testing.assert_array_equal(buffer.rewards[:stored], next_observations[:, 1])
    expected_end = next_observations[:, 1] == np.array([lengths[i] for i in env_ids])
    np.testing.assert_array_equal(buffer.terminations[:stored], expected_end)
    # The action stored is the one sent from that observation (we send obs count % 2).
    np.testing.assert_array_equal(buffer.actions[:stored], observations[:, 1].astype(int) % 2)


@pytest.mark.parametrize("mode", MODES)
def test_first_ready_batches_become_exact_transitions(mode):
    lengths = {0: 2, 1: 3, 2: 5, 3: 4}
    env_fns = [lambda i=i: EpisodicCounter(i, lengths[i]) for i in range(4)]
    with aiovec.VecEnv(env_fns, backend="inline", autoreset_mode=mode) as venv:
        buffer = ReplayBuffer.for_env(venv, capacity=500)
        assert buffer.autoreset_mode is mode
        observations, _ = venv.reset(seed=0)
        buffer.reset(observations)

        def actions_for(observations):
            return observations[:, 1].astype(np.int64) % 2

        async def main():
            actions = actions_for(observations)
            buffer.sent(actions)
            venv.send(actions)
            rng = np.random.default_rng(0)
            for _ in range(60):
                batch = await venv.recv(max_envs=int(rng.integers(1, 4)))
                ids = batch.env_ids
                buffer.received(batch)
                done = batch.terminations | batch.truncations
                if mode is AutoresetMode.DISABLED and done.any():
                    mask = np.zeros(4, dtype=bool)
                    mask[ids[done]] = True
                    reset_obs, _ = await venv.areset(options={"reset_mask": mask})
                    buffer.reset(reset_obs[mask], np.flatnonzero(mask))
                    current = batch.observations.copy()
                    current[done] = reset_obs[ids[done]]
                else:
                    current = batch.observations
                # Send in a shuffled order: rows and env ids need not be sorted.
                order = rng.permutation(len(ids))
                acts = actions_for(current)[order]
                buffer.sent(acts, ids[order])
                venv.send(acts, ids[order])

        aiovec.run(main())
    assert len(buffer) > 60
    _check_transitions(buffer, lengths)


@pytest.mark.parametrize("mode", MODES)
def test_lockstep_results_become_exact_transitions(mode):
    lengths = {0: 2, 1: 3}
    env_fns = [lambda i=i: EpisodicCounter(i, lengths[i]) for i in range(2)]
    with aiovec.VecEnv(env_fns, backend="inline", autoreset_mode=mode) as venv:
        buffer = ReplayBuffer.for_env(venv, capacity=100)
        observations, _ = venv.reset(seed=0)
        buffer.reset(observations)
        for _ in range(12):
            actions = observations[:, 1].astype(np.int64) % 2
            buffer.sent(actions)
            result = venv.step(actions)
            buffer.received(result)
            observations, _, terminated, truncated, _ = result
            done = terminated | truncated
            if mode is AutoresetMode.DISABLED and done.any():
                observations, _ = venv.reset(options={"reset_mask": done})
                buffer.reset(observations[done], np.flatnonzero(done))
    assert len(buffer) >= 15  # 24 results, less the autoresets (NEXT_STEP)
    _check_transitions(buffer, lengths)


SPACES = {
    "box": spaces.Box(-1, 1, (3,), np.float32),
    "discrete": spaces.Discrete(5),
    "multidiscrete": spaces.MultiDiscrete([3, 4]),
    "multibinary": spaces.MultiBinary(4),
    "dict": spaces.Dict({"a": spaces.Box(0, 1, (2,)), "b": spaces.Discrete(3)}),
    "tuple": spaces.Tuple([spaces.Discrete(2), spaces.Box(-1, 1, (2, 2))]),
}


@pytest.mark.parametrize("name", sorted(SPACES))
def test_every_supported_space_round_trips(name, tmp_path):
    space = SPACES[name]
    env_fns = [lambda: SpacesEnv(observation_space=space, action_space=space)] * 3
    with aiovec.VecEnv(env_fns, backend="inline") as venv:
        buffer = ReplayBuffer.for_env(venv, capacity=64)
        observations, _ = venv.reset(seed=1)
        buffer.reset(observations)
        sent, received = [], []
        for _ in range(5):
            actions = venv.action_space.sample()
            buffer.sent(actions)
            result = venv.step(actions)
            buffer.received(result)
            sent.append(actions)
            received.append(result)
    assert len(buffer) >= 5
    sample = buffer.sample(16, rng=0)
    for field in (sample.observations, sample.next_observations):
        rows = aiovec.replay.read_rows(field, np.arange(16))
        for i in range(16):
            assert space.contains(_row(rows, i))
    for i in range(16):
        assert space.contains(_row(sample.actions, i))
    # Saved and loaded, the buffer samples the same transitions.
    buffer.save(tmp_path / "buffer.npz")
    loaded = ReplayBuffer.load(tmp_path / "buffer.npz", space, space)
    assert len(loaded) == len(buffer)
    again = loaded.sample(16, rng=0)
    _assert_tree_equal(again.observations, sample.observations)
    _assert_tree_equal(again.actions, sample.actions)
    np.testing.assert_array_equal(again.rewards, sample.rewards)


def _row(batch, i):
    if isinstance(batch, dict):
        return {key: _row(value, i) for key, value in batch.items()}
    if isinstance(batch, tuple):
        return tuple(_row(value, i) for value in batch)
    return batch[i]


def _assert_tree_equal(a, b):
    if isinstance(a, dict):
        for key in a:
            _assert_tree_equal(a[key], b[key])
    elif isinstance(a, tuple):
        for x, y in zip(a, b):
            _assert_tree_equal(x, y)
    else:
        np.testing.assert_array_equal(a, b)


def _transitions(count: int, env_ids=None):
    observations = np.arange(count, dtype=np.float32)[:, None].repeat(2, axis=1)
    return dict(
        observations=observations,
        actions=np.zeros(count, dtype=np.int64),
        rewards=np.ones(count, dtype=np.float32),
        next_observations=observations + 1,
        terminations=np.zeros(count, dtype=bool),
        truncations=np.zeros(count, dtype=bool),
        env_ids=env_ids,
    )


OBS = spaces.Box(-np.inf, np.inf, (2,), np.float32)
ACT = spaces.Discrete(2)


def test_capacity_keeps_the_newest_transitions():
    buffer = ReplayBuffer(10, OBS, ACT)
    buffer.add(**_transitions(7))
    buffer.add(**_transitions(25))  # more than fits at once
    assert len(buffer) == 10
    assert sorted(buffer.observations[:, 0].tolist()) == list(range(15, 25))


def test_n_step_returns_follow_each_env_and_stop_at_episode_ends():
    buffer = ReplayBuffer(100, OBS, ACT, num_envs=2, n_step=3, gamma=0.5)
    # Two envs interleaved; env 0 terminates at its 2nd transition.
    data = _transitions(6, env_ids=[0, 1, 0, 1, 0, 1])
    data["rewards"] = np.array([1, 10, 2, 20, 4, 40], dtype=np.float32)
    data["terminations"][2] = True
    buffer.add(**data)
    sample = buffer._gather(np.arange(6), np.ones(6, dtype=np.float32), None)
    # env 0: slot 0 -> slot 2 (terminated): 1 + 0.5 * 2, no bootstrap.
    assert sample.rewards[0] == pytest.approx(2.0)
    assert sample.discounts[0] == 0.0 and sample.terminations[0]
    # env 1: slots 1 -> 3 -> 5: 10 + 0.5 * 20 + 0.25 * 40, bootstrapped by 0.5 ** 3.
    assert sample.rewards[1] == pytest.approx(30.0)
    assert sample.discounts[1] == pytest.approx(0.125)
    np.testing.assert_array_equal(sample.next_observations[1], data["next_observations"][5])
    # env 0's slot 4 starts a new episode: one step, then nothing follows yet.
    assert sample.rewards[4] == pytest.approx(4.0)
    assert sample.discounts[4] == pytest.approx(0.5)


def test_n_step_links_die_with_overwritten_slots():
    buffer = ReplayBuffer(4, OBS, ACT, num_envs=2, n_step=4, gamma=1.0)
    buffer.add(**_transitions(3, env_ids=[0, 0, 1]))
    buffer.add(**_transitions(3, env_ids=[1, 1, 1]))  # wraps: env 0's slots 0, 1 go
    sample = buffer._gather(np.arange(4), np.ones(4, dtype=np.float32), None)
    # No transition reaches into env 0's overwritten slots or beyond its env's data.
    assert sample.rewards.max() <= 4


def test_prioritized_sampling_matches_priorities():
    buffer = PrioritizedReplayBuffer(8, OBS, ACT, alpha=1.0, beta=1.0)
    buffer.add(**_transitions(8))
    priorities = np.array([1, 2, 3, 4, 0, 0, 5, 1], dtype=np.float64)
    buffer.update_priorities(np.arange(8), priorities)
    rng = np.random.default_rng(0)
    counts = np.zeros(8)
    draws = 0
    for _ in range(400):
        sample = buffer.sample(64, rng=rng)
        np.add.at(counts, sample.indices, 1)
        draws += 64
    expected = (priorities + buffer.epsilon) / (priorities + buffer.epsilon).sum()
    # Within 5 standard deviations of a binomial for every slot.
    spread = 5 * np.sqrt(draws * expected * (1 - expected)) + 1
    assert np.all(np.abs(counts - draws * expected) <= spread), counts
    assert counts[4] == 0 and counts[5] == 0  # ~zero priority: (almost) never drawn


def test_prioritized_weights_and_beta_annealing():
    buffer = PrioritizedReplayBuffer(4, OBS, ACT, alpha=1.0, beta=0.5, beta_steps=10)
    buffer.add(**_transitions(4))
    buffer.update_priorities(np.arange(4), np.array([1.0, 1.0, 2.0, 4.0]))
    sample = buffer.sample(100, rng=1)
    weights = dict(zip(sample.indices.tolist(), sample.weights.tolist()))
    # The least likely transition has weight 1; others (p_min / p) ** beta.
    assert max(sample.weights) == pytest.approx(1.0)
    assert weights[3] == pytest.approx((1 / 4) ** 0.5, rel=1e-4)
    for _ in range(20):
        buffer.sample(4, rng=2)
    assert buffer.beta == 1.0


def test_new_transitions_get_the_highest_priority():
    buffer = PrioritizedReplayBuffer(16, OBS, ACT, alpha=1.0)
    buffer.add(**_transitions(4))
    buffer.update_priorities(np.arange(4), np.array([0.1, 0.1, 0.1, 9.0]))
    buffer.add(**_transitions(1))
    assert buffer._sums[buffer._leaves + 4] == pytest.approx(9.0 + buffer.epsilon)


def test_bad_priorities_are_refused():
    buffer = PrioritizedReplayBuffer(8, OBS, ACT)
    buffer.add(**_transitions(4))
    with pytest.raises(ValueError, match="finite"):
        buffer.update_priorities(np.array([0]), np.array([np.nan]))
    with pytest.raises(ValueError, match="indices"):
        buffer.update_priorities(np.array([6]), np.array([1.0]))
    with pytest.raises(ValueError, match="2 indices but 1 priorities"):
        buffer.update_priorities(np.array([0, 1]), np.array([1.0]))


def test_signed_td_errors_count_by_magnitude():
    """update_priorities takes TD errors as they come: a negative one counts as its
    magnitude (as documented), not as a smaller priority."""
    signed = PrioritizedReplayBuffer(4, OBS, ACT, alpha=1.0)
    magnitudes = PrioritizedReplayBuffer(4, OBS, ACT, alpha=1.0)
    for buffer, errors in ((signed, [-2.0, 1.0, -0.5, 3.0]), (magnitudes, [2.0, 1.0, 0.5, 3.0])):
        buffer.add(**_transitions(4))
        buffer.update_priorities(np.arange(4), np.array(errors))
    np.testing.assert_array_equal(signed._sums, magnitudes._sums)


def test_sampling_when_every_priority_is_zero_is_a_clear_error():
    """With epsilon=0 and every priority 0 nothing can be drawn in proportion: a
    ValueError says so, instead of NaN weights that would poison a loss."""
    buffer = PrioritizedReplayBuffer(4, OBS, ACT, epsilon=0.0)
    buffer.add(**_transitions(4))
    buffer.update_priorities(np.arange(4), np.zeros(4))
    with pytest.raises(ValueError, match="every priority is 0.*epsilon"):
        buffer.sample(4, rng=0)
    buffer.update_priorities(np.array([2]), np.array([1.0]))
    sample = buffer.sample(4, rng=0)
    assert sample.indices.tolist() == [2, 2, 2, 2]
    assert np.isfinite(sample.weights).all()


def test_prioritized_buffer_saves_and_loads(tmp_path):
    buffer = PrioritizedReplayBuffer(32, OBS, ACT, alpha=0.7, num_envs=2, n_step=2)
    buffer.add(**_transitions(20, env_ids=[i % 2 for i in range(20)]))
    buffer.update_priorities(np.arange(20), np.linspace(0.1, 3, 20))
    buffer.sample(8, rng=0)
    buffer.save(tmp_path / "per.npz")
    loaded = PrioritizedReplayBuffer.load(tmp_path / "per.npz", OBS, ACT)
    assert loaded.alpha == 0.7 and loaded.samples_drawn == 1 and loaded.n_step == 2
    first, second = buffer.sample(8, rng=5), loaded.sample(8, rng=5)
    np.testing.assert_array_equal(first.indices, second.indices)
    np.testing.assert_allclose(first.weights, second.weights)
    np.testing.assert_allclose(first.rewards, second.rewards)
    with pytest.raises(ValueError, match="PrioritizedReplayBuffer, not a ReplayBuffer"):
        ReplayBuffer.load(tmp_path / "per.npz", OBS, ACT)


def test_bad_input_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="capacity"):
        ReplayBuffer(0, OBS, ACT)
    with pytest.raises(TypeError, match="no fixed-size array form"):
        ReplayBuffer(8, spaces.Text(4), ACT)
    buffer = ReplayBuffer(8, OBS, ACT, num_envs=2)
    with pytest.raises(ValueError, match="empty"):
        buffer.sample(1)
    with pytest.raises(RuntimeError, match="buffer.reset"):
        buffer.received(
            (np.zeros((2, 2), np.float32), np.zeros(2), np.zeros(2, bool), np.zeros(2, bool), {})
        )
    with pytest.raises(ValueError, match="env_ids"):
        buffer.sent(np.zeros(1, dtype=np.int64), [5])


torch = pytest.importorskip("torch")


def test_torch_views_share_memory_with_the_result_buffers():
    with aiovec.VecEnv([CounterEnv] * 2, backend="inline", copy=False) as venv:
        observations, _ = venv.reset(seed=0)
        view = to_torch(observations)
        assert isinstance(view, torch.Tensor)
        venv.step(np.zeros(2, dtype=np.int64))
        # The same memory: the view sees the step's results without a copy.
        assert view[:, 1].tolist() == [1.0, 1.0]
        assert view.data_ptr() == observations.__array_interface__["data"][0]


def test_sample_on_a_device_returns_tensors():
    buffer = ReplayBuffer(16, OBS, ACT)
    buffer.add(**_transitions(8))
    sample = buffer.sample(4, rng=0, device="cpu")
    assert isinstance(sample.observations, torch.Tensor)
    assert sample.observations.shape == (4, 2)
    assert isinstance(sample.indices, np.ndarray)


def test_transition_assembler_chunks_go_in_linked_per_env():
    with aiovec.VecEnv(
        [lambda i=i: EpisodicCounter(i, 50) for i in range(3)], backend="inline"
    ) as venv:
        assembler = aiovec.TransitionAssembler(3)
        observations, _ = venv.reset(seed=0)
        assembler.reset(observations)
        for _ in range(4):
            actions = observations[:, 1].astype(np.int64) % 2
            assembler.sent(actions)
            observations, rewards, terminated, truncated, infos = venv.step(actions)
            assembler.received(
                aiovec.Batch(observations, rewards, terminated, truncated, infos, np.arange(3))
            )
        chunk = assembler.take(4)
    buffer = ReplayBuffer(64, venv.single_observation_space, venv.single_action_space,
                          num_envs=3, n_step=4, gamma=1.0)  # fmt: skip
    buffer.add_chunk(chunk)
    assert len(buffer) == 12
    _check_transitions(buffer, {0: 50, 1: 50, 2: 50})
    # Each env's first transition reaches 4 steps ahead through its own links.
    stored = buffer.observations
    first = [int(np.flatnonzero((stored[:, 0] == i) & (stored[:, 1] == 0))[0]) for i in range(3)]
    sample = buffer._gather(np.array(first), np.ones(3, dtype=np.float32), None)
    np.testing.assert_array_equal(sample.rewards, [1 + 2 + 3 + 4] * 3)
    np.testing.assert_array_equal(sample.next_observations[:, 1], [4, 4, 4])


def test_results_without_a_recorded_action_are_refused():
    buffer = ReplayBuffer(16, OBS, ACT, num_envs=2)
    buffer.reset(np.zeros((2, 2), np.float32))
    buffer.sent(np.zeros(1, dtype=np.int64), [0])  # env 1's action was never recorded
    batch = aiovec.Batch(
        np.ones((2, 2), np.float32), np.ones(2), np.zeros(2, bool), np.zeros(2, bool), {},
        np.array([0, 1]),
    )  # fmt: skip
    with pytest.raises(RuntimeError, match=r"envs \[1\].*buffer.sent"):
        buffer.received(batch)
    with pytest.raises(ValueError, match=r"expected shape \(2,\)"):
        buffer.sent(np.zeros(3, dtype=np.int64), [0, 1])


@pytest.mark.parametrize("mode", MODES[:2])
def test_a_restarted_env_makes_no_transition_into_its_new_episode(mode):
    from tests.faulty import FaultyEnv

    env_fns = [lambda i=i: FaultyEnv(i, at_step=3 if i == 0 else 10**9) for i in range(2)]
    with aiovec.VecEnv(env_fns, backend="inline", on_failure="restart", autoreset_mode=mode) as v:
        buffer = ReplayBuffer.for_env(v, capacity=100)
        observations, _ = v.reset(seed=0)
        buffer.reset(observations)
        # Each built env fails at its 3rd step: stop before the rebuilt one does.
        for _ in range(6 if mode is AutoresetMode.NEXT_STEP else 5):
            actions = np.zeros(2, dtype=np.int64)
            buffer.sent(actions)
            buffer.received(v.step(actions))
        assert v.restart_counts[0] == 1
    stored = len(buffer)
    env0 = buffer.observations[:stored, 0] == 0
    # Every transition of env 0 goes one count up: none from the old env into the new.
    np.testing.assert_array_equal(
        buffer.next_observations[:stored][env0, 1], buffer.observations[:stored][env0, 1] + 1
    )
    # 2 steps before the failing 3rd, 2 after the rebuild (which answered truncated=True:
    # with NEXT_STEP the result after it is an autoreset, no transition either).
    assert env0.sum() == 4


def test_env_ids_must_be_distinct_integers():
    buffer = ReplayBuffer(8, OBS, ACT, num_envs=3)
    with pytest.raises(TypeError, match="flatnonzero"):
        buffer.reset(np.zeros((3, 2), np.float32), np.array([True, True, True]))
    with pytest.raises(ValueError, match="duplicates"):
        buffer.reset(np.zeros((2, 2), np.float32), [1, 1])


def test_actions_are_checked_against_the_action_space():
    buffer = ReplayBuffer(8, OBS, spaces.Box(-1, 1, (3,)), num_envs=2)
    with pytest.raises(ValueError, match="shape"):
        buffer.sent(np.zeros((2, 1), np.float32))
    discrete = ReplayBuffer(8, OBS, ACT, num_envs=2)
    with pytest.raises(ValueError, match="outside"):
        discrete.sent(np.array([7, -3]))
    with pytest.raises(ValueError, match="not whole numbers"):
        discrete.sent(np.array([0.5, 1.0]))
    with pytest.raises(TypeError, match="integers"):
        discrete.sent(np.array(["a", "b"]))
    with pytest.raises(TypeError, match="scalar"):
        discrete.sent(np.int64(1))
    with pytest.raises(ValueError, match="3 observations for 2 env ids"):
        discrete.reset(np.zeros((3, 2), np.float32))
    with pytest.raises(ValueError, match=r"observations: expected shape \(2, 2\)"):
        discrete.reset(np.zeros((2, 3), np.float32))


@pytest.mark.parametrize(
    "space, actions, rows",
    [
        (spaces.Box(-1, 1, (1,)), [0.5, -0.5], [[0.5], [-0.5]]),
        (spaces.MultiDiscrete([3]), [2, 1], [[2], [1]]),
        (spaces.MultiBinary(1), [1, 0], [[1], [0]]),
        (spaces.MultiBinary(1), np.array([1.0, 0.0], np.float32), [[1], [0]]),
    ],
    ids=["box", "multidiscrete", "multibinary", "multibinary-floats"],
)
def test_one_number_per_env_for_a_one_element_space_is_stored_as_its_row(space, actions, rows):
    # As VecEnv takes it (Gymnasium's iterate does): [0.5, -0.5] for Box((1,)) is one
    # action per env, stored as rows of the action space.
    buffer = ReplayBuffer(8, OBS, space, num_envs=2)
    buffer.reset(np.zeros((2, 2), np.float32))
    buffer.sent(actions)
    buffer.received((np.ones((2, 2), np.float32), np.zeros(2), *[np.zeros(2, bool)] * 2, {}))
    assert buffer.actions[:2].tolist() == rows


def test_save_and_load_use_the_exact_path(tmp_path):
    buffer = ReplayBuffer(8, OBS, ACT)
    buffer.add(**_transitions(3))
    buffer.save(tmp_path / "buffer")  # no .npz suffix added behind the caller's back
    assert (tmp_path / "buffer").exists()
    assert len(ReplayBuffer.load(tmp_path / "buffer", OBS, ACT)) == 3


def test_prioritized_edge_cases():
    buffer = PrioritizedReplayBuffer(8, OBS, ACT, epsilon=0.0)
    buffer.add(**_transitions(4))
    assert len(buffer.sample(0, rng=0).indices) == 0
    buffer.update_priorities(np.array([], dtype=np.int64), np.array([]))
    buffer.update_priorities(np.arange(4), np.array([0.0, 1.0, 2.0, 4.0]))
    sample = buffer.sample(64, rng=0)
    assert np.all(np.isfinite(sample.weights)) and sample.weights.max() == pytest.approx(1.0)
    assert 0 not in sample.indices.tolist()


def test_to_torch_keeps_named_tuples_and_leaves_what_torch_cannot_hold():
    batch = aiovec.Batch(
        np.zeros((2, 3), np.float32)[::-1], np.zeros(2), np.zeros(2, bool), np.zeros(2, bool),
        {"final_obs": np.array([None, np.zeros(3)], dtype=object)}, np.arange(2),
    )  # fmt: skip
    converted = to_torch(batch)
    assert isinstance(converted, aiovec.Batch)
    assert isinstance(converted.observations, torch.Tensor)  # negative strides: a copy
    assert converted.infos["final_obs"].dtype == object  # left as it is


@pytest.mark.parametrize("kind", [ReplayBuffer, PrioritizedReplayBuffer])
def test_rewards_keep_float64_precision_when_asked(tmp_path, kind):
    """Rewards are float32 by default (as SB3's buffers; half the memory), which rounds
    16777217 to 16777216 and loses later rewards of an n-step sum beside a large one;
    reward_dtype=np.float64 keeps them, in the sums and discounts too, and through
    save/load."""
    data = _transitions(3, env_ids=[0, 0, 0])
    data["rewards"] = np.array([16777217.0, 0.1, 2.0])
    default = kind(8, OBS, ACT, n_step=3, gamma=0.99)
    default.add(**data)
    assert default._gather(np.arange(1), np.ones(1), None).rewards.dtype == np.float32
    precise = kind(8, OBS, ACT, n_step=3, gamma=0.99, reward_dtype=np.float64)
    precise.add(**data)
    sample = precise._gather(np.arange(3), np.ones(3), None)
    assert sample.rewards.dtype == np.float64 and sample.discounts.dtype == np.float64
    assert sample.rewards[0] == pytest.approx(16777217.0 + 0.99 * 0.1 + 0.99**2 * 2.0, rel=1e-15)
    assert sample.discounts[0] == pytest.approx(0.99**3, rel=1e-15)
    assert sample.rewards[1] == pytest.approx(0.1 + 0.99 * 2.0, rel=1e-15)
    precise.save(tmp_path / "buffer")
    loaded = kind.load(tmp_path / "buffer", OBS, ACT)
    assert loaded.rewards.dtype == np.float64 and loaded.rewards[0] == 16777217.0
    for refused in (np.int32, None, np.float16, np.longdouble, ">f8"):
        with pytest.raises(TypeError, match="reward_dtype"):
            kind(8, OBS, ACT, reward_dtype=refused)


_STATE = ("observations", "actions", "rewards", "next_observations", "terminations")
_STATE += ("truncations", "successors", "stamps", "_last_slot", "_last_stamp", "inserted")


def _snapshot(buffer: ReplayBuffer) -> dict:
    return {name: np.copy(getattr(buffer, name)) for name in _STATE}


def _assert_unchanged(buffer: ReplayBuffer, before: dict) -> None:
    after = _snapshot(buffer)
    for name, value in before.items():
        np.testing.assert_array_equal(after[name], value, err_msg=name)


@pytest.mark.parametrize("kind", [ReplayBuffer, PrioritizedReplayBuffer])
@pytest.mark.parametrize(
    "field, value, message",
    [
        ("observations", np.zeros((1, 2), np.float32), r"observations has 1 rows? for 2"),
        ("next_observations", np.zeros((1, 2), np.float32), r"next_observations has 1 rows? for 2"),
        ("next_observations", np.zeros((3, 2), np.float32), r"next_observations has 3 rows for 2"),
        ("actions", np.zeros(1, np.int64), r"actions has 1 rows? for 2"),
        ("actions", np.zeros(3, np.int64), r"actions has 3 rows for 2"),
        ("terminations", np.zeros(1, bool), r"terminations has 1 rows? for 2"),
        ("truncations", np.zeros(3, bool), r"truncations has 3 rows for 2"),
        ("truncations", np.bool_(False), r"truncations has no rows"),
        ("episode_starts", np.zeros(3, bool), r"episode_starts has 3 rows for 2"),
        ("env_ids", [0, 1, 0], r"env_ids has 3 rows for 2"),
    ],
)
def test_add_refuses_a_field_without_one_row_per_transition_and_writes_nothing(
    kind, field, value, message
):
    # The rows of rewards are the transitions: a field of one row is never broadcast,
    # and a refused add leaves the buffer as it was, even once it has wrapped.
    buffer = kind(2, OBS, ACT, num_envs=2)
    buffer.add(**_transitions(2, env_ids=[0, 1]))
    before = _snapshot(buffer)
    given = _transitions(2, env_ids=[0, 1]) | {field: value}
    with pytest.raises(ValueError, match=message):
        buffer.add(**given)
    _assert_unchanged(buffer, before)


@pytest.mark.parametrize("kind", [ReplayBuffer, PrioritizedReplayBuffer])
def test_add_counts_transitions_by_the_rows_of_rewards(kind):
    buffer = kind(2, OBS, ACT)
    buffer.add(**_transitions(2))
    before = _snapshot(buffer)
    # 3 rewards for 2 of everything else: each other field is named, not sliced to fit.
    with pytest.raises(ValueError, match=r"observations has 2 rows for 3 transitions"):
        buffer.add(**_transitions(2) | {"rewards": np.zeros(3, np.float32)})
    with pytest.raises(ValueError, match=r"rewards must be a 1-D"):
        buffer.add(**_transitions(2) | {"rewards": np.zeros((2, 1), np.float32)})
    _assert_unchanged(buffer, before)


def test_add_checks_every_leaf_of_dict_and_tuple_spaces():
    observation_space = spaces.Dict(
        {"a": spaces.Box(-1, 1, (1,)), "b": spaces.Tuple((spaces.Discrete(3), OBS))}
    )
    buffer = ReplayBuffer(4, observation_space, ACT)

    def observations(rows_of_leaf):
        return {
            "a": np.zeros((2, 1), np.float32),
            "b": (np.zeros(2, np.int64), np.zeros((rows_of_leaf, 2), np.float32)),
        }

    fields = dict(
        actions=np.zeros(2, np.int64),
        rewards=np.zeros(2, np.float32),
        terminations=np.zeros(2, bool),
        truncations=np.zeros(2, bool),
    )
    with pytest.raises(ValueError, match=r"next_observations\['b'\]\[1\] has 1 row for 2"):
        buffer.add(observations(2), next_observations=observations(1), **fields)
    with pytest.raises(ValueError, match=r"observations\['b'\]\[1\] has 3 rows for 2"):
        buffer.add(observations(3), next_observations=observations(2), **fields)
    assert len(buffer) == 0 and buffer.inserted == 0
    buffer.add(observations(2), next_observations=observations(2), **fields)
    assert len(buffer) == 2


@pytest.mark.parametrize("kind", [ReplayBuffer, PrioritizedReplayBuffer])
def test_add_checks_values_against_the_spaces_and_env_ids_like_sent(kind):
    buffer = kind(2, OBS, ACT, num_envs=2)
    buffer.add(**_transitions(2, env_ids=[0, 1]))
    before = _snapshot(buffer)
    with pytest.raises(ValueError, match=r"actions: values \[7\] are outside Discrete\(2\)"):
        buffer.add(**_transitions(2) | {"actions": np.array([0, 7])})
    with pytest.raises(ValueError, match=r"next_observations: expected shape \(2, 2\)"):
        buffer.add(**_transitions(2) | {"next_observations": np.zeros((2, 3), np.float32)})
    with pytest.raises(ValueError, match=r"env_ids must be ids in 0..1"):
        buffer.add(**_transitions(2, env_ids=[0, 2]))
    with pytest.raises(ValueError, match=r"env_ids must be ids in 0..1"):
        buffer.add(**_transitions(2, env_ids=[-1, 0]))
    with pytest.raises(TypeError, match="1-D sequence of ints"):
        buffer.add(**_transitions(2, env_ids=[0.0, 1.0]))
    _assert_unchanged(buffer, before)
    # An env's consecutive transitions may come in one call: repeated ids are fine here.
    buffer.add(**_transitions(2, env_ids=[1, 1]))
    assert buffer.successors[buffer.stamps.argmin()] == buffer.stamps.argmax()


DOTTED = spaces.Dict(
    {
        "a.b": spaces.Box(-10, 10, (1,)),
        "a": spaces.Dict({"b": spaces.Box(-10, 10, (1,)), "c%2Ed": spaces.Discrete(3)}),
        "c.d": spaces.Tuple((spaces.Discrete(3), spaces.Box(-10, 10, (1,)))),
    }
)


def _dotted(value: float) -> dict:
    column = np.array([[value]], np.float32)
    return {
        "a.b": column,
        "a": {"b": column + 1, "c%2Ed": np.array([1])},
        "c.d": (np.array([2]), column + 2),
    }


@pytest.mark.parametrize("kind", [ReplayBuffer, PrioritizedReplayBuffer])
def test_dict_keys_with_dots_are_saved_each_under_its_own_name(kind, tmp_path):
    # {"a.b": ..., "a": {"b": ...}} are two leaves: both come back, whatever the keys hold.
    buffer = kind(4, DOTTED, ACT, num_envs=1)
    buffer.add(_dotted(1.0), np.array([0]), np.array([0.0]), _dotted(5.0), [False], [False])
    buffer.save(tmp_path / "dotted.npz")
    loaded = kind.load(tmp_path / "dotted.npz", DOTTED, ACT)
    for name in ("observations", "next_observations"):
        _assert_tree_equal(getattr(loaded, name), getattr(buffer, name))
    assert loaded.observations["a.b"][0] == 1.0 and loaded.observations["a"]["b"][0] == 2.0


def _as_format_1(path, tmp_path):
    """The file ``path`` as aiovec's format 1 wrote it: Dict keys joined with "." as
    they are, unescaped."""
    with np.load(path) as data:
        arrays = {name.replace("%2E", ".").replace("%25", "%"): data[name] for name in data}
    arrays["format_version"] = np.array(1)
    old = tmp_path / "format1.npz"
    np.savez(old, **arrays)
    return old


def test_files_of_format_1_still_load_unless_they_lost_a_leaf(tmp_path):
    space = spaces.Dict({"a.b": spaces.Box(-10, 10, (1,)), "c": spaces.Box(-10, 10, (1,))})
    buffer = ReplayBuffer(4, space, ACT)
    one = {"a.b": np.array([[1.0]], np.float32), "c": np.array([[2.0]], np.float32)}
    buffer.add(one, np.array([1]), np.array([3.0]), one, [True], [False])
    buffer.save(tmp_path / "new.npz")
    loaded = ReplayBuffer.load(_as_format_1(tmp_path / "new.npz", tmp_path), space, ACT)
    _assert_tree_equal(loaded.observations, buffer.observations)
    # Format 1 stored "a.b" and "a" -> "b" under one name: one of them is gone for good.
    dotted = ReplayBuffer(4, DOTTED, ACT)
    dotted.save(tmp_path / "dotted.npz")
    with pytest.raises(ValueError, match=r"observations\.a\.b.*lost"):
        ReplayBuffer.load(_as_format_1(tmp_path / "dotted.npz", tmp_path), DOTTED, ACT)


def test_dict_keys_that_would_share_a_saved_name_are_refused_on_save(tmp_path):
    # A Dict may hold 0 and "0": both print as "0", so saving refuses rather than lose one.
    space = spaces.Dict({0: spaces.Box(-1, 1, (1,)), "0": spaces.Box(-1, 1, (1,))})
    buffer = ReplayBuffer(2, space, ACT)
    with pytest.raises(ValueError, match=r"'0'.*0|0.*'0'"):
        buffer.save(tmp_path / "clash.npz")
    assert not (tmp_path / "clash.npz").exists()
