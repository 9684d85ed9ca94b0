"""Small, deterministic envs used by the tests (importable by worker processes)."""

from __future__ import annotations

import copy
import time

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class SpacesEnv(gym.Env):
    """Random observations of any space, random episode ends, and varied infos.

    Everything is drawn from generators seeded by ``reset(seed=...)``, so two copies
    reset with the same seed and fed the same actions produce identical data.
    """

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(
        self,
        observation_space: spaces.Space | None = None,
        action_space: spaces.Space | None = None,
        max_steps: int = 12,
        render_mode: str | None = None,
    ) -> None:
        # Own copies: a space samples from its own generator, which must not be shared.
        self.observation_space = copy.deepcopy(observation_space) or spaces.Box(-1, 1, (3,))
        self.action_space = copy.deepcopy(action_space) or spaces.Discrete(3)
        self.max_steps = max_steps
        self.render_mode = render_mode
        self.steps = 0
        self.level = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.observation_space.seed(int(self.np_random.integers(2**31)))
        self.steps = 0
        info = {"reset_count": 1, "options": dict(options) if options else None}
        return self.observation_space.sample(), info

    def step(self, action):
        assert self.action_space.contains(action), f"bad action {action!r}"
        self.steps += 1
        terminated = bool(self.np_random.random() < 0.15)
        truncated = self.steps >= self.max_steps
        info = {
            "step": self.steps,
            "value": float(self.np_random.random()),
            "vector": np.full(2, self.steps, dtype=np.int32),
            "nested": {"x": np.float32(self.steps / 2)},
            "zero_d": np.array(self.steps),  # a 0-d array, batched as Gymnasium batches it
        }
        if self.steps % 2:
            info["odd"] = "yes"
            info["pair"] = (self.steps, "odd")
        return self.observation_space.sample(), float(self.steps), terminated, truncated, info

    def render(self):
        return np.full((2, 2, 3), self.steps, dtype=np.uint8)

    def scale(self, factor: int) -> int:
        return self.steps * factor


class CounterEnv(gym.Env):
    """Observation ``[env_index, step]`` and reward ``step``: results can be traced to their env.

    Optionally sleeps ``delay`` seconds per step (or a random delay in ``delay_range``).
    """

    def __init__(self, env_index: int = 0, delay: float = 0.0, delay_range=None) -> None:
        self.env_index = env_index
        self.delay = delay
        self.delay_range = delay_range
        self.observation_space = spaces.Box(0, np.inf, (2,), np.float64)
        self.action_space = spaces.Discrete(2)
        self.count = 0
        self._rng = np.random.default_rng(env_index)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.count = 0
        return np.array([self.env_index, 0], dtype=np.float64), {}

    def step(self, action):
        if self.delay_range is not None:
            time.sleep(self._rng.uniform(*self.delay_range))
        elif self.delay:
            time.sleep(self.delay)
        self.count += 1
        observation = np.array([self.env_index, self.count], dtype=np.float64)
        return observation, float(self.count), False, False, {"action": int(action)}


#: Module state a script might change at run time (see ``SettingsEnv``).
SETTINGS = {"level": 1}


class SettingsEnv(CounterEnv):
    """A ``CounterEnv`` whose ``level`` is read from this module's ``SETTINGS`` when built."""

    def __init__(self, env_index: int = 0) -> None:
        super().__init__(env_index)
        self.level = SETTINGS["level"]


class LedgerEnv(CounterEnv):
    """A ``CounterEnv`` that appends ``"build <index>"``, ``"reset <index>"`` and
    ``"step <index>"`` lines to the file ``ledger`` (from any process): what the envs
    were made to do, and how many were built."""

    def __init__(self, env_index: int = 0, ledger: str = "", delay: float = 0.0) -> None:
        super().__init__(env_index, delay=delay)
        self.ledger = ledger
        self._note("build")

    def _note(self, what: str) -> None:
        with open(self.ledger, "a") as handle:
            handle.write(f"{what} {self.env_index}\n")

    def reset(self, *, seed=None, options=None):
        self._note("reset")
        return super().reset(seed=seed, options=options)

    def step(self, action):
        self._note("step")
        return super().step(action)


class DuckEnv:
    """Gymnasium's env API without subclassing ``gymnasium.Env`` (Gymnasium's vector envs
    take such envs): observation ``[seeded draw, step]``, episodes of 3 steps."""

    metadata: dict = {"render_modes": []}
    render_mode = None
    spec = None

    def __init__(self) -> None:
        self.observation_space = spaces.Box(-np.inf, np.inf, (2,), np.float64)
        self.action_space = spaces.Discrete(2)
        self.rng = np.random.default_rng(0)
        self.steps = 0

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.steps = 0
        return np.array([self.rng.random(), 0.0]), {}

    def step(self, action):
        self.steps += 1
        observation = np.array([self.rng.random(), float(self.steps)])
        return observation, float(action), self.steps >= 3, False, {"steps": self.steps}

    def close(self) -> None:
        pass

    def get_wrapper_attr(self, name):
        return getattr(self, name)

    def set_wrapper_attr(self, name, value, *, force=True):
        setattr(self, name, value)


class OptionsEcho(CounterEnv):
    """A ``CounterEnv`` whose reset info holds the ``options`` it was given."""

    def reset(self, *, seed=None, options=None):
        observation, _ = super().reset(seed=seed, options=options)
        return observation, {"options": options}


class ArrayRewardEnv(CounterEnv):
    """A ``CounterEnv`` whose reward is a 1-element array (a model's output, say)."""

    def step(self, action):
        observation, reward, terminated, truncated, info = super().step(action)
        return observation, np.array([reward]), terminated, truncated, info


class ListInfoEnv(CounterEnv):
    """A ``CounterEnv`` (env ``env_index``) whose info is a list on its ``at_step``-th
    step and, with ``in_reset``, from its resets (a ``(observation, info)`` API misread)."""

    def __init__(self, env_index: int = 0, at_step: int = 1, in_reset: bool = False) -> None:
        super().__init__(env_index)
        self.at_step, self.in_reset, self.steps_taken = at_step, in_reset, 0

    def reset(self, *, seed=None, options=None):
        observation, info = super().reset(seed=seed, options=options)
        return observation, (["not", "a", "dict"] if self.in_reset else info)

    def step(self, action):
        self.steps_taken += 1
        observation, reward, terminated, truncated, info = super().step(action)
        if self.steps_taken == self.at_step:
            info = ["not", "a", "dict"]
        return observation, reward, terminated, truncated, info


class DictActionEnv(CounterEnv):
    """A ``CounterEnv`` with a Dict action space; each step's info holds the action's
    keys as the env received them."""

    def __init__(self, env_index: int = 0) -> None:
        super().__init__(env_index)
        self.action_space = spaces.Dict({"move": spaces.Discrete(3)})

    def step(self, action):
        observation, reward, terminated, truncated, _ = super().step(0)
        return observation, reward, terminated, truncated, {"keys": sorted(action)}


class GoalEnv(gym.Env):
    """An env that moves its ``goal`` (a numpy array it is given, or its own) one step
    on, in place, at each step, and pops ``"level"`` from its reset options: what an
    env does with a value it owns. Observation: the goal."""

    observation_space = spaces.Box(-1e6, 1e6, (2,), np.float64)
    action_space = spaces.Discrete(2)

    def __init__(self, goal: np.ndarray | None = None) -> None:
        self.goal = np.zeros(2) if goal is None else goal
        self.level = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if options is not None:
            self.level = options.pop("level", 0)
        return self.goal.copy(), {}

    def set_goal(self, goal: np.ndarray) -> None:
        self.goal = goal

    def step(self, action):
        self.goal += 1
        return self.goal.copy(), 0.0, False, False, {}


class ChatEnv(gym.Env):
    """Text actions (an LLM agent's reply): reward, the reply's length."""

    observation_space = spaces.Discrete(2)
    action_space = spaces.Text(16)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return 0, {}

    def step(self, action):
        return 0, float(len(action)), False, False, {"got": str(action)}


class GridEnv(gym.Env):
    """A ``Tuple((Discrete(5), Discrete(5)))`` position returned as a numpy array, as
    Gymnasium's vector envs accept it."""

    observation_space = spaces.Tuple((spaces.Discrete(5), spaces.Discrete(5)))
    action_space = spaces.Discrete(4)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.array([1, 2]), {}

    def step(self, action):
        return np.array([3, int(action)]), 0.0, False, False, {}


class PointCloudEnv(gym.Env):
    """A Sequence observation (a point set) that the env keeps and rewrites in place at
    each step: the step count in every coordinate."""

    observation_space = spaces.Sequence(spaces.Box(-1e6, 1e6, (2,), np.float32), stack=True)
    action_space = spaces.Discrete(2)

    def __init__(self) -> None:
        self.points = np.zeros((3, 2), np.float32)
        self.steps = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        self.points[:] = 0
        return self.points, {}

    def step(self, action):
        self.steps += 1
        self.points[:] = self.steps
        return self.points, 0.0, False, False, {}
