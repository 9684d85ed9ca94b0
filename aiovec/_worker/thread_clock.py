"""How the calling thread spent a stretch of time: running, waiting for a CPU, or blocked.

Telling an env that mostly waits (sleep, IO) from one that computes must hold on a
loaded machine: there a computing thread spends much of its wall time preempted, so
"CPU time / wall time" alone would call it waiting. Linux reports the time a thread sat
runnable on a run-queue and how often it blocked of its own accord; elsewhere those
read as zero and unknown, and the plain share decides.
"""

from __future__ import annotations

import os
import resource
import threading
import time
from typing import Final, NamedTuple

#: Below this CPU share of the time it could run, an env that blocks counts as waiting.
WAITING_CPU_SHARE: Final = 0.25

_SCHEDSTAT = "/proc/thread-self/schedstat"
#: getrusage of the calling thread alone (Linux); None where the platform has none.
_RUSAGE_THREAD = getattr(resource, "RUSAGE_THREAD", None)


class ThreadTimes(NamedTuple):
    """A reading of the calling thread's clocks (seconds) and counters."""

    wall: float
    cpu: float
    queued: float  #: runnable but not running (preempted, waiting for a core); 0 if unknown
    blocks: int | None  #: voluntary context switches so far; ``None`` if unknown


class Interval(NamedTuple):
    """What a thread did between two :func:`read` calls."""

    wall: float
    cpu: float
    queued: float
    blocks: int | None

    @property
    def cpu_share(self) -> float:
        """CPU time over the time the thread could have run (queued time left out), in [0, 1]."""
        runnable = self.wall - self.queued
        return min(self.cpu / runnable, 1.0) if runnable > 0 else 1.0


def mostly_waits(cpu_share: float, blocks_per_step: float | None) -> bool:
    """Whether an env that used ``cpu_share`` of the time it could run, blocking in the
    kernel ``blocks_per_step`` times a step (``None``: unknown), mostly waits (sleep,
    IO, a remote simulator). A computing env preempted on a busy machine never blocks
    of its own accord, so it never counts, however small its share looks."""
    blocked = blocks_per_step is None or blocks_per_step >= 0.5
    return blocked and cpu_share < WAITING_CPU_SHARE


def read() -> ThreadTimes:
    """The calling thread's clocks now (a few microseconds on Linux)."""
    return ThreadTimes(time.perf_counter(), time.thread_time(), _queued(), _blocks())


def since(start: ThreadTimes) -> Interval:
    """What the calling thread did since ``start`` (taken by :func:`read` in this thread)."""
    end = read()
    blocks = None if start.blocks is None or end.blocks is None else end.blocks - start.blocks
    return Interval(end.wall - start.wall, end.cpu - start.cpu, end.queued - start.queued, blocks)


class _SchedStat:
    """This thread's schedstat file, open for as long as the thread lives (a thread-local
    holds it: re-reading an open /proc file costs a few microseconds, opening it tens)."""

    def __init__(self) -> None:
        self.fd = os.open(_SCHEDSTAT, os.O_RDONLY)

    def __del__(self) -> None:
        os.close(self.fd)


_this_thread = threading.local()


def _queued() -> float:
    try:
        stat = getattr(_this_thread, "schedstat", None)
        if stat is None:
            stat = _this_thread.schedstat = _SchedStat()
        return int(os.pread(stat.fd, 128, 0).split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def _blocks() -> int | None:
    try:
        return resource.getrusage(_RUSAGE_THREAD).ru_nvcsw  # type: ignore[arg-type]
    except (OSError, ValueError, TypeError):  # no per-thread usage here
        return None
