"""Fault injection: envs that raise, crash, hang or misbehave, under both failure policies."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
import traceback
from functools import partial

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

import aiovec
from tests.async_envs import AsyncCounterEnv
from tests.batched import point_masses
from tests.conftest import pid_alive, worker_pids, worker_processes
from tests.envs import CounterEnv
from tests.faulty import (
    Abort,
    BadObservationEnv,
    FailingConstructorEnv,
    FaultyEnv,
    GeneratorExitAsyncEnv,
    UnsendableInfoEnv,
    WatchdogEnv,
)
from tests.helpers import random_traffic, start_agent, workers

BOUND = 30  # seconds: any wait longer than this is a hang

CRASHES = {
    "exit": r"exit code 7",
    "sigkill": r"killed by SIGKILL",
    "sigsegv": r"killed by SIGSEGV",
}


def three_envs(fault: str, **fault_options) -> list:
    """Env 1 is faulty; envs 0 and 2 are healthy."""
    return [
        partial(CounterEnv, 0),
        partial(FaultyEnv, 1, fault, **fault_options),
        partial(CounterEnv, 2),
    ]


def assert_healthy_envs_still_work(venv, env_ids=(0, 2)):
    venv.send(np.zeros(len(env_ids), dtype=np.int64), env_ids=list(env_ids))
    batch = aiovec.run(venv.recv(min_envs=len(env_ids)))
    assert sorted(batch.env_ids.tolist()) == sorted(env_ids)
    assert set(batch.observations[:, 0].tolist()) == set(env_ids)


@pytest.mark.parametrize("fault", list(CRASHES))
def test_crash_is_reported_with_exit_status_and_envs(fault, no_leaks):
    venv = aiovec.VecEnv(three_envs(fault), num_workers=3)
    pids = worker_pids(venv)
    venv.reset()
    venv.step([0, 0, 0])
    with pytest.raises(aiovec.WorkerCrashedError, match=CRASHES[fault]) as caught:
        venv.step([0, 0, 0])
    assert caught.value.worker_index == 1 and caught.value.env_ids == [1]
    assert "worker 1 hosting envs [1]" in str(caught.value)
    assert_healthy_envs_still_work(venv)
    with pytest.raises(aiovec.WorkerCrashedError):  # a dead env stays dead under "raise"
        venv.send([0], env_ids=[1])
    venv.close()
    assert not any(pid_alive(pid) for pid in pids)


def test_raising_env_is_reported_with_traceback(backend):
    with aiovec.VecEnv(three_envs("raise"), backend=backend) as venv:
        venv.reset()
        venv.step([0, 0, 0])
        with pytest.raises(aiovec.EnvError) as caught:
            venv.step([0, 0, 0])
        error = caught.value
        assert (error.env_index, error.operation, error.exc_type) == (1, "step", "RuntimeError")
        assert error.exc_message == "simulator diverged at step 2"
        assert "in _fail" in error.worker_traceback
        assert_healthy_envs_still_work(venv)


# A worker ignores SIGINT (Ctrl-C belongs to the agent), so there a KeyboardInterrupt,
# a SystemExit or any other BaseException can only come from the env's own code: it is
# that env's error, as AsyncVectorEnv's worker reports a KeyboardInterrupt, and the
# worker's other envs live on.
ENV_EXITS = {
    "interrupt": ("KeyboardInterrupt", "interrupted"),
    "sys.exit": ("SystemExit", "gave up"),
    "abort": ("Abort", "aborted"),
}


@pytest.mark.parametrize("fault", list(ENV_EXITS))
@pytest.mark.parametrize("concurrent_envs", [False, True], ids=["in-turn", "threads"])
def test_keyboardinterrupt_or_systemexit_raised_by_an_env_is_that_envs_error(
    fault, concurrent_envs, no_leaks
):
    exc_type, text = ENV_EXITS[fault]
    with aiovec.VecEnv(three_envs(fault), num_workers=1, concurrent_envs=concurrent_envs) as venv:
        pids = worker_pids(venv)
        venv.reset()
        venv.step([0, 0, 0])
        with pytest.raises(aiovec.EnvError) as caught:
            venv.step([0, 0, 0])
        error = caught.value
        # Neither a KeyboardInterrupt nor a SystemExit itself: asyncio would take it for
        # Ctrl-C or an exit wherever it crossed a task, and stop the caller's loop.
        assert not isinstance(error, (KeyboardInterrupt, SystemExit))
        assert (error.env_index, error.operation, error.exc_type) == (1, "step", exc_type)
        assert error.exc_message == f"{text} at step 2"
        assert "in _fail" in error.worker_traceback
        assert_healthy_envs_still_work(venv)
        assert worker_pids(venv) == pids  # the worker lived on


@pytest.mark.parametrize("in_subtask", [False, True], ids=["in-step", "in-a-task-of-its-own"])
def test_an_async_env_or_a_batched_env_raising_keyboardinterrupt_in_a_worker_is_its_error(
    in_subtask,
):
    async_fns = [
        partial(AsyncCounterEnv, 0),
        partial(AsyncCounterEnv, 1, interrupt_at=1, in_subtask=in_subtask),
    ]
    with aiovec.VecEnv(async_fns, backend="process", num_workers=1) as venv:
        venv.reset()
        with pytest.raises(aiovec.EnvError) as caught:
            venv.step([0, 0])
        assert caught.value.env_index == 1 and "simulator 1 interrupted" in str(caught.value)
        assert venv.step([0, 0])[0][0].tolist() == [0, 2]  # env 0 goes on
    for exit_class in (SystemExit, Abort):  # Abort: a BaseException of a library's own
        with aiovec.make(
            point_masses,
            4,
            envs_per_block=2,
            backend="process",
            num_workers=1,
            env_kwargs=[{}, {"fail_at": 1, "fail_with": exit_class}],
        ) as venv:
            venv.reset(seed=0)
            with pytest.raises(aiovec.EnvError, match=r"batched env of envs 2..3") as caught:
                venv.step(np.zeros((4, 1), np.float32))
            assert caught.value.exc_type == exit_class.__name__
            assert not isinstance(caught.value, exit_class)


def test_an_envs_keyboardinterrupt_leaves_the_callers_event_loop_running():
    """Met in a task (``gather``), the env's error is that task's result, not a Ctrl-C
    that stops the loop and cancels the others."""
    with aiovec.VecEnv(three_envs("interrupt"), num_workers=1) as venv:

        async def heartbeat() -> str:
            await asyncio.sleep(0.05)
            return "alive"

        async def main():
            await venv.areset()
            await venv.astep([0, 0, 0])
            step = venv.astep([0, 0, 0])
            return await asyncio.gather(step, heartbeat(), return_exceptions=True)

        error, beat = aiovec.run(main())
        assert isinstance(error, aiovec.EnvError) and error.exc_type == "KeyboardInterrupt"
        assert beat == "alive"


@pytest.mark.parametrize("fault", list(ENV_EXITS))
def test_an_env_that_raises_systemexit_is_rebuilt_under_the_restart_policy(fault):
    with aiovec.VecEnv(three_envs(fault), num_workers=1, on_failure="restart") as venv:
        venv.reset()
        venv.step([0, 0, 0])
        observations, _, _, truncations, infos = venv.step([0, 0, 0])
        assert observations[1].tolist() == [1, 0] and truncations.tolist() == [False, True, False]
        assert ENV_EXITS[fault][0] in infos["restart_reason"][1]
        assert venv.worker_restarts == (0,)


def test_hanging_env_times_out_and_names_the_late_env(no_leaks):
    venv = aiovec.VecEnv(three_envs("hang", at_step=1), num_workers=3, step_timeout=0.5)
    pids = worker_pids(venv)
    venv.reset()
    started = time.monotonic()
    with pytest.raises(aiovec.StepTimeoutError, match=r"envs \[1\] did not answer") as caught:
        venv.step([0, 0, 0])
    assert 0.4 < time.monotonic() - started < 5.0
    assert caught.value.timed_out == [1] and caught.value.timeout == 0.5
    assert isinstance(caught.value, aiovec.WorkerCrashedError)
    assert not pid_alive(pids[1])
    assert_healthy_envs_still_work(venv)
    venv.close()


def test_step_timeout_needs_the_process_backend():
    with pytest.raises(ValueError, match="step_timeout needs backend='process'"):
        aiovec.VecEnv([CounterEnv], backend="inline", step_timeout=1.0)


@pytest.mark.parametrize("fault", ["raise", *CRASHES, "hang"])
def test_restart_policy_rebuilds_the_env_and_training_goes_on(fault, no_leaks):
    venv = aiovec.VecEnv(
        three_envs(fault),
        num_workers=3,
        on_failure="restart",
        step_timeout=1.0 if fault == "hang" else None,
    )
    venv.reset()
    first = venv.step([0, 0, 0])
    observations, rewards, terminations, truncations, infos = venv.step([0, 0, 0])
    # env 1 came back rebuilt: fresh reset observation, truncated, flagged
    assert observations[1].tolist() == [1, 0]
    assert truncations.tolist() == [False, True, False]
    assert rewards.tolist() == [2.0, 0.0, 2.0]
    assert infos["restarted"].tolist() == [False, True, False]
    assert infos["_restarted"].tolist() == [False, True, False]
    reason = infos["restart_reason"][1]
    assert {"raise": "RuntimeError: simulator diverged", "hang": "did not answer"}.get(
        fault, "worker 1"
    ) in reason
    # "<error class>: <message>", whoever restarted the env (its worker or the agent)
    expected_class = {"raise": "RuntimeError", "hang": "StepTimeoutError"}
    assert reason.startswith(expected_class.get(fault, "WorkerCrashedError") + ": "), reason
    assert venv.restart_counts.tolist() == [0, 1, 0]
    # an env that raised is rebuilt inside its worker; a dead or hung worker is replaced
    assert venv.worker_restarts == ((0, 0, 0) if fault == "raise" else (0, 1, 0))
    # and it keeps going (the healthy envs never noticed)
    _, rewards, *_ = venv.step([0, 0, 0])
    assert rewards[0] == 3.0 and rewards[2] == 3.0 and first[1][0] == 1.0
    venv.close()


@pytest.mark.parametrize("fault", ["raise", "exit"])
def test_restart_limit_stops_crash_loops(fault):
    env_fns = [partial(CounterEnv, 0), partial(FaultyEnv, 1, fault, rate=1.0)]
    with aiovec.VecEnv(env_fns, num_workers=2, on_failure="restart", max_restarts=2) as venv:
        venv.reset()
        restarts = 0
        expected = aiovec.EnvError if fault == "raise" else aiovec.WorkerCrashedError
        with pytest.raises(expected):
            for _ in range(20):
                _, _, _, truncations, _ = venv.step([0, 0])
                restarts += int(truncations[1])
        assert restarts == 2
        assert venv.restart_counts[1] == 2


def test_env_restart_in_first_ready_mode(backend):
    env_fns = [partial(FaultyEnv, 0, "raise", at_step=1), partial(CounterEnv, 1)]
    with aiovec.VecEnv(env_fns, backend=backend, on_failure="restart") as venv:
        venv.reset()

        async def one_round():
            venv.send([0, 0])
            return await venv.recv(min_envs=2)

        batch = aiovec.run(one_round())
        by_env = dict(zip(batch.env_ids.tolist(), range(2)))
        assert batch.truncations[by_env[0]] and not batch.truncations[by_env[1]]
        assert batch.infos["restarted"][by_env[0]]


@pytest.mark.parametrize("concurrent_envs", [False, True], ids=["in-turn", "threads"])
async def test_an_env_raising_in_first_ready_one_env_at_a_time_is_raised_by_its_recv(
    backend, concurrent_envs
):
    """Sent to one env at a time, an env's error is raised by the recv that takes its
    result, once, with its traceback; the other env's results and its info still arrive."""
    options = {"concurrent_envs": concurrent_envs} if backend == "process" else {}
    env_fns = [partial(FaultyEnv, 0, "raise", at_step=2), partial(CounterEnv, 1)]
    async with aiovec.VecEnv(env_fns, backend=backend, **options) as venv:
        await venv.areset()
        results = {0: [], 1: []}
        for _ in range(3):
            for env_id in (0, 1):
                venv.send(np.array([1]), [env_id])
                try:
                    batch = await venv.recv()
                except aiovec.EnvError as error:
                    assert (error.env_index, error.exc_type) == (0, "RuntimeError")
                    assert "in _fail" in error.worker_traceback
                    results[env_id].append("error")
                else:
                    assert batch.env_ids.tolist() == [env_id]
                    results[env_id].append(batch.infos["action"].tolist())
    assert results == {0: [[1], "error", [1]], 1: [[1], [1], [1]]}


def test_a_crash_raised_again_and_again_keeps_a_traceback_of_its_last_raise():
    """A dead worker's crash is raised by every later call on its envs: each raise gets a
    fresh traceback, not the previous ones' frames too (they would pile up, holding
    whatever those frames held)."""
    env_fns = [partial(FaultyEnv, 0, "sigkill", at_step=1), partial(CounterEnv, 1)]
    with aiovec.VecEnv(env_fns, backend="process", num_workers=2) as venv:
        venv.reset(seed=0)
        lengths = []
        for _ in range(20):
            with pytest.raises(aiovec.WorkerCrashedError) as caught:
                venv.step(np.zeros(2, dtype=np.int64))
            lengths.append(len(list(traceback.walk_tb(caught.value.__traceback__))))
    assert max(lengths[1:]) == min(lengths[1:]) < 40


def test_bad_observation_is_an_error_not_a_corruption(backend):
    env_fns = [partial(CounterEnv, 0), partial(BadObservationEnv, 1, at_step=1)]
    with aiovec.VecEnv(env_fns, backend=backend) as venv:
        before, _ = venv.reset()
        with pytest.raises(aiovec.EnvError, match=r"observation_space.*shape \(2,\).*\(7,\)"):
            venv.step([0, 0])
        assert_healthy_envs_still_work(venv, env_ids=(0,))


def test_failing_constructor_names_the_env_and_leaves_no_process(backend, no_leaks):
    before = worker_processes()
    env_fns = [partial(CounterEnv, 0), partial(FailingConstructorEnv, 1)]
    with pytest.raises(aiovec.EnvError, match="env 1 raised OSError in make") as caught:
        aiovec.VecEnv(env_fns, backend=backend, num_workers=2) if backend == "process" else (
            aiovec.VecEnv(env_fns, backend=backend)
        )
    assert "cannot connect to simulator 1" in caught.value.worker_traceback
    deadline = time.monotonic() + 5
    while worker_processes() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert worker_processes() - before == set()


def test_ctrl_c_during_a_step_closes_the_workers(tmp_path):
    agent, pids = start_agent(
        tmp_path,
        """
            import sys
            from functools import partial
            import aiovec
            from tests.envs import CounterEnv

            if __name__ == "__main__":
                venv = aiovec.VecEnv([partial(CounterEnv, i, delay=30) for i in range(2)])
                venv.reset()
                print(" ".join(str(p.pid) for p in venv._backend._processes), flush=True)
                try:
                    venv.step([0, 0])
                except KeyboardInterrupt:
                    print("interrupted closed=%s" % venv.closed, flush=True)
                try:  # a notebook user's next cell: told why, not just "closed"
                    venv.step([0, 0])
                except aiovec.ClosedError as exc:
                    print(exc, flush=True)
        """,
    )
    try:
        time.sleep(0.3)  # inside step() now
        agent.send_signal(signal.SIGINT)
        assert agent.stdout.readline().strip() == "interrupted closed=True"
        assert agent.stdout.readline().strip() == (
            "cannot step: the vector env was closed by a Ctrl-C (KeyboardInterrupt) during "
            "step(), which stops its workers at once; create a new one with aiovec.make()"
        )
        assert agent.wait(10) == 0
        assert not any(pid_alive(pid) for pid in pids)
    finally:
        agent.kill()
        agent.wait()


@pytest.mark.parametrize("when", ["in close", "second in the step's cleanup"])
def test_ctrl_c_while_closing_still_kills_every_worker(tmp_path, when):
    """Ctrl-C while close() waits for a hung env that ignores SIGTERM (or a second
    Ctrl-C while the first one's cleanup waits): the workers are killed and reaped before
    the KeyboardInterrupt leaves, not left running for as long as the agent lives."""
    agent, pids = start_agent(
        tmp_path,
        f"""
            import sys, time
            from functools import partial
            import aiovec
            from tests.faulty import FaultyEnv

            if __name__ == "__main__":
                env_fns = [partial(FaultyEnv, i, "stubborn", at_step=1) for i in range(2)]
                venv = aiovec.VecEnv(env_fns, num_workers=2, close_timeout=60)
                venv.reset()
                print(" ".join(str(p.pid) for p in venv._backend._processes), flush=True)
                try:
                    if {when!r} == "in close":
                        venv.step_async([0, 0])
                        try:
                            venv.step_wait(timeout=0.2)
                        except TimeoutError:
                            pass
                        print("closing", flush=True)
                        venv.close()
                    else:  # the first Ctrl-C's cleanup gives the workers a grace
                        print("stepping", flush=True)
                        venv.step([0, 0])
                except KeyboardInterrupt:
                    print("interrupted closed=%s" % venv.closed, flush=True)
                time.sleep(30)  # alive: its workers must be gone while it lives
        """,
    )
    try:
        agent.stdout.readline()  # closing / stepping
        time.sleep(0.5)
        agent.send_signal(signal.SIGINT)
        if when != "in close":
            time.sleep(0.3)  # inside the first Ctrl-C's cleanup (SIGTERM ignored)
            agent.send_signal(signal.SIGINT)
        assert agent.stdout.readline().strip() == "interrupted closed=True"
        deadline = time.monotonic() + 5
        while any(pid_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(pid_alive(pid) for pid in pids)
        assert agent.poll() is None  # the agent lives on: nothing waited for its exit
    finally:
        agent.kill()
        agent.wait()


@pytest.mark.parametrize("fault", ["hang", "exit"])
def test_a_killed_or_crashed_worker_takes_its_envs_processes_along(tmp_path, fault):
    """A simulator process that an env started dies with its worker when the worker is
    killed (step_timeout) or crashes, since the env's close() never runs there: it is
    not left behind for as long as the agent lives."""
    from tests.faulty import SimulatorEnv

    pid_file = tmp_path / "simulator.pid"
    env_fns = [partial(SimulatorEnv, 0, str(pid_file), fault)]
    with aiovec.VecEnv(env_fns, backend="process", step_timeout=0.5) as venv:
        venv.reset()
        simulator = int(pid_file.read_text())
        assert pid_alive(simulator)
        with pytest.raises(aiovec.WorkerCrashedError):
            venv.step([0])
        deadline = time.monotonic() + 10
        while pid_alive(simulator) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not pid_alive(simulator)


async def test_soak_random_crashes_under_restart_policy(no_leaks):
    """Thousands of first-ready rounds while envs raise and die at random: every action
    gets exactly one result, the process count stays constant, nothing leaks."""
    from aiovec.bench.system import descendant_pids

    num_envs = 6
    env_fns = [
        partial(FaultyEnv, i, "exit" if i % 2 else "raise", rate=0.004) for i in range(num_envs)
    ]
    async with aiovec.VecEnv(env_fns, num_workers=3, on_failure="restart", max_restarts=10) as venv:
        await venv.areset()
        processes = len(descendant_pids())

        def check(batch, row, env_id, count):
            assert batch.observations[row][0] == env_id

        sent, received = await random_traffic(venv, 3000, seed=0, check=check, seconds=20)
        assert received == sent
        assert venv.restart_counts.sum() > 0
        assert len(descendant_pids()) == processes


class _SurrogateMessageEnv(CounterEnv):
    def step(self, action):
        path = os.fsdecode(b"/data/\xff.cfg")  # an undecodable name: a lone surrogate
        raise RuntimeError(f"cannot load {path}")


def test_an_error_message_with_a_lone_surrogate_keeps_its_class_and_text(backend):
    # It used to fail its reply's encoding and arrive as "could not be sent back".
    with aiovec.VecEnv([_SurrogateMessageEnv] * 2, backend=backend) as venv:
        venv.reset(seed=0)
        with pytest.raises(RuntimeError, match=r"cannot load /data/") as caught:
            venv.step(np.zeros(2, dtype=np.int64))
    assert caught.value.env_index == 0
    assert "\\udcff.cfg" in str(caught.value)


class _ObservationAsGiven(gym.Env):
    """Returns ``value`` (set by the test) as its observation from every step."""

    def __init__(self, space):
        self.observation_space, self.action_space = space, spaces.Discrete(2)
        self.value = space.sample()

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.value, 0.0, False, False, {}


U8 = spaces.Box(0, 255, (2,), np.uint8)


@pytest.mark.parametrize(
    ("space", "value", "expected"),
    [
        (spaces.Box(0, 1, (1,), np.float32), 0.5, [0.5]),  # a scalar for one element
        (spaces.Box(0, 9, (2,), np.float32), np.array([[1.0, 2.0]]), [1.0, 2.0]),
        (spaces.Discrete(3), 2.0, 2),  # a whole float
        (spaces.Box(0, 9, (2,), np.int64), np.array([3.0, 4.0]), [3, 4]),
        (U8, np.array([3.0, 250.0], np.float32), [3, 250]),
        (U8, [300 - 45, 0], [255, 0]),  # Python ints within range
        (spaces.Dict(a=spaces.Discrete(2)), {"a": 1, "extra": "ignored"}, {"a": 1}),
        (spaces.Box(0, 1, (1,), np.float32), 0.1, [np.float32(0.1)]),  # rounded, as floats are
        (spaces.Box(0, 1, (2, 2), np.float32), [0.1, 0.2, 0.3, 0.4], None),
        (spaces.Box(0, 1, (1,), np.float64), float("nan"), None),
    ],
)
def test_an_observation_that_converts_without_changing_a_number_is_taken(
    backend, space, value, expected
):
    # As Gymnasium's shared memory takes them; no value is changed on the way.
    with aiovec.VecEnv([partial(_ObservationAsGiven, space)], backend=backend) as venv:
        venv.reset()
        venv.set_attr("value", [value])
        observations, *_ = venv.step(np.zeros(1, dtype=np.int64))
        if isinstance(expected, dict):
            assert {key: observations[key][0].tolist() for key in expected} == expected
        elif expected is None:  # as numpy converts it
            given = np.asarray(value, dtype=space.dtype).reshape(space.shape)
            np.testing.assert_array_equal(observations[0], given)
        else:
            assert observations[0].tolist() == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([300, -1], "uint8 cannot hold"),  # would wrap to [44, 255]
        (np.array([3.7, 1.0]), "uint8 cannot hold"),  # would truncate to 3
        (np.array([np.nan, 1.0]), "uint8 cannot hold"),
        (np.array([1, 2, 3]), r"shape \(2,\)"),
        (np.array([300, 1]), "uint8 cannot hold"),  # the shape matches: no shortcut
        (np.array([300, 1], np.uint16), "uint8 cannot hold"),
        (np.array([1e5, 1.0]), "float16 cannot hold"),  # would overflow to inf
    ],
)
def test_an_observation_that_would_change_in_conversion_is_refused(backend, value, message):
    space = spaces.Box(0, 9, (2,), np.float16) if "float16" in message else U8
    with aiovec.VecEnv([partial(_ObservationAsGiven, space)] * 2, backend=backend) as venv:
        venv.reset()
        venv.set_attr("value", [value, np.array([1, 2], space.dtype)])
        with pytest.raises(aiovec.EnvError, match=message) as caught:
            venv.step(np.zeros(2, dtype=np.int64))
        assert caught.value.env_index == 0
        venv.set_attr("value", [np.array([5, 6], space.dtype)] * 2)
        observations, *_ = venv.step(np.zeros(2, dtype=np.int64))
        assert observations.tolist() == [[5, 6], [5, 6]]


def test_a_refused_dict_observation_leaves_every_part_of_its_row_as_it_was(backend):
    space = spaces.Dict(a=spaces.Box(0, 9, (2,), np.float32), b=U8)
    with aiovec.VecEnv(
        [partial(_ObservationAsGiven, space)] * 2,
        backend=backend,
        autoreset_mode=gym.vector.AutoresetMode.DISABLED,
    ) as venv:
        before, _ = venv.reset(seed=0)
        venv.set_attr("value", [{"a": np.array([7, 7], np.float32), "b": [300, 1]}, None])
        with pytest.raises(aiovec.EnvError, match="uint8 cannot hold"):
            venv.step(np.zeros(2, dtype=np.int64))
        after, _ = venv.reset(options={"reset_mask": np.array([False, True])})
        assert after["a"][0].tolist() == before["a"][0].tolist()  # "a" was not written
        assert after["b"][0].tolist() == before["b"][0].tolist()


@pytest.mark.parametrize("serving", ["in turn", "threads", "async"])
def test_a_killed_agent_takes_its_envs_processes_along(tmp_path, serving):
    """The agent is SIGKILLed while its workers are idle: what their envs started (and
    whose close() would not stop) dies with them, however each worker serves its envs.
    A worker that reads the end of its channel first ends as if it had been killed."""
    agent, pids = start_agent(
        tmp_path,
        f"""
            import time
            from functools import partial
            import aiovec
            from tests.faulty import AsyncSimulatorEnv, SimulatorEnv

            serving = {serving!r}
            files = [{str(tmp_path)!r} + f"/sim{{i}}.pid" for i in range(8)]
            if serving == "async":
                env_fns = [partial(AsyncSimulatorEnv, i, files[i]) for i in range(8)]
            else:
                env_fns = [partial(SimulatorEnv, i, files[i], "none") for i in range(8)]
            venv = aiovec.VecEnv(
                env_fns, backend="process", num_workers=8,
                concurrent_envs=None if serving == "async" else serving == "threads",
            )
            venv.reset()
            venv.step([0] * 8)
            print(" ".join(str(p.pid) for p in venv._backend._processes), flush=True)
            time.sleep(300)
        """,
    )
    try:
        simulators = [int((tmp_path / f"sim{i}.pid").read_text()) for i in range(8)]
        assert all(pid_alive(pid) for pid in simulators)
    finally:
        agent.kill()
        agent.wait()
    deadline = time.monotonic() + 10
    while any(pid_alive(pid) for pid in simulators + pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in simulators if pid_alive(pid)]
    assert not [pid for pid in pids if pid_alive(pid)]


@pytest.mark.parametrize("backend_name", ["process", "coroutine"])
@pytest.mark.parametrize("where", ["step", "reset"])
def test_an_async_env_raising_generatorexit_itself_fails_its_call(backend_name, where):
    """A GeneratorExit an async env raises itself (not one closing its coroutine) is
    that env's error, with its message: the call fails, it never waits forever."""
    from tests.faulty import GeneratorExitAsyncEnv

    env_fns = [partial(AsyncCounterEnv, 0)] + [
        partial(GeneratorExitAsyncEnv, 1, in_reset=where == "reset")
    ]
    with aiovec.VecEnv(env_fns, backend=backend_name) as venv:
        venv.reset()
        venv.step([0, 0])
        with pytest.raises(aiovec.EnvError, match="simulator 1 gone") as caught:
            if where == "step":
                venv.step_async([0, 0])
                venv.step_wait(timeout=BOUND)
            else:
                venv.reset_async()
                venv.reset_wait(timeout=BOUND)
        assert caught.value.env_index == 1 and caught.value.exc_type == "GeneratorExit"
        assert caught.value.operation == where


@pytest.mark.parametrize("before", ["descriptors", "layout"])
def test_ctrl_c_while_handing_buffers_to_workers_leaves_them_quiet(tmp_path, before):
    """Ctrl-C lands while the agent hands the shared buffers to its workers: the
    workers still waiting for them are closed without printing tracebacks (they used
    to read the Close as their descriptors: ``received 0 items of ancdata``)."""
    script = tmp_path / "agent.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import time
            import aiovec
            from aiovec.backends.process import ProcessBackend
            from tests.envs import CounterEnv

            original = ProcessBackend._hand_buffers

            def interrupted(self, worker):
                if worker == 1:
                    if {before!r} == "descriptors":
                        raise KeyboardInterrupt
                    connection = self._connections[worker]
                    real_send = connection.send
                    def send(payload, *args, **kwargs):
                        connection.send = real_send  # the layout's send only
                        raise KeyboardInterrupt
                    connection.send = send
                return original(self, worker)

            ProcessBackend._hand_buffers = interrupted
            try:
                aiovec.VecEnv([CounterEnv] * 3, num_workers=3)
            except KeyboardInterrupt:
                print("interrupted", flush=True)
            time.sleep(1)  # the workers' output, if any, arrives meanwhile
            """
        )
    )
    agent = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=BOUND,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert agent.stdout.strip() == "interrupted"
    assert "Traceback" not in agent.stderr, agent.stderr


@pytest.mark.parametrize("backend_name", ["process", "coroutine"])
@pytest.mark.parametrize("again_in", ["close", "rebuild"])
def test_an_async_envs_generatorexit_while_it_is_rebuilt_is_handled_as_any_error(
    backend_name, again_in, tmp_path
):
    """Under the restart policy, an async env's step raises GeneratorExit, then its
    close() or its factory raises another while it is rebuilt: as with any error there,
    a failing close() is passed over (the env is rebuilt) and a failing factory fails
    the step once the restarts are spent; never an unanswered step."""
    from tests.faulty import GeneratorExitAsyncEnv

    builds = str(tmp_path / "builds") if again_in == "rebuild" else None
    env_fns = [
        partial(AsyncCounterEnv, 0),
        partial(GeneratorExitAsyncEnv, 1, in_close=again_in == "close", builds=builds),
    ]
    with aiovec.VecEnv(env_fns, backend=backend_name, on_failure="restart", max_restarts=3) as venv:
        venv.reset()
        venv.step([0, 0])
        venv.step_async([0, 0])
        if again_in == "close":
            observations, *_, infos = venv.step_wait(timeout=BOUND)
            assert infos["restarted"].tolist() == [False, True]
            assert "GeneratorExit: simulator 1 gone" in infos["restart_reason"][1]
        else:
            with pytest.raises(
                aiovec.EnvError, match="simulator 1 gone while rebuilding"
            ) as caught:
                venv.step_wait(timeout=BOUND)
            assert caught.value.env_index == 1 and caught.value.exc_type == "GeneratorExit"
        venv.step_async([0, 0])  # env 0 goes on
        try:
            observations, *_ = venv.step_wait(timeout=BOUND)
        except aiovec.EnvError as again:  # env 1 still cannot be rebuilt
            assert again.env_index == 1 and again_in == "rebuild"
        else:
            assert observations[0].tolist() == [0, 3]


@pytest.mark.parametrize("backend_name", ["process", "coroutine"])
def test_a_factory_raising_generatorexit_is_that_envs_build_error(backend_name, tmp_path):
    """A factory's own GeneratorExit (a synchronous call: no coroutine of aiovec's is
    being closed) fails the construction as any factory error, naming the env."""
    from tests.faulty import GeneratorExitAsyncEnv

    builds = tmp_path / "builds"
    builds.write_text("x")  # built once before: this build is a rebuild, and raises
    env_fns = [partial(AsyncCounterEnv, 0), partial(GeneratorExitAsyncEnv, 1, builds=str(builds))]
    with pytest.raises(aiovec.EnvError, match="simulator 1 gone while rebuilding") as caught:
        aiovec.VecEnv(env_fns, backend=backend_name)
    assert caught.value.env_index == 1 and caught.value.exc_type == "GeneratorExit"


@pytest.mark.parametrize(
    "backend_name, options",
    [
        ("process", {"concurrent_envs": False}),
        ("process", {"concurrent_envs": True}),
        ("inline", {}),
        ("coroutine", {}),
    ],
    ids=["in turn", "threads", "inline", "coroutine"],
)
def test_a_blocking_envs_generatorexit_is_its_error_on_every_backend(backend_name, options):
    """A blocking env's own GeneratorExit is that env's EnvError wherever it runs (it
    crashed a worker, and escaped raw from the inline backend); its close() raising
    one does not stop close()."""
    from tests.faulty import GeneratorExitEnv

    env_fns = [partial(CounterEnv, 0), partial(GeneratorExitEnv, 1, in_close=True)]
    if backend_name == "coroutine":
        env_fns = [partial(AsyncCounterEnv, 0), partial(GeneratorExitAsyncEnv, 1)]
    venv = aiovec.VecEnv(env_fns, backend=backend_name, **workers(backend_name, 1), **options)
    venv.reset()
    venv.step([0, 0])
    with pytest.raises(aiovec.EnvError, match="simulator 1 gone") as caught:
        venv.step([0, 0])
    assert caught.value.env_index == 1 and caught.value.exc_type == "GeneratorExit"
    assert venv.step([0, 0])[0][0].tolist() == [0, 3]  # its worker lives on
    venv.close()
    assert venv.closed


def test_close_while_a_worker_is_rebuilt_is_a_normal_close_for_it(tmp_path):
    """close() while a crashed worker's replacement still builds its envs: that worker
    is told to close, as the others are, not treated as abandoned by a dead agent, so
    what its envs started and their close() leaves running is left alone (a normal
    close never kills the processes of the envs' process groups)."""
    from tests.faulty import RebuiltSlowlyEnv

    env_fns = [partial(RebuiltSlowlyEnv, 0, str(tmp_path))]
    venv = aiovec.VecEnv(env_fns, backend="process", on_failure="restart", max_restarts=2)
    try:
        venv.reset()
        venv.step([0])
        venv.step_async([0])  # the worker exits; its replacement builds for a second
        with pytest.raises(aiovec.WaitTimeoutError):
            venv.step_wait(timeout=0.5)
        venv.close()
        files = sorted(tmp_path.glob("*.pid"), key=lambda path: path.stat().st_mtime_ns)
        crashed, rebuilt = (int(path.stem) for path in files)  # one each
        time.sleep(0.5)
        assert not pid_alive(crashed)  # its worker crashed: taken along
        assert pid_alive(rebuilt)
    finally:
        for path in tmp_path.glob("*.pid"):
            try:
                os.kill(int(path.stem), signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.parametrize("fault", list(CRASHES))
@pytest.mark.parametrize("call", ["step", "reset", "call"])
def test_a_crash_names_the_env_that_was_running(fault, call):
    """A worker hosting four envs dies in env 2's step, reset or call: the error names
    env 2 as the one running (``running_env_ids``), not only the worker's group."""

    class CrashesInCalls(FaultyEnv):
        def reset(self, *, seed=None, options=None):
            if self.env_index == 2 and call == "reset" and options == {"crash": True}:
                self._fail()
            return super().reset(seed=seed, options=options)

        def crash(self):
            if self.env_index == 2:
                self._fail()

    env_fns = [
        partial(CrashesInCalls, i, fault, 2 if (i == 2 and call == "step") else 10**9)
        for i in range(4)
    ]
    with aiovec.VecEnv(env_fns, num_workers=1, concurrent_envs=False) as venv:
        venv.reset(seed=0)
        venv.step(np.zeros(4, dtype=np.int64))
        with pytest.raises(aiovec.WorkerCrashedError, match=CRASHES[fault]) as caught:
            if call == "step":
                venv.step(np.zeros(4, dtype=np.int64))
            elif call == "reset":
                venv.reset(options={"crash": True})
            else:
                venv.call("crash")
    assert caught.value.env_ids == [0, 1, 2, 3]
    assert caught.value.running_env_ids == [2]
    assert "while env 2 was running" in str(caught.value)


def test_a_crash_of_a_worker_stepping_its_envs_in_threads_names_the_env_among_those_running():
    env_fns = [partial(FaultyEnv, i, "exit", 2 if i == 2 else 10**9) for i in range(4)]
    with aiovec.VecEnv(env_fns, num_workers=1, concurrent_envs=True) as venv:
        venv.reset(seed=0)
        venv.step(np.zeros(4, dtype=np.int64))
        with pytest.raises(aiovec.WorkerCrashedError, match="exit code 7") as caught:
            venv.step(np.zeros(4, dtype=np.int64))
    assert 2 in caught.value.running_env_ids
    assert set(caught.value.running_env_ids) <= {0, 1, 2, 3}


@pytest.mark.parametrize("concurrent_envs", [False, True], ids=["in-turn", "threads"])
def test_a_worker_killed_by_an_error_outside_any_env_call_says_what_it_was(
    concurrent_envs, no_leaks
):
    """An env's own signal handler raises while its worker waits for the next command
    (no env call to blame): the WorkerCrashedError carries that exception and the
    worker's traceback (it said only "died (exit code 1)", the traceback on the
    worker's stderr)."""
    env_fns = [partial(WatchdogEnv, i, armed=1) for i in range(2)]
    with aiovec.VecEnv(env_fns, num_workers=2, concurrent_envs=concurrent_envs) as venv:
        venv.reset(seed=0)
        venv.step([0, 0])
        time.sleep(0.3)  # the watchdog fires in the idle worker of env 1
        with pytest.raises(aiovec.WorkerCrashedError) as caught:
            venv.step([0, 0])
    message = str(caught.value)
    assert caught.value.env_ids == [1]
    assert "TimeoutError: simulator watchdog fired" in message
    assert "outside any env's call" in message
    assert "on_alarm" in message  # the worker's traceback


def test_workers_lost_with_their_zygote_say_so():
    """aiovec's zygote (which forks the workers) is killed (the OOM killer's pick, say):
    its workers die with it, and the crash says so (it read "exit status unknown" and
    nothing more); restarted workers get a new zygote."""
    from aiovec._worker import zygote as _zygote

    env_fns = [partial(CounterEnv, i) for i in range(2)]
    with aiovec.VecEnv(env_fns, num_workers=2) as venv:
        venv.reset(seed=0)
        os.kill(_zygote.shared()._process.pid, signal.SIGKILL)
        with pytest.raises(aiovec.WorkerCrashedError, match="zygote") as caught:
            for _ in range(100):  # until the workers' deaths are seen
                venv.step([0, 0])
                time.sleep(0.05)
        assert "was killed" in str(caught.value)
    with aiovec.VecEnv(env_fns, num_workers=2) as venv:  # a new zygote
        venv.reset(seed=0)
        venv.step([0, 0])


def test_workers_lost_with_their_zygote_take_their_envs_processes_along(tmp_path):
    """The zygote, which kills a dead worker's process group (what its envs started),
    is killed itself: the agent then does it, when it sees the worker gone."""
    from aiovec._worker import zygote as _zygote
    from tests.faulty import SimulatorEnv

    pid_files = [tmp_path / f"simulator{i}.pid" for i in range(2)]
    env_fns = [partial(SimulatorEnv, i, str(pid_files[i]), "none") for i in range(2)]
    with aiovec.VecEnv(env_fns, num_workers=2) as venv:
        venv.reset(seed=0)
        simulators = [int(pid_file.read_text()) for pid_file in pid_files]
        assert all(pid_alive(pid) for pid in simulators)
        os.kill(_zygote.shared()._process.pid, signal.SIGKILL)
        with pytest.raises(aiovec.WorkerCrashedError, match="zygote"):
            for _ in range(100):  # until the workers' deaths are seen
                venv.step([0, 0])
                time.sleep(0.05)
    deadline = time.monotonic() + 10
    while any(pid_alive(pid) for pid in simulators) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(pid_alive(pid) for pid in simulators)


@pytest.mark.timeout(40)  # waiting on the stuck zygote took 60 s
def test_close_does_not_wait_on_a_stuck_zygote_for_exit_codes(monkeypatch):
    """The zygote is stopped (SIGSTOP: a debugger, a stuck machine): its workers serve
    on, and close() stops them without waiting for the zygote to say how they exited
    longer than a short bound; the next vector env gets a new zygote."""
    from aiovec._worker import zygote as _zygote

    monkeypatch.setattr(_zygote, "STATUS_TIMEOUT", 1.0)  # (5 s by default)

    env_fns = [partial(CounterEnv, i) for i in range(2)]
    venv = aiovec.VecEnv(env_fns, num_workers=2, close_timeout=1)
    stuck = _zygote.shared()._process
    try:
        venv.reset(seed=0)
        os.kill(stuck.pid, signal.SIGSTOP)
        venv.step([0, 0])
        venv.close()
        assert venv.closed
        with aiovec.VecEnv(env_fns, num_workers=2) as fresh:
            fresh.reset(seed=0)
            assert _zygote.shared()._process.pid != stuck.pid
    finally:
        os.kill(stuck.pid, signal.SIGCONT)
        venv.close()


@pytest.mark.parametrize("first_ready", [False, True], ids=["lockstep", "first-ready"])
def test_an_info_that_cannot_be_sent_back_fails_only_its_env(first_ready):
    # Four envs in one worker, answered in one reply: only env 3's info cannot travel.
    fns = [partial(UnsendableInfoEnv, i, 3) for i in range(4)]
    with aiovec.VecEnv(fns, num_workers=1) as venv:
        venv.reset(seed=0)
        actions = np.zeros(4, dtype=np.int64)
        if not first_ready:
            with pytest.raises(TypeError, match="could not be sent back") as caught:
                venv.step(actions)
            assert caught.value.env_index == 3 and "_thread.lock" in str(caught.value)
            return
        venv.send(actions)
        observations, error = {}, None
        while len(observations) + (error is not None) < 4:  # each env answers once
            try:
                batch = aiovec.run(venv.recv())
            except TypeError as exc:
                error = exc
                continue
            observations.update(zip(batch.env_ids, batch.observations))
        assert error is not None and error.env_index == 3
        assert "could not be sent back" in str(error)
        assert {i: observation[0] for i, observation in observations.items()} == {0: 0, 1: 1, 2: 2}


@pytest.mark.parametrize("backend", ["inline", "process"])
def test_same_step_an_env_whose_autoreset_raised_is_reset_by_its_next_step(backend):
    """SAME_STEP autoreset: env 1's episode ends and its reset raises (the step's
    error, ``on_failure="raise"``). Its next step resets it, as NEXT_STEP's step after an
    episode end does (reward 0, no flags, the reset's observation), instead of stepping
    the ended episode on (it used to: a step past termination)."""
    from gymnasium.vector import AutoresetMode

    from tests.faulty import FlakyAutoresetEnv

    env_fns = [partial(FlakyAutoresetEnv, 0), partial(FlakyAutoresetEnv, 1, failing_reset=2)]
    with aiovec.VecEnv(env_fns, backend=backend, autoreset_mode=AutoresetMode.SAME_STEP) as venv:
        venv.reset(seed=0)
        with pytest.raises(RuntimeError, match="reset 2 failed"):
            venv.step([0, 0])  # both episodes end; env 1's autoreset raises
        observations, rewards, terminations, _, infos = venv.step([0, 0])
        assert observations[1].tolist() == [1, 200] and rewards[1] == 0.0
        assert not terminations[1] and not infos["_final_obs"][1]
        assert terminations[0] and infos["_final_obs"][0]  # env 0 steps on as before
        observations, rewards, terminations, _, infos = venv.step([0, 0])
        assert terminations.tolist() == [True, True] and rewards.tolist() == [1.0, 1.0]
        assert observations[1].tolist() == [1, 300]  # stepped, ended, reset again
