"""The per-vector-env data block: observations, actions, rewards and flags, one row per env.

The layout depends only on the two single-env spaces and ``num_envs``, so the vector
env and every worker carve the same arrays from the same shared region.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

from aiovec._transport.memory import ArrayAllocator
from aiovec._transport.spaces import allocate, is_shareable


@dataclass
class Buffers:
    """Batched arrays shared by all envs. ``observations``/``actions`` are ``None`` when
    their space is not shareable (then those values travel in messages instead)."""

    observations: Any
    actions: Any
    rewards: np.ndarray
    terminations: np.ndarray
    truncations: np.ndarray
    #: 1 while the worker hosting the env is inside one of its calls: after the worker
    #: died (a segfault, ``os._exit``), the agent reads which env was running.
    running: np.ndarray


def build_buffers(
    observation_space: spaces.Space[Any],
    action_space: spaces.Space[Any],
    num_envs: int,
    allocator: Any,
) -> Buffers:
    """Lay the buffers out in a fixed order using ``allocator`` (see ``ArrayAllocator``)."""
    return Buffers(
        observations=allocate(observation_space, num_envs, allocator)
        if is_shareable(observation_space)
        else None,
        actions=allocate(action_space, num_envs, allocator) if is_shareable(action_space) else None,
        rewards=allocator((num_envs,), np.float64),
        terminations=allocator((num_envs,), np.bool_),
        truncations=allocator((num_envs,), np.bool_),
        running=allocator((num_envs,), np.uint8),
    )


def buffers_nbytes(
    observation_space: spaces.Space[Any], action_space: spaces.Space[Any], num_envs: int
) -> int:
    """How many bytes :func:`build_buffers` needs for these spaces."""
    measure = ArrayAllocator()
    build_buffers(observation_space, action_space, num_envs, measure)
    return measure.nbytes
