"""What the envs are given, and what the caller gets back, is nobody else's: as with
``AsyncVectorEnv`` (each env unpickles its own copy), wherever aiovec runs the envs,
except where the caller asked for ``SyncVectorEnv``'s in-process sharing by name
(``backend="inline"``, ``vectorization_mode="sync"``)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

import aiovec


class KeeperEnv(gym.Env):
    """Keeps what it is given and hands out its own objects."""

    observation_space = spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = spaces.Discrete(2)
    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, config: dict[str, int] | None = None) -> None:
        self.render_mode = "rgb_array"
        self.config = config if config is not None else {"n": 0}
        self.path: list[int] = []
        self.frame = np.zeros((2, 2, 3), np.uint8)  # a renderer's reused frame

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self.path = [0]
        return np.zeros(1, np.float32), {"path": self.path}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        self.path.append(len(self.path))
        self.frame += 1
        return np.zeros(1, np.float32), 0.0, False, False, {"path": self.path}

    def render(self) -> np.ndarray:
        return self.frame

    def bump(self) -> int:
        self.config["n"] += 1
        return self.config["n"]

    def keep(self, box: list[int]) -> int:
        box.append(1)
        return len(box)


def _check_isolated(envs: aiovec.VecEnv, captured: dict[str, int]) -> None:
    _, reset_infos = envs.reset(seed=0)
    assert envs.call("bump") == (1, 1, 1)  # each env's own copy of what its factory captured
    assert captured == {"n": 0}  # and never the caller's
    given = {"n": 10}
    envs.set_attr("config", given)  # one value for every env: each gets its own copy
    assert envs.call("bump") == (11, 11, 11)
    assert given == {"n": 10}
    box: list[int] = []
    assert envs.call("keep", box) == (1, 1, 1)
    assert box == []
    configs = envs.get_attr("config")
    configs[0]["n"] = -5  # the caller's copy
    assert [config["n"] for config in envs.get_attr("config")] == [11, 11, 11]
    frames = envs.render()
    envs.step(np.zeros(3, np.int64))
    assert all(int(frame[0, 0, 0]) == 0 for frame in frames)  # kept as they were rendered
    assert list(reset_infos["path"][0]) == [0]  # an info the env changes later: as returned


@pytest.mark.parametrize(
    "options",
    [
        {"backend": "process", "num_workers": 1, "inline_envs": 2},  # two envs in this process
        {"backend": "auto"},  # in this process for an env this cheap (or workers: the same)
        {"backend": "process", "num_workers": 1},
    ],
    ids=["process-inline_envs", "auto", "process"],
)
def test_what_envs_are_given_and_what_they_return_is_nobody_elses(options, no_leaks):
    captured = {"n": 0}
    with aiovec.VecEnv([lambda: KeeperEnv(captured)] * 3, **options) as envs:
        _check_isolated(envs, captured)


def test_make_keeps_async_vector_env_isolation_wherever_it_runs_the_envs(no_leaks):
    captured = {"n": 0}
    with aiovec.make(lambda: KeeperEnv(captured), 3) as envs:
        _check_isolated(envs, captured)


def test_inline_by_name_shares_as_sync_vector_env_does_but_infos_and_frames_are_the_callers():
    """``backend="inline"`` (``vectorization_mode="sync"``) hands the envs the caller's
    objects, as ``SyncVectorEnv`` does (a live model set on every env stays one model);
    infos returned are the caller's all the same."""
    captured = {"n": 0}
    for envs in (
        aiovec.VecEnv([lambda: KeeperEnv(captured)] * 3, backend="inline"),
        aiovec.make(lambda: KeeperEnv(captured), 3, vectorization_mode="sync"),
    ):
        with envs:
            _, reset_infos = envs.reset(seed=0)
            model = {"n": 0}
            envs.set_attr("config", model)
            assert envs.call("bump") == (1, 2, 3)
            assert model == {"n": 3}
            envs.step(np.zeros(3, np.int64))
            assert list(reset_infos["path"][0]) == [0]
