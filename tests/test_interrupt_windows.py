"""A Ctrl-C can land between any two lines of aiovec's own code: right after a lock or
a call count was taken, between two workers' commands. Wherever it lands in a blocking
call, the vector env is closed (later calls raise ``ClosedError``), never left wedged
(busy envs, a held lock, a call counted forever)."""

from __future__ import annotations

import asyncio
import linecache
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

import aiovec
from aiovec._scheduler import Scheduler
from tests.envs import CounterEnv


@contextmanager
def ctrl_c_at(function: Callable[..., Any], text: str, hit: int = 1) -> Iterator[list[int]]:
    """Deliver a real SIGINT when ``function`` reaches (for the ``hit``-th time) the line
    holding ``text``: where a Ctrl-C from a terminal can land by chance."""
    code = function.__code__  # the function itself, not what a decorator wraps
    lines = linecache.getlines(code.co_filename)
    first = code.co_firstlineno
    target = next(n for n in range(first, len(lines) + 1) if text in lines[n - 1])
    hits: list[int] = []

    def local(frame: Any, event: str, arg: Any) -> Any:
        if event == "line" and frame.f_lineno == target:
            hits.append(1)
            if len(hits) == hit:
                signal.raise_signal(signal.SIGINT)
        return local

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        return local if frame.f_code is code else None

    sys.settrace(tracer)
    try:
        yield hits
    finally:
        sys.settrace(None)


def _envs(**options: Any) -> aiovec.VecEnv:
    envs = aiovec.VecEnv([lambda: CounterEnv(0)] * 4, **options)
    envs.reset(seed=0)
    return envs


def _assert_closed_by_ctrl_c(envs: aiovec.VecEnv) -> None:
    assert envs.closed
    for call in (lambda: envs.step(np.zeros(4, np.int64)), envs.reset):
        with pytest.raises(aiovec.ClosedError, match="Ctrl-C"):
            call()


@pytest.mark.parametrize("backend", ["process", "inline"])
def test_a_ctrl_c_just_after_the_blocking_call_lock_is_taken_closes(backend, no_leaks):
    options = {"num_workers": 2} if backend == "process" else {}
    envs = _envs(backend=backend, **options)
    try:
        with (
            ctrl_c_at(Scheduler.enter_sync, "self.blocking = True") as hits,
            pytest.raises(KeyboardInterrupt),
        ):
            envs.step(np.zeros(4, np.int64))
        assert hits
        _assert_closed_by_ctrl_c(envs)
    finally:
        envs.close()


def test_a_ctrl_c_between_two_workers_commands_closes(no_leaks):
    """One worker has its step, the other not yet: closed, not left half busy."""
    envs = _envs(backend="process", num_workers=2)
    try:
        with (
            ctrl_c_at(Scheduler.submit, "self.backend.submit(worker, payload)", hit=2),
            pytest.raises(KeyboardInterrupt),
        ):
            envs.step(np.zeros(4, np.int64))
        _assert_closed_by_ctrl_c(envs)
    finally:
        envs.close()


@pytest.mark.parametrize(
    "where",
    [
        (Scheduler.enter_call, "self._calls, self.active = self._calls + 1"),  # before
        (aiovec.VecEnv.send, "result = method(self, *args, **kwargs)"),  # just after
    ],
    ids=["before-counting", "after-counting"],
)
def test_a_ctrl_c_around_a_call_being_counted_does_not_count_it_forever(where, no_leaks):
    """``send`` interrupted as it counts itself as a call in progress: the count is
    right after, so a later close() closes at once (a call in progress would defer it),
    and the envs stay usable."""
    envs = _envs(backend="process", num_workers=2)
    try:
        with ctrl_c_at(*where), pytest.raises(KeyboardInterrupt):
            envs.send(np.zeros(1, np.int64), [0])
        assert envs._scheduler.calls == 0 and envs._scheduler.active == 0
        assert not envs.closed
        observations, *_ = envs.step(np.zeros(4, np.int64))
        assert observations.shape[0] == 4
        envs.close()
        assert envs.closed
    finally:
        envs.close()


def _usable_or_closed_by_ctrl_c(envs: aiovec.VecEnv) -> None:
    """The env steps, or says a Ctrl-C closed it; close() then closes it either way."""
    try:
        observations, *_ = envs.step(np.zeros(4, np.int64))
        assert observations.shape[0] == 4
    except aiovec.ClosedError as closed:
        assert "Ctrl-C" in str(closed)
    envs.close()
    assert envs.closed


@pytest.mark.parametrize("backend", ["process", "inline"])
@pytest.mark.parametrize(
    "where",
    [
        (Scheduler.exit_sync, "self._sync_lock.release()"),  # releasing the call's lock
        (Scheduler.exit_call, "self._calls, self.active = self._calls - 1"),
        (aiovec.VecEnv._submitted, "scheduler.leave(calls)"),  # sent, not yet pending
    ],
    ids=["releasing-lock", "uncounting", "sent-not-pending"],
)
def test_a_ctrl_c_as_a_blocking_call_ends_does_not_wedge_it(backend, where, no_leaks):
    if backend == "inline" and where[0] is aiovec.VecEnv._submitted:
        pytest.skip("an inline lockstep step is one call (its fast path), not sent then awaited")
    options = {"num_workers": 2} if backend == "process" else {}
    envs = _envs(backend=backend, **options)
    try:
        with ctrl_c_at(*where), pytest.raises(KeyboardInterrupt):
            envs.step(np.zeros(4, np.int64))
        _usable_or_closed_by_ctrl_c(envs)
    finally:
        envs.close()


@pytest.mark.parametrize("backend", ["process", "inline"])
@pytest.mark.parametrize("text", ["self._close_begins()", "self._backend.close(self.close_timeout"])
def test_a_ctrl_c_in_close_leaves_nothing_running(backend, text, no_leaks):
    """Closed means closed: a close cut short by a Ctrl-C stops its workers at once."""
    options = {"num_workers": 2} if backend == "process" else {}
    envs = _envs(backend=backend, **options)
    with ctrl_c_at(aiovec.VecEnv.close_extras, text), pytest.raises(KeyboardInterrupt):
        envs.close()
    assert envs.closed
    envs.close()  # nothing left to do
    with pytest.raises(aiovec.ClosedError):
        envs.step(np.zeros(4, np.int64))


@pytest.mark.parametrize("turns", [1, 3])  # (cancelled before its first turn, it never ran)
async def test_an_aclose_cancelled_midway_leaves_nothing_running(turns, no_leaks):
    """``aclose()`` cancelled (a timeout around it, Ctrl-C under ``asyncio.run``) after
    a few loop turns: closed, its workers stopped; awaiting it again is a no-op."""
    envs = aiovec.VecEnv([lambda: CounterEnv(0)] * 4, num_workers=2)
    await envs.areset(seed=0)
    task = asyncio.ensure_future(envs.aclose())
    for _ in range(turns):
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert envs.closed
    await envs.aclose()
    with pytest.raises(aiovec.ClosedError):
        await envs.astep(np.zeros(4, np.int64))
