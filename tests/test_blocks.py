"""Batched envs ("blocks"): a gymnasium VectorEnv of k envs per block, behind the same
vector-env API, on every backend that hosts blocks (inline and process)."""

from __future__ import annotations

import asyncio
import pickle
from functools import partial

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import aiovec
from aiovec._worker.blocks import split_infos
from tests.batched import PointMassVectorEnv, point_masses

pytestmark = pytest.mark.timeout(120)

MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED]


def assert_same(actual, expected, path="infos"):
    """Nested dicts / arrays / object arrays equal, key for key."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict), path
        assert sorted(actual) == sorted(expected), f"{path}: {sorted(actual)} vs {sorted(expected)}"
        for key in expected:
            assert_same(actual[key], expected[key], f"{path}[{key!r}]")
    elif isinstance(expected, np.ndarray) and expected.dtype == object:
        assert len(actual) == len(expected), path
        for index, (a, e) in enumerate(zip(actual, expected)):
            assert_same(a, e, f"{path}[{index}]")
    elif expected is None:
        assert actual is None, path
    else:
        np.testing.assert_array_equal(actual, expected, err_msg=path)


def cartpole_blocks(num_envs, mode):
    """A batched CartPole in ``mode``: the vector entry point (NEXT_STEP, its only mode)
    or Gymnasium's sync vector env of CartPoles for the other modes."""
    if mode is AutoresetMode.NEXT_STEP:
        return gym.make_vec("CartPole-v1", num_envs, vectorization_mode="vector_entry_point")
    return gym.make_vec(
        "CartPole-v1", num_envs, vectorization_mode="sync", vector_kwargs={"autoreset_mode": mode}
    )


def run_parity(venv, references, k, steps, seed, action_of):
    """Step ``venv`` and the reference blocks side by side; compare everything."""
    obs, infos = venv.reset(seed=seed)
    expected = [ref.reset(seed=seed + index * k) for index, ref in enumerate(references)]
    np.testing.assert_array_equal(obs, np.concatenate([e[0] for e in expected]))
    rng = np.random.default_rng(seed)
    mode = venv.autoreset_mode
    ended = 0
    for _ in range(steps):
        actions = action_of(rng, venv.num_envs)
        got = venv.step(actions)
        outs = [ref.step(actions[i * k : (i + 1) * k]) for i, ref in enumerate(references)]
        for field in range(4):
            expected = np.concatenate([o[field] for o in outs])
            np.testing.assert_array_equal(got[field], expected)
            # the batched env's own dtypes, as gymnasium.make_vec gives them (CartPole's
            # rewards are float32; single envs' rewards are float64, as in Gymnasium)
            assert got[field].dtype == expected.dtype, (field, got[field].dtype)
        expected_infos: dict = {}
        for index, out in enumerate(outs):
            for offset, row in enumerate(split_infos(out[4], k) or [{}] * k):
                if row:
                    expected_infos = venv._add_info(expected_infos, row, index * k + offset)
        assert_same(got[4], expected_infos)
        done = got[2] | got[3]
        ended += int(done.sum())
        if mode is AutoresetMode.DISABLED and done.any():
            obs, _ = venv.reset(options={"reset_mask": done})
            for index, ref in enumerate(references):
                mask = done[index * k : (index + 1) * k]
                if mask.any():
                    ref.reset(options={"reset_mask": mask})
    assert ended > 0, "the run must cross episode ends"


@pytest.mark.parametrize("mode", MODES)
def test_batched_cartpole_matches_the_vector_env_stepped_directly(backend, mode):
    k = 4
    factory = partial(cartpole_blocks, mode=mode)
    references = [cartpole_blocks(k, mode) for _ in range(2)]
    with aiovec.make(
        factory, 2 * k, vectorization_mode="vector_entry_point", envs_per_block=k, backend=backend
    ) as venv:
        assert venv.autoreset_mode is mode
        assert venv.envs_per_block == k and venv.num_envs == 2 * k
        run_parity(venv, references, k, 250, 7, lambda rng, n: rng.integers(0, 2, n))


@pytest.mark.parametrize("mode", MODES)
def test_a_numpy_batched_env_matches_itself_stepped_directly(backend, mode):
    k = 3
    references = [PointMassVectorEnv(k, mode) for _ in range(3)]
    with aiovec.make(
        point_masses,
        3 * k,
        envs_per_block=k,
        backend=backend,
        env_kwargs={"autoreset_mode": mode},
    ) as venv:
        run_parity(
            venv,
            references,
            k,
            60,
            3,
            lambda rng, n: rng.uniform(-1, 1, (n, 1)).astype(np.float32),
        )


def test_the_registry_vector_entry_point_in_one_block_equals_make_vec():
    reference = gym.make_vec("CartPole-v1", 16, vectorization_mode="vector_entry_point")
    with aiovec.make(
        "CartPole-v1", 16, vectorization_mode="vector_entry_point", backend="inline"
    ) as venv:
        assert venv.envs_per_block == 16
        assert venv.spec.id == "CartPole-v1"
        run_parity(venv, [reference], 16, 200, 11, lambda rng, n: rng.integers(0, 2, n))


def test_dict_observations_of_blocks_reach_the_shared_buffers(backend):
    with aiovec.make(
        point_masses, 4, envs_per_block=2, backend=backend, env_kwargs={"dict_obs": True}
    ) as venv:
        obs, _ = venv.reset(seed=0)
        assert venv.observation_space.contains(obs)
        obs, *_ = venv.step(np.zeros((4, 1), np.float32))
        np.testing.assert_array_equal(obs["steps"], [1, 1, 1, 1])


def test_per_block_env_kwargs_and_attributes(backend):
    with aiovec.make(
        point_masses,
        6,
        envs_per_block=2,
        backend=backend,
        env_kwargs=lambda block: {"gain": float(block + 1)},
    ) as venv:
        assert venv.get_attr("gain") == (1.0, 1.0, 2.0, 2.0, 3.0, 3.0)
        venv.set_attr("gain", [5.0, 5.0, 6.0, 6.0, 7.0, 7.0])
        assert venv.get_attr("gain") == (5.0, 5.0, 6.0, 6.0, 7.0, 7.0)
        venv.set_attr("gain", 9.0, env_ids=[2, 3])
        assert venv.get_attr("gain") == (5.0, 5.0, 9.0, 9.0, 7.0, 7.0)
        with pytest.raises(ValueError, match="part of a batched env: envs 2..3"):
            venv.set_attr("gain", 1.0, env_ids=[2])
        with pytest.raises(ValueError, match="one value"):
            venv.set_attr("gain", [1.0, 2.0, 6.0, 6.0, 7.0, 7.0])
        assert venv.call("_observations")[0].shape == (2, 2)  # each row: its block's result


def test_env_kwargs_as_a_list_needs_one_dict_per_block():
    with pytest.raises(ValueError, match="2 entries for 3 blocks"):
        aiovec.make(point_masses, 6, envs_per_block=2, env_kwargs=[{}, {}], backend="inline")
    with aiovec.make(
        point_masses,
        4,
        envs_per_block=2,
        env_kwargs=[{"gain": 1.0}, {"gain": 2.0}],
        backend="inline",
    ) as venv:
        assert venv.get_attr("gain") == (1.0, 1.0, 2.0, 2.0)


def test_send_refuses_part_of_a_block_before_anything_is_sent(backend):
    with aiovec.make(point_masses, 4, envs_per_block=2, backend=backend) as venv:
        venv.reset(seed=0)

        async def main():
            with pytest.raises(ValueError, match=r"envs 2..3 form one block \(envs_per_block=2\)"):
                venv.send(np.zeros((3, 1), np.float32), env_ids=[0, 1, 2])
            venv.send(np.zeros((2, 1), np.float32), env_ids=[3, 2])  # whole, any order
            batch = await venv.recv()
            assert sorted(batch.env_ids.tolist()) == [2, 3]
            venv.send(np.zeros((4, 1), np.float32))
            batch = await venv.recv(max_envs=3)  # rounds down to whole blocks
            assert len(batch.env_ids) == 2
            rest = await venv.recv()
            assert sorted(batch.env_ids.tolist() + rest.env_ids.tolist()) == [0, 1, 2, 3]

        aiovec.run(main())


def test_recv_returns_fast_blocks_before_slow_ones():
    # Block 0 sleeps 0.4 s per step, blocks 1 and 2 none: first-ready at block level.
    with aiovec.make(
        point_masses,
        6,
        envs_per_block=2,
        backend="process",
        num_workers=3,
        env_kwargs=lambda block: {"step_sleep": 0.4 if block == 0 else 0.0},
    ) as venv:

        async def main():
            await venv.areset(seed=0)
            venv.send(np.zeros((6, 1), np.float32))
            first = await venv.recv(min_envs=4)
            assert sorted(first.env_ids.tolist()) == [2, 3, 4, 5]
            venv.send(np.zeros((4, 1), np.float32), env_ids=first.env_ids)
            again = await venv.recv(min_envs=4)  # the fast blocks step again meanwhile
            assert sorted(again.env_ids.tolist()) == [2, 3, 4, 5]
            slow = await venv.recv()
            assert sorted(slow.env_ids.tolist()) == [0, 1]

        aiovec.run(main())


def test_a_raising_block_is_one_error_naming_its_envs(backend):
    with aiovec.make(
        point_masses,
        4,
        envs_per_block=2,
        backend=backend,
        env_kwargs=[{}, {"fail_at": 3}],
    ) as venv:
        venv.reset(seed=0)
        actions = np.zeros((4, 1), np.float32)
        venv.step(actions)
        venv.step(actions)
        with pytest.raises(aiovec.EnvError, match=r"batched env of envs 2..3") as caught:
            venv.step(actions)
        assert caught.value.env_index == 2
        assert caught.value.operation == "step"  # the call, as for single envs
        assert isinstance(caught.value, RuntimeError)
        assert "block failed on step 3" in caught.value.worker_traceback
        # lossless through pickling (Ray, a multiprocessing queue)
        again = pickle.loads(pickle.dumps(caught.value))
        assert (str(again), again.operation) == (str(caught.value), "step")

        async def first_ready():  # the good block's results stay; the bad one: one error
            venv.send(actions)
            errors, good = 0, []
            while len(good) + 2 * errors < 4:
                try:
                    good += (await venv.recv()).env_ids.tolist()
                except aiovec.EnvError:
                    errors += 1
            assert errors == 1 and sorted(good) == [0, 1]

        venv.reset(seed=1)
        aiovec.run(first_ready())


def test_a_raising_block_is_restarted(backend):
    with aiovec.make(
        point_masses,
        4,
        envs_per_block=2,
        backend=backend,
        on_failure="restart",
        env_kwargs=[{}, {"fail_at": 2}],
    ) as venv:
        venv.reset(seed=0)
        actions = np.zeros((4, 1), np.float32)
        venv.step(actions)
        obs, rewards, terminated, truncated, infos = venv.step(actions)
        np.testing.assert_array_equal(truncated, [False, False, True, True])
        np.testing.assert_array_equal(infos["restarted"], [False, False, True, True])
        np.testing.assert_array_equal(infos["_restarted"], [False, False, True, True])
        assert "block failed on step 2" in infos["restart_reason"][2]
        np.testing.assert_array_equal(venv.restart_counts, [0, 0, 1, 1])
        # NEXT_STEP: the step after a truncation resets those rows, as for single envs.
        obs, rewards, terminated, truncated, infos = venv.step(actions)
        np.testing.assert_array_equal(rewards[2:], [0.0, 0.0])
        np.testing.assert_array_equal(truncated, [False] * 4)
        venv.step(actions)  # the rebuilt block steps on


def test_a_block_failing_its_reset_is_rebuilt_and_reset_again(tmp_path, backend):
    """Under the restart policy a block that raises in ``reset()`` is rebuilt and reset
    with the same seeds and options: the same observations as without the failure, its
    rows' infos flagged ``restarted``, counted in ``restart_counts``."""
    kwargs = {"reset_ledger": str(tmp_path / "failed")}
    made = partial(aiovec.make, point_masses, 4, envs_per_block=2, backend=backend)
    with made(on_failure="restart", env_kwargs=kwargs) as venv, made() as reference:
        observations, infos = venv.reset(seed=5, options={"fail": True})
        expected, _ = reference.reset(seed=5)
        np.testing.assert_array_equal(observations, expected)
        restarted = infos["_restarted"].tolist()  # the block that reset first failed
        assert restarted in ([True, True, False, False], [False, False, True, True])
        assert "server went away" in infos["restart_reason"][restarted.index(True)]
        assert venv.restart_counts.tolist() == [int(flag) for flag in restarted]
        _, _, _, truncated, infos = venv.step(np.zeros((4, 1), np.float32))
        assert not truncated.any() and "restarted" not in infos  # reported once


def test_a_step_after_a_block_reset_that_gave_up_replays_that_reset(tmp_path, backend):
    """A block whose reset fails past ``max_restarts`` is left rebuilt, not reset: the
    next step resets it (a restart) with the seeds and options of the reset that gave
    up, so its rows start where that reset would have put them."""
    failing = {"reset_ledger": str(tmp_path / "failed"), "reset_failures": 2}
    made = partial(aiovec.make, point_masses, 4, envs_per_block=2, backend=backend)
    with (
        made(on_failure="restart", max_restarts=1, env_kwargs=[{}, failing]) as venv,
        made() as reference,
    ):
        with pytest.raises(ConnectionError, match="server went away"):
            venv.reset(seed=5, options={"fail": True})
        expected, _ = reference.reset(seed=5)
        observations, _, _, truncated, infos = venv.step(np.zeros((4, 1), np.float32))
        np.testing.assert_array_equal(truncated, [False, False, True, True])
        np.testing.assert_array_equal(infos["_restarted"], [False, False, True, True])
        np.testing.assert_array_equal(observations[2:], expected[2:])


@pytest.mark.parametrize("fault", ["fail_at", "crash_at"])
def test_same_step_a_restarted_block_gives_its_rows_final_obs(fault):
    """A batched env in SAME_STEP mode: a restart truncates the block's rows, and each
    ended row has ``final_obs`` (its last observation) and ``final_info`` (the restart
    said), as single envs do; SAME_STEP code reading ``infos["final_obs"][i]`` for
    every truncated row used to get a KeyError."""
    with aiovec.make(
        point_masses,
        4,
        envs_per_block=2,
        backend="process",
        on_failure="restart",
        env_kwargs=[{"autoreset_mode": "SameStep"}, {"autoreset_mode": "SameStep", fault: 2}],
    ) as venv:
        venv.reset(seed=0)
        last, *_ = venv.step(np.zeros((4, 1), np.float32))
        _, _, _, truncated, infos = venv.step(np.zeros((4, 1), np.float32))
        # (rows 0 and 1 may end an episode of their own: a mass leaving [-1, 1])
        np.testing.assert_array_equal(truncated[2:], [True, True])
        np.testing.assert_array_equal(infos["_final_obs"][2:], [True, True])
        for row in (2, 3):
            np.testing.assert_array_equal(infos["final_obs"][row], last[row])
            assert infos["final_info"]["restarted"][row]


def test_a_crashing_worker_of_blocks(no_leaks):
    env_kwargs = [{}, {"crash_at": 2}]
    with aiovec.make(
        point_masses, 4, envs_per_block=2, backend="process", env_kwargs=env_kwargs
    ) as venv:
        venv.reset(seed=0)
        venv.step(np.zeros((4, 1), np.float32))
        with pytest.raises(aiovec.WorkerCrashedError, match=r"envs \[2, 3\]"):
            venv.step(np.zeros((4, 1), np.float32))
    with aiovec.make(
        point_masses,
        4,
        envs_per_block=2,
        backend="process",
        on_failure="restart",
        env_kwargs=[{}, {"crash_at": 2}],
    ) as venv:
        venv.reset(seed=0)
        venv.step(np.zeros((4, 1), np.float32))
        *_, truncated, infos = venv.step(np.zeros((4, 1), np.float32))
        np.testing.assert_array_equal(truncated, [False, False, True, True])
        np.testing.assert_array_equal(infos["_restarted"], [False, False, True, True])
        assert venv.worker_restarts == (0, 1)


def test_async_api_and_partial_resets(backend):
    with aiovec.make(
        point_masses,
        4,
        envs_per_block=2,
        backend=backend,
        env_kwargs={"autoreset_mode": "Disabled"},
    ) as venv:

        async def main():
            obs, _ = await venv.areset(seed=0)
            obs2, *_ = await venv.astep(np.zeros((4, 1), np.float32))
            assert not np.array_equal(obs, obs2)
            # DISABLED mode: a block must honour reset_mask, so a partial reset is allowed.
            obs3, _ = await venv.areset(options={"reset_mask": np.array([0, 1, 0, 0], bool)})
            np.testing.assert_array_equal(obs3[[0, 2, 3]], obs2[[0, 2, 3]])
            assert not np.array_equal(obs3[1], obs2[1])

        aiovec.run(main())
    with aiovec.make(point_masses, 4, envs_per_block=2, backend=backend) as venv:
        venv.reset(seed=0)
        with pytest.raises(ValueError, match="part of a batched env"):
            venv.reset(options={"reset_mask": np.array([0, 1, 0, 0], bool)})
        obs, _ = venv.reset(options={"reset_mask": np.array([0, 0, 1, 1], bool)})


def test_bad_batched_env_arguments_get_clear_errors():
    with pytest.raises(ValueError, match="divides num_envs=6"):
        aiovec.make(point_masses, 6, envs_per_block=4)
    with pytest.raises(ValueError, match="no vector_entry_point"):
        aiovec.make("Pendulum-v1", 4, vectorization_mode="vector_entry_point")
    with pytest.raises(ValueError, match="vectorization_mode must be"):
        aiovec.make("CartPole-v1", 4, vectorization_mode="threads")
    with pytest.raises(aiovec.EnvError, match="not a gymnasium.vector.VectorEnv"):
        aiovec.make(lambda num_envs: gym.make("CartPole-v1"), 4, envs_per_block=2, backend="inline")
    with pytest.raises(aiovec.EnvError, match="VectorEnv of 3 envs, but envs_per_block=2"):
        aiovec.make(lambda num_envs: PointMassVectorEnv(3), 4, envs_per_block=2, backend="inline")
    with pytest.raises(ValueError, match="autoreset in AutoresetMode.NEXT_STEP mode"):
        aiovec.make(point_masses, 4, envs_per_block=2, backend="inline", autoreset_mode="SameStep")
    with aiovec.VecEnv(
        [partial(PointMassVectorEnv, 2)], envs_per_block=2, backend="coroutine"
    ) as venv:  # blocking batched envs on the loop work too (stepped on its thread)
        venv.reset(seed=0)
        venv.step(np.zeros((2, 1), np.float32))


def test_auto_picks_a_layout_of_whole_blocks():
    with aiovec.make("CartPole-v1", 64, vectorization_mode="vector_entry_point") as venv:
        assert venv.num_envs == 64 and 64 % venv.envs_per_block == 0
        assert venv.backend in ("inline", "process")
        venv.reset(seed=0)
        venv.step(np.zeros(64, np.int64))
    with aiovec.make(point_masses, 4, envs_per_block=2) as venv:  # explicit blocks: workers
        assert venv.backend == "process" and venv.num_workers == 2


def test_render_of_a_block_is_split_per_env(backend):
    with aiovec.make(
        point_masses, 4, envs_per_block=2, backend=backend, render_mode="rgb_array"
    ) as venv:
        assert venv.render_mode == "rgb_array"
        venv.reset(seed=0)
        frames = venv.render()
        assert len(frames) == 4 and frames[0].shape == (8, 8, 3)


def test_closing_blocks_leaves_nothing_behind(no_leaks):
    venv = aiovec.make(point_masses, 8, envs_per_block=4, backend="process")
    venv.reset(seed=0)
    venv.step(np.zeros((8, 1), np.float32))
    venv.close()


def test_split_infos_inverts_gymnasium_batching():
    env = PointMassVectorEnv(3, AutoresetMode.SAME_STEP, max_steps=1)
    env.reset(seed=0)
    *_, infos = env.step(np.zeros((3, 1), np.float32))
    rows = split_infos(infos, 3)
    assert all(set(row) == {"final_obs", "final_info"} for row in rows)
    assert rows[1]["final_info"] == {"steps": 1}
    assert split_infos({}, 3) is None
    asyncio.run(asyncio.sleep(0))  # nothing left running


class DtypeRecorder(PointMassVectorEnv):
    """Records the dtype of the actions it receives."""

    def step(self, actions):
        self.last_dtype = np.asarray(actions).dtype
        return super().step(np.asarray(actions, np.float32))


def test_blocks_receive_actions_as_the_caller_passed_them(backend):
    with aiovec.make(
        lambda num_envs: DtypeRecorder(num_envs), 4, envs_per_block=2, backend=backend
    ) as venv:
        venv.reset(seed=0)
        venv.step(np.zeros((4, 1), np.float32))
        assert venv.get_attr("last_dtype")[0] == np.float32
        venv.step(np.zeros((4, 1), np.float64))  # no silent conversion to the space's dtype
        assert venv.get_attr("last_dtype") == (np.dtype(np.float64),) * 4


class WordsVectorEnv(PointMassVectorEnv):
    """Text observations (not in shared memory: they travel in the replies)."""

    def __init__(self, num_envs, **kwargs):
        super().__init__(num_envs, **kwargs)
        self.single_observation_space = gym.spaces.Text(12)
        self.observation_space = gym.vector.utils.batch_space(
            self.single_observation_space, num_envs
        )

    def _observations(self):
        return tuple(f"x={position:+.2f}" for position in self.state[:, 0])


def test_observations_outside_shared_memory_travel_per_row(backend):
    with aiovec.make(
        lambda num_envs: WordsVectorEnv(num_envs), 4, envs_per_block=2, backend=backend
    ) as venv:
        obs, _ = venv.reset(seed=0)
        assert len(obs) == 4 and all(word.startswith("x=") for word in obs)
        reference = [WordsVectorEnv(2), WordsVectorEnv(2)]
        expected = reference[0].reset(seed=0)[0] + reference[1].reset(seed=2)[0]
        assert obs == expected
        obs, *_ = venv.step(np.ones((4, 1), np.float32))
        assert obs == reference[0].step(np.ones((2, 1)))[0] + reference[1].step(np.ones((2, 1)))[0]


def test_blocks_of_one_env_are_blocks(backend):
    with aiovec.make(point_masses, 3, envs_per_block=1, backend=backend) as venv:
        assert venv.envs_per_block == 1
        venv.reset(seed=0)
        venv.step(np.zeros((3, 1), np.float32))
    # Layouts aiovec picks itself may have one env per block (2 envs on 2 workers).
    with aiovec.make(
        "CartPole-v1", 2, vectorization_mode="vector_entry_point", backend="process",
        num_workers=2,
    ) as venv:  # fmt: skip
        assert venv.envs_per_block == 1 and venv.num_workers == 2
        venv.reset(seed=0)
        venv.step(np.zeros(2, np.int64))
    with aiovec.make("CartPole-v1", 1, vectorization_mode="vector_entry_point") as venv:
        venv.reset(seed=0)
        assert venv.step(np.zeros(1, np.int64))[0].shape == (1, 4)


def test_blocks_with_different_autoreset_modes_are_refused():
    modes = [{"autoreset_mode": "NextStep"}, {"autoreset_mode": "SameStep"}]
    with pytest.raises(ValueError, match="different modes"):
        aiovec.make(point_masses, 4, envs_per_block=2, env_kwargs=modes, backend="inline")


def test_errors_name_the_block_at_build_and_step_time():
    def failing(num_envs, index=0):
        if index == 1:
            raise OSError("no simulator licence")
        return PointMassVectorEnv(num_envs)

    with pytest.raises(
        aiovec.EnvError,
        match=r"env 2 raised OSError in make\(\) of the batched env of envs 2..3: no simulator",
    ):
        aiovec.make(
            failing, 4, envs_per_block=2, env_kwargs=lambda b: {"index": b}, backend="inline"
        )
    with aiovec.make(
        point_masses, 4, envs_per_block=2, env_kwargs=[{}, {"fail_at": 1}], backend="inline"
    ) as venv:
        venv.reset(seed=0)
        with pytest.raises(
            aiovec.EnvError, match=r"in step\(\) of the batched env of envs 2..3: block failed"
        ):
            venv.step(np.zeros((4, 1), np.float32))


class MisshapenVectorEnv(PointMassVectorEnv):
    def __init__(self, num_envs, broken="observations"):
        super().__init__(num_envs)
        self.broken = broken

    def step(self, actions):
        obs, rewards, terminated, truncated, infos = super().step(actions)
        if self.broken == "observations":
            obs = obs[:, :1]  # would broadcast into the (k, 2) rows
        elif self.broken == "rewards":
            rewards = rewards[:1]
        elif self.broken == "scalar reward":
            rewards = float(rewards.sum())  # would be every row's
        elif self.broken == "scalar termination":
            terminated = bool(np.any(terminated))  # an np.any(dones) slip
        else:
            truncated = np.True_
        return obs, rewards, terminated, truncated, infos


@pytest.mark.parametrize(
    "broken",
    ["observations", "rewards", "scalar reward", "scalar termination", "scalar truncation"],
)
def test_results_of_the_wrong_shape_are_errors_not_broadcast(backend, broken):
    with aiovec.make(
        lambda num_envs, broken: MisshapenVectorEnv(num_envs, broken), 4, envs_per_block=2,
        backend=backend, env_kwargs={"broken": broken},
    ) as venv:  # fmt: skip
        venv.reset(seed=0)
        with pytest.raises(aiovec.EnvError, match="shape"):
            venv.step(np.zeros((4, 1), np.float32))


class MisshapenInfoVectorEnv(PointMassVectorEnv):
    def step(self, actions):
        obs, rewards, terminated, truncated, _ = super().step(actions)
        rows = self.num_envs + 1  # one row too many: whose is which?
        return obs, rewards, terminated, truncated, {"x": np.zeros(rows), "_x": np.ones(rows, bool)}


def test_infos_with_masks_of_the_wrong_length_are_an_error_naming_the_key(backend):
    with aiovec.make(
        lambda num_envs: MisshapenInfoVectorEnv(num_envs), 4, envs_per_block=2, backend=backend
    ) as venv:
        venv.reset(seed=0)
        with pytest.raises(aiovec.EnvError, match=r"_x.*shape \(3,\), not \(2,\)"):
            venv.step(np.zeros((4, 1), np.float32))


class ArrayRenderVectorEnv(PointMassVectorEnv):
    def render(self):
        return np.stack(super().render())  # one (k, H, W, 3) array


def test_render_as_one_array_is_split_per_env():
    with aiovec.make(
        lambda num_envs: ArrayRenderVectorEnv(num_envs, render_mode="rgb_array"), 4,
        envs_per_block=2, backend="inline",
    ) as venv:  # fmt: skip
        venv.reset(seed=0)
        frames = venv.render()
        assert len(frames) == 4 and frames[3].shape == (8, 8, 3)


@pytest.mark.parametrize("mode", MODES)
def test_async_batched_envs_on_the_coroutine_backend_match_the_sync_ones(mode):
    from tests.batched import async_point_masses

    k = 3
    references = [PointMassVectorEnv(k, mode) for _ in range(2)]
    with aiovec.make(
        async_point_masses, 2 * k, envs_per_block=k, env_kwargs={"autoreset_mode": mode}
    ) as venv:
        assert venv.backend == "coroutine"  # auto: async batched envs run as coroutines
        run_parity(
            venv, references, k, 60, 3, lambda rng, n: rng.uniform(-1, 1, (n, 1)).astype(np.float32)
        )
        assert venv.get_attr("gain") == (1.0,) * 6


def test_async_blocks_answer_first_ready_and_fail_and_restart_alone():
    from tests.batched import async_point_masses

    with aiovec.make(
        async_point_masses,
        6,
        envs_per_block=2,
        backend="coroutine",
        on_failure="restart",
        env_kwargs=[{"await_time": 0.3}, {}, {"fail_at": 2}],
    ) as venv:

        async def main():
            await venv.areset(seed=0)
            actions = np.zeros((6, 1), np.float32)
            venv.send(actions)
            first = await venv.recv(min_envs=4)  # the awaiting block comes last
            assert sorted(first.env_ids.tolist()) == [2, 3, 4, 5]
            venv.send(actions[:4], env_ids=first.env_ids)
            second = await venv.recv(min_envs=4)
            by_row = dict(zip(second.env_ids.tolist(), second.truncations.tolist()))
            assert by_row[4] and by_row[5] and "restarted" in second.infos  # block 2 rebuilt
            assert sorted((await venv.recv()).env_ids.tolist()) == [0, 1]

        aiovec.run(main())
        assert venv.restart_counts.tolist() == [0, 0, 0, 0, 1, 1]


def test_async_batched_envs_elsewhere_get_a_clear_error():
    from tests.batched import async_point_masses

    for backend in ("inline", "process"):  # refused when built, naming the backend to use
        with pytest.raises(aiovec.EnvError, match="async batched envs run on backend='coro"):
            aiovec.make(async_point_masses, 4, envs_per_block=2, backend=backend)
    fns = [partial(async_point_masses, 2)] * 2
    with aiovec.VecEnv(fns, envs_per_block=2, backend="auto") as venv:
        assert venv.backend == "coroutine"  # VecEnv's auto finds them too
    with pytest.raises(ValueError, match="step_timeout is not enforced"):
        aiovec.make(async_point_masses, 4, envs_per_block=2, backend="coroutine", step_timeout=1)


def test_a_loop_that_ends_with_async_block_steps_in_flight_fails_them_clearly():
    import asyncio

    from tests.batched import async_point_masses

    with aiovec.make(
        async_point_masses, 4, envs_per_block=2, backend="coroutine",
        env_kwargs={"await_time": 5.0},
    ) as venv:  # fmt: skip

        async def start():
            await venv.areset(seed=0)
            venv.send(np.zeros((4, 1), np.float32))  # then asyncio.run returns

        asyncio.run(start())

        async def collect():
            with pytest.raises(aiovec.EnvError, match="event loop running this async env stopped"):
                await asyncio.wait_for(venv.recv(), 10)

        asyncio.run(collect())  # an error, never a hang


class CancelledInsideVectorEnv(PointMassVectorEnv):
    async def reset(self, *, seed=None, options=None):
        return super().reset(seed=seed, options=options)

    async def step(self, actions):
        future = asyncio.get_running_loop().create_future()
        future.cancel()  # e.g. a transport cancelled the request
        await future


def test_a_cancellation_inside_an_async_block_is_that_block_s_error():
    with aiovec.make(
        lambda num_envs: CancelledInsideVectorEnv(num_envs), 2, envs_per_block=2,
        backend="coroutine",
    ) as venv:  # fmt: skip

        async def main():
            await venv.areset(seed=0)
            with pytest.raises(aiovec.EnvError, match="cancelled from inside"):
                await asyncio.wait_for(venv.astep(np.zeros((2, 1), np.float32)), 10)

        aiovec.run(main())


def test_set_attr_with_different_values_in_a_block_changes_nothing(backend):
    with aiovec.make(point_masses, 6, envs_per_block=2, backend=backend) as venv:
        with pytest.raises(ValueError, match=r"envs 2..3\) different values"):
            venv.set_attr("gain", [5.0, 5.0, 6.0, 7.0, 8.0, 8.0])
        assert venv.get_attr("gain") == (1.0,) * 6  # no block was changed


class RecordingBlock(gym.vector.VectorEnv):
    """A block of 2 rows that records each batch of actions it is stepped with."""

    def __init__(self, action_space: gym.spaces.Space) -> None:
        from gymnasium.vector.utils import batch_space

        self.num_envs = 2
        self.single_action_space = action_space
        self.action_space = batch_space(action_space, 2)
        self.single_observation_space = gym.spaces.Discrete(2)
        self.observation_space = batch_space(self.single_observation_space, 2)
        self.metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}
        self.received: list = []

    def reset(self, *, seed=None, options=None):
        return np.zeros(2, np.int64), {}

    def step(self, actions):
        self.received.append((actions.dtype.name, actions.tolist()))
        return np.zeros(2, np.int64), np.zeros(2), np.zeros(2, bool), np.zeros(2, bool), {}


@pytest.mark.parametrize("backend", ["inline", "process"])
@pytest.mark.parametrize(
    "space, actions, rows",
    [
        (gym.spaces.Box(0, 1, (1,)), [0.5, 0.25, 0.125, 1.0], ("float64", [[0.5], [0.25]])),
        (
            gym.spaces.Box(0, 1, (1,)),
            np.array([0.5, 0.25, 0.125, 1.0], np.float32),
            ("float32", [[0.5], [0.25]]),
        ),
        (gym.spaces.MultiDiscrete([3]), [2, 1, 0, 1], ("int64", [[2], [1]])),
        (gym.spaces.MultiBinary(1), [1, 0, 0, 1], ("int64", [[1], [0]])),
        (gym.spaces.Discrete(2), [1.0, 0.0, 1.0, 1.0], ("float64", [1.0, 0.0])),
        (gym.spaces.Discrete(2), [1, 0, 1, 1], ("int64", [1, 0])),
    ],
    ids=["flat-list", "flat-array", "multidiscrete", "multibinary", "whole-floats", "ints"],
)
def test_every_action_form_the_check_takes_reaches_a_block_as_its_batch(
    backend, space, actions, rows
):
    # Forms a single env takes as passed (one number per env, whole floats, Python
    # lists) reach a block as an array of its batched action space's shape, in the
    # caller's dtype; they were refused by aiovec's own stacking (and blamed on the env).
    options = {"num_workers": 1} if backend == "process" else {}
    with aiovec.VecEnv(
        [partial(RecordingBlock, space)] * 2, envs_per_block=2, backend=backend, **options
    ) as venv:
        venv.reset(seed=0)
        venv.step(actions)
        assert [received[-1] for received in venv.get_attr("received")[::2]][0] == rows


def test_actions_a_block_cannot_take_fail_that_step_and_never_restart_it(monkeypatch):
    # Batching the caller's actions is aiovec's work, not the block's: a failure there
    # is reported for that step, and on_failure="restart" does not throw the episodes
    # away (it used to restart the block, answering restarted=True, silently).
    from aiovec._worker import blocks

    def refuse(space, values):
        raise ValueError("these actions cannot be batched")

    with aiovec.VecEnv(
        [partial(RecordingBlock, gym.spaces.Discrete(2))] * 2,
        envs_per_block=2,
        backend="inline",
        on_failure="restart",
    ) as venv:
        venv.reset(seed=0)
        venv.step([1, 0, 1, 1])  # Python values: by value, through stack_actions
        monkeypatch.setattr(blocks, "stack_actions", refuse)
        with pytest.raises(ValueError, match="cannot be batched"):
            venv.step([1, 0, 1, 1])
        monkeypatch.undo()
        _, _, _, truncations, infos = venv.step([0, 1, 0, 1])
        assert not truncations.any() and "restarted" not in infos
        assert venv.stats().env_restarts == 0
        assert [len(received) for received in venv.get_attr("received")[::2]] == [2, 2]


class _BlockReturning(gym.vector.VectorEnv):
    """A batched env of 2 whose steps return ``observations`` (set by the test)."""

    def __init__(self, space):
        self.num_envs = 2
        self.single_observation_space = space
        self.observation_space = gym.vector.utils.batch_space(space, 2)
        self.single_action_space = gym.spaces.Discrete(2)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, 2)
        self.metadata = {"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}
        self.observations = None

    def reset(self, *, seed=None, options=None):
        return gym.vector.utils.create_empty_array(self.single_observation_space, 2), {}

    def step(self, actions):
        zeros = np.zeros(2)
        return self.observations, zeros, zeros.astype(bool), zeros.astype(bool), {}


_I8 = gym.spaces.Box(-128, 127, (1,), np.int8)


@pytest.mark.parametrize(
    ("space", "given", "taken"),
    [
        (_I8, np.array([[3.0], [1.0]]), [[3], [1]]),  # whole floats, as for single envs
        (gym.spaces.Dict(a=_I8), {"a": np.array([[1], [2]]), "extra": 0}, [[1], [2]]),
        (_I8, np.array([[300], [1]]), None),  # would wrap to 44: refused
        (_I8, np.array([[0.5], [1.0]]), None),
    ],
)
def test_a_block_takes_the_observations_a_single_env_would(space, given, taken):
    with aiovec.VecEnv(
        [partial(_BlockReturning, space)], envs_per_block=2, backend="inline"
    ) as venv:
        venv.reset(seed=0)
        venv.set_attr("observations", given)
        if taken is None:
            with pytest.raises(aiovec.EnvError, match="cannot hold"):
                venv.step(np.array([0, 0]))
            return
        observations, *_ = venv.step(np.array([0, 0]))
        observations = observations["a"] if isinstance(observations, dict) else observations
        assert observations.tolist() == taken


async def test_first_ready_batches_of_batched_envs_keep_their_reward_dtype(backend):
    reference = gym.make_vec("CartPole-v1", 2, vectorization_mode="vector_entry_point")
    reference.reset(seed=0)
    dtype = reference.step(np.zeros(2, dtype=np.int64))[1].dtype
    reference.close()
    async with aiovec.make(
        "CartPole-v1", 4, vectorization_mode="vector_entry_point", envs_per_block=2,
        backend=backend,
    ) as venv:  # fmt: skip
        await venv.areset(seed=0)
        venv.send(np.zeros(4, dtype=np.int64))
        for _ in range(6):
            batch = await venv.recv()
            assert batch.rewards.dtype == dtype
            venv.send(np.zeros(len(batch.env_ids), dtype=np.int64), batch.env_ids)


async def test_recv_refuses_a_min_envs_that_whole_blocks_cannot_meet_within_max_envs():
    """Results come in whole blocks and ``max_envs`` rounds down to them: a
    ``min_envs`` above that rounded bound is refused (it returned fewer than
    ``min_envs``, silently); one that whole blocks can meet is kept."""
    async with aiovec.make(point_masses, 8, envs_per_block=2, backend="inline") as venv:
        await venv.areset(seed=0)
        venv.send(np.zeros((8, 1), np.float32))
        with pytest.raises(ValueError, match=r"min_envs=3.*max_envs=3.*2 envs per block"):
            await venv.recv(3, min_envs=3)
        batch = await venv.recv(5, min_envs=3)  # two whole blocks: 4
        assert len(batch.env_ids) == 4
        batch = await venv.recv(min_envs=3)
        assert len(batch.env_ids) == 4


@pytest.mark.parametrize("backend", ["inline", "process"])
def test_per_env_reset_options_holding_arrays_reach_each_block(backend):
    """One options dict holding an array, given to every env (the same dict, or equal
    ones): each block takes it (comparing them raised "truth value of an array is
    ambiguous" once blocks got copies)."""
    goal = np.array([1.0, 2.0])
    with aiovec.make(point_masses, 4, envs_per_block=2, backend=backend) as venv:
        venv.reset(seed=0, options=[{"goal": goal}] * 4)
        venv.reset(seed=0, options=[{"goal": goal.copy()} for _ in range(4)])
