"""Space-aware buffers: batched numpy arrays laid out from a Gymnasium space.

A *buffer* is what ``gymnasium.vector.utils.create_empty_array`` builds for a space:
an array for Box/Discrete/MultiDiscrete/MultiBinary, and dicts/tuples of buffers for
Dict/Tuple. Row ``i`` belongs to env ``i``. Spaces that have no fixed-size array form
(Text, Graph, Sequence, custom) are *not shareable*: their values travel in messages.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import singledispatch
from typing import Any, cast

import numpy as np
from gymnasium import spaces
from gymnasium.spaces.utils import is_space_dtype_shape_equiv
from gymnasium.vector.utils import (
    batch_differing_spaces,
    batch_space,
    concatenate,
    create_empty_array,
    iterate,
)

_ARRAY_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)


def is_shareable(space: spaces.Space[Any]) -> bool:
    """True when every leaf of ``space`` has a fixed shape and dtype."""
    if isinstance(space, _ARRAY_SPACES):
        return True
    if isinstance(space, spaces.Dict):
        return all(is_shareable(sub) for sub in space.spaces.values())
    if isinstance(space, spaces.Tuple):
        return all(is_shareable(sub) for sub in space.spaces)
    return False


_GYMNASIUM_SHARED_SPACES = (*_ARRAY_SPACES, spaces.Text, spaces.OneOf)


def check_gymnasium_shareable(space: spaces.Space[Any]) -> None:
    """Refuse, as ``AsyncVectorEnv(shared_memory=True)`` does, an observation space
    that Gymnasium cannot place in shared memory: ``TypeError`` for a Graph or Sequence
    anywhere in it (dynamic shapes), ``ValueError`` for a custom space."""
    if isinstance(space, spaces.Dict):
        for sub in space.spaces.values():
            check_gymnasium_shareable(sub)
    elif isinstance(space, spaces.Tuple):
        for sub in space.spaces:
            check_gymnasium_shareable(sub)
    elif isinstance(space, (spaces.Graph, spaces.Sequence)):
        raise TypeError(
            # Gymnasium's wording (code may match it), then the fix.
            f"shared_memory=True: {space} has a dynamic shape so its not possible to make a "
            "static shared memory. Pass shared_memory=False (or leave it out: aiovec then "
            "shares what it can and sends the rest by value)"
        )
    elif not isinstance(space, _GYMNASIUM_SHARED_SPACES):
        raise ValueError(
            f"shared_memory=True: the custom space {space!r} cannot live in shared memory; "
            "pass shared_memory=False (or leave it out: aiovec then shares what it can and "
            "sends the rest by value)"
        )


def allocate(space: spaces.Space[Any], num_envs: int, allocator: Any) -> Any:
    """A buffer with ``num_envs`` rows for a shareable ``space``, from ``allocator``."""
    return create_empty_array(space, n=num_envs, fn=allocator)


def batch_values(space: spaces.Space[Any], values: Sequence[Any]) -> Any:
    """One sample of ``space`` per env (``values``) as Gymnasium batches them: what
    ``concatenate`` gives into ``create_empty_array(space, len(values))`` (for Text,
    Graph, Sequence and custom spaces at the top level: a tuple of the values)."""
    # create_empty_array is annotated as possibly returning None, which it never does.
    out: Any = create_empty_array(space, n=len(values))
    return concatenate(space, values, out)


def split_batch(batched_space: spaces.Space[Any], batch: Any) -> list[Any]:
    """The samples of a batch of ``batched_space``, one per env, as Gymnasium's
    ``iterate`` splits it; arrays are copies (an env may keep its action)."""
    return [_own(item) for item in iterate(batched_space, batch)]


def _own(value: Any) -> Any:
    if type(value) is np.ndarray:
        return value.copy()
    if type(value) is dict:
        return {key: _own(item) for key, item in value.items()}
    if type(value) is tuple:  # not a GraphInstance (a NamedTuple): that stays as it is
        return tuple(_own(item) for item in value)
    return value


# --- observation_mode: the single and batched observation spaces ------------------------

OBSERVATION_MODES = ("same", "different")


def check_observation_mode(observation_mode: Any) -> Any:
    """Refuse an ``observation_mode`` that is not ``"same"``, ``"different"`` or a
    ``(batched_space, single_space)`` tuple, as ``AsyncVectorEnv`` does (before any env
    is built)."""
    if isinstance(observation_mode, tuple) and len(observation_mode) == 2:
        if not all(isinstance(space, spaces.Space) for space in observation_mode):
            raise TypeError(
                "Expected both elements of observation_mode to be Spaces, got "
                f"{type(observation_mode[0])} and {type(observation_mode[1])}"
            )
        return observation_mode
    if isinstance(observation_mode, str) and observation_mode in OBSERVATION_MODES:
        return observation_mode
    raise ValueError(
        "Invalid `observation_mode`, expected: 'same' or 'different' or tuple of single and "
        f"batch observation space, actual got {observation_mode}"
    )


def observation_spaces(
    observation_mode: Any, env_spaces: Sequence[spaces.Space[Any]], owner: str = "VecEnv"
) -> tuple[spaces.Space[Any], spaces.Space[Any]]:
    """``(single_observation_space, observation_space)`` of a vector env whose envs have
    the observation spaces ``env_spaces``, under ``observation_mode`` (see
    :func:`check_observation_mode`), with ``AsyncVectorEnv``'s checks and errors.

    ``"same"``: every space equals env 0's, batched with ``batch_space``.
    ``"different"``: env 0's space, and ``batch_differing_spaces`` of all (its errors
    propagate); a custom ``(batched, single)`` tuple is taken as it is. In both, every
    env's space must share shape and dtype with the single space.

    Raises:
        RuntimeError: the spaces do not fit the mode (Gymnasium's wording, plus which env).
    """
    first = env_spaces[0]
    if observation_mode == "same":
        for index, space in enumerate(env_spaces):
            if space != first:
                raise RuntimeError(
                    f"{owner}(..., observation_mode='same') however some of the "
                    "sub-environments observation spaces are not equivalent. If this is "
                    "intentional, use `observation_mode='different'` instead. "
                    f"(env {index} has observation_space {space}, env 0 has {first})"
                )
        return first, batch_space(first, len(env_spaces))
    if observation_mode == "different":
        single, batched = first, batch_differing_spaces(env_spaces)
    else:
        batched, single = observation_mode
    for index, space in enumerate(env_spaces):
        if not is_space_dtype_shape_equiv(single, space):
            raise RuntimeError(
                f"{owner}(..., observation_mode='different' or custom space) however the "
                "sub-environment's observation spaces do not share a common shape and dtype. "
                f"(env {index} has observation_space {space}, the single observation space "
                f"is {single})"
            )
    return single, batched


# --- writing one env's value into its row ---------------------------------------------


def row_writer(space: spaces.Space[Any], buffer: Any) -> Callable[[int, Any], None]:
    """A function ``write(index, value)`` storing one sample of ``space`` in row ``index``.

    ``write`` takes a value of the space's shape and dtype (or a dtype that holds every
    value of the given one), and any other value that converts without changing a
    number: the same count of numbers in another shape (a scalar for a one-element Box),
    whole floats for an integer space, integers in the dtype's range, floats rounded to
    the nearest the space's float dtype holds (never to an infinity); for a Dict, keys
    beyond the space's are left out (as Gymnasium's shared memory does). Anything else
    raises ValueError, leaving every part of the row as it was: never a value changed
    in silence (300 wrapped to 44). Built once per space so the per-step cost is a few
    comparisons and one copy.
    """
    convert = _row_converter(space)
    if isinstance(buffer, np.ndarray):  # one array (the usual case): no walk of parts

        def write_array(index: int, value: Any) -> None:
            buffer[index] = convert(value)

        return write_array

    def write(index: int, value: Any) -> None:
        _put(buffer, index, convert(value))  # every part converted before any is written

    return write


def _put(buffer: Any, index: int, converted: Any) -> None:
    if isinstance(buffer, np.ndarray):
        buffer[index] = converted
    elif isinstance(buffer, dict):
        for key, sub in buffer.items():
            _put(sub, index, converted[key])
    else:
        for sub, item in zip(buffer, converted):
            _put(sub, index, item)


@singledispatch
def _row_converter(space: spaces.Space[Any]) -> Callable[[Any], Any]:
    """``convert(value)``: one sample of ``space`` ready for its row (see
    :func:`row_writer`), or ValueError."""
    raise TypeError(f"{type(space).__name__} is not a shareable space")


@_row_converter.register(spaces.Box)
@_row_converter.register(spaces.Discrete)
@_row_converter.register(spaces.MultiDiscrete)
@_row_converter.register(spaces.MultiBinary)
def _array_row_converter(space: spaces.Space[Any]) -> Callable[[Any], Any]:
    # Array spaces always have a shape and a dtype (Space types both as optional).
    shape = cast("tuple[int, ...]", space.shape)
    dtype = cast("np.dtype[Any]", space.dtype)

    def convert(value: Any) -> np.ndarray:
        array = value if type(value) is np.ndarray else np.asarray(value)
        if array.shape == shape and (
            array.dtype == dtype or np.can_cast(array.dtype, dtype, "safe")
        ):
            return array
        return converted_exactly(array, value, shape, dtype, space)

    return convert


def converted_exactly(
    array: np.ndarray, value: Any, shape: tuple[int, ...], dtype: np.dtype[Any], space: Any
) -> np.ndarray:
    """``array`` in ``shape`` and ``dtype`` if that changes no number (floats may round
    to the nearest ``dtype`` holds, as they do in Gymnasium), else ValueError."""
    if array.size != math.prod(shape):
        raise ValueError(
            f"expected shape {shape} for {space}, got shape {array.shape} (value {_preview(value)})"
        )
    if array.dtype.kind not in "biuf":
        raise ValueError(f"expected dtype {dtype} for {space}, got dtype {array.dtype}")
    with np.errstate(invalid="ignore", over="ignore"):
        converted = array.astype(dtype).reshape(shape)
        flat, original = converted.ravel(), array.ravel()
        if dtype.kind == "f":  # rounding is what floats do; an infinity is another number
            exact = bool(np.array_equal(np.isinf(flat), np.isinf(original)))
        else:
            exact = bool(np.array_equal(flat, original))
    if not exact:
        raise ValueError(
            f"expected dtype {dtype} for {space}, got dtype {array.dtype} with values that "
            f"{dtype} cannot hold (value {_preview(value)})"
        )
    return converted


@_row_converter.register(spaces.Dict)
def _dict_row_converter(space: spaces.Dict) -> Callable[[Any], Any]:
    converters = {key: _row_converter(sub) for key, sub in space.spaces.items()}

    def convert(value: Any) -> dict[str, Any]:
        if not isinstance(value, dict) or not converters.keys() <= value.keys():
            keys = sorted(map(str, value)) if isinstance(value, dict) else type(value).__name__
            raise ValueError(f"expected a dict with keys {sorted(converters)}, got {keys}")
        return {key: convert_item(value[key]) for key, convert_item in converters.items()}

    return convert


@_row_converter.register(spaces.Tuple)
def _tuple_row_converter(space: spaces.Tuple[Any]) -> Callable[[Any], Any]:
    converters = [_row_converter(sub) for sub in space.spaces]

    def convert(value: Any) -> tuple[Any, ...]:
        # (an array of the items too, as Gymnasium's vector envs take one)
        sequence = isinstance(value, (tuple, list)) or (
            isinstance(value, np.ndarray) and value.ndim >= 1
        )
        if not sequence or len(value) != len(converters):
            raise ValueError(f"expected a tuple of {len(converters)} items, got {_preview(value)}")
        return tuple(convert_item(item) for convert_item, item in zip(converters, value))

    return convert


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


def read_rows(
    buffer: Any, env_ids: Sequence[int] | Sequence[np.integer[Any]] | np.ndarray | slice
) -> Any:
    """A fresh batch holding the rows ``env_ids``, in that order."""
    if isinstance(buffer, np.ndarray):
        if isinstance(env_ids, np.ndarray):
            return buffer.take(env_ids, axis=0)  # about twice as fast as buffer[env_ids]
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


def write_rows(
    buffer: Any, env_ids: Sequence[int] | Sequence[np.integer[Any]] | np.ndarray | slice, batch: Any
) -> None:
    """Write a validated batch (see :func:`batch_checker`) into the rows ``env_ids``."""
    if isinstance(buffer, np.ndarray):
        batch = np.asarray(batch)  # a Python list the checker kept as passed
        if batch.ndim < buffer.ndim:  # one number per env for a one-element space
            batch = batch.reshape(-1, *buffer.shape[1:])
        buffer[env_ids] = batch
    elif isinstance(buffer, dict):
        for key, sub in buffer.items():
            write_rows(sub, env_ids, batch[key])
    else:
        for sub, item in zip(buffer, batch):
            write_rows(sub, env_ids, item)


# --- validating a batch of actions before anything is written --------------------------


Checked = tuple[Any, bool]


@singledispatch
def batch_checker(space: spaces.Space[Any], path: str = "actions") -> Callable[[Any, int], Checked]:
    """A function ``check(batch, count)`` validating ``count`` samples of ``space``.

    ``check`` returns ``(batch, exact)``: the batch as numpy arrays (a tuple of objects
    for parts that are not shareable, the caller's list where it holds Python values),
    and whether every array has exactly the dtype of its space (only then may it go
    through shared memory without changing a value or its type: else the envs get the
    caller's values by value). It checks shape and dtype kind
    everywhere and the range of discrete values, on the caller's values before any
    cast (floats for a discrete space must be whole numbers: they reach the envs as
    floats, as in Gymnasium); Box bounds are not checked (Gymnasium does not clip either).

    Raises (from ``check``):
        TypeError: the batch (or a part) is not the kind of object the space needs: a
            scalar, a non-dict for a Dict, numbers of the wrong kind (as Gymnasium, whose
            ``iterate`` raises TypeError on them).
        ValueError: a batch of the wrong length or shape, values out of range (or not
            whole numbers for a discrete space).
    """

    def check(batch: Any, count: int) -> Checked:  # not shareable: one Python object per env
        if isinstance(batch, np.ndarray) and batch.ndim:  # e.g. np.array of Text actions
            batch = list(batch)
        if not isinstance(batch, (list, tuple)):
            raise TypeError(
                f"{path}: expected a sequence of {count} samples of {space} (one per env), "
                f"got {_preview(batch)}"
            )
        if len(batch) != count:
            raise ValueError(
                f"{path}: expected a sequence of {count} samples of {space}, got {len(batch)}"
            )
        return tuple(batch), False

    return check


@batch_checker.register(spaces.Box)
def _box_checker(space: spaces.Box, path: str = "actions") -> Callable[[Any, int], Checked]:
    shape, dtype = space.shape, space.dtype
    one_element = _has_one_element(shape)

    def check(batch: Any, count: int) -> Checked:
        if type(batch) is np.ndarray and batch.dtype == dtype and batch.shape == (count, *shape):
            return batch, True  # the usual case, all checks passed at once
        array = np.asarray(batch)
        flat = _check_shape(array, count, shape, space, path, one_element)
        if array.dtype.kind not in "biuf":
            raise TypeError(f"{path}: expected numbers for {space}, got dtype {array.dtype}")
        if _holds_python_values(batch):
            return batch, False
        return array, array.dtype == dtype and not flat

    return check


@batch_checker.register(spaces.Discrete)
@batch_checker.register(spaces.MultiDiscrete)
@batch_checker.register(spaces.MultiBinary)
def _discrete_checker(
    space: spaces.Space[Any], path: str = "actions"
) -> Callable[[Any, int], Checked]:
    # Discrete, MultiDiscrete and MultiBinary always have a shape (Space types it optional).
    shape, dtype = cast("tuple[int, ...]", space.shape), space.dtype
    low: Any  # ints, or per-element arrays for MultiDiscrete
    high: Any
    if isinstance(space, spaces.Discrete):
        low, high = int(space.start), int(space.start + space.n - 1)
    elif isinstance(space, spaces.MultiDiscrete):
        low, high = space.start, space.start + space.nvec - 1  # per-element arrays
    else:
        low, high = 0, 1
    one_element = _has_one_element(shape)
    if one_element and not isinstance(low, int):  # compare flat batches with plain bounds
        low, high = int(np.ravel(low)[0]), int(np.ravel(high)[0])
    scalar_bounds = isinstance(low, int)
    integers = np.dtype(dtype).kind in "biu"  # no value of the space's dtype is fractional

    def in_range(array: np.ndarray) -> bool:
        if scalar_bounds and array.size <= 64:  # Python's min/max beat numpy's on few values
            values = array.ravel().tolist()
            return not values or (min(values) >= low and max(values) <= high)
        return not ((array < low).any() or (array > high).any())

    def check(batch: Any, count: int) -> Checked:
        if (  # the usual case, every check passed at a glance
            integers
            and type(batch) is np.ndarray
            and batch.dtype == dtype
            and batch.shape == (count, *shape)
            and in_range(batch)
        ):
            return batch, True
        array = np.asarray(batch)  # the caller's values: checked before any cast
        # The usual case (an array of the space's dtype and shape) skips to the range.
        exact_array = type(batch) is np.ndarray and array.dtype == dtype
        flat = False
        if not exact_array or array.shape != (count, *shape):
            flat = _check_shape(array, count, shape, space, path, one_element)
        kind: str = array.dtype.kind
        if kind == "O":  # numbers in an object array: each env gets its number as passed
            kind = _kind_of_objects(array.ravel().tolist())
        if kind not in "biuf":
            raise TypeError(f"{path}: expected integers for {space}, got dtype {array.dtype}")
        if kind == "f":  # e.g. a torch Bernoulli sample: whole numbers go through as passed
            numbers = array.astype(np.float64) if array.dtype == object else array
            fractional = ~np.isfinite(numbers) | (numbers != np.trunc(numbers))
            if fractional.any():
                raise ValueError(
                    f"{path}: values {array[fractional][:5].tolist()} are not whole "
                    f"numbers, so not in {space}"
                )
        if not in_range(array):
            bad = array[(array < low) | (array > high)]
            raise ValueError(f"{path}: values {bad[:5].tolist()} are outside {space}")
        if exact_array:
            return array, not flat
        if _holds_python_values(batch):
            return batch, False
        return array, array.dtype == dtype and not flat

    return check


def _kind_of_objects(values: list[Any]) -> str:
    """The dtype kind an object array of ``values`` stands for: ``"f"`` when they are
    all numbers and some are fractional types (checked as floats are), ``"i"`` when all
    are ints or bools, ``"O"`` otherwise (refused)."""
    numbers = (int, float, np.integer, np.floating, np.bool_)
    if not all(isinstance(value, numbers) for value in values):
        return "O"
    return "f" if any(isinstance(value, (float, np.floating)) for value in values) else "i"


def _holds_python_values(batch: Any) -> bool:
    """Whether ``batch`` is a list or tuple with an item that is not a numpy value
    (``[1, 0]``, ``[[0.5], [0.25]]``), or numpy values of different dtypes (stacked,
    one would be promoted to the other's): each env then gets its item as passed, a
    Python ``int`` or ``list``, or its own dtype, as in Gymnasium, not the value one
    stacked array would give."""
    if type(batch) is not list and type(batch) is not tuple:
        return False
    dtypes = set()
    for item in batch:
        if not isinstance(item, (np.ndarray, np.generic)):
            return True
        dtypes.add(item.dtype)
    return len(dtypes) > 1


def _has_one_element(shape: tuple[int, ...]) -> bool:
    """Whether a space of ``shape`` holds one number, though in an array (``Box(0, 1,
    (1,))``, ``MultiDiscrete([3])``, ``MultiBinary(1)``): a batch of such actions may
    then come as one number per env, shape ``(count,)``. That cannot mean anything else,
    and Gymnasium takes it (its ``iterate`` hands env i the number ``batch[i]``): so
    does aiovec, by value, each env getting its number as passed."""
    return shape != () and math.prod(shape) == 1


def _check_shape(
    array: np.ndarray,
    count: int,
    shape: tuple[int, ...],
    space: spaces.Space[Any],
    path: str,
    one_element: bool = False,
) -> bool:
    """Check that ``array`` is ``count`` rows of ``shape``; with ``one_element`` (see
    :func:`_has_one_element`), one number per env is taken too. Returns whether the
    batch is such a flat one."""
    if one_element and array.shape == (count,):
        return True
    if array.ndim == 0:
        raise TypeError(
            f"{path}: got the scalar {_preview(array.item())}, but a vector env steps with a "
            f"batch: one row of {space} per env, shape {(count, *shape)}"
        )
    if array.shape[:1] != (count,) or array.shape[1:] != shape:
        raise ValueError(
            f"{path}: expected shape {(count, *shape)} (one row of {space} per env), "
            f"got {array.shape}"
        )
    return False


@batch_checker.register(spaces.Dict)
def _dict_checker(space: spaces.Dict, path: str = "actions") -> Callable[[Any, int], Checked]:
    checkers = {key: batch_checker(sub, f"{path}[{key!r}]") for key, sub in space.spaces.items()}

    def check(batch: Any, count: int) -> Checked:
        if not isinstance(batch, dict):
            raise TypeError(
                f"{path}: expected a dict with keys {sorted(checkers)}, got {_preview(batch)}"
            )
        if not checkers.keys() <= batch.keys():  # extra keys are left out, as in Gymnasium
            missing = sorted(checkers.keys() - batch.keys())
            raise ValueError(
                f"{path}: expected a dict with keys {sorted(checkers)}, got {sorted(batch)} "
                f"(missing {missing})"
            )
        checked, exact = {}, True
        for key, check_item in checkers.items():
            checked[key], item_exact = check_item(batch[key], count)
            exact = exact and item_exact
        return checked, exact

    return check


@batch_checker.register(spaces.Tuple)
def _tuple_checker(
    space: spaces.Tuple[Any], path: str = "actions"
) -> Callable[[Any, int], Checked]:
    checkers = [batch_checker(sub, f"{path}[{i}]") for i, sub in enumerate(space.spaces)]

    def check(batch: Any, count: int) -> Checked:
        if not isinstance(batch, (tuple, list)):
            raise TypeError(
                f"{path}: expected a tuple of {len(checkers)} batches, got {_preview(batch)}"
            )
        if len(batch) != len(checkers):
            hint = ""
            if _per_env_tuples(batch, count, len(checkers)):
                hint = f" (per-env tuples? pass tuple(zip(*{path})))"
            raise ValueError(
                f"{path}: expected a tuple of {len(checkers)} batches, got {len(batch)}{hint}"
            )
        checked, exact = [], True
        try:
            for check_item, item in zip(checkers, batch):
                item_checked, item_exact = check_item(item, count)
                checked.append(item_checked)
                exact = exact and item_exact
        except (ValueError, TypeError) as exc:
            if _per_env_tuples(batch, count, len(checkers)):  # the likely mistake: say so
                raise ValueError(
                    f"{path}: got {count} per-env tuples; a batch of {space} is a tuple of "
                    f"{len(checkers)} batches, one per part (pass tuple(zip(*{path})))"
                ) from exc
            raise
        return tuple(checked), exact

    return check


def _per_env_tuples(batch: Any, count: int, parts: int) -> bool:
    """Whether ``batch`` looks like ``count`` per-env samples of a ``parts``-part Tuple."""
    return len(batch) == count and all(
        isinstance(item, tuple) and len(item) == parts for item in batch
    )
