"""The wire protocol round-trips every value exactly: samples of every Gymnasium space
type (as infos, call results, observations and actions travel), and every command and
reply, including the compact form of a step for a worker's whole group. No processes:
encoding and decoding only."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces

from aiovec._transport.protocol import (
    Call,
    ErrorInfo,
    Reply,
    Reset,
    SetAttr,
    Step,
    compact_step,
    decode_command,
    decode_message,
    encode,
    encode_reply,
    expand_command,
    wire_command,
)

SPACES = {
    "box-f32": spaces.Box(-1, 1, (3, 2), np.float32),
    "box-f64": spaces.Box(-1, 1, (4,), np.float64),
    "box-u8-image": spaces.Box(0, 255, (8, 8, 3), np.uint8),
    "box-i64": spaces.Box(-(2**40), 2**40, (2,), np.int64),
    "box-f16-scalar": spaces.Box(-1, 1, (), np.float16),
    "discrete": spaces.Discrete(7, start=-3),
    "multi-discrete": spaces.MultiDiscrete([[2, 3], [4, 5]]),
    "multi-binary": spaces.MultiBinary(5),
    "text": spaces.Text(12),
    "graph": spaces.Graph(spaces.Box(-1, 1, (2,)), spaces.Discrete(3)),
    "sequence": spaces.Sequence(spaces.Discrete(4)),
    "one-of": spaces.OneOf([spaces.Discrete(2), spaces.Box(-1, 1, (2,))]),
    "dict": spaces.Dict(
        {"pos": spaces.Box(-1, 1, (2,)), "inner": spaces.Dict({"k": spaces.Discrete(3)})}
    ),
    "tuple": spaces.Tuple((spaces.MultiBinary(2), spaces.Text(4), spaces.Discrete(2))),
}


def assert_exact(actual, expected, path="value"):
    """Equal values of the same types (and dtypes, for numpy)."""
    assert type(actual) is type(expected), f"{path}: {type(actual)} is not {type(expected)}"
    if isinstance(expected, np.ndarray | np.generic):
        assert actual.dtype == expected.dtype, f"{path}: {actual.dtype} != {expected.dtype}"
        assert actual.shape == expected.shape, f"{path}: {actual.shape} != {expected.shape}"
        np.testing.assert_array_equal(actual, expected, err_msg=path)
    elif isinstance(expected, dict):
        assert list(actual) == list(expected), path
        for key in expected:
            assert_exact(actual[key], expected[key], f"{path}[{key!r}]")
    elif isinstance(expected, tuple | list):
        assert len(actual) == len(expected), path
        for index, (a, e) in enumerate(zip(actual, expected)):
            assert_exact(a, e, f"{path}[{index}]")
    elif hasattr(expected, "_fields"):  # GraphInstance and other named tuples
        for field in expected._fields:
            assert_exact(getattr(actual, field), getattr(expected, field), f"{path}.{field}")
    else:
        assert actual == expected, path


def round_trip_reply(values):
    reply = Reply(seq=3, env_ids=list(range(len(values))), infos=values, values=values)
    decoded = decode_message(encode_reply(reply))
    return decoded.infos, decoded.values


@pytest.mark.parametrize("name", sorted(SPACES))
def test_samples_of_every_space_round_trip_exactly(name):
    space = SPACES[name]
    space.seed(0)
    samples = [space.sample() for _ in range(25)]
    infos, values = round_trip_reply(
        [{"sample": sample, "n": i} for i, sample in enumerate(samples)]
    )
    for sample, info, value in zip(samples, infos, values):
        assert_exact(info["sample"], sample)
        assert_exact(value["sample"], sample)
    # Actions by value (spaces not in shared memory, or another dtype than the space's).
    step = Step(9, list(range(len(samples))), samples, stream=True)
    decoded = decode_command(encode(wire_command(step)))
    assert decoded.seq == 9 and decoded.stream
    for sample, action in zip(samples, decoded.actions):
        assert_exact(action, sample)


@pytest.mark.parametrize(
    "value",
    [
        0,
        -(2**63),
        2**64 - 1,
        2**70,  # beyond msgpack's integers: pickled, still exact
        1.5,
        float("inf"),
        True,
        None,
        "text",
        "non-ASCII: é ✓",
        "/data/\udcff.cfg",  # a lone surrogate (os.fsdecode of a bad name): pickled, exact
        b"\x00bytes",
        [1, [2, 3]],
        (1, "a"),
        {1: "non-str keys"},
        {"nested": {"array": np.arange(6, dtype=np.int16).reshape(2, 3)}},
        np.float32(0.25),
        np.int8(-3),
        np.bool_(True),
        np.array(["a", "bc"]),  # not a numeric dtype: pickled
        np.zeros((0, 4), np.float64),
        np.array(7),  # 0-d arrays stay 0-d (not shape (1,))
        np.array(0.5, np.float32),
        np.ones((1, 1, 1), np.uint8),
        np.asfortranarray(np.arange(6.0).reshape(2, 3)),
        np.arange(10)[::3],  # not contiguous
        {1, 2},
        frozenset({"a"}),
        complex(1, 2),
        slice(1, 5),
    ],
    ids=repr,
)
def test_infos_and_call_results_keep_value_and_type(value):
    infos, values = round_trip_reply([{"x": value}])
    assert_exact(infos[0]["x"], value)
    assert_exact(values[0]["x"], value)


def test_commands_round_trip():
    commands = [
        Reset(1, [0, 2], [5, None], {"difficulty": np.float32(2)}),
        Reset(2, [1], [None], [{"a": 1}], per_env_options=True),
        Step(3, [4, 5], None),
        Call(4, [0], "render", (1,), {"mode": "x"}),
        SetAttr(5, [0, 1], "gravity", [9.8, np.float64(3.7)]),
    ]
    for command in commands:
        decoded = decode_command(encode(wire_command(command)))
        assert type(decoded) is type(command)
        assert decoded.seq == command.seq and decoded.env_ids == command.env_ids


def test_a_step_for_a_whole_group_travels_without_its_env_ids():
    group = list(range(100, 4196))
    compact = compact_step(Step(7, group, None), group)
    frame = encode(wire_command(compact))
    assert len(frame) < 32  # no env ids on the wire
    decoded = expand_command(decode_command(frame), group)
    assert decoded.env_ids is group
    # A step for another list (even with the same ids) travels in full.
    assert compact_step(Step(8, list(group), None), group).env_ids == group
    # The reply for the whole group comes back compact; the agent restores its ids.
    reply = Reply(7, group, infos=None)
    assert decode_message(encode_reply(reply, group)).env_ids == []
    assert decode_message(encode_reply(Reply(7, group[:3]), group)).env_ids == group[:3]


def test_errors_standing_for_a_block_keep_every_env_id():
    error = ErrorInfo(
        4, "step", "RuntimeError", "boom", "tb", exc_module="builtins", env_ids=[4, 5, 6, 7]
    )
    decoded = decode_message(encode_reply(Reply(1, [4, 5, 6, 7], errors=[error])))
    assert decoded.errors[0].env_ids == [4, 5, 6, 7]
    exception = decoded.errors[0].to_exception()
    assert isinstance(exception, RuntimeError) and exception.env_index == 4


@pytest.mark.parametrize("field", ["infos", "values", "observations"])
def test_a_value_that_cannot_be_pickled_fails_only_its_env(field):
    import threading

    # Env 4 stepped and its info cannot travel; envs 3 and 5 are fine, and so is the
    # error env 6 raised itself: only env 4's part is replaced by an error.
    raised = ErrorInfo(6, "step", "RuntimeError", "boom", "tb", exc_module="builtins")
    parts = [{"a": 1}, {"lock": threading.Lock()}, {"b": 2}, None]
    reply = Reply(2, [3, 4, 5, 6], errors=[raised], busy=0.5, **{field: parts})
    decoded = decode_message(encode_reply(reply))
    assert decoded.env_ids == [3, 4, 5, 6] and decoded.busy == 0.5
    assert getattr(decoded, field) == [{"a": 1}, None, {"b": 2}, None]
    assert [(error.env_id, error.exc_type) for error in decoded.errors] == [
        (6, "RuntimeError"),
        (4, "TypeError"),
    ]
    message = decoded.errors[1].message
    assert "could not be sent back" in message and "_thread.lock" in message
    # The part that cannot travel is named, down to its key.
    part = {
        "infos": "info['lock']",
        "values": "call result['lock']",
        "observations": "observation['lock']",
    }
    assert part[field] in message


def test_the_unsendable_part_of_a_nested_info_is_named_by_its_path():
    import threading

    info = {"ok": [1, 2], "stats": {"fine": 1.0, "handles": [0, threading.Lock()]}}
    decoded = decode_message(encode_reply(Reply(2, [0], infos=[info])))
    message = decoded.errors[0].message
    assert "info['stats']['handles'][1]" in message, message


def test_a_reply_that_cannot_be_encoded_as_a_whole_fails_each_of_its_envs():
    # No env's own part to blame (an error text that cannot be encoded): every env fails.
    unsendable = ErrorInfo(0, "step", "RuntimeError", "bad \udcff", "", exc_module="builtins")
    decoded = decode_message(encode_reply(Reply(2, [0, 1], infos=[{}, {}], errors=[unsendable])))
    assert [error.env_id for error in decoded.errors] == [0, 1]
    assert "could not be sent back" in decoded.errors[0].message


def _round_trip(value):
    reply = decode_message(encode_reply(Reply(1, [0], values=[value])))
    assert reply.errors is None, reply.errors
    return reply.values[0]


def test_values_holding_a_reference_cycle_travel_with_it():
    # A tree whose children point back to their parent, a dict holding itself: pickled
    # whole (as AsyncVectorEnv sends them), never walked without end.
    root = {"name": "root", "children": []}
    root["children"].append({"name": "leaf", "parent": root})
    tree = _round_trip(root)
    assert tree["children"][0]["parent"] is tree
    looped = []
    looped.append(looped)
    back = _round_trip({"loop": looped})
    assert back["loop"][0] is back["loop"]


def test_values_sharing_an_object_keep_sharing_it():
    shared, array = [1, 2], np.arange(3)
    back = _round_trip({"a": shared, "b": [shared], "x": array, "y": array})
    assert back["a"] is back["b"][0] and back["a"] == [1, 2]
    assert back["x"] is back["y"] and back["x"].tolist() == [0, 1, 2]


def test_a_dict_with_a_key_msgpack_cannot_carry_travels_pickled():
    # A lone surrogate (os.fsdecode of an undecodable file name) in a key, as in a value.
    back = _round_trip({"\udcffk": 1, "ok": {"\ud800": [2]}})
    assert back == {"\udcffk": 1, "ok": {"\ud800": [2]}}
