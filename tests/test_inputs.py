"""Whatever the caller passes is checked before anything is sent: a bad argument is an
error at once, never a dead worker or envs left busy."""

from __future__ import annotations

import os
import sys
import threading
import types
from functools import partial

import gymnasium as gym
import numpy as np
import pytest

import aiovec
from tests.envs import CounterEnv, SpacesEnv


def spaces_envs(count: int) -> list:
    return [SpacesEnv for _ in range(count)]


def test_numpy_integer_seeds_are_seeds(backend):
    kwargs = {"num_workers": 2} if backend == "process" else {}
    with aiovec.VecEnv(spaces_envs(4), backend=backend, **kwargs) as venv:
        expected, _ = venv.reset(seed=[0, 1, 2, 3])
        observations, _ = venv.reset(seed=[0, 1, np.int64(2), np.uint8(3)])
        np.testing.assert_array_equal(observations, expected)
        observations, _ = venv.reset(seed=np.arange(4))
        np.testing.assert_array_equal(observations, expected)
        observations, _ = venv.reset(seed=np.int32(0))
        np.testing.assert_array_equal(observations, expected)


@pytest.mark.parametrize(
    "seed",
    [
        1.5,
        "7",
        [0, 1, 2.0, 3],
        [0, 1, "2", 3],
        [0, -1, 2, 3],
        -5,
        {"a": 1},
        np.True_,
    ],
)
def test_bad_seeds_are_refused_before_anything_is_sent(backend, seed):
    kwargs = {"num_workers": 2} if backend == "process" else {}
    with aiovec.VecEnv(spaces_envs(4), backend=backend, **kwargs) as venv:
        venv.reset(seed=0)
        # Caught as Gymnasium's envs raise it (gymnasium.error.Error), and as a
        # ValueError/TypeError.
        with pytest.raises(gym.error.Error, match="seed") as caught:
            venv.reset(seed=seed)
        assert isinstance(caught.value, aiovec.InvalidSeedError)
        assert isinstance(caught.value, (ValueError, TypeError))
        assert venv._scheduler.num_busy == 0
        observations, _ = venv.reset(seed=0)  # every env still idle and healthy
        assert observations.shape[0] == 4


def test_seeds_beyond_64_bits_seed_as_gymnasiums_envs_take_them(backend):
    # A 128-bit seed (numpy's SeedSequence().entropy) is what Gymnasium's vector envs
    # take: env i gets seed + i, each env's own reset takes any non-negative int.
    big = 0x1234_5678_9ABC_DEF0_0FED_CBA9_8765_4321  # as SeedSequence().entropy draws them
    seeds = [big, None, 2**64, 3]
    kwargs = {"num_workers": 2} if backend == "process" else {}
    reference = gym.vector.SyncVectorEnv(spaces_envs(4))
    with aiovec.VecEnv(spaces_envs(4), backend=backend, **kwargs) as venv:
        for seed in (big, seeds):
            observations, _ = venv.reset(seed=seed)
            expected, _ = reference.reset(seed=seed)
            if seed is seeds:  # the env seeded with None: anything goes
                observations, expected = observations[[0, 2, 3]], expected[[0, 2, 3]]
            np.testing.assert_array_equal(observations, expected)
    reference.close()


def test_a_bool_seed_is_the_int_it_equals_as_in_gymnasium():
    with aiovec.VecEnv(spaces_envs(2), backend="inline") as venv:
        expected, _ = venv.reset(seed=1)
        np.testing.assert_array_equal(venv.reset(seed=True)[0], expected)
        expected, _ = venv.reset(seed=[1, 0])
        np.testing.assert_array_equal(venv.reset(seed=[True, False])[0], expected)


def test_a_seed_list_of_the_wrong_length_is_gymnasiums_assertion_error():
    with (
        aiovec.VecEnv(spaces_envs(2), backend="inline") as venv,
        pytest.raises(AssertionError, match="length must match num_envs=2"),
    ):
        venv.reset(seed=[0, 1, 2])


@pytest.mark.parametrize(
    "bad_call",
    [
        lambda venv: venv.call(None),
        lambda venv: venv.get_attr(3),
        lambda venv: venv.set_attr(3, 1),
        lambda venv: venv.call(b"env_index"),
    ],
)
def test_bad_names_are_type_errors_and_the_workers_live_on(backend, bad_call):
    with aiovec.VecEnv([partial(CounterEnv, i) for i in range(2)], backend=backend) as venv:
        venv.reset()
        with pytest.raises(TypeError, match="name of an env attribute"):
            bad_call(venv)
        assert venv.call("env_index") == (0, 1)


def test_an_argument_that_cannot_be_pickled_fails_before_any_worker_is_sent_it():
    env_fns = [partial(CounterEnv, i) for i in range(4)]
    with aiovec.VecEnv(env_fns, num_workers=2) as venv:
        venv.reset()
        with pytest.raises(Exception, match="lock"):
            venv.call("scale", threading.Lock())
        assert venv._scheduler.num_busy == 0
        observations, *_ = venv.step(np.zeros(4, dtype=np.int64))
        assert observations[:, 1].tolist() == [1, 1, 1, 1]


def test_an_argument_the_worker_cannot_unpickle_is_the_callers_error(monkeypatch):
    """A value of a class that only exists in the agent (its module cannot be imported
    by the worker): the call fails with a TypeError naming the problem; the worker and
    its envs live on."""
    ghost = types.ModuleType("aiovec_ghost_module")

    class Level:
        def __init__(self, value):
            self.value = value

    Level.__module__ = ghost.__name__
    Level.__qualname__ = "Level"
    ghost.Level = Level
    monkeypatch.setitem(sys.modules, ghost.__name__, ghost)
    env_fns = [partial(CounterEnv, i) for i in range(2)]
    with aiovec.VecEnv(env_fns, num_workers=2) as venv:
        venv.reset()
        with pytest.raises(TypeError, match="could not be unpickled"):
            venv.set_attr("level", Level(3))
        assert venv.call("env_index") == (0, 1)
        assert venv.worker_restarts == (0, 0)


def test_a_per_env_value_the_worker_cannot_unpickle_is_named_with_its_env(monkeypatch):
    """set_attr with one value per env, env 3's of a class the worker cannot import:
    the error says it was env 3's value (it blamed env 2, the first env of its worker,
    for env 3's value)."""
    ghost = types.ModuleType("aiovec_ghost_module")

    class Level:
        pass

    Level.__module__ = ghost.__name__
    Level.__qualname__ = "Level"
    ghost.Level = Level
    monkeypatch.setitem(sys.modules, ghost.__name__, ghost)
    env_fns = [partial(CounterEnv, i) for i in range(4)]
    with aiovec.VecEnv(env_fns, num_workers=2) as venv:  # envs [0, 1] and [2, 3]
        venv.reset()
        with pytest.raises(TypeError) as caught:
            venv.set_attr("level", [1, 2, 3, Level()])
        assert caught.value.env_index == 3  # env 3's own error is the one raised
        assert "env 3's value for set_attr() could not be unpickled" in str(caught.value)
        assert "not run on envs [2]" in str(caught.value)
        venv.set_attr("level", [1, 2, 3, 4])  # the worker goes on
        assert venv.get_attr("level") == (1, 2, 3, 4)


class _ActionKeeper(__import__("gymnasium").Env):
    """Keeps every action it was given, to check later that none changed under it."""

    def __init__(self):
        import gymnasium as gym

        self.observation_space = gym.spaces.Box(-1, 1, (2,))
        self.action_space = gym.spaces.Box(-1, 1, (3,))
        self.kept = []

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, dtype=np.float32), {}

    def step(self, action):
        self.kept.append(action)
        return np.zeros(2, dtype=np.float32), 0.0, False, False, {}


def test_an_env_may_keep_the_actions_it_was_given(backend):
    """Each env gets an action of its own: later steps (which write new actions into the
    shared buffers) never change one it kept."""
    with aiovec.VecEnv([_ActionKeeper] * 3, backend=backend) as venv:
        venv.reset(seed=0)
        sent = [
            (step / 10 + np.arange(9).reshape(3, 3) / 100).astype(np.float32) for step in range(4)
        ]
        for actions in sent:
            venv.step(actions)
        for env_id, kept in enumerate(venv.get_attr("kept")):
            np.testing.assert_array_equal(np.stack(kept), np.stack([a[env_id] for a in sent]))


@pytest.mark.parametrize("bad", [0, -1, True, 1.0, 2.5, "2", float("nan")], ids=repr)
def test_recv_refuses_a_max_envs_that_is_not_a_positive_int(bad):
    with aiovec.make("CartPole-v1", 2, backend="inline") as venv:

        async def main():
            await venv.areset(seed=0)
            venv.send(np.zeros(2, dtype=np.int64))
            with pytest.raises(ValueError, match="max_envs must be a positive int"):
                await venv.recv(max_envs=bad)
            with pytest.raises(ValueError, match="max_envs must be a positive int"):
                venv.recv_nowait(max_envs=bad)
            batch = await venv.recv(max_envs=np.int64(2))  # numpy ints are ints; nothing lost
            assert sorted(batch.env_ids.tolist()) == [0, 1]

        aiovec.run(main())


NAN = float("nan")


@pytest.mark.parametrize(
    "option, bad",
    [
        ("step_timeout", NAN),
        ("step_timeout", "1"),
        ("step_timeout", True),
        ("close_timeout", NAN),
        ("close_timeout", -1),
        ("startup_timeout", NAN),
        ("startup_timeout", 0),
        ("spin", NAN),
        ("spin", -0.5),
        ("max_restarts", -1),
        ("max_restarts", 1.5),
        ("num_workers", True),
        ("num_workers", "2"),
        ("num_workers", 2.5),
        ("inline_envs", -1),
        ("context", ""),
    ],
    ids=repr,
)
def test_bad_construction_numbers_are_refused_naming_the_argument(option, bad):
    """Refused before anything starts, with the argument's name and what it takes (NaN
    used to pass and fail later inside the poller, leaving envs busy)."""
    from aiovec.bench.system import descendant_pids

    before = set(descendant_pids(os.getpid()))  # a zygote of earlier tests may be there
    with pytest.raises((ValueError, TypeError), match=rf"\b{option}\b") as caught:
        aiovec.VecEnv([CounterEnv, CounterEnv], backend="process", **{option: bad})
    assert "got" in str(caught.value)
    assert set(descendant_pids(os.getpid())) <= before


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"min_envs": 0}, "min_envs must be an int >= 1"),
        ({"min_envs": NAN}, "min_envs must be an int >= 1"),
        ({"min_envs": 3, "max_envs": 2}, "min_envs=3 is more than max_envs=2"),
        ({"timeout": NAN}, "timeout must be"),
        ({"timeout": "1"}, "timeout must be"),
    ],
    ids=repr,
)
def test_recv_refuses_bad_counts_and_timeouts_and_loses_nothing(kwargs, message):
    with aiovec.make("CartPole-v1", 2, backend="inline") as venv:

        async def main():
            await venv.areset(seed=0)
            venv.send(np.zeros(2, dtype=np.int64))
            with pytest.raises((ValueError, TypeError), match=message):
                await venv.recv(**kwargs)
            batch = await venv.recv(min_envs=2)
            assert sorted(batch.env_ids.tolist()) == [0, 1]

        aiovec.run(main())


def test_a_nan_wait_timeout_is_refused_and_the_step_can_still_be_waited_for():
    with aiovec.VecEnv([CounterEnv, CounterEnv], backend="process") as venv:
        venv.reset(seed=0)
        venv.step_async(np.zeros(2, dtype=np.int64))
        with pytest.raises(ValueError, match="timeout must be"):
            venv.step_wait(timeout=NAN)
        observations, *_ = venv.step_wait(timeout=10)
        assert observations[:, 1].tolist() == [1, 1]


def test_numpy_and_infinite_times_are_taken_everywhere():
    """numpy floats of any precision and ``inf`` (no limit) pass the checks, so they
    must work too: a float32 timeout used to wedge the vector env inside the poller, and
    an infinite close or startup timeout overflowed a clock."""
    inf = float("inf")
    options = {
        "step_timeout": np.float32(30),
        "close_timeout": inf,
        "startup_timeout": inf,
        "spin": np.float16(0.001),
    }
    venv = aiovec.VecEnv([CounterEnv, CounterEnv], backend="process", **options)
    venv.reset(seed=0)
    venv.step_async(np.zeros(2, dtype=np.int64))
    observations, *_ = venv.step_wait(timeout=np.float32(10))
    assert observations[:, 1].tolist() == [1, 1]
    venv.call_async("count")
    assert venv.call_wait(timeout=np.float16(10)) == (1, 1)
    venv.reset_async()
    venv.reset_wait(timeout=inf)

    async def first_ready():
        venv.send(np.zeros(2, dtype=np.int64))
        batch = await venv.recv(min_envs=2, timeout=np.float32(10))
        assert sorted(batch.env_ids.tolist()) == [0, 1]

    aiovec.run(first_ready())
    venv.close(timeout=np.float32(5))
    with aiovec.VecEnv([CounterEnv], backend="process", close_timeout=np.float64(1)) as venv:
        venv.reset()
    with aiovec.VecEnv([CounterEnv], backend="process") as venv:
        venv.reset()
        venv.close(timeout=inf)


@pytest.mark.parametrize("count", [2, 3])
def test_per_env_tuples_for_a_tuple_space_are_refused_naming_the_batch_form(count):
    """A Tuple space's batch is a tuple of one batch per part; a list of per-env
    tuples (two envs of a two-part Tuple look alike) raised numpy's bare
    "inhomogeneous shape" error, or a count mismatch without the fix."""
    from gymnasium import spaces as S

    from tests.envs import SpacesEnv

    space = S.Tuple((S.Discrete(2), S.Box(-1, 1, (3,), np.float32)))
    fns = [lambda: SpacesEnv(action_space=space)] * count
    with aiovec.VecEnv(fns, backend="inline") as venv:
        venv.reset(seed=0)
        per_env = [(1, np.zeros(3, np.float32))] * count
        with pytest.raises(ValueError, match=r"per-env tuples.*tuple\(zip\(\*actions\)\)"):
            venv.step(per_env)
        venv.step(tuple(zip(*per_env)))  # the batch form steps
