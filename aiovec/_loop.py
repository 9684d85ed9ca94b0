"""Choosing the event loop: uvloop when installed, asyncio otherwise."""

from __future__ import annotations

import asyncio
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


def ensure_no_running_loop(method: str, async_method: str) -> None:
    """Raise if called from a coroutine: blocking there would freeze the caller's loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise SyncCallInEventLoopError(
        f"{method}() blocks and was called from inside a running event loop; "
        f"use `await venv.{async_method}(...)` there instead"
    )


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
