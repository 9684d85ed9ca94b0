"""The ``replay`` workload: insert and sample throughput of aiovec's replay buffers.

CartPole transitions (4 float32 observation values, a Discrete action), a capacity of
1,000,000 and batches of 256, against a plain-Python reference (a deque of transition
tuples, sampled with ``random.choices`` and stacked), measured in the same run as
medians of interleaved windows.
"""

from __future__ import annotations

import random
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gymnasium import spaces

from aiovec.replay import PrioritizedReplayBuffer, ReplayBuffer

CAPACITY = 1_000_000
BATCH = 256
OBSERVATION_SPACE = spaces.Box(-np.inf, np.inf, (4,), np.float32)
ACTION_SPACE = spaces.Discrete(2)


@dataclass
class ReplayResult:
    name: str
    insert_rates: list[float] = field(default_factory=list)  # transitions per second
    sample_rates: list[float] = field(default_factory=list)  # batches of BATCH per second
    #: Prioritized only: sample, then update_priorities of the sample (a learner's step).
    sample_update_rates: list[float] = field(default_factory=list)

    @property
    def insert_rate(self) -> float:
        return statistics.median(self.insert_rates)

    @property
    def sample_rate(self) -> float:
        return statistics.median(self.sample_rates)


class _ListReference:
    """What a replay buffer looks like written by hand: a deque of tuples."""

    def __init__(self, capacity: int) -> None:
        self.storage: deque[tuple[Any, ...]] = deque(maxlen=capacity)

    def add(
        self,
        observations: Any,
        actions: Any,
        rewards: Any,
        next_observations: Any,
        terminations: Any,
        truncations: Any,
    ) -> None:
        for row in zip(observations, actions, rewards, next_observations, terminations):
            self.storage.append(row)

    def sample(self, batch_size: int) -> tuple[Any, ...]:
        rows = random.choices(self.storage, k=batch_size)
        return tuple(np.stack(column) for column in zip(*rows))


def _transitions(rng: np.random.Generator) -> dict[str, np.ndarray]:
    observations = rng.standard_normal((BATCH, 4)).astype(np.float32)
    return {
        "observations": observations,
        "actions": rng.integers(0, 2, BATCH),
        "rewards": np.ones(BATCH, dtype=np.float32),
        "next_observations": observations + 0.01,
        "terminations": rng.random(BATCH) < 0.05,
        "truncations": np.zeros(BATCH, dtype=bool),
    }


def run_replay(
    seconds: float = 0.4, repeats: int = 3, progress: Callable[[str], None] = print
) -> list[ReplayResult]:
    """Insert and sample rates of each buffer, full to a quarter of CAPACITY first."""
    rng = np.random.default_rng(0)
    batches = [_transitions(rng) for _ in range(16)]
    contenders: dict[str, ReplayBuffer | _ListReference] = {
        "aiovec ReplayBuffer": ReplayBuffer(CAPACITY, OBSERVATION_SPACE, ACTION_SPACE),
        "aiovec PrioritizedReplayBuffer": PrioritizedReplayBuffer(
            CAPACITY, OBSERVATION_SPACE, ACTION_SPACE
        ),
        "plain-Python list reference": _ListReference(CAPACITY),
    }
    for name, buffer in contenders.items():
        progress(f"replay: filling {name}")
        for index in range(CAPACITY // 4 // BATCH):
            buffer.add(**batches[index % len(batches)])
    results = {name: ReplayResult(name) for name in contenders}
    for round_index in range(repeats):
        for name, buffer in contenders.items():
            progress(f"replay: {name} ({round_index + 1}/{repeats})")
            count, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                buffer.add(**batches[count % len(batches)])
                count += 1
            results[name].insert_rates.append(count * BATCH / (time.perf_counter() - start))
            count, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                if isinstance(buffer, ReplayBuffer):
                    buffer.sample(BATCH, rng=rng)
                else:
                    buffer.sample(BATCH)
                count += 1
            results[name].sample_rates.append(count / (time.perf_counter() - start))
            if isinstance(buffer, PrioritizedReplayBuffer):
                count, start = 0, time.perf_counter()
                while time.perf_counter() - start < seconds:
                    sample = buffer.sample(BATCH, rng=rng)
                    buffer.update_priorities(sample.indices, rng.random(BATCH))
                    count += 1
                rate = count / (time.perf_counter() - start)
                results[name].sample_update_rates.append(rate)
    return list(results.values())


def replay_table(results: list[ReplayResult]) -> str:
    reference = next(r for r in results if r.name.startswith("plain"))
    lines = [
        f"### Replay buffers: CartPole transitions, capacity {CAPACITY:,}, batches of {BATCH}",
        "",
        "| buffer | insert (transitions/s) | vs list | sample (batches/s) | vs list "
        "| sample + update_priorities (batches/s) |",
        "|---|---|---|---|---|---|",
    ]
    for result in results:
        updates = (
            f"{statistics.median(result.sample_update_rates):,.0f}"
            if result.sample_update_rates
            else "-"
        )
        lines.append(
            f"| {result.name} | {result.insert_rate:,.0f} "
            f"| {result.insert_rate / reference.insert_rate:.1f}x "
            f"| {result.sample_rate:,.0f} | {result.sample_rate / reference.sample_rate:.1f}x "
            f"| {updates} |"
        )
    return "\n".join(lines)
