"""A thread per env, for blocking envs that mostly wait, driven from an event loop.

Why not ``loop.run_in_executor``: a pool hands each call through a
``concurrent.futures.Future`` (a lock and a condition) chained to an asyncio future, and
the work queue wakes whichever thread is free. A thread of its own per env, fed through a
``SimpleQueue`` and answering with one ``call_soon_threadsafe``, costs about half the CPU
per step (measured: 78 vs 146 us per hand-off and back, 16 sleeping envs, uvloop).
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    _Request = tuple[
        asyncio.AbstractEventLoop, asyncio.Future[Any], Callable[..., Any], tuple[Any, ...]
    ]


class EnvThreads:
    """Runs calls for env ``env_id`` in that env's own thread (started on first use).

    Calls to one env run in order; calls to different envs overlap. Threads are daemons:
    an env blocked forever cannot keep the process alive.
    """

    def __init__(self, name: str = "aiovec-env") -> None:
        self._name = name
        self._queues: dict[int, queue.SimpleQueue[_Request | None]] = {}
        self._closed = False

    def run(self, env_id: int, function: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """``function(*args)`` in env ``env_id``'s thread; the running loop's future of it."""
        if self._closed:
            raise RuntimeError("the env threads are shut down")
        requests = self._queues.get(env_id)
        if requests is None:
            requests = self._queues[env_id] = queue.SimpleQueue()
            threading.Thread(
                target=_serve, args=(requests,), name=f"{self._name}-{env_id}", daemon=True
            ).start()
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        requests.put((loop, future, function, args))
        return future

    def shutdown(self) -> None:
        """Let every thread end once its current call returns; later calls raise."""
        self._closed = True
        for requests in self._queues.values():
            requests.put(None)


def _serve(requests: queue.SimpleQueue[_Request | None]) -> None:
    while (request := requests.get()) is not None:
        loop, future, function, args = request
        try:
            result = function(*args)
        except BaseException as exc:  # handed to the awaiting task, which decides
            settle: Callable[[asyncio.Future[Any], Any], None] = _settle_exception
            outcome: Any = exc
        else:
            settle, outcome = _settle, result
        try:
            loop.call_soon_threadsafe(settle, future, outcome)
        except RuntimeError:  # the loop is closed: nobody waits any more
            return


def _settle(future: asyncio.Future[Any], result: Any) -> None:
    if not future.done():  # a cancelled waiter (timeout, close) no longer wants it
        future.set_result(result)


def _settle_exception(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
