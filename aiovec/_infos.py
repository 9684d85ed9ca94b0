"""Gymnasium's vector info format: one array per key plus a boolean ``_key`` mask.

Same rules as ``gymnasium.vector.VectorEnv._add_info`` (so results match
``SyncVectorEnv`` exactly), but for a batch of any size: in a first-ready batch,
position ``i`` belongs to the ``i``-th env id of the batch. Objects in the arrays are
copies, as ``AsyncVectorEnv``'s are (unpickled): an env changing its own later leaves
the infos returned as they were.

One difference: where Gymnasium's rules raise (a key's later value does not fit the
array shaped after its first: another shape, a string after a number, a dict after a
number), that key becomes an object array of each env's own value. A batch's results
are never lost to an info, and first-ready batches, which mix envs by timing, never
fail at random.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from aiovec._transport.by_value import own_copy


def add_info(
    batch_infos: dict[str, Any], info: dict[str, Any], position: int, size: int
) -> dict[str, Any]:
    """Merge one env's ``info`` into ``batch_infos`` at ``position`` of a batch of ``size``."""
    for key, value in info.items():
        if key == "final_obs":
            array = batch_infos.get(key)
            if array is None:
                array = np.full(size, fill_value=None, dtype=object)
            array[position] = own_copy(value)
        elif isinstance(value, dict):
            array = batch_infos.get(key, {})
            if isinstance(array, dict):
                array = add_info(array, value, position, size)
            else:  # other envs' values for this key were no dicts
                array = _as_objects(array, batch_infos[f"_{key}"])
                array[position] = own_copy(value)
        else:
            array = batch_infos.get(key)
            if isinstance(array, dict):  # as Gymnasium merges it: under the position
                array[position] = own_copy(value)
            else:
                if array is None:
                    array = _array_for(value, size)
                try:
                    # An object (a list, say) is the caller's copy, never the env's own,
                    # which it may change later (numbers and arrays are copied in).
                    array[position] = own_copy(value) if array.dtype == object else value
                except (ValueError, TypeError, OverflowError):  # it does not fit
                    array = _as_objects(array, batch_infos.get(f"_{key}"))
                    array[position] = own_copy(value)

        mask = batch_infos.get(f"_{key}")
        if mask is None:
            mask = np.zeros(size, dtype=np.bool_)
        mask[position] = True
        batch_infos[key], batch_infos[f"_{key}"] = array, mask
    return batch_infos


def _array_for(value: Any, size: int) -> np.ndarray:
    """The array Gymnasium's rules give a key whose first value is ``value``."""
    if type(value) in (int, float, bool) or issubclass(type(value), np.number):
        return np.zeros(size, dtype=type(value))
    if isinstance(value, np.ndarray):
        return np.zeros((size, *value.shape), dtype=value.dtype)
    return np.full(size, fill_value=None, dtype=object)


def _as_objects(array: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """``array`` as an object array: each position ``mask`` marks holds its env's
    value (an array row as its own array, a number as a numpy scalar), others ``None``."""
    objects = np.full(len(array), fill_value=None, dtype=object)
    if mask is not None:
        for position in np.flatnonzero(mask):
            item = array[position]
            objects[position] = item.copy() if isinstance(item, np.ndarray) else item
    return objects


def batch_infos(infos: list[dict[str, Any]]) -> dict[str, Any]:
    """The vector-format infos of a batch whose ``i``-th env returned ``infos[i]``."""
    result: dict[str, Any] = {}
    size = len(infos)
    for position, info in enumerate(infos):
        if info:
            add_info(result, info, position, size)
    return result
