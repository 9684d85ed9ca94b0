"""The Stable-Baselines3 adapter: same data as SB3's DummyVecEnv, and SB3 trains on it."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from stable_baselines3 import PPO
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv, VecFrameStack, VecNormalize

import aiovec
from aiovec.integrations.sb3 import SB3VecEnv, make_sb3_vec_env
from tests.test_parity import assert_same


def rollout(env, steps: int = 120) -> list:
    env.seed(11)
    record = [env.reset(), [dict(info) for info in env.reset_infos]]
    for step in range(steps):
        observations, rewards, dones, infos = env.step(np.array([step % 2, 1, 0]))
        record.append((observations, rewards, dones, infos, [dict(i) for i in env.reset_infos]))
    env.close()
    return record


def test_same_data_as_dummy_vec_env(backend):
    expected = rollout(DummyVecEnv([lambda: gym.make("CartPole-v1")] * 3))
    actual = rollout(make_sb3_vec_env("CartPole-v1", 3, monitor=False, backend=backend))
    for index, (a, e) in enumerate(zip(actual, expected)):
        assert_same(a, e, f"record[{index}]")


def test_attribute_access_with_indices(backend):
    env = make_sb3_vec_env("CartPole-v1", 3, monitor=False, backend=backend,
                           wrappers=[Monitor])  # fmt: skip
    assert env.get_attr("gravity", indices=[0, 2]) == [9.8, 9.8]
    env.set_attr("gravity", 1.5, indices=1)
    assert env.get_attr("gravity") == [9.8, 1.5, 9.8]
    assert env.env_method("get_wrapper_attr", "gravity", indices=[1]) == [1.5]
    assert env.env_is_wrapped(Monitor) == [True, True, True]
    assert env.env_is_wrapped(gym.wrappers.RecordVideo, indices=[0]) == [False]
    env.set_options({"ignored": True})
    env.reset()
    env.close()


def test_requires_same_step_autoreset():
    with pytest.raises(ValueError, match="SAME_STEP"):
        SB3VecEnv(aiovec.make("CartPole-v1", 2, backend="inline"))


def test_ppo_trains_with_sb3_wrappers():
    env = VecFrameStack(VecNormalize(make_sb3_vec_env("CartPole-v1", 4)), n_stack=2)
    model = PPO("MlpPolicy", env, n_steps=64, batch_size=64, n_epochs=1, seed=0, device="cpu")
    model.learn(total_timesteps=1024)
    assert model.num_timesteps >= 1024
    assert len(model.ep_info_buffer) > 0  # VecMonitor saw whole episodes
    env.close()
