"""Property-based checks of the transport (hypothesis): for any Gymnasium space built
from every space type, nested in Dict/Tuple, samples survive the wire exactly (as infos,
call results and by-value actions), batches of them pass the action check unchanged, and
the shared rows give back exactly what was written. No processes."""

from __future__ import annotations

import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aiovec._transport.buffers import build_buffers
from aiovec._transport.protocol import (
    Reply,
    Step,
    decode_command,
    decode_message,
    encode,
    encode_reply,
    wire_command,
)
from aiovec._transport.spaces import batch_checker, is_shareable, read_rows, write_rows
from tests.test_wire import assert_exact

NUMERIC_DTYPES = [np.float16, np.float32, np.float64, np.int8, np.int16, np.int64, np.uint8]

shapes = st.lists(st.integers(1, 4), min_size=0, max_size=3).map(tuple)


@st.composite
def boxes(draw: st.DrawFn) -> spaces.Box:
    dtype = np.dtype(draw(st.sampled_from(NUMERIC_DTYPES)))
    shape = draw(shapes)
    if dtype.kind == "f":
        return spaces.Box(-2.0, 2.0, shape, dtype)
    # Gymnasium's own sampling overflows for bounds near the int64 limits: stay within 2**40.
    info = np.iinfo(dtype)
    floor, ceiling = max(int(info.min), -(2**40)), min(int(info.max), 2**40)
    low = draw(st.integers(floor, ceiling))
    high = draw(st.integers(low, ceiling))
    return spaces.Box(low, high, shape, dtype)


leaves = st.one_of(
    boxes(),
    st.builds(spaces.Discrete, st.integers(1, 50), start=st.integers(-10, 10)),
    st.builds(spaces.MultiDiscrete, st.lists(st.integers(1, 9), min_size=1, max_size=4)),
    st.builds(spaces.MultiBinary, st.integers(1, 6)),
    st.builds(spaces.Text, st.integers(1, 8), min_length=st.just(0)),
)
# Spaces whose samples vary in size: never in shared memory, always by value.
dynamic = st.one_of(
    st.builds(spaces.Graph, boxes(), st.one_of(st.none(), st.just(spaces.Discrete(3)))),
    st.builds(spaces.Sequence, leaves),
    st.builds(lambda items: spaces.OneOf(items), st.lists(leaves, min_size=1, max_size=3)),
)


def containers(children: st.SearchStrategy[spaces.Space]) -> st.SearchStrategy[spaces.Space]:
    return st.one_of(
        st.dictionaries(
            st.text("abcxyz", min_size=1, max_size=3), children, min_size=1, max_size=3
        ).map(spaces.Dict),
        st.lists(children, min_size=1, max_size=3).map(lambda items: spaces.Tuple(items)),
    )


shareable_spaces = st.recursive(
    leaves.filter(lambda s: not isinstance(s, spaces.Text)), containers, max_leaves=6
)
any_spaces = st.recursive(st.one_of(leaves, dynamic), containers, max_leaves=6)

PROPERTY = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(space=any_spaces, seed=st.integers(0, 2**32 - 1), count=st.integers(1, 5))
def test_samples_of_any_space_cross_the_wire_exactly(space, seed, count):
    space.seed(seed)
    samples = [space.sample() for _ in range(count)]
    reply = Reply(
        seq=1, env_ids=list(range(count)), infos=[{"s": s} for s in samples], values=samples
    )
    decoded = decode_message(encode_reply(reply))
    step = decode_command(encode(wire_command(Step(2, list(range(count)), samples, True))))
    for index, sample in enumerate(samples):
        assert_exact(decoded.infos[index]["s"], sample)
        assert_exact(decoded.values[index], sample)
        assert_exact(step.actions[index], sample)


@PROPERTY
@given(space=any_spaces, seed=st.integers(0, 2**32 - 1), count=st.integers(1, 5))
def test_a_batch_of_samples_passes_the_action_check(space, seed, count):
    space.seed(seed)
    batched = batch_space(space, count)
    batch = concatenate(
        space, [space.sample() for _ in range(count)], create_empty_array(space, count)
    )
    checked, exact = batch_checker(space)(batch, count)
    if is_shareable(space):
        assert exact  # the space's own dtypes: the shared-memory path
    assert batched.contains(batch)


@PROPERTY
@given(
    space=shareable_spaces, seed=st.integers(0, 2**32 - 1), count=st.integers(1, 6), data=st.data()
)
def test_rows_written_to_shared_buffers_read_back_exactly(space, seed, count, data):
    buffers = build_buffers(space, spaces.Discrete(2), count, np.zeros)
    space.seed(seed)
    rows = data.draw(st.lists(st.integers(0, count - 1), min_size=1, max_size=count, unique=True))
    batch = concatenate(space, [space.sample() for _ in rows], create_empty_array(space, len(rows)))
    checked, _ = batch_checker(space, "observations")(batch, len(rows))
    write_rows(buffers.observations, np.array(rows), checked)
    assert_exact(read_rows(buffers.observations, np.array(rows)), batch)
