"""Restart paths and start-up deadlines: a worker whose envs cannot be rebuilt, or are
rebuilt slowly, never hangs the agent nor freezes its event loop."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from functools import partial
from pathlib import Path

import numpy as np
import pytest

import aiovec
from tests.async_envs import AsyncCounterEnv
from tests.conftest import worker_processes
from tests.envs import CounterEnv
from tests.faulty import (
    CheckpointEnv,
    CrashLoopEnv,
    FailingResetEnv,
    FaultyEnv,
    FlakyFactoryEnv,
    FlakyResetAfterRebuildEnv,
    ResetKillsEnv,
    SlowlyDyingEnv,
)
from tests.helpers import Heartbeat

BOUND = 30


class HangingConstructorEnv(CounterEnv):
    def __init__(self, env_index: int = 0) -> None:
        time.sleep(3600)


def test_a_hanging_constructor_hits_the_startup_timeout():
    before = worker_processes()
    env_fns = [partial(CounterEnv, 0), partial(HangingConstructorEnv, 1)]
    with pytest.raises(aiovec.StartupTimeoutError, match=r"envs \[1\].*startup_timeout=0.5") as e:
        aiovec.VecEnv(env_fns, num_workers=2, startup_timeout=0.5, step_timeout=1)
    assert isinstance(e.value, TimeoutError)
    deadline = time.monotonic() + 5
    while worker_processes() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert worker_processes() - before == set()


@pytest.mark.parametrize("policy_restarts", [1, 3])
def test_a_factory_that_raises_while_its_worker_is_rebuilt(tmp_path, policy_restarts):
    """Worker 1 dies (os._exit) and its factory then refuses to build: the step fails
    with the factory's error (an EnvError that is a ConnectionError), nothing hangs, a
    later send tries a new worker once and reports the factory's error again, and the
    healthy worker goes on."""
    ledger = str(tmp_path / "builds")
    env_fns = [partial(CounterEnv, 0), partial(FlakyFactoryEnv, 1, ledger)]
    with aiovec.VecEnv(
        env_fns, num_workers=2, on_failure="restart", max_restarts=policy_restarts
    ) as venv:
        venv.reset()
        venv.step([0, 0])
        with pytest.raises(ConnectionError, match="refused the connection") as caught:
            venv.step([0, 0])  # worker 1 exits on this step; its rebuild fails
        assert isinstance(caught.value, aiovec.EnvError)
        venv.send([0], env_ids=[1])  # a new worker, whose factory refuses again
        with pytest.raises(ConnectionError, match="refused the connection"):
            aiovec.run(venv.recv())
        venv.send([0], env_ids=[0])
        assert aiovec.run(venv.recv()).env_ids.tolist() == [0]
        assert venv.call("env_index", env_ids=[0]) == (0,)


async def test_a_hanging_rebuild_times_out_without_freezing_the_loop(tmp_path):
    ledger = str(tmp_path / "builds")
    env_fns = [partial(CounterEnv, 0), partial(FlakyFactoryEnv, 1, ledger, on_rebuild="hang")]
    async with aiovec.VecEnv(
        env_fns, num_workers=2, on_failure="restart", max_restarts=1, startup_timeout=1.0
    ) as venv:
        await venv.areset()
        await venv.astep([0, 0])
        heartbeat = Heartbeat(0.01)
        venv.send([0, 0])
        started = time.monotonic()
        with pytest.raises(aiovec.StartupTimeoutError, match=r"envs \[1\]"):
            while True:  # env 0 answers; env 1's worker is rebuilt, hangs, is killed
                batch = await asyncio.wait_for(venv.recv(), BOUND)
                assert batch.env_ids.tolist() == [0]
        elapsed = time.monotonic() - started
        heartbeat.stop()
        assert heartbeat.beats >= elapsed / 0.01 / 4  # the loop kept running during the rebuild


def test_an_env_whose_in_worker_rebuild_fails_is_never_stepped_again(tmp_path, backend):
    """The env raises in step (rebuilt where it lives), its factory then raises: the
    closed env is not stepped silently on the next step; the failure is reported."""
    ledger = str(tmp_path / "builds")
    env_fns = [partial(CounterEnv, 0), partial(FlakyFactoryEnv, 1, ledger, fault="raise")]
    with aiovec.VecEnv(env_fns, backend=backend, on_failure="restart", max_restarts=1) as venv:
        venv.reset()
        venv.step([0, 0])
        with pytest.raises(ConnectionError, match="refused"):
            venv.step([0, 0])
        with pytest.raises(aiovec.EnvError, match="could not be rebuilt|refused"):
            venv.step([0, 0])


@pytest.mark.parametrize("policy", ["restart", "raise"])
async def test_a_worker_that_died_between_recv_and_send(policy):
    """A worker dies while the agent awaits something else: under the restart policy the
    next send goes to its replacement (never 'it is gone'); under raise it reports the
    crash; either way nothing of the send reaches the other worker unless all of it can."""
    import os
    import signal

    env_fns = [partial(CounterEnv, i) for i in range(2)]
    async with aiovec.VecEnv(env_fns, num_workers=2, on_failure=policy) as venv:
        await venv.areset()
        venv.send([0, 0])
        await asyncio.wait_for(venv.recv(min_envs=2), BOUND)
        os.kill(venv._backend._processes[1].pid, signal.SIGKILL)
        await asyncio.sleep(0.5)  # the agent is busy elsewhere meanwhile
        if policy == "raise":
            with pytest.raises(aiovec.WorkerCrashedError, match="SIGKILL"):
                venv.send([0, 0])
            assert venv._scheduler.num_busy == 0  # env 0 was not sent its action either
            return
        venv.send([0, 0])
        batch = await asyncio.wait_for(venv.recv(min_envs=2), BOUND)
        assert sorted(batch.env_ids.tolist()) == [0, 1]
        row = batch.env_ids.tolist().index(1)
        assert batch.infos["restarted"][row]


_STEPS = {"env 0": 0}


class _FailsTogether(__import__("tests.envs", fromlist=["CounterEnv"]).CounterEnv):
    """Env 0 fails once, on its 4th step; env 1 fails on every step from the 2nd on
    (rebuilt or not), so its failures run past max_restarts."""

    def step(self, action):
        if self.env_index == 0:
            _STEPS["env 0"] += 1
            if _STEPS["env 0"] == 4:
                raise RuntimeError("env 0 diverged once")
        elif _STEPS["env 0"] >= 2:
            raise RuntimeError("env 1 keeps failing")
        return super().step(action)


def test_an_env_rebuilt_in_a_step_that_fails_is_still_counted():
    """One env is rebuilt while another fails past max_restarts in the same step: the
    step raises, and restart_counts still counts the rebuilt env."""
    import numpy as np

    import aiovec

    _STEPS["env 0"] = 0
    env_fns = [lambda i=i: _FailsTogether(i) for i in range(2)]
    with aiovec.VecEnv(env_fns, backend="inline", on_failure="restart", max_restarts=1) as v:
        v.reset(seed=0)
        raised = 0
        for _ in range(4):
            try:
                v.step(np.zeros(2, dtype=np.int64))
            except aiovec.EnvError:
                raised += 1
        assert raised >= 1
        assert v.restart_counts[0] == 1
        assert v.stats().env_restarts == int(v.restart_counts.sum())


def test_closing_while_a_restarted_worker_waits_for_its_buffers_is_quiet(capfd):
    # The worker is told to close before it was handed its shared memory: it stops
    # without a traceback (the Close frame once reached it as "0 items of ancdata").
    env_fns = [partial(FaultyEnv, 0, fault="exit", at_step=1), CounterEnv]
    venv = aiovec.VecEnv(env_fns, num_workers=1, on_failure="restart", context="fork")
    try:
        venv.reset()
        venv.send(np.zeros(2, dtype=np.int64))
        deadline = time.monotonic() + 10
        while venv.stats().worker_restarts == 0 and time.monotonic() < deadline:
            venv.recv_nowait()  # applies the worker's exit: restarted, not yet handed buffers
            time.sleep(0.01)
        assert venv.stats().worker_restarts == 1
        time.sleep(0.5)  # the new worker has built its envs and waits for its buffers
    finally:
        venv.close()
    time.sleep(0.2)
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.parametrize("failing_resets", [1, 2, 3])
def test_a_rebuilt_env_whose_reset_fails_is_rebuilt_again_within_max_restarts(
    tmp_path, backend, failing_resets
):
    """The env fails a step; its replacement (and the next) fail their first reset: each
    failure counts against max_restarts=3 and the env is rebuilt again (the first
    replacement's reset error was raised at once, as if it were the step's)."""
    ledger = str(tmp_path / "builds")
    env_fns = [
        partial(CounterEnv, 0),
        partial(FlakyResetAfterRebuildEnv, 1, ledger, failing_resets=failing_resets),
    ]
    with aiovec.VecEnv(env_fns, backend=backend, on_failure="restart", max_restarts=3) as venv:
        venv.reset(seed=0)
        venv.step([0, 0])
        if failing_resets < 3:  # 1 step failure + that many reset failures <= 3
            _, _, _, truncations, infos = venv.step([0, 0])
            assert truncations[1] and infos["restarted"][1]
            assert "RuntimeError: simulator 1 diverged" in infos["restart_reason"][1]
            assert len(Path(ledger).read_text()) == 2 + failing_resets
            venv.step([0, 0])  # (NEXT_STEP autoreset of the truncated episode)
            observations, *_ = venv.step([0, 0])  # the rebuilt env steps on
            assert observations[1].tolist() == [1, 1]
        else:  # the fourth failure in a row is reported
            with pytest.raises(ConnectionError, match="still starting"):
                venv.step([0, 0])


def test_a_restart_that_cannot_start_leaves_its_envs_failed_not_in_flight():
    """A worker dies while the agent is at its descriptor limit: its replacement cannot
    start. The step raises that (the explained OSError) and the worker's envs are
    failed, not left in flight for good (every later call raised EnvBusyError); the
    other workers' envs go on, and once descriptors are free again, the next call to
    the failed envs starts their worker anew."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    venv = aiovec.VecEnv(
        [partial(CounterEnv, i) for i in range(4)], num_workers=2, on_failure="restart"
    )
    try:
        venv.reset(seed=0)
        # Well below what is open: the few the dead worker frees cannot make room.
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) - 16, hard))
        try:
            os.kill(venv._backend._processes[1].pid, signal.SIGKILL)
            time.sleep(0.2)
            with pytest.raises(OSError, match="ulimit -n"):
                venv.step([0, 0, 0, 0])
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        venv.send(np.zeros(2, dtype=np.int64), [0, 1])  # the other worker's envs go on
        batch = aiovec.run(venv.recv(min_envs=2))
        assert sorted(batch.env_ids.tolist()) == [0, 1]
        _, _, _, truncations, infos = venv.step([0, 0, 0, 0])  # room again: a new worker
        assert truncations.tolist() == [False, False, True, True]
        assert infos["_restarted"].tolist() == [False, False, True, True]
    finally:
        venv.close()


RESET_FAULTS = [("inline", "raise"), ("process", "raise"), ("process", "exit")]


@pytest.mark.parametrize(("backend", "fault"), RESET_FAULTS)
def test_a_reset_that_fails_under_restart_is_rebuilt_and_reported(tmp_path, backend, fault):
    """An env that raises (or whose worker dies) in ``reset()`` is rebuilt and reset
    again with the same seed and options, like a failed step: the reset returns, and the
    env's info says so (``restarted``, ``restart_reason``); ``restart_counts`` counts it.
    A raising reset used to raise despite the policy, a dying worker's to replay the
    reset silently (no info, no count)."""
    ledger = str(tmp_path / "failures")
    env_fns = [partial(CounterEnv, 0), partial(FailingResetEnv, 1, ledger, fault)]
    workers = {"num_workers": 2} if backend == "process" else {}
    with aiovec.VecEnv(env_fns, backend=backend, on_failure="restart", **workers) as venv:
        venv.reset(seed=0)
        venv.step([0, 0])
        observations, infos = venv.reset(seed=10, options=[None, {"fail": True}])
        assert observations.tolist() == [[0, 0], [1, 0]]
        assert infos["_restarted"].tolist() == [False, True]
        assert infos["restarted"][1]
        reason = "ConnectionError: simulator 1 lost" if fault == "raise" else "died"
        assert reason in infos["restart_reason"][1]
        assert infos["seed"][1] == 11  # the rebuilt env got the same seed and options
        assert infos["options"]["fail"][1]
        assert venv.restart_counts.tolist() == [0, 1]
        observations, _, _, truncations, infos = venv.step([0, 0])
        assert observations.tolist() == [[0, 1], [1, 1]]  # a reset env: no restart notice
        assert not truncations.any() and "restarted" not in infos


@pytest.mark.parametrize("backend", ["inline", "process"])
def test_a_reset_that_keeps_failing_raises_after_max_restarts(tmp_path, backend):
    ledger = str(tmp_path / "failures")
    env_fns = [partial(CounterEnv, 0), partial(FailingResetEnv, 1, ledger, failures=3)]
    with aiovec.VecEnv(env_fns, backend=backend, on_failure="restart", max_restarts=2) as venv:
        venv.reset(seed=0)
        with pytest.raises(ConnectionError, match="lost its connection"):
            venv.reset(options=[None, {"fail": True}])
        assert len(Path(ledger).read_text()) == 3  # the first try and two rebuilds
        # The last rebuilt env (never reset) resets fine now: this reset reports it.
        _, infos = venv.reset(options=[None, {"fail": True}])
        assert infos["_restarted"].tolist() == [False, True]
        assert venv.restart_counts.tolist() == [0, 1]


@pytest.mark.parametrize("backend", ["inline", "process"])
def test_a_step_after_a_reset_that_gave_up_replays_that_reset(tmp_path, backend):
    """A reset that failed past ``max_restarts`` leaves its env rebuilt but not reset:
    the next step resets it (reported as a restart) with the seed and options of the
    reset that gave up, not a bare ``reset()`` (which lost the caller's seeding)."""
    ledger = str(tmp_path / "failures")
    env_fns = [partial(CounterEnv, 0), partial(FailingResetEnv, 1, ledger, failures=3)]
    with aiovec.VecEnv(env_fns, backend=backend, on_failure="restart", max_restarts=2) as venv:
        venv.reset(seed=0)
        with pytest.raises(ConnectionError, match="lost its connection"):
            venv.reset(seed=5, options=[None, {"fail": True}])
        observations, _, _, truncations, infos = venv.step([0, 0])
        assert truncations.tolist() == [False, True] and infos["restarted"][1]
        assert infos["seed"][1] == 6 and infos["options"]["fail"][1]
        # Replayed once: a later reset and step are the caller's own again.
        _, infos = venv.reset(seed=1)
        assert infos["seed"][1] == 2 and infos["options"][1] is None
        venv.step([0, 0])


@pytest.mark.parametrize("backend", ["inline", "process"])
def test_a_new_reset_replaces_the_one_owed_by_a_reset_that_gave_up(tmp_path, backend):
    ledger = str(tmp_path / "failures")
    env_fns = [partial(CounterEnv, 0), partial(FailingResetEnv, 1, ledger, failures=3)]
    with aiovec.VecEnv(env_fns, backend=backend, on_failure="restart", max_restarts=2) as venv:
        with pytest.raises(ConnectionError, match="lost its connection"):
            venv.reset(seed=5, options=[None, {"fail": True}])
        _, infos = venv.reset(seed=20)
        assert infos["seed"][1] == 21 and infos["options"][1] is None


async def test_an_async_reset_under_restart_reports_the_restart(tmp_path, backend):
    ledger = str(tmp_path / "failures")
    env_fns = [partial(CounterEnv, 0), partial(FailingResetEnv, 1, ledger)]
    async with aiovec.VecEnv(env_fns, backend=backend, on_failure="restart") as venv:
        _, infos = await venv.areset(seed=3, options=[None, {"fail": True}])
        assert infos["_restarted"].tolist() == [False, True]
        assert venv.restart_counts.tolist() == [0, 1]


class _AsyncFailingResetEnv(AsyncCounterEnv):
    """An async env whose reset with ``options={"fail": True}`` raises (``fault="raise"``)
    or hangs (``"hang"``), once per ``ledger``."""

    def __init__(self, env_index: int = 0, ledger: str = "", fault: str = "raise") -> None:
        super().__init__(env_index)
        self.ledger, self.fault = ledger, fault

    async def reset(self, *, seed=None, options=None):
        if options and options.get("fail") and not os.path.exists(self.ledger):
            Path(self.ledger).touch()
            if self.fault == "hang":
                await asyncio.sleep(3600)
            raise ConnectionError("the simulator's server went away")
        return await super().reset(seed=seed, options=options)


def test_an_async_env_failing_its_reset_is_rebuilt(tmp_path):
    ledger = str(tmp_path / "failed")
    env_fns = [partial(_AsyncFailingResetEnv, i, ledger) for i in range(2)]
    with aiovec.VecEnv(env_fns, backend="coroutine", on_failure="restart") as venv:
        observations, infos = venv.reset(seed=1, options=[{"fail": True}, None])
        assert observations.tolist() == [[0, 0], [1, 0]]
        assert infos["_restarted"].tolist() == [True, False]
        assert "server went away" in infos["restart_reason"][0]
        assert venv.restart_counts.tolist() == [1, 0]


@pytest.mark.parametrize("dies", ["once", "always", "hang"])
@pytest.mark.parametrize("method", ["call", "get_attr"])
def test_a_call_that_kills_its_worker_is_not_run_again(tmp_path, dies, method):
    """Under the restart policy a worker that dies in a ``call`` (or ``get_attr``) is
    replaced, but the call fails with the crash: it is never run again on the rebuilt
    env (its side effects twice, silently; one that always crashes used up the restart
    budget and left the env failed for every later step)."""
    ledger = tmp_path / "runs"
    healthy = partial(CheckpointEnv, 0, str(tmp_path / "healthy"), "never")
    env_fns = [healthy, partial(CheckpointEnv, 1, str(ledger), dies)]
    timeout = {"step_timeout": 0.5} if dies == "hang" else {}
    with aiovec.VecEnv(env_fns, num_workers=2, on_failure="restart", **timeout) as venv:
        venv.reset(seed=0)
        with pytest.raises(aiovec.WorkerCrashedError, match=r"SIGSEGV|step_timeout=0.5"):
            if method == "call":
                venv.call("save_checkpoint", env_ids=[1])
            else:  # a property read that crashes
                venv.get_attr("checkpoint")
        assert len(ledger.read_text()) == 1
        *_, truncations, infos = venv.step([0, 0])  # the rebuilt env reports its restart
        assert truncations.tolist() == [False, True] and infos["_restarted"][1]
        venv.step([0, 0])
        assert venv.worker_restarts == (0, 1)


def test_an_env_whose_rebuilt_copy_fails_its_reset_is_not_stepped(tmp_path):
    """A step fails, the rebuilt env's reset fails past max_restarts: the step raises
    the reset's error, and each later step tries that reset again (reporting the
    restart once it works) rather than step an env that was never reset."""
    ledger = str(tmp_path / "builds")
    env_fns = [
        partial(CounterEnv, 0),
        partial(FlakyResetAfterRebuildEnv, 1, ledger, failing_resets=5),
    ]
    with aiovec.VecEnv(env_fns, backend="inline", on_failure="restart", max_restarts=1) as venv:
        venv.reset(seed=0)
        venv.step([0, 0])
        with pytest.raises(ConnectionError, match="still starting"):
            venv.step([0, 0])
        for _ in range(2):  # each step tries the reset again, and reports its failure
            with pytest.raises(ConnectionError, match="still starting") as caught:
                venv.step([0, 0])
            assert caught.value.operation == "step"
            assert "stepped before any reset" not in caught.value.worker_traceback


async def test_a_call_queued_behind_a_crash_runs_on_the_replacement(tmp_path):
    """A call that had not started when its worker died (queued behind another env's
    step, in a worker stepping its envs in turn) is sent to the replacement, as steps
    are: it never ran, so nothing runs twice; only a call the worker was running when it
    died fails with the crash."""
    ledger = tmp_path / "runs"
    env_fns = [
        partial(FaultyEnv, 0, fault="exit", at_step=1),
        partial(CheckpointEnv, 1, str(ledger), "never"),
    ]
    async with aiovec.VecEnv(
        env_fns, num_workers=1, on_failure="restart", concurrent_envs=False
    ) as venv:
        await venv.areset(seed=0)
        venv.send([0], env_ids=[0])  # the worker dies in this step
        saved = await venv.acall("save_checkpoint", env_ids=[1])  # queued behind it
        assert saved == ("saved",) and len(ledger.read_text()) == 1
        batch = await venv.recv()
        assert batch.env_ids.tolist() == [0] and batch.infos["restarted"][0]
        assert venv.worker_restarts == (1,)


@pytest.mark.parametrize("method", ["call", "set_attr"])
@pytest.mark.parametrize("concurrent", [False, True], ids=["in-turn", "threads"])
async def test_a_call_queued_behind_its_own_envs_crashing_step_runs_on_the_replacement(
    tmp_path, method, concurrent
):
    """A call to an env whose step is still in flight waits behind that step in the
    worker; when the step kills the worker, the call never started (the env was running
    its step), so it goes to the replacement, as a call queued behind another env's step
    does (it used to fail with the crash, under the restart policy)."""
    ledger = tmp_path / "runs"
    env_fns = [
        partial(CounterEnv, 0),
        partial(SlowlyDyingEnv, 1, str(ledger), str(tmp_path / "died"), 0.5),
    ]
    async with aiovec.VecEnv(
        env_fns, num_workers=2, on_failure="restart", concurrent_envs=concurrent
    ) as venv:
        await venv.areset(seed=0)
        venv.send([0, 0])  # env 1's worker dies in this step, after 0.5 s
        await asyncio.sleep(0.1)
        if method == "call":
            assert await venv.acall("save_checkpoint", env_ids=[1]) == ("saved",)
            assert len(ledger.read_text()) == 1  # ran once, on the replacement
        else:
            await venv.aset_attr("level", 3, env_ids=[1])
            assert await venv.acall("level", env_ids=[1]) == (3,)
        results = {}
        while len(results) < 2:
            batch = await venv.recv()
            results.update(zip(batch.env_ids.tolist(), batch.truncations.tolist()))
        assert results == {0: False, 1: True}  # env 1's step answered as its restart
        assert venv.worker_restarts == (0, 1)


@pytest.mark.parametrize("backend", ["coroutine", "process"])
def test_an_async_env_whose_reset_hangs_is_rebuilt_within_step_timeout(tmp_path, backend):
    """The hung reset is cancelled at ``step_timeout`` and, under the restart policy,
    the env rebuilt and reset again, as for a reset that raises (it used to fail the
    reset, and the next step stepped the env that never finished its reset)."""
    ledger = str(tmp_path / "hung")
    env_fns = [partial(_AsyncFailingResetEnv, i, ledger, "hang") for i in range(2)]
    with aiovec.VecEnv(env_fns, backend=backend, on_failure="restart", step_timeout=0.5) as venv:
        venv.reset(seed=0)
        venv.step([0, 0])
        observations, infos = venv.reset(options=[None, {"fail": True}])
        assert observations.tolist() == [[0, 0], [1, 0]]
        assert infos["_restarted"].tolist() == [False, True]
        assert "StepTimeoutError" in infos["restart_reason"][1]
        assert venv.restart_counts.tolist() == [0, 1]
        observations, *_ = venv.step([0, 0])
        assert observations.tolist() == [[0, 1], [1, 1]]


def test_a_restart_in_a_reset_that_raises_for_another_env_is_counted(tmp_path):
    """Env 0 is rebuilt in a reset that then raises env 1's error (past max_restarts):
    env 0's restart still counts, as in a lockstep step that raises."""
    env_fns = [
        partial(FailingResetEnv, 0, str(tmp_path / "zero"), failures=1),
        partial(FailingResetEnv, 1, str(tmp_path / "one"), failures=5),
    ]
    with aiovec.VecEnv(env_fns, backend="inline", on_failure="restart", max_restarts=1) as venv:
        venv.reset(seed=0)
        with pytest.raises(ConnectionError, match="simulator 1"):
            venv.reset(options={"fail": True})
        assert venv.restart_counts.tolist() == [1, 0]
        assert venv.stats().env_restarts == 1


def test_disabled_autoreset_a_reset_that_raised_leaves_its_env_needing_one(tmp_path, backend):
    """DISABLED mode refuses to step an env whose episode ended before it is reset; a
    reset that raised for an env has not reset it: stepping it is refused too (it was
    allowed: the env's reset was marked done when sent)."""
    env_fns = [partial(CounterEnv, 0), partial(FailingResetEnv, 1, str(tmp_path / "l"))]
    with aiovec.VecEnv(env_fns, backend=backend, autoreset_mode="Disabled") as venv:
        venv.reset(seed=0)
        with pytest.raises(ConnectionError):
            venv.reset(options=[None, {"fail": True}])
        with pytest.raises(aiovec.NeedsResetError, match=r"\[1\]"):
            venv.step([0, 0])
        venv.reset(options=[None, {"fail": True}])  # fails no more
        venv.step([0, 0])


def test_a_rebuild_keeps_the_class_state_of_a_class_sent_by_value():
    """An env class sent by value (a script's, a notebook's: here a local class) keeps
    its class attributes across a restart: a rebuild must not unpickle the class again
    (cloudpickle would reset the one class every env of the worker uses)."""

    class Counted(CounterEnv):
        built = 0

        def __init__(self) -> None:
            super().__init__(0)
            type(self).built += 1
            self.fail_now = False

        def step(self, action):
            if self.fail_now:
                raise RuntimeError("simulator diverged")
            return super().step(action)

    with aiovec.VecEnv([Counted] * 4, num_workers=1, on_failure="restart") as venv:
        venv.reset(seed=0)
        assert venv.get_attr("built") == (4, 4, 4, 4)
        venv.apply(lambda env: setattr(env, "fail_now", True), env_ids=[0])
        *_, infos = venv.step([0] * 4)
        assert infos["_restarted"].tolist() == [True, False, False, False]
        assert venv.get_attr("built") == (5, 5, 5, 5)


@pytest.mark.parametrize("between", ["get_attr", "call", "set_attr", "nothing"])
def test_a_worker_crash_loop_stops_at_max_restarts_whatever_calls_come_between(between):
    """An env whose every step kills its worker is given up on after ``max_restarts``
    replacements in a row, as documented ("without a successful step"): calls,
    get_attr and set_attr answered between the steps are no successful step (their
    replies used to clear the count, and the loop never stopped)."""
    env_fns = [partial(CrashLoopEnv, 0, "never"), partial(CrashLoopEnv, 1, "step")]
    with aiovec.VecEnv(env_fns, num_workers=2, on_failure="restart", max_restarts=2) as venv:
        venv.reset(seed=0)
        steps = 0
        with pytest.raises(aiovec.WorkerCrashedError, match="killed by SIGKILL"):
            for steps in range(1, 20):  # noqa: B007 (read after the loop)
                venv.step([0, 0])
                if between == "get_attr":
                    venv.get_attr("level")
                elif between == "call":
                    venv.call("current_level")
                elif between == "set_attr":
                    venv.set_attr("level", 2)
        # Steps 1 and 3 crash and answer as restarts (truncated); steps 2 and 4 are the
        # resets NEXT_STEP autoreset owes; step 5's crash is the third in a row.
        assert steps == 5
        assert venv.worker_restarts == (0, 2)


def test_a_reset_crash_loop_stops_at_max_restarts():
    """Each replacement of the worker resets its env fine (the reset replayed on it),
    and the env's next reset kills the worker again: resets are no successful step, so
    the third crash in a row is raised (a reset's reply used to clear the count)."""
    env_fns = [partial(CounterEnv, 0), partial(CrashLoopEnv, 1, "reset")]
    with aiovec.VecEnv(env_fns, num_workers=2, on_failure="restart", max_restarts=2) as venv:
        venv.reset(seed=0)
        resets = 0
        with pytest.raises(aiovec.WorkerCrashedError, match="killed by SIGKILL"):
            for resets in range(1, 20):  # noqa: B007 (read after the loop)
                venv.reset(seed=resets)
        assert resets == 3
        assert venv.worker_restarts == (0, 2)


@pytest.mark.parametrize("next_call", ["step", "reset", "call"])
def test_a_worker_given_up_on_is_tried_again_by_the_next_command(tmp_path, next_call):
    """Past ``max_restarts`` the crash is raised, as documented, but the worker is not
    dead for good (it used to be: every later call raised the old crash, so the vector
    env had to be rebuilt): as an env given up on is tried again by its next step, the
    next command to its envs starts a new worker, once; should that die as well, its
    crash is raised at once."""
    ledger = tmp_path / "resets"
    env_fns = [partial(CounterEnv, 0), partial(ResetKillsEnv, 1, str(ledger), 3)]
    with aiovec.VecEnv(env_fns, num_workers=2, on_failure="restart", max_restarts=2) as venv:
        with pytest.raises(aiovec.WorkerCrashedError, match="killed by SIGKILL"):
            venv.reset(seed=42)  # the first try and two replacements die
        assert venv.worker_restarts == (0, 2)
        if next_call == "step":
            _, _, _, truncations, infos = venv.step([0, 0])
            assert truncations.tolist() == [False, True] and infos["restarted"][1]
        elif next_call == "reset":
            _, infos = venv.reset(seed=7)
            assert infos["seed"][1] == 8 and infos["restarted"][1]
        else:
            assert venv.get_attr("env_index") == (0, 1)  # built anew, not reset yet
            assert len(ledger.read_text()) == 3
            _, _, _, truncations, _ = venv.step([0, 0])
            assert truncations.tolist() == [False, True]
        assert len(ledger.read_text()) == 4  # the fourth reset, on the new worker
        assert venv.worker_restarts == (0, 3)
        venv.step([0, 0])


def test_a_worker_tried_again_that_dies_again_raises_at_once(tmp_path):
    ledger = tmp_path / "resets"
    env_fns = [partial(CounterEnv, 0), partial(ResetKillsEnv, 1, str(ledger), 10)]
    with aiovec.VecEnv(env_fns, num_workers=2, on_failure="restart", max_restarts=1) as venv:
        with pytest.raises(aiovec.WorkerCrashedError):
            venv.reset(seed=0)  # two deaths: the first try and one replacement
        with pytest.raises(aiovec.WorkerCrashedError):
            venv.reset(seed=0)  # one more worker, which dies: raised at once
        assert len(ledger.read_text()) == 3
        assert venv.worker_restarts == (0, 2)


@pytest.mark.parametrize("fault", ["raise", "exit"])
def test_same_step_a_restart_gives_the_ended_episodes_final_obs(fault):
    """SAME_STEP: every env whose episode ends in a step has ``final_obs`` (and
    ``final_info``), which code bootstrapping truncations reads (``infos["final_obs"]
    [i]`` for each truncated ``i``); a restart ends the episode (truncated) and used to
    give neither (KeyError). Its final observation is the last one the env returned."""
    from gymnasium.vector import AutoresetMode

    env_fns = [partial(CounterEnv, 0), partial(FaultyEnv, 1, fault=fault, at_step=2)]
    with aiovec.VecEnv(
        env_fns,
        num_workers=2,
        on_failure="restart",
        autoreset_mode=AutoresetMode.SAME_STEP,
    ) as venv:
        venv.reset(seed=0)
        observations, *_ = venv.step([0, 0])
        assert observations[1].tolist() == [1, 1]
        observations, _, _, truncations, infos = venv.step([0, 0])  # env 1 fails
        assert truncations.tolist() == [False, True] and infos["restarted"][1]
        assert infos["_final_obs"].tolist() == [False, True]
        assert infos["final_obs"][1].tolist() == [1, 1]  # where the episode was left
        assert infos["_final_info"].tolist() == [False, True]
        assert infos["final_info"]["restarted"][1]  # why the episode ended
        assert observations[1].tolist() == [1, 0]  # the rebuilt env's reset


@pytest.mark.parametrize("backend", ["inline", "process"])
def test_same_step_a_restart_after_a_failed_autoreset_keeps_the_terminal_step(backend):
    """The episode really ended (``env.step`` returned reward and ``terminated``) and
    then the autoreset's ``reset()`` raised: the restart that follows must not replace
    that transition (it did: reward 0, truncated, the previous step's observation as
    ``final_obs``): the step's own reward, flags, observation and info stay, with the
    restart said in the infos, and the rebuilt env's reset observation is returned."""
    from gymnasium.vector import AutoresetMode

    from tests.faulty import FlakyAutoresetEnv

    env_fns = [partial(FlakyAutoresetEnv, 0), partial(FlakyAutoresetEnv, 1, failing_reset=2)]
    with aiovec.VecEnv(
        env_fns, backend=backend, on_failure="restart", autoreset_mode=AutoresetMode.SAME_STEP
    ) as venv:
        venv.reset(seed=0)
        observations, rewards, terminations, truncations, infos = venv.step([1, 1])
        assert rewards.tolist() == [1.0, 1.0] and terminations.tolist() == [True, True]
        assert not truncations.any() and infos["restarted"][1] and infos["_final_obs"].all()
        assert infos["final_obs"][1].tolist() == [1, 1]  # what the ending step returned
        assert infos["final_info"]["action"].tolist() == [1, 1]  # its info
        assert infos["final_info"]["restarted"][1]
        assert observations[1].tolist() == [1, 100]  # the rebuilt env's first reset


async def test_a_crash_loop_stops_at_max_restarts_beside_a_healthy_env_of_its_worker():
    """First-ready, envs in threads: env 1 kills the worker in every step while env 0,
    in the same worker, steps fine. Env 0's results are no progress of env 1's: the
    worker used to be replaced forever (each of env 0's results cleared the count)."""
    from tests.faulty import SlowKillEnv

    env_fns = [partial(SlowKillEnv, 0), partial(SlowKillEnv, 1)]
    async with aiovec.VecEnv(
        env_fns, num_workers=1, concurrent_envs=True, on_failure="restart", max_restarts=2
    ) as venv:
        await venv.areset(seed=0)
        venv.send([0, 0])
        deadline = time.monotonic() + BOUND
        with pytest.raises(aiovec.WorkerCrashedError, match="while env 1 was running"):
            while time.monotonic() < deadline:
                batch = await venv.recv()
                venv.send(np.zeros(len(batch.env_ids), np.int64), batch.env_ids)
        assert venv.worker_restarts == (2,)
