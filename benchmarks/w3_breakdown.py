"""Where each step of W3's first-ready loop spends its time, across the processes.

W3 (16 envs sleeping lognormal, mean 2 ms) under the default ``aiovec.VecEnv(fns)``,
first-ready one env at a time, as ``aiovec bench`` runs it. Each env stamps when its
``step`` starts and ends (in its worker); the agent stamps when ``recv`` returned an
env's result and when ``send`` to that env returned. ``time.perf_counter`` is the
same clock in every process on Linux (``CLOCK_MONOTONIC``), so the stamps line up and
one env's cycle splits into:

- ``env step``: inside the env's ``step`` (its sleep, and the machine's lateness in
  ending it);
- ``worker -> agent``: the step's end to ``recv`` returning it (the worker writing
  and sending the result, the agent noticing it, dispatching it, building the batch,
  and any results ahead of it);
- ``agent``: ``recv`` returning to ``send`` returning (the user's loop, ``send``'s
  checks, the command, and the write that wakes the env's thread);
- ``agent -> worker``: ``send`` returning to the env's next ``step`` starting (the env's
  thread being scheduled, its GIL, reading the command and the action; below zero
  when that thread started before the agent's ``send`` was back).

Every microsecond outside ``env step`` is lost throughput: the rate is 16 envs over
the mean cycle. Usage: ``python benchmarks/w3_breakdown.py [--seconds 3]``.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

import aiovec
from aiovec.envs import VariableLatencyEnv

NUM_ENVS = 16
IDEAL = NUM_ENVS / 0.002  # env steps per second if every step lasted its mean, 2 ms
KEPT = 20_000  # the last steps each env keeps stamps of


class StampedEnv(VariableLatencyEnv):
    """W3's env, stamping the start and end of each step."""

    def __init__(self) -> None:
        super().__init__()
        self._stamps = np.zeros((KEPT, 2))
        self._count = 0

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        started = time.perf_counter()
        result = super().step(action)
        self._stamps[self._count % KEPT] = started, time.perf_counter()
        self._count += 1
        return result

    def stamps(self) -> np.ndarray:
        """``(start, end)`` of the steps kept, oldest first."""
        if self._count <= KEPT:
            return self._stamps[: self._count].copy()
        return np.roll(self._stamps, -(self._count % KEPT), axis=0)


async def run(seconds: float) -> tuple[float, np.ndarray, list[np.ndarray]]:
    """Step W3 for ``seconds`` (after a 1 s warm-up): the rate as a fraction of ideal,
    the agent's ``(env id, recv returned, send returned)`` rows, each env's stamps."""
    async with aiovec.VecEnv([StampedEnv] * NUM_ENVS) as envs:
        await envs.areset(seed=0)
        actions = np.zeros(NUM_ENVS, np.int64)
        envs.send(actions)
        warm_until = time.perf_counter() + 1.0
        while time.perf_counter() < warm_until:
            batch = await envs.recv(1)
            envs.send(actions[:1], batch.env_ids)
        agent: list[tuple[int, float, float]] = []
        clock = time.perf_counter
        started = clock()
        deadline = started + seconds
        while clock() < deadline:
            batch = await envs.recv(1)
            received = clock()
            envs.send(actions[:1], batch.env_ids)
            agent.append((int(batch.env_ids[0]), received, clock()))
        rate = len(agent) / (clock() - started) / IDEAL
        await envs.recv(min_envs=NUM_ENVS)
        stamps = list(await envs.acall("stamps"))
    return rate, np.array(agent), stamps


def split(agent: np.ndarray, stamps: list[np.ndarray]) -> dict[str, np.ndarray]:
    """Each stage's durations in seconds, over the agent's timed rows."""
    first, last = agent[0, 1], agent[-1, 2]
    stages: dict[str, list[float]] = {"worker -> agent": [], "agent": [], "agent -> worker": []}
    steps: list[np.ndarray] = []
    for env_id, env_stamps in enumerate(stamps):
        starts, ends = env_stamps[:, 0], env_stamps[:, 1]
        timed = (starts > first) & (ends < last)
        steps.append(ends[timed] - starts[timed])
        for _, received, sent in agent[agent[:, 0] == env_id]:
            before = np.searchsorted(ends, received) - 1  # the step recv returned
            # The step send started: the env's first after recv returned (it may start
            # before send returns: its thread can run before the agent's call is back).
            after = np.searchsorted(starts, received)
            if before < 0 or after >= len(starts):
                continue  # a step outside the stamps kept
            stages["worker -> agent"].append(received - ends[before])
            stages["agent"].append(sent - received)
            stages["agent -> worker"].append(starts[after] - sent)
    return {"env step": np.concatenate(steps), **{k: np.array(v) for k, v in stages.items()}}


def report(rate: float, durations: dict[str, np.ndarray]) -> str:
    lines = [
        f"W3 first-ready one env at a time: {rate:.3f} of ideal",
        "",
        "| stage | p50 us | mean us | p90 us | p99 us | share of cycle |",
        "|---|---|---|---|---|---|",
    ]
    cycle = sum(float(values.mean()) for values in durations.values())
    for name, values in durations.items():
        us = values * 1e6
        lines.append(
            f"| {name} | {np.median(us):,.0f} | {us.mean():,.0f} | "
            f"{np.percentile(us, 90):,.0f} | {np.percentile(us, 99):,.0f} | "
            f"{values.mean() / cycle:.1%} |"
        )
    lines.append(f"| cycle (sum of means) | | {cycle * 1e6:,.0f} | | | 100% |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="timed seconds")
    args = parser.parse_args()
    rate, agent, stamps = aiovec.run(run(args.seconds))
    print(report(rate, split(agent, stamps)))


if __name__ == "__main__":
    main()
