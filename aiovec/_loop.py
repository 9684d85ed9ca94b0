"""Choosing the event loop: uvloop when installed, asyncio otherwise."""

from __future__ import annotations

import asyncio
import sys
import warnings
from collections.abc import Coroutine
from typing import Any, TypeVar

from aiovec.errors import SyncCallInEventLoopError

T = TypeVar("T")

LOOP_KINDS = ("auto", "uvloop", "asyncio")


def new_event_loop(kind: str = "auto") -> asyncio.AbstractEventLoop:
    """A new loop: uvloop when installed (``auto``) or required (``uvloop``), else asyncio's."""
    if kind not in LOOP_KINDS:
        raise ValueError(f"loop must be one of {LOOP_KINDS}, got {kind!r}")
    if kind != "asyncio":
        try:
            import uvloop
        except ImportError as exc:
            if kind == "uvloop":
                raise ImportError(
                    "loop='uvloop' needs the uvloop package: pip install uvloop"
                ) from exc
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


_warned_about_blocking = False


def check_blocking_call(method: str, async_method: str, *, deadlocks: bool = False) -> None:
    """Allow a blocking call from inside a running event loop, as Gymnasium does (it
    blocks that loop meanwhile); warn once, except in IPython/Jupyter, where every cell
    runs inside a loop. ``deadlocks``: the call needs this very loop (async envs on the
    coroutine backend), so it is refused with :class:`aiovec.SyncCallInEventLoopError`."""
    global _warned_about_blocking
    if asyncio._get_running_loop() is None:  # the common case, without raising
        return
    if deadlocks:
        raise SyncCallInEventLoopError(
            f"{method}() was called from inside the running event loop that steps this "
            f"vector env's async envs: blocking would deadlock; use `await "
            f"venv.{async_method}(...)` there instead"
        )
    if _warned_about_blocking or _in_ipython():
        return
    _warned_about_blocking = True
    warnings.warn(
        f"{method}() blocks the running event loop until it returns; in a coroutine, "
        f"use `await venv.{async_method}(...)` so that other tasks keep running",
        RuntimeWarning,
        stacklevel=4,
    )


def _in_ipython() -> bool:
    ipython = sys.modules.get("IPython")
    return ipython is not None and getattr(ipython, "get_ipython", lambda: None)() is not None


def run(main: Coroutine[Any, Any, T], *, loop: str = "auto") -> T:
    """Run ``main`` to completion on a new event loop of kind ``loop`` and close it.

    Like :func:`asyncio.run`, with uvloop chosen automatically when it is installed.

    Example:
        >>> import aiovec
        >>> async def main():
        ...     async with aiovec.make("CartPole-v1", 2, backend="inline") as envs:
        ...         observations, _ = await envs.areset(seed=0)
        ...         return observations.shape
        >>> aiovec.run(main())
        (2, 4)
    """
    if hasattr(asyncio, "Runner"):  # Python >= 3.11
        with asyncio.Runner(loop_factory=lambda: new_event_loop(loop)) as runner:
            return runner.run(main)
    event_loop = new_event_loop(loop)
    try:
        return event_loop.run_until_complete(main)
    finally:
        event_loop.run_until_complete(event_loop.shutdown_asyncgens())
        event_loop.close()
