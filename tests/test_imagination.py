"""Imagination rollouts (:mod:`aiovec.imagination`) as batched envs: seeding and what
building them does to the process."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import aiovec  # noqa: E402
from aiovec.imagination import DynamicsModel, ModelVectorEnv, model_weights  # noqa: E402


def _env_kwargs() -> dict:
    torch.manual_seed(0)
    return {
        "weights": model_weights(DynamicsModel(obs_dim=4, num_actions=2)),
        "start_states": np.random.default_rng(0).uniform(-1, 1, (256, 4)).astype(np.float32),
        "horizon": 8,
    }


def _blocks(backend: str, **options):
    return aiovec.make(
        ModelVectorEnv.factory,
        8,
        envs_per_block=4,
        vectorization_mode="vector_entry_point",
        env_kwargs=_env_kwargs(),
        backend=backend,
        **options,
    )


@pytest.mark.parametrize("backend", ["inline", "process"])
def test_unseeded_blocks_start_from_different_states(backend):
    """Without a seed every block, and every new vector env, draws its own start
    states (as Gymnasium's unseeded resets do), instead of one fixed draw copied."""
    with _blocks(backend) as first, _blocks(backend) as second:
        a, _ = first.reset()
        b, _ = second.reset()
    assert not np.array_equal(a[:4], a[4:])  # block 0 vs block 1
    assert not np.array_equal(a, b)  # two vector envs


def test_seeded_resets_repeat():
    with _blocks("inline") as first, _blocks("inline") as second:
        a, _ = first.reset(seed=3)
        b, _ = second.reset(seed=3)
        actions = np.zeros(8, np.int64)
        for _ in range(10):  # past the horizon: autoresets draw alike too
            a = np.concatenate([a, first.step(actions)[0]])
            b = np.concatenate([b, second.step(actions)[0]])
    np.testing.assert_array_equal(a, b)


def test_building_in_the_callers_process_leaves_its_torch_threads_alone():
    """On the inline backend the blocks live in the learner's process: its torch thread
    count is its own. In a worker process, one thread (a fair split of the cores)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with _blocks("inline") as envs:
            envs.reset(seed=0)
            assert torch.get_num_threads() == 2
        with _blocks("process", num_workers=2) as envs:
            threads = envs.apply(lambda env: torch.get_num_threads())  # per env
        assert set(threads) == {1}
        ModelVectorEnv(2, threads=1, **_env_kwargs())  # asked for: set wherever built
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(previous)
