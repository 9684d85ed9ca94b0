"""EnvThreads: blocking calls of each env in its own thread, awaited from an event loop."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from aiovec._worker.threads import EnvThreads


async def test_calls_to_one_env_run_in_order_in_its_own_thread():
    threads = EnvThreads()
    seen = []

    def record(value):
        time.sleep(0.01 * (3 - value))  # later calls are faster: order must still hold
        seen.append((value, threading.current_thread().name))
        return value * 10

    results = await asyncio.gather(*[threads.run(7, record, v) for v in range(3)])
    threads.shutdown()
    assert results == [0, 10, 20]
    assert [value for value, _ in seen] == [0, 1, 2]
    assert {name for _, name in seen} == {"aiovec-env-7"}


async def test_calls_to_different_envs_overlap():
    threads = EnvThreads()
    started = time.monotonic()
    await asyncio.gather(*[threads.run(env_id, time.sleep, 0.3) for env_id in range(4)])
    threads.shutdown()
    assert time.monotonic() - started < 1.0  # four 0.3 s sleeps together, not in turn


async def test_an_exception_reaches_the_awaiting_task_and_the_thread_goes_on():
    threads = EnvThreads()
    with pytest.raises(ZeroDivisionError):
        await threads.run(0, lambda: 1 / 0)
    assert await threads.run(0, lambda: "still here") == "still here"
    threads.shutdown()


async def test_a_cancelled_waiter_is_left_alone_and_shutdown_refuses_new_calls():
    threads = EnvThreads()
    slow = threads.run(0, time.sleep, 0.2)
    slow.cancel()
    assert await threads.run(0, lambda: 5) == 5  # ran after the cancelled call finished
    threads.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        threads.run(0, lambda: 5)
