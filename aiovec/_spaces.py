"""Space-aware buffers: batched numpy arrays laid out from a Gymnasium space.

A *buffer* is what ``gymnasium.vector.utils.create_empty_array`` builds for a space:
an array for Box/Discrete/MultiDiscrete/MultiBinary, and dicts/tuples of buffers for
Dict/Tuple. Row ``i`` belongs to env ``i``. Spaces that have no fixed-size array form
(Text, Graph, Sequence, custom) are *not shareable*: their values travel in messages.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import singledispatch
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import create_empty_array

_ARRAY_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)


def is_shareable(space: spaces.Space) -> bool:
    """True when every leaf of ``space`` has a fixed shape and dtype."""
    if isinstance(space, _ARRAY_SPACES):
        return True
    if isinstance(space, spaces.Dict):
        return all(is_shareable(sub) for sub in space.spaces.values())
    if isinstance(space, spaces.Tuple):
        return all(is_shareable(sub) for sub in space.spaces)
    return False


def allocate(space: spaces.Space, num_envs: int, allocator: Any) -> Any:
    """A buffer with ``num_envs`` rows for a shareable ``space``, from ``allocator``."""
    return create_empty_array(space, n=num_envs, fn=allocator)


# --- writing one env's value into its row ---------------------------------------------


@singledispatch
def row_writer(space: spaces.Space, buffer: Any) -> Callable[[int, Any], None]:
    """A function ``write(index, value)`` storing one sample of ``space`` in row ``index``.

    ``write`` raises ValueError, leaving the buffer as it was, when ``value`` does not
    have the shape of ``space`` or has a dtype that does not convert to it within kind.
    Built once per space so the per-step cost is a few comparisons and one copy.
    """
    raise TypeError(f"{type(space).__name__} is not a shareable space")


@row_writer.register(spaces.Box)
@row_writer.register(spaces.Discrete)
@row_writer.register(spaces.MultiDiscrete)
@row_writer.register(spaces.MultiBinary)
def _array_row_writer(space: spaces.Space, buffer: np.ndarray) -> Callable[[int, Any], None]:
    shape, dtype = space.shape, space.dtype

    def write(index: int, value: Any) -> None:
        array = value if type(value) is np.ndarray else np.asarray(value)
        if array.shape != shape:
            raise ValueError(
                f"expected shape {shape} for {space}, got shape {array.shape} "
                f"(value {_preview(value)})"
            )
        if array.dtype != dtype and not np.can_cast(array.dtype, dtype, "same_kind"):
            raise ValueError(f"expected dtype {dtype} for {space}, got dtype {array.dtype}")
        buffer[index] = array

    return write


@row_writer.register(spaces.Dict)
def _dict_row_writer(space: spaces.Dict, buffer: dict) -> Callable[[int, Any], None]:
    writers = {key: row_writer(sub, buffer[key]) for key, sub in space.spaces.items()}

    def write(index: int, value: Any) -> None:
        if not isinstance(value, dict) or value.keys() != writers.keys():
            keys = sorted(value) if isinstance(value, dict) else type(value).__name__
            raise ValueError(f"expected a dict with keys {sorted(writers)}, got {keys}")
        for key, write_item in writers.items():
            write_item(index, value[key])

    return write


@row_writer.register(spaces.Tuple)
def _tuple_row_writer(space: spaces.Tuple, buffer: tuple) -> Callable[[int, Any], None]:
    writers = [row_writer(sub, subbuffer) for sub, subbuffer in zip(space.spaces, buffer)]

    def write(index: int, value: Any) -> None:
        if not isinstance(value, (tuple, list)) or len(value) != len(writers):
            raise ValueError(f"expected a tuple of {len(writers)} items, got {_preview(value)}")
        for write_item, item in zip(writers, value):
            write_item(index, item)

    return write


def _preview(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# --- reading rows back ----------------------------------------------------------------


def read_row(buffer: Any, index: int) -> Any:
    """A private copy of row ``index`` (what a single env receives as its action)."""
    if isinstance(buffer, np.ndarray):
        row = buffer[index]
        return row.copy() if isinstance(row, np.ndarray) else row
    if isinstance(buffer, dict):
        return {key: read_row(sub, index) for key, sub in buffer.items()}
    return tuple(read_row(sub, index) for sub in buffer)


def read_rows(buffer: Any, env_ids: Sequence[int] | np.ndarray) -> Any:
    """A fresh batch holding the rows ``env_ids``, in that order."""
    if isinstance(buffer, np.ndarray):
        return buffer[env_ids]
    if isinstance(buffer, dict):
        return {key: read_rows(sub, env_ids) for key, sub in buffer.items()}
    return tuple(read_rows(sub, env_ids) for sub in buffer)


def copy_buffer(buffer: Any) -> Any:
    """A deep copy of a whole buffer."""
    if isinstance(buffer, np.ndarray):
        return buffer.copy()
    if isinstance(buffer, dict):
        return {key: copy_buffer(sub) for key, sub in buffer.items()}
    return tuple(copy_buffer(sub) for sub in buffer)


def write_rows(buffer: Any, env_ids: Sequence[int] | slice, batch: Any) -> None:
    """Write a validated batch (see :func:`check_batch`) into the rows ``env_ids``."""
    if isinstance(buffer, np.ndarray):
        buffer[env_ids] = batch
    elif isinstance(buffer, dict):
        for key, sub in buffer.items():
            write_rows(sub, env_ids, batch[key])
    else:
        for sub, item in zip(buffer, batch):
            write_rows(sub, env_ids, item)


# --- validating a batch of actions before anything is written --------------------------


@singledispatch
def check_batch(space: spaces.Space, batch: Any, count: int, path: str = "actions") -> Any:
    """Validate a batch of ``count`` samples of ``space``; return it as numpy arrays.

    Checks shape and dtype kind everywhere and the range of discrete values; Box
    bounds are not checked (Gymnasium does not clip either).

    Raises:
        ValueError / TypeError: naming the offending part of the batch and what was expected.
    """
    # Not shareable: one Python object per env.
    if not isinstance(batch, (list, tuple)) or len(batch) != count:
        raise ValueError(
            f"{path}: expected a sequence of {count} samples of {space}, got {_preview(batch)}"
        )
    return tuple(batch)


@check_batch.register(spaces.Box)
@check_batch.register(spaces.Discrete)
@check_batch.register(spaces.MultiDiscrete)
@check_batch.register(spaces.MultiBinary)
def _check_array_batch(space: spaces.Space, batch: Any, count: int, path: str = "actions") -> Any:
    array = np.asarray(batch)
    expected = (count, *space.shape)
    if array.shape != expected:
        raise ValueError(
            f"{path}: expected shape {expected} (one row of {space} per env), got {array.shape}"
        )
    if isinstance(space, spaces.Box):
        if array.dtype.kind not in "biuf":
            raise TypeError(f"{path}: expected numbers for {space}, got dtype {array.dtype}")
        return array
    if array.dtype.kind not in "biu":
        raise TypeError(
            f"{path}: expected integers for {space}, got dtype {array.dtype}; "
            "cast with .astype(int) if the values are whole numbers"
        )
    if array.size:
        low, high = _discrete_bounds(space)
        if (array < low).any() or (array > high).any():
            bad = array[(array < low) | (array > high)]
            raise ValueError(f"{path}: values {bad[:5].tolist()} are outside {space}")
    return array


def _discrete_bounds(space: spaces.Space) -> tuple[Any, Any]:
    if isinstance(space, spaces.Discrete):
        return space.start, space.start + space.n - 1
    if isinstance(space, spaces.MultiDiscrete):
        return space.start, space.start + space.nvec - 1
    return 0, 1  # MultiBinary


@check_batch.register(spaces.Dict)
def _check_dict_batch(space: spaces.Dict, batch: Any, count: int, path: str = "actions") -> Any:
    if not isinstance(batch, dict) or batch.keys() != space.spaces.keys():
        keys = sorted(batch) if isinstance(batch, dict) else type(batch).__name__
        raise ValueError(f"{path}: expected a dict with keys {sorted(space.spaces)}, got {keys}")
    return {
        key: check_batch(sub, batch[key], count, f"{path}[{key!r}]")
        for key, sub in space.spaces.items()
    }


@check_batch.register(spaces.Tuple)
def _check_tuple_batch(space: spaces.Tuple, batch: Any, count: int, path: str = "actions") -> Any:
    if not isinstance(batch, (tuple, list)) or len(batch) != len(space.spaces):
        raise ValueError(f"{path}: expected a tuple of {len(space.spaces)} batches")
    return tuple(
        check_batch(sub, item, count, f"{path}[{i}]")
        for i, (sub, item) in enumerate(zip(space.spaces, batch))
    )
