"""aiovec: an asyncio-native vectorized environment runtime for reinforcement learning.

Run N copies of a Gymnasium environment as one batched ``gymnasium.vector.VectorEnv``,
stepped in lockstep or first-ready from asyncio.
"""

from importlib import metadata as _metadata

from gymnasium.vector import AutoresetMode

from aiovec._loop import new_event_loop, run
from aiovec._make import make
from aiovec._stats import Stats
from aiovec.async_env import AsyncEnv, SyncEnvAdapter
from aiovec.bookkeeping import Episode, EpisodeStatistics, TransitionAssembler
from aiovec.envs import register_envs
from aiovec.errors import (
    AiovecError,
    ClosedError,
    EnvBusyError,
    EnvError,
    FactoryPicklingError,
    InvalidSeedError,
    NeedsResetError,
    NoPendingCallError,
    NothingInFlightError,
    PendingCallError,
    StartupTimeoutError,
    StepTimeoutError,
    SyncCallInEventLoopError,
    WaitTimeoutError,
    WorkerCrashedError,
)
from aiovec.replay import PrioritizedReplayBuffer, ReplayBuffer, Sample, to_torch
from aiovec.vector_env import Batch, VecEnv

try:  # the version is written once, in pyproject.toml
    __version__ = _metadata.version("aiovec")
except _metadata.PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

register_envs()

__all__ = [
    "AiovecError",
    "AsyncEnv",
    "AutoresetMode",
    "Batch",
    "ClosedError",
    "EnvBusyError",
    "EnvError",
    "Episode",
    "EpisodeStatistics",
    "FactoryPicklingError",
    "InvalidSeedError",
    "NeedsResetError",
    "NoPendingCallError",
    "NothingInFlightError",
    "PendingCallError",
    "PrioritizedReplayBuffer",
    "ReplayBuffer",
    "Sample",
    "StartupTimeoutError",
    "Stats",
    "StepTimeoutError",
    "SyncCallInEventLoopError",
    "SyncEnvAdapter",
    "TransitionAssembler",
    "VecEnv",
    "WaitTimeoutError",
    "WorkerCrashedError",
    "make",
    "new_event_loop",
    "run",
    "to_torch",
]
