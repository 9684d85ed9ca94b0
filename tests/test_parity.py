"""aiovec returns exactly what gymnasium.vector.SyncVectorEnv returns."""

from __future__ import annotations

import asyncio
from functools import partial

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.wrappers.vector import RecordEpisodeStatistics

import aiovec
from tests.envs import SpacesEnv

BOX = spaces.Box(-1, 1, (3,), np.float32)
SPACE_CASES = {
    "box-discrete": (BOX, spaces.Discrete(3)),
    "discrete-box": (spaces.Discrete(5, start=-2), spaces.Box(-2, 2, (2,), np.float64)),
    "multidiscrete-multibinary": (spaces.MultiDiscrete([3, 4]), spaces.MultiBinary(3)),
    "multibinary-multidiscrete": (spaces.MultiBinary([2, 2]), spaces.MultiDiscrete([2, 5])),
    "dict-dict": (
        spaces.Dict({"position": BOX, "mode": spaces.Discrete(4)}),
        spaces.Dict({"move": spaces.Discrete(2), "force": spaces.Box(0, 1, (1,), np.float32)}),
    ),
    "tuple-tuple": (
        spaces.Tuple((BOX, spaces.Dict({"flag": spaces.MultiBinary(2)}))),
        spaces.Tuple((spaces.Discrete(2), spaces.MultiDiscrete([2, 2]))),
    ),
    "scalar box-scalar box": (
        spaces.Box(-1, 1, (), np.float32),
        spaces.Box(-1, 1, (), np.float64),
    ),
    "image-discrete": (spaces.Box(0, 255, (16, 16, 3), np.uint8), spaces.Discrete(2)),
    "text-discrete": (spaces.Text(8), spaces.Discrete(2)),
    "discrete-text": (spaces.Discrete(4), spaces.Text(5)),
    # Spaces with no fixed-size layout, nested in Tuple/Dict and at the top: batched as
    # Gymnasium's concatenate does, actions split as its iterate does.
    "tuple(graph)-dict(graph)": (
        spaces.Tuple(
            (
                spaces.Graph(node_space=spaces.Box(-1, 1, (2, 1)), edge_space=None),
                spaces.Discrete(2),
            )
        ),
        spaces.Dict(
            a=spaces.Dict(
                a=spaces.Graph(node_space=BOX, edge_space=None), b=spaces.Box(-100, 100, (2, 2))
            ),
            b=spaces.Tuple((BOX, spaces.Discrete(3))),
        ),
    ),
    "dict(sequence)-graph": (
        spaces.Dict(
            {
                "seq": spaces.Sequence(spaces.Discrete(4)),
                "stacked": spaces.Sequence(BOX, stack=True),
                "box": BOX,
            }
        ),
        spaces.Graph(node_space=spaces.Discrete(3), edge_space=spaces.Discrete(4)),
    ),
    "graph-tuple(sequence)": (
        spaces.Graph(node_space=BOX, edge_space=spaces.Box(0, 1, (2,))),
        spaces.Tuple((spaces.Sequence(spaces.Discrete(4)), spaces.Discrete(2))),
    ),
}
MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED]


def assert_same(actual, expected, path="result"):
    """Deep equality including numpy dtypes, container types and dict keys."""
    if isinstance(expected, np.ndarray):
        assert isinstance(actual, np.ndarray), f"{path}: {type(actual)} is not an array"
        assert actual.dtype == expected.dtype, f"{path}: dtype {actual.dtype} != {expected.dtype}"
        assert actual.shape == expected.shape, f"{path}: shape {actual.shape} != {expected.shape}"
        if expected.dtype == object:
            for index, (a, e) in enumerate(zip(actual, expected)):
                assert_same(a, e, f"{path}[{index}]")
        else:
            np.testing.assert_array_equal(actual, expected, err_msg=path)
    elif isinstance(expected, dict):
        assert isinstance(actual, dict), f"{path}: {type(actual)} is not a dict"
        assert list(actual) == list(expected) or set(actual) == set(expected), (
            f"{path}: keys {sorted(actual)} != {sorted(expected)}"
        )
        for key in expected:
            assert_same(actual[key], expected[key], f"{path}[{key!r}]")
    elif isinstance(expected, (tuple, list)):
        assert type(actual) is type(expected), f"{path}: {type(actual)} != {type(expected)}"
        assert len(actual) == len(expected), f"{path}: length differs"
        for index, (a, e) in enumerate(zip(actual, expected)):
            assert_same(a, e, f"{path}[{index}]")
    else:
        assert type(actual) is type(expected), f"{path}: {type(actual)} != {type(expected)}"
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


def run_episodes(
    venv: gym.vector.VectorEnv, mode: AutoresetMode, steps: int = 40, calls: bool = True
) -> list:
    """Everything ``venv`` returns over ``steps`` steps with fixed seeds and actions."""
    venv.action_space.seed(7)
    record = [venv.reset(seed=123, options={"note": 1})]
    for _ in range(steps):
        result = venv.step(venv.action_space.sample())
        record.append(result)
        if mode is AutoresetMode.DISABLED:
            done = np.logical_or(result[2], result[3])
            if done.any():
                record.append(venv.reset(options={"reset_mask": done}))
    if calls:
        record.append(venv.call("scale", 3))
        record.append(venv.get_attr("steps"))
        record.append(venv.render())
    return record


CONFIGS = {
    "inline": {"backend": "inline"},
    "process": {"backend": "process", "num_workers": 2},
    "process+main": {"backend": "process", "num_workers": 1, "inline_envs": 1},
}


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
@pytest.mark.parametrize("case", list(SPACE_CASES))
@pytest.mark.parametrize("config", list(CONFIGS))
def test_same_results_as_sync_vector_env(config, case, mode):
    observation_space, action_space = SPACE_CASES[case]
    env_fns = [partial(SpacesEnv, observation_space, action_space) for _ in range(3)]
    expected_env = SyncVectorEnv(env_fns, autoreset_mode=mode)
    expected = run_episodes(expected_env, mode)
    expected_env.close()
    with aiovec.VecEnv(env_fns, autoreset_mode=mode, **CONFIGS[config]) as venv:
        assert venv.single_observation_space == expected_env.single_observation_space
        assert venv.single_action_space == expected_env.single_action_space
        assert venv.observation_space == expected_env.observation_space
        assert venv.action_space == expected_env.action_space
        assert venv.metadata["autoreset_mode"] is mode
        actual = run_episodes(venv, mode)
    assert len(actual) == len(expected)
    for index, (a, e) in enumerate(zip(actual, expected)):
        assert_same(a, e, f"record[{index}]")


def test_cartpole_matches_sync_vector_env(backend):
    expected_env = gym.make_vec("CartPole-v1", num_envs=4, vectorization_mode="sync")
    expected = run_episodes(expected_env, AutoresetMode.NEXT_STEP, 200, calls=False)
    expected_env.close()
    with aiovec.make("CartPole-v1", 4, backend=backend) as venv:
        actual = run_episodes(venv, AutoresetMode.NEXT_STEP, 200, calls=False)
    for index, (a, e) in enumerate(zip(actual, expected)):
        assert_same(a, e, f"record[{index}]")


@pytest.mark.parametrize("api", ["reset", "reset_async", "areset"])
def test_a_reset_takes_reset_mask_out_of_the_callers_options_as_gymnasium_does(api):
    # Gymnasium's vector envs pop it; RecordEpisodeStatistics then counts differently.
    mask = np.array([True, False])
    with aiovec.make("CartPole-v1", 2, autoreset_mode=AutoresetMode.DISABLED) as venv:
        venv.reset(seed=0)
        options = {"reset_mask": mask, "other": 1}
        if api == "reset":
            venv.reset(options=options)
        elif api == "reset_async":
            venv.reset_async(options=options)
            venv.reset_wait()
        else:
            asyncio.run(venv.areset(options=options))
        assert options == {"other": 1}


def test_episode_statistics_under_partial_resets_match_async_vector_env():
    def lengths(venv) -> list[int]:
        venv = RecordEpisodeStatistics(venv)
        venv.reset(seed=3)
        venv.action_space.seed(3)
        found: list[int] = []
        for _ in range(120):
            _, _, terminated, truncated, infos = venv.step(venv.action_space.sample())
            if "episode" in infos:
                found.extend(infos["episode"]["l"][infos["_episode"]].tolist())
            done = terminated | truncated
            if done.any():
                venv.reset(options={"reset_mask": done})
        venv.close()
        return found

    mode = {"autoreset_mode": AutoresetMode.DISABLED}
    expected = lengths(
        gym.make_vec("CartPole-v1", 3, vectorization_mode="async", vector_kwargs=mode)
    )
    assert lengths(aiovec.make("CartPole-v1", 3, **mode)) == expected
