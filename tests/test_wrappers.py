"""Gymnasium's vector wrappers on an aiovec env give what they give on SyncVectorEnv."""

from __future__ import annotations

from functools import partial

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import SyncVectorEnv
from gymnasium.wrappers import vector as vector_wrappers

import aiovec
from tests.envs import SpacesEnv
from tests.test_parity import assert_same

BOX = spaces.Box(-1, 1, (3,), np.float32)
DICT_OBS = partial(
    SpacesEnv, spaces.Dict({"a": BOX, "b": spaces.Box(0, 1, (2,), np.float32)}), spaces.Discrete(2)
)
CASES = {
    "RecordEpisodeStatistics": ("CartPole-v1", vector_wrappers.RecordEpisodeStatistics),
    "NormalizeObservation": ("CartPole-v1", vector_wrappers.NormalizeObservation),
    "NormalizeReward": ("CartPole-v1", vector_wrappers.NormalizeReward),
    "ClipReward": (
        "CartPole-v1",
        partial(vector_wrappers.ClipReward, min_reward=0, max_reward=0.5),
    ),
    "ClipAction": ("Pendulum-v1", vector_wrappers.ClipAction),
    "RescaleAction": (
        "Pendulum-v1",
        partial(vector_wrappers.RescaleAction, min_action=0, max_action=1),
    ),
    "FlattenObservation": (DICT_OBS, vector_wrappers.FlattenObservation),
    "DictInfoToList": (DICT_OBS, vector_wrappers.DictInfoToList),
}


def run(venv: gym.vector.VectorEnv, steps: int = 300) -> list:
    venv.action_space.seed(3)
    record = [venv.reset(seed=5)]
    for _ in range(steps):
        result = venv.step(venv.action_space.sample())
        if isinstance(result[4], dict) and "episode" in result[4]:
            result[4]["episode"].pop("t")  # wall-clock episode time differs run to run
        record.append(result)
    venv.close()
    return record


@pytest.mark.parametrize("case", list(CASES))
def test_vector_wrapper_matches_sync(backend, case):
    env, wrapper = CASES[case]
    env_fn = partial(gym.make, env) if isinstance(env, str) else env
    expected = run(wrapper(SyncVectorEnv([env_fn] * 3)))
    actual = run(wrapper(aiovec.VecEnv([env_fn] * 3, backend=backend)))
    for index, (a, e) in enumerate(zip(actual, expected)):
        assert_same(a, e, f"{case} record[{index}]")


def test_episode_statistics_show_up(backend):
    venv = vector_wrappers.RecordEpisodeStatistics(aiovec.make("CartPole-v1", 2, backend=backend))
    venv.reset(seed=0)
    episodes = 0
    for _ in range(200):
        *_, infos = venv.step(np.array([0, 1]))
        if "episode" in infos:
            episodes += int(infos["_episode"].sum())
            assert (infos["episode"]["r"][infos["_episode"]] > 0).all()
    venv.close()
    assert episodes > 2
