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
def batch_checker(space: spaces.Space, path: str = "actions") -> Callable[[Any, int], Any]:
    """A function ``check(batch, count)`` validating ``count`` samples of ``space``.

    ``check`` returns the batch as numpy arrays (a tuple of objects for spaces that are
    not shareable). It checks shape and dtype kind everywhere and the range of discrete
    values; Box bounds are not checked (Gymnasium does not clip either).

    Raises (from ``check``):
        ValueError / TypeError: naming the offending part of the batch and what was expected.
    """

    def check(batch: Any, count: int) -> Any:  # not shareable: one Python object per env
        if not isinstance(batch, (list, tuple)) or len(batch) != count:
            raise ValueError(
                f"{path}: expected a sequence of {count} samples of {space}, got {_preview(batch)}"
            )
        return tuple(batch)

    return check


@batch_checker.register(spaces.Box)
def _box_checker(space: spaces.Box, path: str = "actions") -> Callable[[Any, int], Any]:
    shape = space.shape

    def check(batch: Any, count: int) -> Any:
        array = np.asarray(batch)
        _check_shape(array, count, shape, space, path)
        if array.dtype.kind not in "biuf":
            raise TypeError(f"{path}: expected numbers for {space}, got dtype {array.dtype}")
        return array

    return check


@batch_checker.register(spaces.Discrete)
@batch_checker.register(spaces.MultiDiscrete)
@batch_checker.register(spaces.MultiBinary)
def _discrete_checker(space: spaces.Space, path: str = "actions") -> Callable[[Any, int], Any]:
    shape = space.shape
    if isinstance(space, spaces.Discrete):
        low, high = int(space.start), int(space.start + space.n - 1)
    elif isinstance(space, spaces.MultiDiscrete):
        low, high = space.start, space.start + space.nvec - 1  # per-element arrays
    else:
        low, high = 0, 1
    scalar_bounds = isinstance(low, int)

    def check(batch: Any, count: int) -> Any:
        array = np.asarray(batch)
        _check_shape(array, count, shape, space, path)
        if array.dtype.kind not in "biu":
            raise TypeError(
                f"{path}: expected integers for {space}, got dtype {array.dtype}; "
                "cast with .astype(int) if the values are whole numbers"
            )
        if scalar_bounds and array.size <= 64:  # Python's min/max beat numpy's on few values
            values = array.ravel().tolist()
            in_range = not values or (min(values) >= low and max(values) <= high)
        else:
            in_range = not ((array < low).any() or (array > high).any())
        if not in_range:
            bad = array[(array < low) | (array > high)]
            raise ValueError(f"{path}: values {bad[:5].tolist()} are outside {space}")
        return array

    return check


def _check_shape(array: np.ndarray, count: int, shape: tuple, space: spaces.Space, path: str):
    if array.shape[:1] != (count,) or array.shape[1:] != shape:
        raise ValueError(
            f"{path}: expected shape {(count, *shape)} (one row of {space} per env), "
            f"got {array.shape}"
        )


@batch_checker.register(spaces.Dict)
def _dict_checker(space: spaces.Dict, path: str = "actions") -> Callable[[Any, int], Any]:
    checkers = {key: batch_checker(sub, f"{path}[{key!r}]") for key, sub in space.spaces.items()}

    def check(batch: Any, count: int) -> Any:
        if not isinstance(batch, dict) or batch.keys() != checkers.keys():
            keys = sorted(batch) if isinstance(batch, dict) else type(batch).__name__
            raise ValueError(f"{path}: expected a dict with keys {sorted(checkers)}, got {keys}")
        return {key: check_item(batch[key], count) for key, check_item in checkers.items()}

    return check


@batch_checker.register(spaces.Tuple)
def _tuple_checker(space: spaces.Tuple, path: str = "actions") -> Callable[[Any, int], Any]:
    checkers = [batch_checker(sub, f"{path}[{i}]") for i, sub in enumerate(space.spaces)]

    def check(batch: Any, count: int) -> Any:
        if not isinstance(batch, (tuple, list)) or len(batch) != len(checkers):
            raise ValueError(f"{path}: expected a tuple of {len(checkers)} batches")
        return tuple(check_item(item, count) for check_item, item in zip(checkers, batch))

    return check
