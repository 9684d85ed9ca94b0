"""Spaces as ``gymnasium.vector.AsyncVectorEnv`` handles them (issue #12, items 5 and 6):
``observation_mode``, non-shareable spaces nested in Tuple/Dict, scalar actions, action
dtypes, and ``render_mode`` in :func:`aiovec.make`."""

from __future__ import annotations

import math
import re
from functools import partial

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.spaces import GraphInstance
from gymnasium.vector.utils import batch_differing_spaces, batch_space

import aiovec
from tests.envs import SpacesEnv


def describe(value):
    """What an env received, in plain data: ``(type name, dtype, values)`` for numbers."""
    if isinstance(value, GraphInstance):
        return ("graph", describe(value.nodes), describe(value.edges))
    if isinstance(value, (np.ndarray, np.generic)):
        return (type(value).__name__, str(value.dtype), value.tolist())
    if isinstance(value, dict):
        return {key: describe(item) for key, item in value.items()}
    if isinstance(value, tuple):
        return tuple(describe(item) for item in value)
    return (type(value).__name__, None, value)


class RecordingEnv(gym.Env):
    """Records every action it receives (``received``), as :func:`describe` gives it."""

    def __init__(self, action_space: spaces.Space, observation_space=None) -> None:
        self.action_space = action_space
        self.observation_space = observation_space or spaces.Discrete(2)
        self.received: list = []

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return 0, {}

    def step(self, action):
        self.received.append(describe(action))
        return 0, 0.0, False, False, {}


def _received(backend, action_space, actions):
    """What each of 2 ``RecordingEnv`` received (see :func:`describe`) for one ``step(actions)``."""
    with aiovec.VecEnv([partial(RecordingEnv, action_space)] * 2, backend=backend) as venv:
        venv.reset(seed=0)
        venv.step(actions)
        return [received[-1] for received in venv.get_attr("received")]


# --- item 1: observation_mode -----------------------------------------------------------


def spaces_envs(observation_spaces, action_space=None):
    return [partial(SpacesEnv, space, action_space) for space in observation_spaces]


def test_invalid_observation_mode_is_refused_with_the_valid_values(backend):
    with pytest.raises(
        ValueError,
        match=re.escape(
            "Invalid `observation_mode`, expected: 'same' or 'different' or tuple of single "
            "and batch observation space, actual got invalid"
        ),
    ):
        aiovec.VecEnv(spaces_envs([spaces.Box(0, 1, (5,))] * 2), backend=backend,
                      observation_mode="invalid")  # fmt: skip
    with pytest.raises(TypeError, match="Expected both elements of observation_mode to be Spaces"):
        aiovec.VecEnv(spaces_envs([spaces.Box(0, 1, (5,))] * 2), backend=backend,
                      observation_mode=(spaces.Box(0, 1, (2, 5)), "box"))  # fmt: skip


def test_same_mode_refuses_differing_spaces_with_gymnasiums_message(backend):
    observation_spaces = [spaces.Box(0, i, (2,)) for i in range(1, 4)]
    with pytest.raises(
        RuntimeError,
        match="the sub-environments observation spaces are not equivalent. .*If this is "
        "intentional, use `observation_mode='different'` instead.",
    ) as caught:
        aiovec.VecEnv(spaces_envs(observation_spaces), backend=backend)
    assert "env 1 has observation_space" in str(caught.value)  # and says which env
    with pytest.raises(RuntimeError, match="not equivalent"):
        aiovec.VecEnv(spaces_envs(observation_spaces), backend=backend, observation_mode="same")


@pytest.mark.parametrize(
    "observation_spaces",
    [
        [spaces.Box(0, i, (5,)) for i in range(1, 4)],
        [spaces.Discrete(3), spaces.Discrete(5, start=1), spaces.Discrete(4)],
        [
            spaces.Dict({"a": spaces.Box(0, i, (2,)), "b": spaces.Discrete(i + 1)})
            for i in range(1, 4)
        ],
    ],
    ids=["box", "discrete", "dict"],
)
def test_different_mode_batches_differing_spaces(backend, observation_spaces):
    with aiovec.VecEnv(
        spaces_envs(observation_spaces), backend=backend, observation_mode="different"
    ) as venv:
        assert venv.observation_mode == "different"
        assert venv.observation_space == batch_differing_spaces(observation_spaces)
        assert venv.single_observation_space == observation_spaces[0]
        observations, _ = venv.reset(seed=0)
        assert observations in venv.observation_space
        observations, *_ = venv.step(venv.action_space.sample())
        assert observations in venv.observation_space


def test_different_mode_via_make_with_per_env_kwargs(backend):
    with aiovec.make(
        SpacesEnv,
        3,
        env_kwargs=lambda i: {"observation_space": spaces.Box(0, i + 1, (4,))},
        observation_mode="different",
        backend=backend,
    ) as venv:
        observations, _ = venv.reset(seed=1)
        assert observations in venv.observation_space
        assert venv.observation_space.high[:, 0].tolist() == [1, 2, 3]


def test_different_mode_refuses_what_cannot_be_batched(backend):
    shapes = spaces_envs([spaces.Box(0, 1, (i + 1,)) for i in range(3)])
    with pytest.raises(ValueError, match="Box.low shape"):  # batch_differing_spaces's error
        aiovec.VecEnv(shapes, backend=backend, observation_mode="different")
    mixed = spaces_envs([spaces.Box(0, 1, (3,)), spaces.Discrete(5)])
    with pytest.raises(TypeError, match="same type"):
        aiovec.VecEnv(mixed, backend=backend, observation_mode="different")


def test_custom_mode_uses_the_given_spaces(backend):
    observation_spaces = [spaces.Box(0, i, (5,)) for i in range(1, 4)]
    batched = spaces.Box(0, np.repeat(np.arange(1, 4), 5).reshape((3, 5)), (3, 5))
    single = spaces.Box(0, 1, (5,))
    with aiovec.VecEnv(
        spaces_envs(observation_spaces), backend=backend, observation_mode=(batched, single)
    ) as venv:
        assert venv.observation_space == batched == batch_differing_spaces(observation_spaces)
        assert venv.single_observation_space == single
        observations, _ = venv.reset(seed=0)
        assert observations in venv.observation_space
        venv.step(venv.action_space.sample())


def test_custom_mode_refuses_spaces_of_another_shape_or_dtype(backend):
    actual = spaces.Tuple([spaces.Discrete(3)] * 2)
    single = spaces.Tuple([spaces.Discrete(3)])
    with pytest.raises(RuntimeError, match="do not share a common shape and dtype"):
        aiovec.VecEnv(spaces_envs([actual]), backend=backend,
                      observation_mode=(batch_space(single, 1), single))  # fmt: skip


def test_action_spaces_must_still_be_equal(backend):
    env_fns = [partial(SpacesEnv, None, spaces.Discrete(i + 2)) for i in range(2)]
    with pytest.raises(RuntimeError, match="the action spaces from all environments must be equal"):
        aiovec.VecEnv(env_fns, backend=backend, observation_mode="different")


# --- item 2: non-shareable spaces nested in Tuple/Dict ------------------------------------

NODES = spaces.Box(-100, 100, (2,), np.float32)


class GraphEnv(gym.Env):
    """Observations hold a Graph (nodes all equal to the env index, one per step so far)
    beside a Discrete (the step count), nested in a Tuple or a Dict; actions are a Graph
    beside a Discrete, recorded in ``received``."""

    def __init__(self, index: int, kind: str) -> None:
        self.index, self.kind, self.steps = index, kind, 0
        graph = spaces.Graph(node_space=NODES, edge_space=None)
        if kind == "tuple":
            self.observation_space = spaces.Tuple((graph, spaces.Discrete(50)))
        else:
            self.observation_space = spaces.Dict({"graph": graph, "steps": spaces.Discrete(50)})
        self.action_space = spaces.Tuple(
            (spaces.Graph(node_space=spaces.Discrete(10), edge_space=None), spaces.Discrete(3))
        )
        self.received: list = []

    def observation(self):
        graph = GraphInstance(np.full((self.steps + 1, 2), self.index, np.float32), None, None)
        if self.kind == "tuple":
            return (graph, self.steps)
        return {"graph": graph, "steps": self.steps}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        return self.observation(), {}

    def step(self, action):
        assert self.action_space.contains(action), f"bad action {action!r}"
        self.received.append(describe(action))
        self.steps += 1
        return self.observation(), 1.0, False, False, {}


def graph_actions(env_ids, offset=0):
    graphs = tuple(GraphInstance(np.array([i + offset]), None, None) for i in env_ids)
    return (graphs, np.array([i % 3 for i in env_ids]))


def check_graph_observations(observations, env_ids, steps, kind):
    graphs, counts = observations if kind == "tuple" else tuple(observations.values())
    assert type(graphs) is tuple and len(graphs) == len(env_ids)
    for graph, env_id, step in zip(graphs, env_ids, steps):
        assert isinstance(graph, GraphInstance)
        np.testing.assert_array_equal(graph.nodes, np.full((step + 1, 2), env_id, np.float32))
    assert isinstance(counts, np.ndarray) and counts.dtype == np.int64
    assert counts.tolist() == list(steps)


@pytest.mark.parametrize("kind", ["tuple", "dict"])
async def test_graphs_nested_in_spaces_are_batched_as_gymnasium_does(backend, kind):
    env_fns = [partial(GraphEnv, i, kind) for i in range(3)]
    async with aiovec.VecEnv(env_fns, backend=backend) as venv:
        observations, _ = await venv.areset(seed=0)
        assert observations in venv.observation_space
        check_graph_observations(observations, [0, 1, 2], [0, 0, 0], kind)

        observations, *_ = await venv.astep(graph_actions([0, 1, 2], offset=4))
        assert observations in venv.observation_space
        check_graph_observations(observations, [0, 1, 2], [1, 1, 1], kind)
        received = await venv.acall("received")
        for env_id, actions in enumerate(received):  # each env got its own row
            assert actions == [
                (
                    ("graph", ("ndarray", "int64", [env_id + 4]), ("NoneType", None, None)),
                    ("int64", "int64", env_id % 3),
                )
            ]

        venv.send(graph_actions([2, 0]), env_ids=[2, 0])
        batch = await venv.recv(min_envs=2)
        order = batch.env_ids.tolist()
        assert sorted(order) == [0, 2]
        assert batch.observations in batch_space(venv.single_observation_space, 2)
        check_graph_observations(batch.observations, order, [2, 2], kind)
        assert (await venv.acall("received", env_ids=[2]))[0][-1][0][1][2] == [2]


# --- item 3: scalar actions ---------------------------------------------------------------


@pytest.mark.parametrize(
    "action_space",
    [
        spaces.Discrete(3),
        spaces.Box(-1, 1, (2,), np.float32),
        spaces.Dict({"a": spaces.Discrete(2)}),
        spaces.Tuple((spaces.Discrete(2), spaces.Discrete(2))),
        spaces.Text(4),
    ],
    ids=["discrete", "box", "dict", "tuple", "text"],
)
def test_a_scalar_action_for_a_vector_env_is_a_type_error(backend, action_space):
    with aiovec.VecEnv([partial(RecordingEnv, action_space)] * 2, backend=backend) as venv:
        venv.reset(seed=0)
        with pytest.raises(TypeError, match="actions"):
            venv.step(0)
        with pytest.raises(ValueError, match="actions"):  # a batch of the wrong length
            venv.step(batch_space(action_space, 3).sample())
        venv.step(venv.action_space.sample())  # nothing was sent: the envs are idle


# --- item 4: action dtypes ---------------------------------------------------------------


@pytest.mark.parametrize(
    "action_space, actions, expected",
    [
        (
            spaces.Box(-1, 1, (2,), np.float32),
            np.array([[0.1, 0.2], [0.3, 0.4]]),
            [("ndarray", "float64", [0.1, 0.2]), ("ndarray", "float64", [0.3, 0.4])],
        ),
        (
            spaces.Box(0, 255, (1,), np.uint8),
            np.array([[300], [7]]),
            [("ndarray", "int64", [300]), ("ndarray", "int64", [7])],
        ),
        (
            spaces.Box(-10, 10, (1,), np.int64),
            np.array([[np.nan], [1.0]]),
            [("ndarray", "float64", [math.nan]), ("ndarray", "float64", [1.0])],
        ),
        (
            spaces.Discrete(3),
            np.array([2, 1], dtype=np.uint8),
            [("uint8", "uint8", 2), ("uint8", "uint8", 1)],
        ),
        (
            spaces.Dict({"x": spaces.Box(-1, 1, (1,), np.float32), "n": spaces.Discrete(3)}),
            {"x": np.array([[0.1], [0.2]]), "n": np.array([1, 2])},
            [
                {"n": ("int64", "int64", 1), "x": ("ndarray", "float64", [0.1])},
                {"n": ("int64", "int64", 2), "x": ("ndarray", "float64", [0.2])},
            ],
        ),
    ],
    ids=["float64-for-float32", "300-for-uint8", "nan-for-int64", "uint8-for-discrete", "dict"],
)
def test_envs_receive_the_callers_actions_unchanged(backend, action_space, actions, expected):
    received = _received(backend, action_space, actions)
    assert len(received) == len(expected)
    for got, want in zip(received, expected):
        assert repr(got) == repr(want)  # repr: nan equals nan, and types show


@pytest.mark.parametrize(
    "space, actions, expected",
    [
        (spaces.Box(0, 1, (1,)), [0, 1], [("int", None, 0), ("int", None, 1)]),
        (
            spaces.Box(0, 1, (1, 1), np.float32),
            np.array([0.5, 0.25], np.float32),
            [("float32", "float32", 0.5), ("float32", "float32", 0.25)],
        ),
        (spaces.MultiDiscrete([3]), [2, 0], [("int", None, 2), ("int", None, 0)]),
        (
            spaces.MultiDiscrete([[4]], start=[[1]]),
            np.array([4, 1], np.int32),
            [("int32", "int32", 4), ("int32", "int32", 1)],
        ),
        (
            spaces.MultiBinary(1),
            np.array([1, 0], np.int8),
            [("int8", "int8", 1), ("int8", "int8", 0)],
        ),
    ],
    ids=["list-of-ints", "float32-for-1x1", "multidiscrete", "multidiscrete-1x1", "multibinary"],
)
def test_one_number_per_env_for_a_one_element_space_reaches_each_env_as_passed(
    backend, space, actions, expected
):
    # Gymnasium iterates a batch of [0, 1] over Box((1,)) as one number per env; aiovec
    # takes it too (it cannot mean anything else) and hands env i the number actions[i].
    received = _received(backend, space, actions)
    assert received == expected


@pytest.mark.parametrize(
    "space, actions, expected",
    [
        (spaces.Discrete(3), [2, 0], [("int", None, 2), ("int", None, 0)]),
        (spaces.Discrete(3), (True, 1), [("bool", None, True), ("int", None, 1)]),
        (
            spaces.Box(0, 255, (1,), np.uint8),
            [[300], [7]],
            [("list", None, [300]), ("list", None, [7])],
        ),
        (
            spaces.Box(-1, 1, (2,), np.float32),
            [[0.5, 0.25], np.array([0.125, 0.75], np.float32)],
            [("list", None, [0.5, 0.25]), ("ndarray", "float32", [0.125, 0.75])],
        ),
        (
            spaces.Dict({"n": spaces.Discrete(3), "x": spaces.Box(-1, 1, (1,), np.float32)}),
            {"n": [1, 2], "x": np.array([[0.5], [0.25]], np.float32)},
            [
                {"n": ("int", None, 1), "x": ("ndarray", "float32", [0.5])},
                {"n": ("int", None, 2), "x": ("ndarray", "float32", [0.25])},
            ],
        ),
        # numpy values of different dtypes: stacking them would promote one to the
        # other's dtype (float32 -> float64); each env gets its own, as passed.
        (
            spaces.Box(-1, 1, (2,), np.float32),
            [np.array([0.5, 0.5], np.float32), np.array([0.25, 0.75], np.float64)],
            [("ndarray", "float32", [0.5, 0.5]), ("ndarray", "float64", [0.25, 0.75])],
        ),
        (
            spaces.Discrete(3),
            [np.int64(0), np.int32(2)],
            [("int64", "int64", 0), ("int32", "int32", 2)],
        ),
    ],
    ids=[
        "ints",
        "bool-and-int",
        "out-of-dtype-list",
        "list-and-array-rows",
        "dict",
        "numpy-dtypes-mixed",
        "numpy-ints-mixed",
    ],
)
def test_python_values_in_a_list_reach_each_env_as_passed(backend, space, actions, expected):
    # Gymnasium's iterate hands env i the item actions[i] itself: a Python int stays an
    # int (json.dumps of it works), a list stays a list, whatever the space's dtype.
    received = _received(backend, space, actions)
    assert received == expected


def test_a_list_of_numpy_values_of_the_spaces_dtype_still_takes_shared_memory(backend):
    space = spaces.Discrete(5)
    with aiovec.VecEnv([partial(RecordingEnv, space)] * 2, backend=backend) as venv:
        venv.reset(seed=0)
        venv.step([np.int64(3), np.int64(4)])
        assert venv._buffers.actions.tolist() == [3, 4]  # the shared path
        venv.step([1, 2])  # Python ints: by value, the buffer is untouched
        assert venv._buffers.actions.tolist() == [3, 4]
        received = [actions for actions in venv.get_attr("received")]
    assert received == [
        [("int64", "int64", 3), ("int", None, 1)],
        [("int64", "int64", 4), ("int", None, 2)],
    ]


@pytest.mark.parametrize(
    "space, actions, expected",
    [
        (
            spaces.MultiBinary(2),
            np.array([[1.0, 0.0], [0.0, 1.0]], np.float32),  # torch's Bernoulli samples
            [("ndarray", "float32", [1.0, 0.0]), ("ndarray", "float32", [0.0, 1.0])],
        ),
        (
            spaces.Discrete(3, start=-1),
            np.array([-1.0, 1.0]),
            [("float64", "float64", -1.0), ("float64", "float64", 1.0)],
        ),
        (
            spaces.MultiDiscrete([3, 2]),
            [[2.0, 1.0], [0.0, 0.0]],
            [("list", None, [2.0, 1.0]), ("list", None, [0.0, 0.0])],
        ),
        (  # ints in an object array (np.array(list_of_ints, dtype=object)): as Gymnasium
            spaces.Discrete(2),
            np.array([0, 1], dtype=object),
            [("int", None, 0), ("int", None, 1)],
        ),
        (  # numpy bools and whole floats in an object array: as passed, too
            spaces.Discrete(2),
            np.array([np.True_, 1.0], dtype=object),
            [("bool", "bool", True), ("float", None, 1.0)],
        ),
    ],
    ids=[
        "multibinary-float32",
        "discrete-float64",
        "multidiscrete-list",
        "discrete-object",
        "discrete-object-mixed",
    ],
)
def test_whole_floats_for_a_discrete_space_reach_the_envs_as_passed(
    backend, space, actions, expected
):
    # Gymnasium hands them on; an env's contains() check is the env's business.
    received = _received(backend, space, actions)
    assert received == expected


@pytest.mark.parametrize(
    "space, actions, message",
    [
        (spaces.Discrete(2), [0.5, 1.0], r"values \[0.5\] are not whole numbers"),
        (spaces.Discrete(2), np.array([np.nan, 1.0]), r"values \[nan\] are not whole"),
        (spaces.MultiBinary(2), np.array([[1.0, 2.0], [0, 0]]), r"values \[2.0\] are outside"),
        (spaces.Discrete(2), ["a", "b"], "expected integers"),
        (spaces.Discrete(2), np.array([0, "b"], dtype=object), "expected integers"),
        (spaces.Discrete(2), np.array([0, 2], dtype=object), r"values \[2\] are outside"),
        (spaces.Discrete(2), np.array([0, 0.5], dtype=object), r"values \[0.5\] are not whole"),
        (spaces.MultiDiscrete([3]), [0, 3], r"values \[3\] are outside"),
        (spaces.MultiDiscrete([[4]], start=[[1]]), [0, 2], r"values \[0\] are outside"),
        (spaces.MultiBinary(1), [1, 2], r"values \[2\] are outside"),
        (spaces.MultiBinary(1), [0.5, 1.0], r"values \[0.5\] are not whole numbers"),
        (spaces.MultiDiscrete([3]), [0, 1, 2], r"expected shape \(2, 1\)"),
    ],
    ids=[
        "fraction",
        "nan",
        "float-outside",
        "strings",
        "object-string",
        "object-outside",
        "object-fraction",
        "above",
        "below-start",
        "binary",
        "floats",
        "length",
    ],
)
def test_one_number_per_env_is_still_checked(backend, space, actions, message):
    with aiovec.VecEnv([partial(RecordingEnv, space)] * 2, backend=backend) as venv:
        venv.reset(seed=0)
        with pytest.raises((ValueError, TypeError), match=message):
            venv.step(actions)
        assert venv.get_attr("received") == ([], [])  # nothing reached an env


def test_a_flat_batch_for_a_box_of_several_elements_is_still_refused(backend):
    space = spaces.Box(0, 1, (2,))
    with aiovec.VecEnv([partial(RecordingEnv, space)] * 2, backend=backend) as venv:
        venv.reset(seed=0)
        with pytest.raises(ValueError, match=r"expected shape \(2, 2\)"):
            venv.step([0.5, 0.5, 0.5, 0.5])
        with pytest.raises(ValueError, match=r"expected shape \(2, 2\)"):
            venv.step([0.5, 0.5])


def test_actions_of_the_spaces_dtype_take_shared_memory_and_paths_can_alternate(backend):
    space = spaces.Box(-10, 10, (1,), np.float32)
    with aiovec.VecEnv([partial(RecordingEnv, space)] * 2, backend=backend) as venv:
        venv.reset(seed=0)
        venv.step(np.array([[1.5], [2.5]], dtype=np.float32))
        assert venv._buffers.actions.tolist() == [[1.5], [2.5]]  # the shared path
        venv.step(np.array([[3.25], [4.25]]))  # float64: by value, the buffer is untouched
        assert venv._buffers.actions.tolist() == [[1.5], [2.5]]
        venv.step(np.array([[5.5], [6.5]], dtype=np.float32))
        received = venv.get_attr("received")
    assert received[0] == [
        ("ndarray", "float32", [1.5]),
        ("ndarray", "float64", [3.25]),
        ("ndarray", "float32", [5.5]),
    ]
    assert received[1][1] == ("ndarray", "float64", [4.25])


@pytest.mark.parametrize(
    "space, actions",
    [
        (spaces.Discrete(3), np.array([255, 1], dtype=np.uint8)),
        (spaces.Discrete(3), np.array([2**63 + 1, 1], dtype=np.uint64)),
        (spaces.Discrete(3), [300, 1]),
        (spaces.Discrete(3, dtype=np.int8), np.array([258, 1])),  # int8(258) would be 2
        (spaces.MultiDiscrete([3, 3], dtype=np.uint8), np.array([[256, 0], [1, 1]])),
        (spaces.MultiBinary(2), np.array([[2, 0], [1, 1]], dtype=np.int16)),
    ],
    ids=["uint8-255", "uint64-huge", "list-300", "258-for-int8", "256-for-uint8", "binary"],
)
def test_range_checks_are_not_fooled_by_wrapping(backend, space, actions):
    with aiovec.VecEnv([partial(RecordingEnv, space)] * 2, backend=backend) as venv:
        venv.reset(seed=0)
        with pytest.raises(ValueError, match="outside"):
            venv.step(actions)
        assert venv.get_attr("received") == ([], [])


# --- item 5: render_mode in make ----------------------------------------------------------


def test_make_passes_render_mode_to_each_env(backend):
    with aiovec.make("CartPole-v1", 2, render_mode="rgb_array", backend=backend) as venv:
        assert venv.render_mode == "rgb_array"
        assert venv.get_attr("render_mode") == ("rgb_array", "rgb_array")
    with aiovec.make(SpacesEnv, 2, render_mode="rgb_array", backend=backend) as venv:
        assert venv.render_mode == "rgb_array"
        venv.reset(seed=0)
        frames = venv.render()
        assert len(frames) == 2 and frames[0].shape == (2, 2, 3)
    with aiovec.make("CartPole-v1", 2, backend=backend) as venv:
        assert venv.render_mode is None


def test_render_mode_conflicting_with_env_kwargs_is_refused():
    with pytest.raises(ValueError, match="render_mode"):
        aiovec.make(SpacesEnv, 2, render_mode="rgb_array", env_kwargs={"render_mode": "human"})


def test_cartpole_frames_like_make_vec():
    pytest.importorskip("pygame")
    expected = gym.make_vec("CartPole-v1", 2, vectorization_mode="sync", render_mode="rgb_array")
    expected.reset(seed=0)
    with aiovec.make("CartPole-v1", 2, render_mode="rgb_array", backend="inline") as venv:
        venv.reset(seed=0)
        for frame, expected_frame in zip(venv.render(), expected.render()):
            np.testing.assert_array_equal(frame, expected_frame)
    expected.close()


# --- first-ready sends to one env take a shorter path: the same actions, the same refusals ---


_ONE_ENV_CASES = {
    "discrete-int64": (spaces.Discrete(3), np.array([2, 1])),
    "discrete-python-ints": (spaces.Discrete(3), [2, 1]),
    "box-float32": (
        spaces.Box(-10, 10, (2,), np.float32),
        np.array([[1.5, 2.5], [3.5, 4.5]], np.float32),
    ),
    "box-float64-by-value": (
        spaces.Box(-10, 10, (2,), np.float32),
        np.array([[1.25, 2.0], [3.0, 4.0]]),
    ),
    "dict": (
        spaces.Dict({"move": spaces.Discrete(4), "aim": spaces.Box(-1, 1, (2,), np.float32)}),
        {"move": np.array([3, 0]), "aim": np.array([[0.5, -0.5], [0.25, 0.75]], np.float32)},
    ),
}


@pytest.mark.parametrize("case", sorted(_ONE_ENV_CASES))
@pytest.mark.parametrize(
    "as_ids",
    [lambda i: [i], lambda i: (i,), lambda i: np.array([i], np.int32), lambda i: [np.int64(i)]],
    ids=["list", "tuple", "int32-array", "numpy-int"],
)
async def test_sending_to_one_env_delivers_what_a_step_of_all_delivers(backend, case, as_ids):
    space, actions = _ONE_ENV_CASES[case]
    env_fns = [partial(RecordingEnv, space)] * 2
    async with aiovec.VecEnv(env_fns, backend=backend) as venv:
        await venv.areset(seed=0)
        await venv.astep(actions)
        for env_id in (1, 0):  # each env on its own, with the other one's action
            venv.send(_rows(actions, 1 - env_id), as_ids(env_id))
            batch = await venv.recv()
            assert batch.env_ids.tolist() == [env_id]
        received = await venv.acall("received")
    # What one send gave an env is what the step of all gave the env whose row it was.
    assert [received[0][1], received[1][1]] == [received[1][0], received[0][0]]


def _rows(actions, env_id):
    """Row ``env_id`` of a batch of actions, as a batch of one (the caller's kind kept)."""
    if isinstance(actions, dict):
        return {key: _rows(part, env_id) for key, part in actions.items()}
    return actions[env_id : env_id + 1]


async def test_sending_to_one_env_is_refused_as_sending_to_several(backend):
    env_fns = [partial(RecordingEnv, spaces.Discrete(3))] * 2
    async with aiovec.VecEnv(env_fns, backend=backend) as venv:
        await venv.areset(seed=0)
        refused = [
            (ValueError, "outside 0..1", np.array([0]), [2]),
            (ValueError, "outside 0..1", np.array([0]), np.array([-1])),
            (TypeError, "sequence of ints", np.array([0]), [True]),
            (TypeError, "sequence of ints", np.array([0]), np.array([0.0])),
            (TypeError, "sequence of ints, got 1", np.array([0]), 1),  # (not "not iterable")
            (TypeError, "sequence of ints", np.array([0]), np.int64(1)),
            (ValueError, "outside", np.array([3]), [0]),
            (ValueError, "expected shape", np.array([[0, 1]]), [0]),
        ]
        for error, message, actions, env_ids in refused:
            with pytest.raises(error, match=message):
                venv.send(actions, env_ids)
        venv.send(np.array([1]), [0])
        with pytest.raises(aiovec.EnvBusyError, match="in flight|not yet taken"):
            venv.send(np.array([1]), [0])  # its step is in flight (or its result unread)
        batch = await venv.recv()
        assert batch.env_ids.tolist() == [0]
        assert await venv.acall("received") == ([("int64", "int64", 1)], [])  # once only
    with pytest.raises(aiovec.ClosedError):
        venv.send(np.array([1]), [0])
