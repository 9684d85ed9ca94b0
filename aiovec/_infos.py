"""Gymnasium's vector info format: one array per key plus a boolean ``_key`` mask.

Same rules as ``gymnasium.vector.VectorEnv._add_info`` (so results match
``SyncVectorEnv`` exactly), but for a batch of any size: in a first-ready batch,
position ``i`` belongs to the ``i``-th env id of the batch. Objects in the arrays are
copies, as ``AsyncVectorEnv``'s are (unpickled): an env changing its own later leaves
the infos returned as they were.
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
            array = add_info(batch_infos.get(key, {}), value, position, size)
        else:
            array = batch_infos.get(key)
            if array is None:
                if type(value) in (int, float, bool) or issubclass(type(value), np.number):
                    array = np.zeros(size, dtype=type(value))
                elif isinstance(value, np.ndarray):
                    array = np.zeros((size, *value.shape), dtype=value.dtype)
                else:
                    array = np.full(size, fill_value=None, dtype=object)
            # An object (a list, say) is the caller's copy, never the env's own, which
            # the env may change later (numbers and arrays are copied into the arrays).
            array[position] = own_copy(value) if array.dtype == object else value

        mask = batch_infos.get(f"_{key}")
        if mask is None:
            mask = np.zeros(size, dtype=np.bool_)
        mask[position] = True
        batch_infos[key], batch_infos[f"_{key}"] = array, mask
    return batch_infos


def batch_infos(infos: list[dict[str, Any]]) -> dict[str, Any]:
    """The vector-format infos of a batch whose ``i``-th env returned ``infos[i]``."""
    result: dict[str, Any] = {}
    size = len(infos)
    for position, info in enumerate(infos):
        if info:
            add_info(result, info, position, size)
    return result
