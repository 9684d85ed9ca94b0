"""The private event loop behind the synchronous API."""

from __future__ import annotations

import asyncio

from aiovec.errors import SyncCallInEventLoopError

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
