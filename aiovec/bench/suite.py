"""Running workloads: build every contender, warm up, then interleave timed windows.

Windows of all contenders alternate (A B C A B C ...), so a noisy neighbour slows
everyone alike, and each figure is the median over windows.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, cast

import gymnasium as gym

import aiovec
from aiovec.bench import system
from aiovec.bench.contenders import Contender, lockstep_contenders
from aiovec.bench.workloads import CORES, Workload

Progress = Callable[[str], None]


@dataclass
class ContenderResult:
    name: str
    library: str
    rates: list[float]  # env steps per second, one per window
    cpu_us_per_step: float | None = None
    memory_per_env: float | None = None  # bytes, when the workload measures memory
    recv_latencies: list[float] = field(default_factory=list)
    error: str | None = None
    #: aiovec only, from ``VecEnv.stats()`` over the timed windows: microseconds per
    #: env-step in the envs, in aiovec on the agent side, and waiting; step latency.
    breakdown: dict[str, float] | None = None

    @property
    def rate(self) -> float:
        """Median env steps per second."""
        return statistics.median(self.rates) if self.rates else 0.0


@dataclass
class WorkloadResult:
    key: str
    title: str
    metric: str
    num_envs: int
    ideal: float | None
    bytes_per_step: int
    results: list[ContenderResult]

    def find(self, prefix: str) -> ContenderResult | None:
        """The best result whose name starts with ``prefix``."""
        matches = [r for r in self.results if r.name.startswith(prefix) and r.rates]
        return max(matches, key=lambda r: r.rate, default=None)

    def value(self, result: ContenderResult) -> float:
        """The workload's metric for ``result`` (steps/s, or µs per vector step)."""
        if self.metric == "us/step":
            return 1e6 * self.num_envs / result.rate if result.rate else float("inf")
        return result.rate


def run_workload(
    workload: Workload, seconds: float, repeats: int, progress: Progress = print
) -> WorkloadResult:
    """Median throughput of every contender of ``workload``, measured in the same run."""
    neighbour = None
    if workload.busy_neighbour:
        neighbour = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        return _run_workload(workload, seconds, repeats, progress)
    finally:
        if neighbour is not None:
            neighbour.kill()
            neighbour.wait()


def _close_all(contenders: list[Contender], quietly: bool) -> None:
    """Close every contender, even after one fails to; the first failure is raised at
    the end unless ``quietly`` (unwinding from another error, e.g. a Ctrl-C that the
    libraries' workers took too, which that error must reach the caller as: then each
    is abandoned, see :meth:`Contender.abandon`, with the libraries' warnings muted)."""
    failure: Exception | None = None
    for contender in contenders:
        try:
            if quietly:  # what the libraries say of the cut (their workers' tracebacks
                with warnings.catch_warnings():  # of the same Ctrl-C) is no news
                    warnings.simplefilter("ignore")
                    contender.abandon()
            else:
                contender.close()
        except Exception as exc:
            failure = failure or exc
    if failure is not None and not quietly:
        raise failure


def _run_workload(
    workload: Workload, seconds: float, repeats: int, progress: Progress
) -> WorkloadResult:
    contenders = workload.contenders()
    results = {c.name: ContenderResult(c.name, c.library, []) for c in contenders}
    cpu = {c.name: [0.0, 0] for c in contenders}
    windows: dict[str, list[Any]] = {c.name: [] for c in contenders}
    started: list[Contender] = []
    unwinding = True  # until every window ran: close errors must not hide the cause
    try:
        for contender in contenders:
            progress(f"{workload.key}: starting {contender.name}")
            started.append(contender)
            try:
                existing = set(system.descendant_pids())
                memory_before = system.proportional_memory([os.getpid()])
                contender.start()
                contender.run(min(0.3, seconds))  # warm-up: caches, first episodes
                if workload.measure_memory:
                    new = [pid for pid in system.descendant_pids() if pid not in existing]
                    used = system.proportional_memory([os.getpid(), *new]) - memory_before
                    results[contender.name].memory_per_env = used / workload.num_envs
            except Exception as exc:  # a library that fails is reported, not fatal
                results[contender.name].error = f"{type(exc).__name__}: {exc}"
                started.pop()
                # what it started before failing: closed, its start's error reported
                _close_all([contender], quietly=True)
                continue
        for round_index in range(repeats):
            for contender in started:
                progress(f"{workload.key}: {contender.name} ({round_index + 1}/{repeats})")
                if workload.settle:
                    contender.run(workload.settle)
                stats_before = contender.stats()
                cpu_before, clock_before = system.tree_cpu_seconds(), time.perf_counter()
                steps = contender.run(seconds)
                elapsed = time.perf_counter() - clock_before
                if stats_before is not None:
                    # a contender with stats before has them after
                    stats_after = cast(aiovec.Stats, contender.stats())
                    windows[contender.name].append(stats_after - stats_before)
                cpu[contender.name][0] += system.tree_cpu_seconds() - cpu_before
                cpu[contender.name][1] += steps
                results[contender.name].rates.append(steps / elapsed)
        unwinding = False
    finally:
        _close_all(started, quietly=unwinding)
    for contender in contenders:
        cpu_seconds, step_count = cpu[contender.name]
        if step_count:
            results[contender.name].cpu_us_per_step = 1e6 * cpu_seconds / step_count
        results[contender.name].recv_latencies = contender.recv_latencies
        results[contender.name].breakdown = breakdown(windows[contender.name])
    return WorkloadResult(
        workload.key,
        workload.title,
        workload.metric,
        workload.num_envs,
        workload.ideal,
        workload.bytes_per_step,
        list(results.values()),
    )


def breakdown(windows: list[Any]) -> dict[str, float] | None:
    """Microseconds per env-step over the timed windows (``aiovec.Stats`` of each):
    ``agent``, ``env``, ``wait``, and the latest step latency quantiles."""
    steps = sum(window.env_steps for window in windows)
    if not steps:
        return None
    latency = windows[-1].step_latency
    return {
        "agent": 1e6 * sum(window.agent_time for window in windows) / steps,
        "env": 1e6 * sum(window.env_time for window in windows) / steps,
        "wait": 1e6 * sum(window.wait_time for window in windows) / steps,
        "latency_p50": 1e6 * latency.get("p50", 0.0),
        "latency_p99": 1e6 * latency.get("p99", 0.0),
    }


@dataclass
class MemoryResult:
    name: str
    bytes: int
    num_envs: int = 64


def run_memory(num_envs: int = 64, progress: Progress = print) -> list[MemoryResult]:
    """Proportional memory of ``num_envs`` CartPole envs (all processes) per library."""
    env_fn = partial(gym.make, "CartPole-v1")
    # Start aiovec's zygote first, so no contender is charged for it.
    aiovec.VecEnv([env_fn], backend="process").close()
    results = []
    for contender in lockstep_contenders(env_fn, num_envs, env_id="CartPole-v1"):
        progress(f"memory: {contender.name}")
        existing = set(system.descendant_pids())
        before = system.proportional_memory([os.getpid()])
        try:
            contender.start()
            contender.run(0.05)
            new = [pid for pid in system.descendant_pids() if pid not in existing]
            after = system.proportional_memory([os.getpid()])
            results.append(
                MemoryResult(
                    contender.name, after - before + system.proportional_memory(new), num_envs
                )
            )
        finally:
            contender.close()
    return results


@dataclass
class MachineResult:
    cores: int
    bare_step_us: float
    ceiling_steps_per_s: float
    pipe_round_trip_us: float


def run_machine(env_id: str = "CartPole-v1") -> MachineResult:
    """This machine's own limits, measured now: bare env step and pipe round trip."""
    step = system.bare_step_seconds(partial(gym.make, env_id))
    return MachineResult(
        cores=CORES,
        bare_step_us=step * 1e6,
        ceiling_steps_per_s=CORES / step,
        pipe_round_trip_us=system.pipe_round_trip_seconds() * 1e6,
    )
