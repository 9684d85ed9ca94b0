"""Infos in Gymnasium's vector format, built from any mix of values the envs return.

Gymnasium's ``_add_info`` shapes a key's array after the first env's value; a later
value that does not fit (another shape, a string after a number, a dict after an
array) makes it raise, or, for a non-dict after a dict, merges it oddly. aiovec keeps
Gymnasium's result wherever Gymnasium has one, and where it would raise gives that
key as an object array of the envs' own values instead: a batch's results are never
lost to an info (first-ready batches mix envs by timing, so it would strike at random).
"""

from __future__ import annotations

import numpy as np
import pytest

import aiovec
from aiovec._infos import batch_infos
from tests.envs import CounterEnv


def test_values_that_batch_keep_gymnasiums_arrays():
    infos = batch_infos([{"a": 1, "b": np.zeros(2)}, {}, {"a": 3, "b": np.ones(2)}])
    assert infos["a"].dtype == np.int64 and infos["a"].tolist() == [1, 0, 3]
    assert infos["_a"].tolist() == [True, False, True]
    assert infos["b"].shape == (3, 2) and infos["b"][2].tolist() == [1.0, 1.0]


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (np.zeros(0), np.zeros(3)),  # shapes differ
        (1, "text"),
        (1.5, "text"),
        (1, None),
        (np.int8(1), 300),  # out of the first value's dtype
        (1, {"x": 1}),  # a dict after a number
        (np.zeros(2), [1, 2, 3]),
        (2**70, 1),  # no numpy integer holds the first
    ],
    ids=[
        "shapes",
        "int-str",
        "float-str",
        "int-None",
        "int8-300",
        "int-dict",
        "array-list",
        "bigint",
    ],  # fmt: skip
)
def test_values_that_do_not_batch_become_an_object_array_of_each_envs_value(first, second):
    infos = batch_infos([{"k": first}, {}, {"k": second}])
    values = infos["k"]
    assert values.dtype == object and len(values) == 3
    assert infos["_k"].tolist() == [True, False, True]
    for got, expected in ((values[0], first), (values[2], second)):
        if isinstance(expected, np.ndarray):
            np.testing.assert_array_equal(got, expected)
        else:
            assert got == expected
    assert values[1] is None


def test_a_value_after_a_dict_merges_as_gymnasium_merges_it():
    # Gymnasium's _add_info stores it in the dict under the env's position.
    infos = batch_infos([{"stats": {"hits": 3}}, {"stats": None}])
    assert infos["stats"]["hits"].tolist() == [3, 0] and infos["stats"][1] is None
    assert infos["_stats"].tolist() == [True, True]


class MixedInfoEnv(CounterEnv):
    """Env 1's info holds an array of another shape than env 0's, and a string where
    env 0 has a number."""

    def step(self, action):
        observation, reward, terminated, truncated, _ = super().step(action)
        info = {"arr": np.zeros(3 * self.env_index), "tag": "x" if self.env_index else 1}
        return observation, reward, terminated, truncated, info


async def test_a_first_ready_batch_with_infos_that_do_not_batch_loses_nothing(backend):
    async with aiovec.VecEnv([MixedInfoEnv, lambda: MixedInfoEnv(1)], backend=backend) as venv:
        await venv.areset(seed=0)
        venv.send([0, 0])
        batch = await venv.recv(min_envs=2)
        assert sorted(batch.env_ids.tolist()) == [0, 1]
        by_env = dict(zip(batch.env_ids.tolist(), batch.infos["arr"]))
        assert by_env[0].shape == (0,) and by_env[1].shape == (3,)
        _, _, _, _, infos = await venv.astep([0, 0])
        assert infos["tag"].tolist() == [1, "x"]
