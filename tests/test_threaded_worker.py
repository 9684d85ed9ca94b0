"""A worker of blocking envs that mostly wait serves each env from a thread of its own
(aiovec._worker.thread_server): every command, not only steps, keeps its guarantees there."""

from __future__ import annotations

import asyncio
import gc
import os
import random
import sys
import threading
import time
import types
from functools import partial
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import aiovec
from tests.conftest import worker_pids
from tests.envs import CounterEnv
from tests.faulty import FaultyEnv
from tests.helpers import random_traffic, voluntary_switches

# concurrent_envs=True: the envs are served by threads from the first command on.
THREADED = {"num_workers": 1, "concurrent_envs": True}
BOUND = 30  # seconds: only a hang takes this long


def _thread_name(env) -> str:
    return threading.current_thread().name


class FatalEnv(CounterEnv):
    """Raises ``asyncio.CancelledError`` on its second step, from a blocking step: the
    one BaseException that is never an env's error there (a cancellation of aiovec's
    own must run its course), so what nothing in the worker expects: the worker must
    fail."""

    def step(self, action):
        if self.count == 1:
            raise asyncio.CancelledError("beyond any handler")
        return super().step(action)


class TextObservationEnv(CounterEnv):
    """Observations that are not in shared memory (they travel in replies)."""

    def __init__(self, env_index: int = 0, delay_range=None) -> None:
        super().__init__(env_index, delay_range=delay_range)
        self.observation_space = gym.spaces.Sequence(gym.spaces.Discrete(1000))

    def reset(self, *, seed=None, options=None):
        _, info = super().reset(seed=seed, options=options)
        return (self.env_index, 0), info

    def step(self, action):
        _, *rest = super().step(action)
        return (self.env_index, self.count), *rest


def test_every_command_of_an_env_runs_in_that_envs_thread():
    with aiovec.VecEnv([partial(CounterEnv, i) for i in range(3)], **THREADED) as venv:
        observations, _ = venv.reset(seed=0)
        assert observations[:, 0].tolist() == [0, 1, 2]
        assert venv.apply(_thread_name) == ("aiovec-env-0", "aiovec-env-1", "aiovec-env-2")
        venv.step(np.zeros(3, dtype=np.int64))
        assert venv.get_attr("count") == (1, 1, 1)
        venv.set_attr("count", [10, 20, 30])
        observations, *_ = venv.step(np.zeros(3, dtype=np.int64))
        assert observations[:, 1].tolist() == [11, 21, 31]
        assert venv.call("count", env_ids=[2, 0]) == (31, 11)


async def test_commands_to_one_env_run_in_the_order_sent():
    """A call sent while the env's step is in flight runs after that step; a step sent
    after a set_attr sees the value set."""
    env_fns = [partial(CounterEnv, i, delay=0.05) for i in range(2)]
    async with aiovec.VecEnv(env_fns, **THREADED) as venv:
        await venv.areset()
        venv.send(np.zeros(1, dtype=np.int64), env_ids=[0])
        assert await venv.acall("count", env_ids=[0]) == (1,)  # after the step in flight
        batch = await venv.recv()
        assert batch.env_ids.tolist() == [0] and batch.observations[0, 1] == 1
        await venv.aset_attr("count", 100, env_ids=[1])
        observations, *_ = await venv.astep(np.zeros(2, dtype=np.int64))
        assert observations[:, 1].tolist() == [2, 101]


async def test_first_ready_results_keep_each_envs_order_under_load():
    """Many first-ready steps of envs with random delays: every result arrives once,
    and each env's counter goes up by exactly one per result."""
    env_fns = [partial(CounterEnv, i, delay_range=(0.0, 0.003)) for i in range(6)]
    async with aiovec.VecEnv(env_fns, num_workers=2, concurrent_envs=True) as venv:
        await venv.areset()
        venv.send(np.zeros(6, dtype=np.int64))
        expected = [1] * 6
        for _ in range(300):
            batch = await venv.recv(max_envs=2)
            for env_id, observation in zip(batch.env_ids.tolist(), batch.observations):
                assert observation.tolist() == [env_id, expected[env_id]]
                expected[env_id] += 1
            venv.send(np.zeros(len(batch.env_ids), dtype=np.int64), batch.env_ids)
        await venv.recv(min_envs=6)


def test_an_env_that_raises_fails_alone_while_the_others_step():
    env_fns = [partial(CounterEnv, 0, delay=0.01), partial(FaultyEnv, 1, "raise")]
    env_fns.append(partial(CounterEnv, 2, delay=0.01))
    with aiovec.VecEnv(env_fns, **THREADED) as venv:
        venv.reset()
        venv.step(np.zeros(3, dtype=np.int64))
        with pytest.raises(aiovec.EnvError, match="simulator diverged") as caught:
            venv.step(np.zeros(3, dtype=np.int64))
        assert caught.value.env_index == 1
        assert venv.call("count", env_ids=[0, 2]) == (2, 2)  # stepped meanwhile
        venv.send(np.zeros(3, dtype=np.int64))  # env 1 still answers (its next step works)
        batch = aiovec.run(venv.recv(min_envs=3))
        assert sorted(batch.env_ids.tolist()) == [0, 1, 2]


def test_a_failed_env_is_rebuilt_in_its_own_thread():
    env_fns = [partial(FaultyEnv, 0, "raise", at_step=2), partial(CounterEnv, 1, delay=0.01)]
    with aiovec.VecEnv(env_fns, on_failure="restart", **THREADED) as venv:
        venv.reset()
        venv.step(np.zeros(2, dtype=np.int64))
        observations, _, _, truncated, infos = venv.step(np.zeros(2, dtype=np.int64))
        assert truncated.tolist() == [True, False]
        assert infos["restarted"].tolist()[0] is True
        assert observations[:, 1].tolist() == [0, 2]  # env 0 fresh, env 1 stepped on
        assert venv.apply(_thread_name) == ("aiovec-env-0", "aiovec-env-1")
        assert venv.restart_counts[0] == 1


def test_a_baseexception_no_handler_expects_fails_its_worker_as_a_crash():
    env_fns = [partial(FatalEnv, 0), partial(CounterEnv, 1)]
    with aiovec.VecEnv(env_fns, **THREADED) as venv:
        venv.reset()
        venv.step(np.zeros(2, dtype=np.int64))
        with pytest.raises(aiovec.WorkerCrashedError, match="exit code 1"):
            venv.step(np.zeros(2, dtype=np.int64))


def test_an_argument_the_worker_cannot_unpickle_fails_only_that_call(monkeypatch):
    ghost = types.ModuleType("aiovec_ghost_threads")

    class Level:
        pass

    Level.__module__ = ghost.__name__  # a class only this process can import
    Level.__qualname__ = "Level"
    ghost.Level = Level
    monkeypatch.setitem(sys.modules, ghost.__name__, ghost)
    with aiovec.VecEnv([partial(CounterEnv, i) for i in range(2)], **THREADED) as venv:
        venv.reset()
        with pytest.raises(TypeError, match="could not be unpickled"):
            venv.set_attr("level", Level())
        assert venv.call("env_index") == (0, 1)
        venv.step(np.zeros(2, dtype=np.int64))


async def test_observations_that_travel_in_replies_belong_to_their_env():
    env_fns = [partial(TextObservationEnv, i, delay_range=(0.0, 0.002)) for i in range(4)]
    async with aiovec.VecEnv(env_fns, **THREADED) as venv:
        await venv.areset()
        venv.send(np.zeros(4, dtype=np.int64))
        counts = [1] * 4
        for _ in range(60):
            batch = await venv.recv(max_envs=1)
            (env_id,) = batch.env_ids.tolist()
            assert tuple(batch.observations[0]) == (env_id, counts[env_id])
            counts[env_id] += 1
            venv.send(np.zeros(1, dtype=np.int64), batch.env_ids)
        await venv.recv(min_envs=4)


def test_env_time_is_reported_from_the_threads():
    env_fns = [partial(CounterEnv, i, delay=0.01) for i in range(4)]
    with aiovec.VecEnv(env_fns, **THREADED) as venv:
        venv.reset()
        for _ in range(5):
            venv.step(np.zeros(4, dtype=np.int64))
        stats = venv.stats()
        # Four envs sleeping at least 10 ms five times each: at least 0.2 s of env time,
        # however the threads' additions interleave.
        assert stats.env_time >= 0.2


class LoggingEnv(CounterEnv):
    """Appends ``"<env> step start"``, ``"<env> step end"`` and ``"<env> close"`` to
    ``log`` (a file: the env lives in a worker process)."""

    def __init__(self, env_index: int = 0, log: str = "", slow: float = 0.0) -> None:
        super().__init__(env_index)
        self.log, self.slow = log, slow

    def _write(self, line: str) -> None:
        with open(self.log, "a") as log:
            log.write(f"{self.env_index} {line}\n")

    def step(self, action):
        self._write("step start")
        if self.count >= 1:
            time.sleep(self.slow)
        self._write("step end")
        return super().step(action)

    def close(self):
        self._write("close")


async def test_close_waits_for_the_step_each_env_is_in(tmp_path):
    log = tmp_path / "envs.log"
    env_fns = [partial(LoggingEnv, i, log=str(log), slow=0.3 * (i == 1)) for i in range(3)]
    venv = aiovec.VecEnv(env_fns, close_timeout=10, **THREADED)
    await venv.areset()
    await venv.astep(np.zeros(3, dtype=np.int64))
    venv.send(np.zeros(3, dtype=np.int64))  # env 1 is now in a slow step
    await asyncio.sleep(0.05)
    await venv.aclose()
    lines = log.read_text().splitlines()
    # No env is closed while its own thread is still inside a step of it.
    for env in range(3):
        mine = [line.split(" ", 1)[1] for line in lines if line.startswith(f"{env} ")]
        assert mine[-1] == "close", mine
        assert mine[:-1] == ["step start", "step end"] * (len(mine[:-1]) // 2), mine


def _scheduling_policies(pid: int) -> dict[int, int]:
    """Each thread's id -> its scheduling policy (field 41 of /proc/PID/task/TID/stat)."""
    policies = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        stat = (task / "stat").read_text()
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": field 3 on
        policies[int(task.name)] = int(fields[38])
    return policies


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux scheduling policies")
def test_the_receiving_thread_never_preempts_the_agent_and_env_threads_keep_their_policy():
    # SCHED_BATCH: woken by the agent's send, it waits for a free core instead of
    # preempting the agent (measured in aiovec/_worker/main.py).
    with aiovec.VecEnv([partial(CounterEnv, i) for i in range(2)], **THREADED) as venv:
        venv.reset(seed=0)
        venv.step(np.zeros(2, dtype=np.int64))
        [pid] = worker_pids(venv)
        env_thread_ids = set(venv.apply(lambda env: threading.get_native_id()))
        policies = _scheduling_policies(pid)
    assert policies[pid] == os.SCHED_BATCH  # the receiving thread: the worker's main one
    assert len(env_thread_ids) == 2 and pid not in env_thread_ids
    assert {policies[thread] for thread in env_thread_ids} == {os.SCHED_OTHER}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc task counters")
async def test_a_waiting_worker_is_not_woken_by_the_agent_reading_its_replies():
    """Stepping first-ready one env at a time (steps on the envs' lines), the worker's
    receiving thread sleeps through the agent's reads of the envs' replies: it wakes for
    commands, not once per reply (see Channel._receive_blocking)."""
    env_fns = [partial(CounterEnv, i, delay=0.001) for i in range(2)]
    async with aiovec.VecEnv(env_fns, **THREADED) as venv:
        await venv.areset(seed=0)
        [pid] = worker_pids(venv)
        venv.send(np.zeros(2, dtype=np.int64))
        for _ in range(20):  # warm: the lines in use
            batch = await venv.recv(1)
            venv.send(np.zeros(1, dtype=np.int64), batch.env_ids)
        before = voluntary_switches(pid, pid)
        steps = 300
        for _ in range(steps):
            batch = await venv.recv(1)
            venv.send(np.zeros(1, dtype=np.int64), batch.env_ids)
        woken = voluntary_switches(pid, pid) - before
        await venv.recv(min_envs=2)
    assert woken <= steps // 10, f"woken {woken} times over {steps} steps"


# --- env lines: steps straight to the envs' threads (aiovec._transport.lines) ---------------


def _lined_workers(venv) -> set[int]:
    """The workers whose steps now go on their envs' lines."""
    return set(venv._backend._threaded)


async def test_steps_take_the_env_lines_and_calls_in_between_keep_their_order():
    """Random first-ready traffic mixed with calls and set_attr on a worker stepping its
    envs in threads: every result once, each env's counter in order, while the steps
    go on the lines (and, with a call in flight, through the worker's socket)."""
    env_fns = [partial(CounterEnv, i, delay_range=(0.0, 0.002)) for i in range(5)]
    async with aiovec.VecEnv(env_fns, **THREADED) as venv:
        await venv.areset()
        assert _lined_workers(venv) == {0}
        counts = [0] * 5

        def check(batch, row, env_id, _):
            counts[env_id] += 1
            assert batch.observations[row].tolist() == [env_id, counts[env_id]]

        for seed in range(3):
            sent, received = await random_traffic(venv, 400, seed=seed, check=check)
            assert sent == received
            calls = [asyncio.create_task(venv.acall("count", env_ids=[i])) for i in range(5)]
            await asyncio.sleep(0)  # the calls are sent
            venv.send(np.zeros(5, dtype=np.int64))  # while they are in flight: after them
            assert [value for (value,) in await asyncio.gather(*calls)] == counts
            await venv.recv(min_envs=5)
            counts = [count + 1 for count in counts]
            await venv.aset_attr("count", counts)
        assert _lined_workers(venv) == {0}


def test_a_worker_that_measures_its_envs_waiting_switches_to_lines():
    env_fns = [partial(CounterEnv, i, delay=0.004) for i in range(4)]
    with aiovec.VecEnv(env_fns, num_workers=2) as venv:  # concurrent_envs: measured
        venv.reset()
        for step in range(1, 12):
            observations, *_ = venv.step(np.zeros(4, dtype=np.int64))
            assert observations[:, 1].tolist() == [step] * 4
        assert _lined_workers(venv) == {0, 1}


def test_no_lines_for_cpu_bound_envs_one_env_per_worker_or_batched_envs():
    with aiovec.VecEnv([partial(CounterEnv, i) for i in range(4)], num_workers=2) as venv:
        venv.reset()
        for _ in range(30):  # never waits: served in turn
            venv.step(np.zeros(4, dtype=np.int64))
        assert _lined_workers(venv) == set() and venv._backend._lines != {}
    with aiovec.VecEnv([CounterEnv] * 2, num_workers=2, concurrent_envs=True) as venv:
        venv.reset()
        venv.step(np.zeros(2, dtype=np.int64))
        assert venv._backend._lines == {}


class ExitOnceEnv(CounterEnv):
    """Ends its worker's process on its third step, the first time only (``marker``)."""

    def __init__(self, env_index: int, marker: Path) -> None:
        super().__init__(env_index)
        self.marker = marker

    def step(self, action):
        if self.count == 2 and not self.marker.exists():
            self.marker.touch()
            os._exit(7)
        return super().step(action)


def test_a_restarted_worker_gets_new_lines(tmp_path):
    env_fns = [partial(ExitOnceEnv, 0, tmp_path / "exited"), partial(CounterEnv, 1)]
    with aiovec.VecEnv(env_fns, on_failure="restart", **THREADED) as venv:
        venv.reset()
        pids = worker_pids(venv)
        for _ in range(2):
            venv.step(np.zeros(2, dtype=np.int64))
        _, _, _, truncated, _ = venv.step(np.zeros(2, dtype=np.int64))  # the worker died
        assert truncated[0] and worker_pids(venv) != pids
        venv.reset()  # env 1 may have answered before the worker died, or not
        for step in range(1, 6):
            observations, *_ = venv.step(np.zeros(2, dtype=np.int64))
            assert observations[:, 1].tolist() == [step, step]
        assert _lined_workers(venv) == {0}


def test_closing_leaves_no_line_descriptors():
    def count() -> int:
        gc.collect()  # what earlier tests left for the collector closes now, not midway
        return len(os.listdir("/proc/self/fd"))

    with aiovec.VecEnv([CounterEnv] * 4, num_workers=1, concurrent_envs=True) as venv:
        venv.reset()  # the zygote started
    before = count()
    for _ in range(3):
        with aiovec.VecEnv([CounterEnv] * 4, num_workers=1, concurrent_envs=True) as venv:
            venv.reset()
            venv.step(np.zeros(4, dtype=np.int64))
            assert _lined_workers(venv) == {0}
    assert count() == before


async def test_commands_piling_up_for_a_busy_env_never_stall_its_neighbours():
    """Hundreds of calls queued for an env in a long step: its line would fill up with
    one token each, and the receiving thread block writing the next (every env of the
    worker then stalls). One unread token per env at most."""
    env_fns = [partial(CounterEnv, 0, delay=1.5)] + [partial(CounterEnv, i) for i in (1, 2)]
    async with aiovec.VecEnv(env_fns, **THREADED) as venv:
        await venv.areset()
        assert _lined_workers(venv) == {0}
        venv.send(np.zeros(1, dtype=np.int64), env_ids=[0])  # 1.5 s
        calls = [asyncio.create_task(venv.acall("count", env_ids=[0])) for _ in range(600)]
        await asyncio.sleep(0)  # all sent
        for _ in range(30):  # the neighbours step on meanwhile
            venv.send(np.zeros(2, dtype=np.int64), env_ids=[1, 2])
            batch = await venv.recv(min_envs=2, max_envs=2, timeout=BOUND)
            assert sorted(batch.env_ids.tolist()) == [1, 2]
        assert not any(call.done() for call in calls)  # still behind env 0's step
        assert {value for (value,) in await asyncio.gather(*calls)} == {1}
        batch = await venv.recv(timeout=BOUND)
        assert batch.env_ids.tolist() == [0]


async def test_concurrent_tasks_stepping_and_setting_see_each_envs_commands_in_order():
    """One task steps first-ready while another sets and reads counters at random: a
    step (on its line) must never overtake a command sent before it, nor a command a
    step sent before it (the merge by sequence number in the env's thread)."""
    rng = random.Random(7)
    env_fns = [partial(CounterEnv, i, delay_range=(0.0, 0.002)) for i in range(4)]
    async with aiovec.VecEnv(env_fns, **THREADED) as venv:
        await venv.areset()
        model, in_flight, problems = [0] * 4, {}, []
        stop = time.monotonic() + 3.0

        async def stepper() -> None:
            while time.monotonic() < stop or in_flight:
                idle = [i for i in range(4) if i not in in_flight]
                if idle and time.monotonic() < stop:
                    chosen = rng.sample(idle, rng.randint(1, len(idle)))
                    venv.send(np.zeros(len(chosen), dtype=np.int64), env_ids=chosen)
                    for env_id in chosen:
                        model[env_id] += 1
                        in_flight[env_id] = model[env_id]
                batch = await venv.recv(max_envs=rng.randint(1, 4), timeout=BOUND)
                for env_id, observation in zip(batch.env_ids.tolist(), batch.observations):
                    if observation[1] != in_flight.pop(env_id):
                        problems.append((env_id, observation.tolist()))

        async def controller() -> None:
            while time.monotonic() < stop:
                await asyncio.sleep(rng.uniform(0, 0.003))
                env_ids = rng.sample(range(4), rng.randint(1, 4))
                if rng.random() < 0.5:
                    expected = tuple(model[i] for i in env_ids)
                    if await venv.acall("count", env_ids=env_ids) != expected:
                        problems.append(("call", env_ids))
                else:
                    values = [rng.randint(0, 10**6) for _ in env_ids]
                    setting = venv.aset_attr("count", values, env_ids=env_ids)
                    for env_id, value in zip(env_ids, values):
                        model[env_id] = value  # sent on the first step of `setting`
                    await setting

        await asyncio.gather(stepper(), controller())
        assert problems == []


def test_no_lines_when_the_process_is_short_of_descriptors():
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    in_use = len(os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (in_use + 200, hard))
    try:
        with aiovec.VecEnv([CounterEnv] * 4, **THREADED) as venv:
            observations, *_ = venv.step(np.zeros(4, dtype=np.int64))
            assert venv._backend._lines == {} and observations[:, 1].tolist() == [1] * 4
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _inheritable_descriptors(env) -> list[str]:
    """aiovec's: sockets and shared memory (multiprocessing's spawn keeps pipes of its own)."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
            if fd > 2 and os.get_inheritable(fd) and target.startswith(("socket:", "/memfd:")):
                found.append(target)
        except OSError:  # the listing's own descriptor, closed by now
            pass
    return found


@pytest.mark.parametrize("context", ["zygote", "spawn"])
def test_a_workers_descriptors_are_not_inherited_by_what_its_envs_start(context):
    """Shared memory, the worker's socket and its env lines: a program an env starts
    with close_fds=False would otherwise hold them (and the worker's socket open)."""
    with aiovec.VecEnv([CounterEnv] * 2, context=context, **THREADED) as venv:
        venv.reset()
        assert venv.apply(_inheritable_descriptors) == ([], [])
