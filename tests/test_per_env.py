"""Per-env parameters: constructor kwargs, reset options, targeted call/set_attr/apply."""

from __future__ import annotations

import time

import numpy as np
import pytest

import aiovec
from tests.envs import CounterEnv, SpacesEnv


def test_per_env_kwargs_as_list_and_as_function(backend):
    with aiovec.make(CounterEnv, 3, env_kwargs=[{"env_index": i * 10} for i in range(3)],
                     backend=backend) as venv:  # fmt: skip
        assert venv.get_attr("env_index") == (0, 10, 20)
    with aiovec.make(CounterEnv, 3, env_kwargs=lambda i: {"env_index": i + 5},
                     backend=backend) as venv:  # fmt: skip
        observations, _ = venv.reset()
        assert observations[:, 0].tolist() == [5, 6, 7]
    with pytest.raises(ValueError, match="env_kwargs has 2 entries for 3 envs"):
        aiovec.make(CounterEnv, 3, env_kwargs=[{}, {}])


def test_per_env_reset_options(backend):
    with aiovec.VecEnv([SpacesEnv] * 3, backend=backend) as venv:
        _, infos = venv.reset(options=[{"level": 1}, {"level": 5}, {"level": 3}])
        assert infos["options"]["level"].tolist() == [1, 5, 3]
        _, infos = venv.reset(options={"level": 2})  # Gymnasium's form: one dict for all
        assert infos["options"]["level"].tolist() == [2, 2, 2]
        with pytest.raises(ValueError, match="one dict per env"):
            venv.reset(options=[{}])


def test_a_reset_mask_inside_per_env_options_is_refused_naming_the_dict_form(backend):
    """Per-env options are each env's own: a ``reset_mask`` there was handed to the
    envs and every env was reset, ending the episodes the mask meant to keep."""
    with aiovec.VecEnv([SpacesEnv] * 3, backend=backend) as venv:
        venv.reset(seed=0)
        mask = np.array([False, True, False])
        with pytest.raises(ValueError, match=r"reset_mask.*options=\{'reset_mask': mask"):
            venv.reset(options=[{"level": i, "reset_mask": mask} for i in range(3)])
        _, infos = venv.reset(options=[{"level": i} for i in range(3)])  # still usable
        assert infos["options"]["level"].tolist() == [0, 1, 2]


def test_call_and_set_attr_on_some_envs(backend):
    with aiovec.make(CounterEnv, 4, env_kwargs=lambda i: {"env_index": i},
                     backend=backend) as venv:  # fmt: skip
        venv.set_attr("delay_range", None)
        venv.set_attr("env_index", [30, 10], env_ids=[3, 1])
        assert venv.get_attr("env_index") == (0, 10, 2, 30)
        assert venv.call("env_index", env_ids=[3, 0]) == (30, 0)
        assert venv.apply(lambda env, k: env.unwrapped.env_index * k, 2, env_ids=[1]) == (20,)
        assert venv.apply(lambda env: type(env.unwrapped).__name__) == ("CounterEnv",) * 4


async def test_curriculum_changes_some_envs_while_others_keep_stepping():
    env_fns = [lambda: CounterEnv(0, delay=0.5), lambda: CounterEnv(1)]
    async with aiovec.VecEnv(env_fns, num_workers=2) as venv:
        await venv.areset()
        venv.send([0], env_ids=[0])  # env 0 is busy for half a second
        started = time.monotonic()
        await venv.aset_attr("delay", 0.01, env_ids=[1])
        assert await venv.acall("delay", env_ids=[1]) == (0.01,)
        assert time.monotonic() - started < 0.4  # did not wait for env 0
        batch = await venv.recv()
        assert batch.env_ids.tolist() == [0]
        assert np.isclose(await venv.acall("delay", env_ids=[0]), 0.5)
