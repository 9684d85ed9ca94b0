"""How late the kernel may end a thread's timed waits (Linux's timer slack).

Linux lets a normal thread's sleep, or the timeout of its ``select``/``poll``, end up to
its timer slack after the time asked for (50 us by default), to group wake-ups. An env
that waits on a timer (a rate-limited simulator, a control loop holding its period) then
steps that much slower, every step: measured here, ``time.sleep(0.002)`` overran by a
mean 176 us with the default slack and 106 us with 1 us. A worker serves its envs with
:data:`ENV_TIMER_SLACK_NS` (threads inherit it from the thread that starts them).
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable
from typing import Final

#: The timer slack of a worker's threads, in nanoseconds.
ENV_TIMER_SLACK_NS: Final = 1_000

_PR_SET_TIMERSLACK, _PR_GET_TIMERSLACK = 29, 30


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return prctl


def set_timer_slack(nanoseconds: int = ENV_TIMER_SLACK_NS) -> None:
    """Give the calling thread (and the threads it starts from now on) this timer slack;
    a no-op where the platform has no such setting."""
    prctl = _prctl()
    if prctl is not None:
        prctl(_PR_SET_TIMERSLACK, nanoseconds, 0, 0, 0)


def timer_slack() -> int | None:
    """The calling thread's timer slack in nanoseconds (``None`` where unknown)."""
    prctl = _prctl()
    if prctl is None:
        return None
    value = prctl(_PR_GET_TIMERSLACK, 0, 0, 0, 0)
    return int(value) if value >= 0 else None
