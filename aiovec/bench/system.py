"""What the machine says about this process tree: CPU time, memory, and its own limits."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import gymnasium as gym


def descendant_pids(root: int | None = None) -> list[int]:
    """Every live process below ``root`` (default: this process), via ``/proc``."""
    root = os.getpid() if root is None else root
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry))
    found, frontier = [], [root]
    while frontier:
        pid = frontier.pop()
        for child in children.get(pid, ()):
            found.append(child)
            frontier.append(child)
    return found


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds used so far by ``pids`` (those still alive)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        except (OSError, IndexError, ValueError):
            continue
    return total / ticks


def tree_cpu_seconds() -> float:
    """CPU seconds of this process plus all its live descendants."""
    return cpu_seconds([os.getpid(), *descendant_pids()])


def proportional_memory(pids: list[int]) -> int:
    """Proportional set size (bytes) of ``pids``: shared pages split fairly between them."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as rollup:
                for line in rollup:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        except OSError:
            continue
    return total


def bare_step_seconds(env_fn: Callable[[], gym.Env], seconds: float = 0.3) -> float:
    """Median time of one ``env.step`` in this process (no vectorization at all)."""
    env = env_fn()
    env.reset(seed=0)
    env.action_space.seed(0)
    actions = [env.action_space.sample() for _ in range(64)]
    samples: list[float] = []
    deadline = time.perf_counter() + seconds
    steps = 0
    while time.perf_counter() < deadline or len(samples) < 3:
        start = time.perf_counter()
        for action in actions:
            _, _, terminated, truncated, _ = env.step(action)
            steps += 1
            if terminated or truncated:
                env.reset()
        samples.append((time.perf_counter() - start) / len(actions))
    env.close()
    samples.sort()
    return samples[len(samples) // 2]


def pipe_round_trip_seconds(round_trips: int = 3000) -> float:
    """Median round trip of one byte through two pipes to a forked echo process."""
    to_child, from_parent = os.pipe()
    from_child, to_parent = os.pipe()
    pid = os.fork()
    if pid == 0:  # the echo process: no Python cleanup, just echo then leave
        try:
            while True:
                data = os.read(to_child, 1)
                if not data or data == b"q":
                    break
                os.write(to_parent, data)
        finally:
            os._exit(0)
    samples = []
    try:
        for batch in range(round_trips // 100):
            start = time.perf_counter()
            for _ in range(100):
                os.write(from_parent, b"x")
                os.read(from_child, 1)
            if batch:  # the first batch warms up
                samples.append((time.perf_counter() - start) / 100)
        os.write(from_parent, b"q")
    finally:
        os.waitpid(pid, 0)
        for fd in (to_child, from_parent, from_child, to_parent):
            os.close(fd)
    samples.sort()
    return samples[len(samples) // 2]
