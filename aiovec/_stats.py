"""Where a vector env's time goes: always-on counters, and the snapshot users read.

The scheduler owns one :class:`StatsRecorder` and feeds it at points it passes anyway
(a reply applied, a wait finished, results taken), so recording costs a few additions
per command, never per-env Python work on the lockstep path.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields

import numpy as np

#: How many recent step latencies the quantiles of :class:`Stats` are computed over.
LATENCY_WINDOW = 4096


@dataclass(frozen=True)
class Stats:
    """Counters of one vector env since it was built (see :meth:`aiovec.VecEnv.stats`).

    Times are seconds of wall-clock time. Subtract two snapshots (``later - earlier``)
    for the counters of the interval between them: step-latency quantiles are then
    those of the results that arrived in the interval (as far as the latest
    ``LATENCY_WINDOW`` results reach); ``max_queue_depth`` and ``loop_lag`` are the later
    snapshot's (since the env was built: two snapshots cannot tell an interval's maximum).

    Guarantees: ``env_steps`` counts every step result that arrived (errors included);
    ``env_time`` is what the envs' hosts spent running commands (env code plus the
    host's writing of results), summed over envs stepped at the same time, and includes
    the time of envs stepped in this process; ``agent_time`` is the time aiovec's calls
    spent in this process outside waits and outside envs stepped here, so
    ``agent_time / env_steps`` is aiovec's own cost per env-step on the agent side.
    """

    #: Seconds the counters cover.
    elapsed: float = 0.0
    #: Step results that arrived (one per env per step).
    env_steps: int = 0
    #: Commands sent (one per worker per call).
    commands: int = 0
    #: Seconds the envs' hosts spent running commands, in workers and in this process.
    env_time: float = 0.0
    #: Of ``env_time``, the part spent in this process (inline envs, local share).
    local_env_time: float = 0.0
    #: Seconds aiovec's calls spent in this process, waits and local env time excluded.
    agent_time: float = 0.0
    #: Seconds aiovec's calls spent waiting for results (blocked, or awaiting the loop).
    wait_time: float = 0.0
    #: Ready-queue length when results were taken: mean (of the interval, for a
    #: difference of snapshots) and maximum (always since the env was built).
    mean_queue_depth: float = 0.0
    max_queue_depth: int = 0
    #: Send-to-result latency (seconds) of the latest env-steps (of the interval, for a
    #: difference of snapshots), by quantile: ``p50``,
    #: ``p90``, ``p99``, ``max``; empty before the first step.
    step_latency: dict[str, float] = field(default_factory=dict)
    #: How long aiovec's tasks waited for the event loop when they yielded to it
    #: (seconds): ``mean`` and ``max``; empty when only the synchronous API was used.
    loop_lag: dict[str, float] = field(default_factory=dict)
    #: Envs rebuilt after a failure, and workers replaced (``on_failure="restart"``).
    env_restarts: int = 0
    worker_restarts: int = 0
    # Sums behind the means, so that differences of snapshots stay exact.
    _queue_depth_sum: int = field(default=0, repr=False)
    _queue_samples: int = field(default=0, repr=False)
    _call_time: float = field(default=0.0, repr=False)
    # The latest latency records, oldest first (seconds, env-steps each), and how many
    # were ever recorded: what an interval's quantiles are computed from.
    _latency_records: tuple[np.ndarray, np.ndarray] | None = field(
        default=None, repr=False, compare=False
    )
    _latency_total: int = field(default=0, repr=False)

    @property
    def steps_per_second(self) -> float:
        """Env-steps per second over :attr:`elapsed`."""
        return self.env_steps / self.elapsed if self.elapsed > 0 else 0.0

    def per_env_step(self) -> dict[str, float]:
        """Microseconds per env-step: ``env`` (in the envs' hosts), ``agent`` (aiovec in
        this process), ``wait`` (this process waiting) and ``wall``."""
        steps = max(self.env_steps, 1)
        return {
            "env": 1e6 * self.env_time / steps,
            "agent": 1e6 * self.agent_time / steps,
            "wait": 1e6 * self.wait_time / steps,
            "wall": 1e6 * self.elapsed / steps,
        }

    def __sub__(self, earlier: Stats) -> Stats:
        if not isinstance(earlier, Stats):
            return NotImplemented
        counters = {
            f.name: getattr(self, f.name) - getattr(earlier, f.name)
            for f in fields(self)
            if f.name
            not in (
                "step_latency",
                "loop_lag",
                "max_queue_depth",
                "mean_queue_depth",
                "_latency_records",
            )
        }
        samples = counters["_queue_samples"]
        counters["agent_time"] = _agent_time(
            counters["_call_time"], counters["wait_time"], counters["local_env_time"]
        )
        return Stats(
            **counters,
            mean_queue_depth=counters["_queue_depth_sum"] / samples if samples else 0.0,
            max_queue_depth=self.max_queue_depth,
            step_latency=self._interval_latency(counters["_latency_total"]),
            loop_lag=self.loop_lag,
            _latency_records=self._latency_records,
        )

    def _interval_latency(self, newer: int) -> dict[str, float]:
        """Quantiles over the ``newer`` latest latency records."""
        if self._latency_records is None or newer <= 0:
            return {}
        seconds, weights = self._latency_records
        keep = min(newer, len(seconds))
        return _quantiles(seconds[-keep:], weights[-keep:])


class StatsRecorder:
    """The counters behind :class:`Stats`; fed by the scheduler and the vector env."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.env_steps = 0
        self.commands = 0
        self.env_time = 0.0
        self.local_env_time = 0.0
        # Wall time while at least one call was in progress, and while at least one
        # waited (each interval counted once, however many tasks overlap in it).
        self.call_time = 0.0
        self.wait_time = 0.0
        self.queue_depth_sum = 0
        self.queue_samples = 0
        self.max_queue_depth = 0
        self.lag_sum = 0.0
        self.lag_samples = 0
        self.max_lag = 0.0
        # The latest LATENCY_WINDOW results (a command's envs share one), with how many
        # env-steps each stands for: plain lists, as a numpy write costs more than both.
        self._latency_seconds = [0.0] * LATENCY_WINDOW
        self._latency_weights = [0] * LATENCY_WINDOW
        self._latency_slot = 0
        self._latency_total = 0

    def record_latency(self, seconds: float, count: int) -> None:
        """``count`` env-steps took ``seconds`` from send to result."""
        slot = self._latency_slot
        self._latency_seconds[slot] = seconds
        self._latency_weights[slot] = count
        self._latency_slot = (slot + 1) % LATENCY_WINDOW
        self._latency_total += 1

    def record_queue_depth(self, depth: int) -> None:
        self.queue_depth_sum += depth
        self.queue_samples += 1
        if depth > self.max_queue_depth:
            self.max_queue_depth = depth

    def record_lag(self, seconds: float) -> None:
        self.lag_sum += seconds
        self.lag_samples += 1
        if seconds > self.max_lag:
            self.max_lag = seconds

    def snapshot(self, env_restarts: int, worker_restarts: int) -> Stats:
        # The ring, oldest record first (the slot to write next is the oldest).
        stored = min(self._latency_total, LATENCY_WINDOW)
        slot = self._latency_slot
        seconds = np.array(self._latency_seconds[slot:] + self._latency_seconds[:slot])
        weights = np.array(self._latency_weights[slot:] + self._latency_weights[:slot])
        seconds, weights = seconds[LATENCY_WINDOW - stored :], weights[LATENCY_WINDOW - stored :]
        step_latency = _quantiles(seconds, weights)
        loop_lag = {}
        if self.lag_samples:
            loop_lag = {"mean": self.lag_sum / self.lag_samples, "max": self.max_lag}
        samples = self.queue_samples
        return Stats(
            elapsed=time.perf_counter() - self.started,
            env_steps=self.env_steps,
            commands=self.commands,
            env_time=self.env_time,
            local_env_time=self.local_env_time,
            agent_time=_agent_time(self.call_time, self.wait_time, self.local_env_time),
            wait_time=self.wait_time,
            mean_queue_depth=self.queue_depth_sum / samples if samples else 0.0,
            max_queue_depth=self.max_queue_depth,
            step_latency=step_latency,
            loop_lag=loop_lag,
            env_restarts=env_restarts,
            worker_restarts=worker_restarts,
            _queue_depth_sum=self.queue_depth_sum,
            _queue_samples=samples,
            _call_time=self.call_time,
            _latency_records=(seconds, weights),
            _latency_total=self._latency_total,
        )


def _quantiles(seconds: np.ndarray, weights: np.ndarray) -> dict[str, float]:
    """Weighted latency quantiles: the latency below which that share of env-steps fell."""
    weights = weights.astype(np.float64)
    if not weights.any():
        return {}
    order = np.argsort(seconds)
    seconds, weights = seconds[order], weights[order]
    cumulative = np.cumsum(weights)
    at = np.searchsorted(cumulative, np.array([0.5, 0.9, 0.99]) * cumulative[-1])
    p50, p90, p99 = (float(seconds[min(i, len(seconds) - 1)]) for i in at)
    return {"p50": p50, "p90": p90, "p99": p99, "max": float(seconds[weights > 0][-1])}


def _agent_time(call_time: float, wait_time: float, local_env_time: float) -> float:
    """aiovec's own time in this process: calls less their waits and local envs."""
    return max(call_time - wait_time - local_env_time, 0.0)
