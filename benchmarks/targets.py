"""aiovec's performance targets, checked against one `aiovec bench` run.

Every target is a ratio between figures measured in the same run (never an absolute
time), so it means the same on a noisy machine. Usage:

    aiovec bench --workloads W1,W2,W3,W4,W5,W6,memory --repeats 5 --out bench-results
    python benchmarks/targets.py bench-results/results.json

Prints one line per target with the measured figure and PASS/MISS; exits 0 either way
(misses are documented in the README with their reasons, not hidden).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SYNC, ASYNC = "gymnasium SyncVectorEnv", "gymnasium AsyncVectorEnv"


@dataclass
class Target:
    name: str
    measure: Callable[[dict[str, Any]], float | None]  # None: not in this run
    threshold: float
    higher_is_better: bool = True

    def check(self, data: dict[str, Any]) -> tuple[float | None, bool | None]:
        value = self.measure(data)
        if value is None:
            return None, None
        passed = value >= self.threshold if self.higher_is_better else value <= self.threshold
        return value, passed


def rate(data: dict, workload: str, prefix: str, lockstep: bool = False) -> float | None:
    """Best median steps/s among results of ``workload`` whose name starts with ``prefix``
    (only lockstep ones with ``lockstep=True``)."""
    for item in data["workloads"]:
        if item["key"] == workload:
            rates = [
                r["median_steps_per_s"]
                for r in item["results"]
                if r["name"].startswith(prefix) and not (lockstep and "first-ready" in r["name"])
            ]
            rates = [r for r in rates if r]
            return max(rates) if rates else None
    return None


def field(data: dict, workload: str, prefix: str, key: str) -> float | None:
    for item in data["workloads"]:
        if item["key"] == workload:
            best = max(
                (r for r in item["results"] if r["name"].startswith(prefix)),
                key=lambda r: r["median_steps_per_s"] or 0,
                default=None,
            )
            return None if best is None else best.get(key)
    return None


def ideal(data: dict, workload: str) -> float | None:
    return next((w["ideal"] for w in data["workloads"] if w["key"] == workload), None)


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def per_step_us(data: dict, workload: str, prefix: str, num_envs: int) -> float | None:
    value = rate(data, workload, prefix)
    return 1e6 * num_envs / value if value else None


def memory(data: dict, prefix: str) -> float | None:
    entries = [m["bytes"] for m in data.get("memory") or [] if m["name"].startswith(prefix)]
    return min(entries) if entries else None


TARGETS = [
    Target("W1 8 envs: aiovec.make default >= 1x Sync",
           lambda d: ratio(rate(d, "W1-8", "aiovec make"), rate(d, "W1-8", SYNC)), 1.0),
    Target("W1 8 envs: process backend >= 6x Async",
           lambda d: ratio(rate(d, "W1-8", "aiovec process"), rate(d, "W1-8", ASYNC)), 6.0),
    Target("W1 64 envs: process backend >= 1.5x Sync",
           lambda d: ratio(rate(d, "W1-64", "aiovec process"), rate(d, "W1-64", SYNC)), 1.5),
    Target("W2 1 env: process overhead <= 0.5x Async's",
           lambda d: ratio(per_step_us(d, "W2-1", "aiovec process", 1),
                           per_step_us(d, "W2-1", ASYNC, 1)), 0.5, higher_is_better=False),
    Target("W2 1 env: process overhead <= 3x bare pipe round trip",
           lambda d: ratio(per_step_us(d, "W2-1", "aiovec process", 1),
                           d["machine"]["pipe_round_trip_us"]), 3.0, higher_is_better=False),
    Target("W3: first-ready >= 0.90 of ideal",
           lambda d: ratio(rate(d, "W3", "aiovec process (first-ready"), ideal(d, "W3")), 0.90),
    Target("W3: first-ready CPU per env-step < 140 us (Tianshou first-ready: 140-160 us)",
           lambda d: field(d, "W3", "aiovec process (first-ready", "cpu_us_per_step"), 140.0,
           higher_is_better=False),
    Target("W4: first-ready >= 0.90 of the CPU limit",
           lambda d: ratio(rate(d, "W4", "aiovec process (first-ready"), ideal(d, "W4")), 0.90),
    Target("W4: lockstep >= 0.75 of the CPU limit",
           lambda d: ratio(rate(d, "W4", "aiovec process (", lockstep=True), ideal(d, "W4")), 0.75),
    Target("W5: process MB/s >= 3x Async's (copy=True)",
           lambda d: ratio(rate(d, "W5", "aiovec process copy"), rate(d, "W5", f"{ASYNC} copy")),
           3.0),
    Target("Memory, 64 envs: process <= 1/8 of Async's",
           lambda d: ratio(memory(d, "aiovec process"), memory(d, ASYNC)), 0.125,
           higher_is_better=False),
    Target("W6 1000 envs: coroutine (one loop) >= 0.9 of ideal",
           lambda d: ratio(rate(d, "W6-1000", "aiovec coroutine"), ideal(d, "W6-1000")), 0.9),
    Target("W6 1000 envs: async envs, one loop per core >= 0.9 of ideal",
           lambda d: ratio(rate(d, "W6-1000", "aiovec process (first-ready 1000"),
                           ideal(d, "W6-1000")), 0.9),
    Target("W6 10000 envs: aiovec (coroutine or async envs in workers) >= 50,000 steps/s",
           lambda d: rate(d, "W6-10000", "aiovec"), 50_000),
    Target("W3 Ray: aiovec first-ready >= 5x one actor per env",
           lambda d: ratio(rate(d, "W3", "aiovec ray (first-ready"),
                           rate(d, "W3", "ray, one actor per env")),
           5.0),
]  # fmt: skip


def main(path: str) -> int:
    data = json.loads(Path(path).read_text())
    print("| target | measured | result |\n|---|---|---|")
    for target in TARGETS:
        value, passed = target.check(data)
        shown = "not run" if value is None else f"{value:,.2f}"
        verdict = "-" if passed is None else ("PASS" if passed else "MISS")
        print(f"| {target.name} | {shown} | {verdict} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "bench-results/results.json"))
