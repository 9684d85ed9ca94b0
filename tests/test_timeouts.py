"""Timeouts bound what they promise to bound, whatever the envs do."""

from __future__ import annotations

import asyncio
import signal
import time
from functools import partial

import numpy as np
import pytest

import aiovec
from tests.async_envs import AsyncCounterEnv, RecoveryHangsEnv, StubbornAsyncEnv
from tests.conftest import pid_alive, worker_pids
from tests.envs import CounterEnv
from tests.faulty import FaultyEnv
from tests.helpers import run_python

BOUND = 30


@pytest.mark.parametrize(
    "options", [{"backend": "coroutine"}, {"backend": "process", "num_workers": 1}]
)
async def test_an_async_env_that_swallows_its_cancellation_still_times_out(options):
    env_fns = [partial(AsyncCounterEnv, 0), partial(StubbornAsyncEnv, 1, stubborn_at=2)]
    async with aiovec.VecEnv(env_fns, step_timeout=0.3, close_timeout=0.5, **options) as venv:
        await venv.areset()
        await venv.astep([0, 0])
        venv.send([0, 0])
        received, timed_out = [], []
        while len(received) + len(timed_out) < 2:
            try:
                batch = await asyncio.wait_for(venv.recv(), BOUND)
                received += batch.env_ids.tolist()
            except aiovec.StepTimeoutError as error:
                timed_out += error.timed_out
        assert received == [0] and timed_out == [1]
        venv.send([0], env_ids=[0])  # the others go on
        assert (await asyncio.wait_for(venv.recv(), BOUND)).env_ids.tolist() == [0]
    # aclose above returned although env 1's close ignores cancellation (close_timeout)


async def test_aclose_is_bounded_by_close_timeout_with_stubborn_envs():
    env_fns = [partial(StubbornAsyncEnv, i, stubborn_at=1) for i in range(2)]
    venv = aiovec.VecEnv(env_fns, backend="coroutine", close_timeout=0.2)
    await venv.areset()
    venv.send([0, 0])
    await asyncio.sleep(0.05)
    begun, ended = StubbornAsyncEnv.closes_begun, StubbornAsyncEnv.closes_ended
    await asyncio.wait_for(venv.aclose(), BOUND)  # the runners ignore their cancellation
    assert venv.closed
    # Bounded by close_timeout, not by the envs: aclose returned while both envs' close
    # (which ignores cancellation for STUBBORN_SECONDS) still ran, abandoned.
    assert StubbornAsyncEnv.closes_begun - begun == 2
    assert StubbornAsyncEnv.closes_ended == ended


ABANDONED_CLOSE_SCRIPT = """
import aiovec
from functools import partial
from tests.async_envs import StubbornAsyncEnv
venv = aiovec.VecEnv(
    [partial(StubbornAsyncEnv, i, stubborn_at=1) for i in range(2)],
    backend="coroutine", close_timeout=0.2,
)
venv.reset()
venv.send([0, 0])
venv.close()
print("closed")
"""


def test_an_abandoned_close_is_reported_once_in_aiovecs_words():
    # The sync API closes aiovec's own loop over the abandoned closes: asyncio would
    # print "Task was destroyed but it is pending!" per env at exit.
    result = run_python(ABANDONED_CLOSE_SCRIPT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "closed"
    assert "2 env close() call(s) did not finish within close_timeout=0.2 s" in result.stderr
    assert "abandoned" in result.stderr
    assert "Task was destroyed" not in result.stderr


async def test_a_slow_close_that_honours_its_cancellation_is_not_called_stubborn(caplog):
    """An async env's close takes longer than close_timeout but ends when cancelled: the
    warning says it was cancelled (it said every late close ignores cancellation)."""

    class SlowClose(AsyncCounterEnv):
        async def close(self):
            await asyncio.sleep(30)

    venv = aiovec.VecEnv(
        [partial(SlowClose, i) for i in range(2)], backend="coroutine", close_timeout=0.2
    )
    await venv.areset()
    with caplog.at_level("WARNING", logger="aiovec"):
        await asyncio.wait_for(venv.aclose(), BOUND)
    assert (
        "2 env close() call(s) did not finish within close_timeout=0.2 s: cancelled" in caplog.text
    )
    assert "ignore cancellation" not in caplog.text


class SigtermProofEnv(CounterEnv):
    def __init__(self, env_index: int = 0) -> None:
        super().__init__(env_index)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def test_close_kills_workers_that_ignore_sigterm():
    env_fns = [partial(SigtermProofEnv, i) for i in range(4)]
    venv = aiovec.VecEnv(env_fns, num_workers=4, close_timeout=0.1)
    venv.reset()
    pids = worker_pids(venv)
    venv.send(np.zeros(4, dtype=np.int64))  # never collected
    venv.close()
    assert not any(pid_alive(pid) for pid in pids)


class SlowThirdEnv(CounterEnv):
    def step(self, action):
        if self.env_index == 2:
            time.sleep(3600)
        return super().step(action)


async def test_a_step_timeout_names_only_the_envs_still_owing_results():
    env_fns = [partial(SlowThirdEnv, i) for i in range(3)]
    async with aiovec.VecEnv(
        env_fns, num_workers=1, step_timeout=0.5, concurrent_envs=False
    ) as venv:
        await venv.areset()
        venv.send([0, 0, 0])
        received = []
        with pytest.raises(aiovec.StepTimeoutError) as caught:
            while True:
                batch = await asyncio.wait_for(venv.recv(), BOUND)
                received += batch.env_ids.tolist()
        assert sorted(received) == [0, 1]
        assert caught.value.timed_out == [2]


class BusyEnv(CounterEnv):
    """Computes (not sleeps) ``seconds`` per step: a worker steps such envs in turn."""

    def __init__(self, env_index: int = 0, seconds: float = 0.0) -> None:
        super().__init__(env_index)
        self.seconds = seconds

    def step(self, action):
        deadline = time.perf_counter() + self.seconds
        while time.perf_counter() < deadline:
            pass
        return super().step(action)


@pytest.mark.parametrize(
    "env_fn, options",
    [
        (partial(CounterEnv, delay=0.25), {"concurrent_envs": False}),
        (partial(BusyEnv, seconds=0.25), {}),  # the worker's own choice: in turn
        (partial(CounterEnv, delay=0.25), {"concurrent_envs": True}),
    ],
    ids=["sleeping in turn", "computing", "sleeping concurrently"],
)
async def test_step_timeout_bounds_each_env_not_a_workers_whole_command(env_fn, options):
    """Four envs of one worker, each taking half of step_timeout: none is late, whether
    the worker steps them one after another or concurrently (a worker stepping them in
    turn takes twice step_timeout for the command, which is not any env's doing)."""
    async with aiovec.VecEnv(
        [env_fn] * 4, num_workers=1, step_timeout=0.5, close_timeout=1, **options
    ) as venv:
        await venv.areset()
        for _ in range(2):
            _, rewards, *_ = await venv.astep(np.zeros(4, dtype=np.int64))
        assert rewards.tolist() == [2.0] * 4
        venv.send(np.zeros(4, dtype=np.int64))  # first-ready: the same bound
        received = []
        while len(received) < 4:
            received += (await asyncio.wait_for(venv.recv(), BOUND)).env_ids.tolist()
        assert sorted(received) == [0, 1, 2, 3]


@pytest.mark.parametrize(
    "env_fn, options",
    [
        (partial(CounterEnv, delay=0.25), {"concurrent_envs": False}),
        (partial(BusyEnv, seconds=0.25), {}),
    ],
    ids=["sleeping in turn", "computing"],
)
async def test_step_timeout_counts_from_when_a_queued_command_starts(env_fn, options):
    """First-ready commands sent one env at a time to a worker that steps its envs in
    turn wait for the ones before them: each env, taking half of step_timeout, is given
    its step_timeout from when its worker gets to it, not from its own send."""
    async with aiovec.VecEnv(
        [env_fn] * 4, num_workers=1, step_timeout=0.5, close_timeout=1, **options
    ) as venv:
        await venv.areset()
        for _ in range(2):
            await _step_one_env_at_a_time(venv)


async def _step_one_env_at_a_time(venv) -> None:
    """Send each env its step alone, then receive all of them."""
    for env_id in range(venv.num_envs):
        venv.send(np.zeros(1, dtype=np.int64), env_ids=[env_id])
    received = []
    while len(received) < venv.num_envs:
        received += (await asyncio.wait_for(venv.recv(), BOUND)).env_ids.tolist()
    assert sorted(received) == list(range(venv.num_envs))


def test_a_lockstep_step_timeout_names_only_the_envs_that_owe_their_result():
    """A worker stepping three envs in turn, the middle one hanging: the timeout names
    the hung env, not the env whose step was done nor the one waiting behind it (which
    never started: its result is lost with the worker all the same)."""
    env_fns = [
        partial(CounterEnv, 0, delay=0.05),
        partial(FaultyEnv, 1, "hang", at_step=2),
        partial(CounterEnv, 2, delay=0.05),
    ]
    with aiovec.VecEnv(
        env_fns, num_workers=1, step_timeout=0.5, close_timeout=1, concurrent_envs=False
    ) as venv:
        venv.reset()
        venv.step(np.zeros(3, dtype=np.int64))
        with pytest.raises(aiovec.StepTimeoutError) as caught:
            venv.step(np.zeros(3, dtype=np.int64))
    assert caught.value.timed_out == [1]


class _PausingEnv(CounterEnv):
    """A CounterEnv with a ``pause(seconds)`` method that sleeps (a slow query)."""

    def pause(self, seconds: float) -> int:
        time.sleep(seconds)
        return self.env_index

    def pause_env(self, env_index: int, seconds: float) -> int:
        if self.env_index == env_index:
            time.sleep(seconds)
        return self.env_index


@pytest.mark.parametrize("concurrent_envs", [False, True], ids=["in turn", "threads"])
async def test_a_call_queued_behind_an_envs_step_counts_from_when_it_starts(concurrent_envs):
    """A call sent to envs while their steps run waits for them in each env's queue:
    each call, taking about half of step_timeout like each step, is not late for the
    time the step before it took."""
    env_fns = [partial(_PausingEnv, i, delay=0.3) for i in range(2)]
    async with _one_worker(env_fns, concurrent_envs=concurrent_envs) as venv:
        await venv.areset()
        for _ in range(2):
            venv.send(np.zeros(2, dtype=np.int64))
            if concurrent_envs:
                assert await venv.acall("pause", 0.3) == (0, 1)
            else:  # one env at a time: each call waits for every step before it
                assert await venv.acall("pause", 0.1) == (0, 1)
            received = []
            while len(received) < 2:
                received += (await asyncio.wait_for(venv.recv(), BOUND)).env_ids.tolist()


class _AsyncPausingEnv(AsyncCounterEnv):
    """An AsyncCounterEnv with an async ``pause(seconds)`` method (a slow query)."""

    async def pause(self, seconds: float) -> int:
        await asyncio.sleep(seconds)
        return self.env_index


async def test_calls_queued_on_one_async_env_in_a_worker_are_not_late():
    """Six calls gathered on one async env of a worker process run one after another
    there, each within step_timeout: the agent does not kill the worker for the time
    the calls before each one took (its backstop counts from when the env starts it)."""
    env_fns = [partial(_AsyncPausingEnv, i) for i in range(2)]
    async with aiovec.VecEnv(env_fns, backend="process", step_timeout=0.5) as venv:
        await venv.areset()
        calls = [venv.acall("pause", 0.4, env_ids=[0]) for _ in range(6)]
        assert await asyncio.gather(*calls) == [(0,)] * 6


async def test_a_hang_in_a_call_is_found_while_another_env_of_it_keeps_stepping():
    """A call to every env of a worker stepping them at once hangs in env 3, while env 0
    (done with its part) keeps stepping first-ready: env 0's answers do not keep
    restarting the call's clock, so the hang is found."""
    async with _one_worker(
        [partial(_PausingEnv, i) for i in range(4)], concurrent_envs=True
    ) as venv:
        await venv.areset()
        call = asyncio.ensure_future(venv.acall("pause_env", 3, 3600))
        with pytest.raises(aiovec.StepTimeoutError) as caught:
            for _ in range(100):  # 10 s of stepping: 20 step_timeouts
                venv.send(np.zeros(1, dtype=np.int64), [0])
                await asyncio.wait_for(venv.recv(), BOUND)
                await asyncio.sleep(0.1)
        assert 3 in caught.value.timed_out
        with pytest.raises(aiovec.StepTimeoutError):
            await call


async def test_steps_queued_while_a_worker_finds_its_envs_wait_are_not_late():
    """With concurrent_envs left to the worker, first-ready steps queued while it still
    steps in turn run in threads once it finds that its envs wait: each, taking 0.3 s
    of the 0.5 s step_timeout, counts from then, not from its send."""
    env_fns = [partial(CounterEnv, i, delay=0.3) for i in range(4)]
    async with _one_worker(env_fns) as venv:
        await venv.areset()
        for _ in range(4):
            await _step_one_env_at_a_time(venv)


def _one_worker(env_fns, **options) -> aiovec.VecEnv:
    """``env_fns`` in one worker process, with a step_timeout of 0.5 s."""
    return aiovec.VecEnv(env_fns, num_workers=1, step_timeout=0.5, close_timeout=1, **options)


@pytest.mark.parametrize("mode", ["NextStep", "SameStep"])
def test_after_a_restart_a_timeout_still_names_only_the_hung_env(mode):
    """Env 3 of one worker hangs on the first step of each build. Each restart rebuilds
    the worker's four envs; the steps that follow (restart notices, NEXT_STEP's owed
    resets) are no steps of the env and say nothing of how long its next one takes: the
    healthy envs' results are sent before env 3 steps again, and the timeout that ends
    the restart budget names env 3 alone, after one step_timeout."""
    env_fns = [partial(FaultyEnv, i, "hang", 1 if i == 3 else 10**9) for i in range(4)]
    with _one_worker(
        env_fns,
        concurrent_envs=False,
        on_failure="restart",
        max_restarts=2,
        autoreset_mode=mode,
    ) as venv:
        venv.reset(seed=0)
        blamed = []
        with pytest.raises(aiovec.StepTimeoutError) as caught:
            for _ in range(12):
                venv.step(np.zeros(4, dtype=np.int64))
        blamed.append(caught.value.timed_out)
    assert blamed == [[3]]


@pytest.mark.parametrize("hung", [0, 1])
def test_a_timeout_names_the_env_that_hangs_not_those_queued_behind_it(hung):
    """A worker stepping four envs in turn hangs in env ``hung``: the envs after it never
    started (their results are lost with the worker, as documented), but only the
    hanging env is named as late."""
    env_fns = [partial(FaultyEnv, i, "hang", 1 if i == hung else 10**9) for i in range(4)]
    with _one_worker(env_fns, concurrent_envs=False) as venv:
        venv.reset(seed=0)
        with pytest.raises(aiovec.StepTimeoutError) as caught:
            venv.step(np.zeros(4, dtype=np.int64))
    assert caught.value.timed_out == [hung]
    assert f"envs [{hung}] did not answer" in str(caught.value)


def test_step_timeout_with_envs_stepped_in_this_process_is_refused_at_construction():
    """An env the agent's process steps itself (inline_envs) cannot be interrupted:
    asking for a step_timeout with such envs is refused up front, naming the fix (it
    failed with an internal IndexError at the first late step, and left the vector env
    busy for good)."""
    from functools import partial

    import aiovec
    from tests.envs import CounterEnv

    for backend in ("process", "auto"):
        with pytest.raises(ValueError, match=r"inline_envs=0"):
            aiovec.VecEnv(
                [partial(CounterEnv, i) for i in range(3)],
                backend=backend,
                num_workers=1,
                inline_envs=1,
                step_timeout=0.5,
            )


def test_step_timeout_with_blocking_envs_on_the_coroutine_backend_is_refused():
    """The coroutine backend steps a blocking env on the loop itself, where nothing can
    interrupt it: a step_timeout there is refused at construction (it was accepted and
    never enforced), naming the envs and the fix; no env is left open."""
    from functools import partial

    import aiovec
    from tests.async_envs import AsyncCounterEnv
    from tests.envs import CounterEnv

    closed: list[int] = []

    class Recorded(AsyncCounterEnv):
        async def close(self):  # awaited: an async env's close is a coroutine
            closed.append(self.env_index)

    class RecordedBlocking(CounterEnv):
        def close(self):
            closed.append(self.env_index)

    env_fns = [partial(Recorded, 0), partial(RecordedBlocking, 1), partial(CounterEnv, 2)]
    with pytest.raises(ValueError, match=r"envs \[1, 2\].*backend='process'"):
        aiovec.VecEnv(env_fns, backend="coroutine", step_timeout=0.5)
    assert sorted(closed) == [0, 1]  # every env built was closed, the async one awaited
    # async envs alone: their late commands are cancelled, as documented
    aiovec.VecEnv(env_fns[:1], backend="coroutine", step_timeout=0.5).close()


@pytest.mark.parametrize("hang", ["reset", "close"])
@pytest.mark.parametrize(
    "options", [{"backend": "coroutine"}, {"backend": "process", "num_workers": 1}]
)
async def test_a_restart_that_hangs_is_bounded_by_step_timeout_and_tried_again(hang, options):
    """An async env fails a step and is rebuilt; that recovery hangs (the replacement's
    reset, or the failed env's close): step_timeout bounds it, it counts as a failure
    in a row, and the env is rebuilt again (the step waited forever)."""
    RecoveryHangsEnv.builds = 0  # (counted per process: the coroutine backend's is this one)
    env_fns = [partial(RecoveryHangsEnv, i, hang=hang) for i in range(2)]
    async with aiovec.VecEnv(
        env_fns,
        step_timeout=0.5,
        on_failure="restart",
        max_restarts=3,
        close_timeout=0.5,
        **options,
    ) as venv:
        await venv.areset(seed=0)
        await venv.astep([0, 0])
        _, _, _, truncations, infos = await asyncio.wait_for(venv.astep([0, 0]), BOUND)
        assert truncations.tolist() == [False, True] and infos["restarted"][1]
        assert "simulator 1 diverged" in infos["restart_reason"][1]
        await asyncio.wait_for(venv.astep([0, 0]), BOUND)  # and it steps on


async def test_a_restart_that_keeps_hanging_ends_in_the_step_timeout_error():
    """Every replacement's reset hangs: after max_restarts attempts, the step fails with
    StepTimeoutError naming the env (it waited forever)."""

    class AlwaysHangs(RecoveryHangsEnv):
        async def reset(self, *, seed=None, options=None):
            if self.build >= 2:
                await asyncio.sleep(3600)
            return await AsyncCounterEnv.reset(self, seed=seed, options=options)

    RecoveryHangsEnv.builds = 0
    env_fns = [partial(AlwaysHangs, i) for i in range(2)]
    async with aiovec.VecEnv(
        env_fns, backend="coroutine", step_timeout=0.3, on_failure="restart", max_restarts=2
    ) as venv:
        await venv.areset(seed=0)
        await venv.astep([0, 0])
        with pytest.raises(aiovec.StepTimeoutError) as caught:
            await asyncio.wait_for(venv.astep([0, 0]), BOUND)
        assert caught.value.timed_out == [1]
