"""The Stable-Baselines3 adapter: same data as SB3's DummyVecEnv, and SB3 trains on it."""

from __future__ import annotations

import sys
import tempfile
from functools import partial

import gymnasium as gym
import numpy as np
import pytest
from stable_baselines3 import PPO
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv, VecFrameStack, VecNormalize

import aiovec
from aiovec.integrations.sb3 import SB3VecEnv, make_sb3_vec_env
from tests.envs import SpacesEnv
from tests.test_parity import assert_same


@pytest.fixture(autouse=True)
def _sb3_logs_in_tmp_path(tmp_path, monkeypatch):
    """SB3's ``learn()`` makes a log folder in the temp dir each time: keep it in pytest's."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


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


# --- SB3's VecEnv contract, as SB3's own tests exercise it (tests/test_sb3_upstream.py) ----


def test_missing_attributes_are_attribute_errors(backend, capsys):
    env = make_sb3_vec_env("CartPole-v1", 2, monitor=False, backend=backend)
    assert env.has_attr("gravity")
    assert not env.has_attr("no_such_attribute")  # was aiovec.EnvError
    with pytest.raises(AttributeError, match="env 1: .*no_such_attribute"):
        env.get_attr("no_such_attribute", indices=[1])
    with pytest.raises(AttributeError, match="env 0: .*no_such_method"):
        env.env_method("no_such_method", 1)
    # SB3 probes attributes this way (render_mode, in VecEnv.__init__): no env failed,
    # so nothing is logged as Gymnasium logs a failed env
    assert "ERROR" not in capsys.readouterr().err
    with pytest.raises(aiovec.EnvError):  # other errors stay aiovec's
        env.env_method("step", "not an action")
    # any method, as SubprocVecEnv calls it (VecEnv.call refuses "reset", as Gymnasium)
    assert len(env.env_method("reset", indices=[0])) == 1
    env.reset()  # the envs are fine
    env.step(np.array([0, 1]))
    env.close()


def test_get_attr_returns_methods_uncalled(backend):
    env = make_sb3_vec_env("CartPole-v1", 2, monitor=False, backend=backend)
    env.reset()
    methods = env.get_attr("render")  # SubprocVecEnv returns the attribute as is
    assert all(callable(method) for method in methods)
    assert env.get_attr("spec", indices=0)[0].id == "CartPole-v1"
    env.close()


def test_negative_indices_count_from_the_end(backend):
    env = make_sb3_vec_env("CartPole-v1", 3, monitor=False, backend=backend)
    env.set_attr("gravity", 2.5, indices=-1)
    assert env.get_attr("gravity") == [9.8, 9.8, 2.5]
    assert env.get_attr("gravity", indices=[-1, 0]) == [2.5, 9.8]
    assert env.env_method("get_wrapper_attr", "gravity", indices=[0, -1]) == [9.8, 2.5]
    assert env.env_is_wrapped(gym.wrappers.TimeLimit, indices=[-2]) == [True]
    env.close()


class EchoEnv(gym.Env):
    """Keeps the last action it was given, after checking it belongs to its space."""

    observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)

    def __init__(self, action_space: gym.Space) -> None:
        self.action_space = action_space
        self.last_action = None

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        assert self.action_space.contains(action), f"bad action {action!r}"
        self.last_action = action
        return np.zeros(1, np.float32), 0.0, False, False, {}


DICT_ACTIONS = gym.spaces.Dict(
    {"move": gym.spaces.Discrete(3), "force": gym.spaces.Box(-1, 1, (2,), np.float32)}
)
TUPLE_ACTIONS = gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.MultiBinary(3)))


def object_array(items: list) -> np.ndarray:
    array = np.empty(len(items), dtype=object)
    for index, item in enumerate(items):
        array[index] = item
    return array


@pytest.mark.parametrize("space", [DICT_ACTIONS, TUPLE_ACTIONS], ids=["dict", "tuple"])
@pytest.mark.parametrize("form", ["list", "object-array", "batched"])
def test_dict_and_tuple_actions_one_per_env(space, form):
    """SB3 iterates over ``actions`` (one per env): a list (or object array) of per-env
    dicts or tuples becomes Gymnasium's batched layout; a batch is taken as is."""
    env = SB3VecEnv(
        aiovec.VecEnv([lambda: EchoEnv(space)] * 3, backend="inline", autoreset_mode="SameStep")
    )
    env.reset()
    space.seed(5)
    for _ in range(3):
        per_env = [space.sample() for _ in range(3)]
        if form == "list":
            actions = per_env
        elif form == "object-array":
            actions = object_array(per_env)
        elif isinstance(space, gym.spaces.Dict):
            actions = {key: np.stack([a[key] for a in per_env]) for key in space.spaces}
        else:
            actions = tuple(np.stack([a[i] for a in per_env]) for i in range(len(space)))
        env.step(actions)
        for sent, received in zip(per_env, env.get_attr("last_action")):
            assert_same(dict(received) if isinstance(space, gym.spaces.Dict) else received, sent)
    env.close()


def test_subproc_vec_env_drop_in():
    from stable_baselines3.common.env_util import make_vec_env

    from aiovec.integrations.sb3 import AiovecSubprocVecEnv

    env = make_vec_env(
        "CartPole-v1",
        n_envs=2,
        seed=0,
        vec_env_cls=AiovecSubprocVecEnv,
        vec_env_kwargs={"start_method": None},
    )
    assert isinstance(env, AiovecSubprocVecEnv) and env.num_envs == 2
    assert env.venv.autoreset_mode is gym.vector.AutoresetMode.SAME_STEP
    assert env.env_is_wrapped(Monitor) == [True, True]
    env.reset()
    env.step(np.array([0, 1]))
    env.close()
    # SubprocVecEnv's error for an unknown start method (multiprocessing's message)
    with pytest.raises(ValueError, match="cannot find context for 'illegal_method'"):
        AiovecSubprocVecEnv([lambda: gym.make("CartPole-v1")], start_method="illegal_method")


def test_get_images_needs_rgb_array():
    env = make_sb3_vec_env("CartPole-v1", 2, monitor=False, backend="inline")
    with pytest.warns(UserWarning, match="assumes it is `rgb_array`"):
        assert env.get_images() == [None, None]
    env.close()
    env = make_sb3_vec_env(
        SpacesEnv, 2, monitor=False, backend="inline", env_kwargs={"render_mode": "rgb_array"}
    )
    env.reset()
    assert [frame.shape for frame in env.get_images()] == [(2, 2, 3)] * 2
    assert env.render().shape == (4, 2, 3)  # SB3 tiles the two frames
    env.close()


def test_attribute_helpers_keep_sb3_out_of_workers():
    """``get_attr``/``has_attr``/``env_is_wrapped`` run small functions in the workers;
    unpickling them must not import Stable-Baselines3 (and PyTorch) there."""
    env = make_sb3_vec_env("CartPole-v1", 2, monitor=False, backend="process")
    assert env.env_is_wrapped(gym.wrappers.TimeLimit) == [True, True]
    assert env.has_attr("gravity") and env.get_attr("gravity") == [9.8, 9.8]
    imported = env.venv.apply(lambda _: sorted(m for m in sys.modules if "stable_baselines3" in m))
    assert imported == ([],) * 2
    env.close()


class InfoEnv(gym.Env):
    """Infos whose values differ in type, presence and shape from env to env; records
    the options of each reset."""

    observation_space = gym.spaces.Discrete(2)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, index: int) -> None:
        self.index = index
        self.options: list = []

    def _info(self) -> dict:
        if self.index == 0:
            return {"score": 1, "success": True, "dist": 0.5, "vec": np.arange(1)}
        return {"score": 0.75, "success": 2, "dist": None, "vec": np.arange(2)}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.options.append(options)
        return 0, self._info()

    def step(self, action):
        return 0, 0.0, False, False, self._info()


def test_infos_reach_sb3_as_each_env_returned_them(backend):
    # As SubprocVecEnv passes them on: not through Gymnasium's batched layout, which
    # took each key's type from the first env (0.75 -> 0, None -> nan or a TypeError,
    # arrays of another shape -> ValueError).
    expected = [
        {"score": 1, "success": True, "dist": 0.5, "vec": [0]},
        {"score": 0.75, "success": 2, "dist": None, "vec": [0, 1]},
    ]

    def plain(info):
        return {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in info.items()}

    venv = aiovec.VecEnv(
        [lambda i=i: InfoEnv(i) for i in range(2)],
        backend=backend,
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    env = SB3VecEnv(venv)
    env.reset()
    assert [plain(info) for info in env.reset_infos] == expected
    _, _, _, infos = env.step(np.zeros(2, dtype=np.int64))
    assert [plain({k: v for k, v in i.items() if k != "TimeLimit.truncated"}) for i in infos] == (
        expected
    )
    assert [type(info["score"]) for info in infos] == [int, float]  # Python types kept
    env.set_options([{"level": 3}, {}])
    env.reset()
    # An env given no options gets None, as from SubprocVecEnv (not {}).
    assert [options[-1] for options in env.get_attr("options")] == [{"level": 3}, None]
    env.close()


def test_the_wrapped_vector_env_keeps_gymnasiums_infos():
    """SB3VecEnv takes its per-env infos without changing what the aiovec env itself
    returns: Gymnasium wrappers and loops on the same env still get dict infos."""
    venv = aiovec.make("CartPole-v1", 2, backend="inline", autoreset_mode="SameStep")
    sb3_env = SB3VecEnv(venv)
    sb3_env.reset()
    _, _, _, sb3_infos = sb3_env.step(np.array([0, 1]))
    assert isinstance(sb3_infos, list)
    _, infos = venv.reset(seed=0)
    assert isinstance(infos, dict)
    assert isinstance(venv.step(np.array([0, 1]))[4], dict)
    stats = gym.wrappers.vector.RecordEpisodeStatistics(venv)
    stats.reset(seed=0)
    stats.step(np.array([0, 1]))
    sb3_env.close()


def test_a_restarted_env_ends_its_episode_for_sb3(backend):
    """With ``on_failure="restart"`` a failed env's step comes back done (truncated), the
    last observation the failed env returned as its terminal one (SB3 needs one), and
    the restart said in its info; the other envs' results are SB3's as usual."""
    from tests.faulty import FaultyEnv

    env_fns = [partial(FaultyEnv, i, "raise", 2 if i == 1 else 10**9) for i in range(2)]
    venv = aiovec.VecEnv(env_fns, backend=backend, autoreset_mode="SameStep", on_failure="restart")
    env = SB3VecEnv(venv)
    env.reset()
    last, *_ = env.step(np.array([0, 0]))
    observations, _, dones, infos = env.step(np.array([0, 0]))
    assert dones.tolist() == [False, True]
    assert infos[1]["restarted"] is True and "diverged" in infos[1]["restart_reason"]
    np.testing.assert_array_equal(infos[1]["terminal_observation"], last[1])
    assert env.reset_infos[1]["restarted"] is True  # the rebuilt env's reset says so too
    assert infos[1]["TimeLimit.truncated"] is True
    assert venv.restart_counts.tolist() == [0, 1]
    env.close()
