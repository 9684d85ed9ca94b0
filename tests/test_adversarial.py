"""Cases found by trying to break aiovec as a demanding user would."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import textwrap
import threading
import time
from functools import partial

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.error import NoAsyncCallError

import aiovec
from aiovec._worker import zygote as _zygote
from tests.conftest import pid_alive, worker_pids
from tests.envs import CounterEnv
from tests.faulty import FaultyEnv
from tests.helpers import run_python

BOUND = 30


async def test_cancelling_the_pump_and_a_parked_recv_together_loses_nothing():
    async with aiovec.VecEnv([partial(CounterEnv, 0, delay=0.2)], backend="process") as venv:
        await venv.areset()
        venv.send([0])
        pump = asyncio.ensure_future(venv.recv())
        await asyncio.sleep(0.01)
        parked = asyncio.ensure_future(venv.recv(timeout=10))
        await asyncio.sleep(0.01)
        pump.cancel()
        parked.cancel()
        outcomes = await asyncio.gather(pump, parked, return_exceptions=True)
        assert all(isinstance(outcome, asyncio.CancelledError) for outcome in outcomes)
        batch = await asyncio.wait_for(venv.recv(), BOUND)  # the result is still there
        assert batch.env_ids.tolist() == [0]


def test_a_zygote_whose_agent_left_while_it_started_exits_quietly():
    """Ctrl-C in the agent while its zygote starts (the agent goes away before the
    zygote's hello): the zygote exits without a traceback, and a Ctrl-C reaching it while
    it imports (a terminal's Ctrl-C goes to the whole process group) is ignored."""
    import socket
    import subprocess
    import sys

    from aiovec._worker import zygote

    agent_end, zygote_end = socket.socketpair()
    process = subprocess.Popen(
        [sys.executable, "-c", zygote.launch_command(zygote_end.fileno())],
        pass_fds=(zygote_end.fileno(),),
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    zygote_end.close()
    deadline = time.monotonic() + 5
    while not _ignores_sigint(process.pid) and time.monotonic() < deadline:
        time.sleep(0.001)  # not before: Python's own start-up is not the zygote's
    process.send_signal(signal.SIGINT)  # while it imports numpy, gymnasium and aiovec
    agent_end.close()  # the agent is gone before the hello
    _, stderr = process.communicate(timeout=60)
    assert "Traceback" not in stderr, stderr


def test_a_terminals_ctrl_c_never_reaches_the_zygote():
    """The zygote runs in a process group of its own: a terminal's Ctrl-C (sent to the
    agent's group) cannot interrupt it, not even while its interpreter starts, before
    any of its code can ignore SIGINT (it printed ``init_import_site`` failures)."""
    with aiovec.VecEnv([CounterEnv] * 2, num_workers=2) as venv:
        venv.reset()
    zygote_pid = _zygote.shared()._process.pid
    assert os.getpgid(zygote_pid) == zygote_pid != os.getpgid(0)


def _ignores_sigint(pid: int) -> bool:
    with open(f"/proc/{pid}/status") as status:
        ignored = next(line for line in status if line.startswith("SigIgn:"))
    return bool(int(ignored.split()[1], 16) & (1 << (signal.SIGINT - 1)))


def test_an_interrupted_zygote_request_never_desynchronizes_later_ones(monkeypatch):
    with aiovec.VecEnv([CounterEnv] * 2, num_workers=2) as venv:
        venv.reset()
    zygote = _zygote.shared()
    real_receive = _zygote._receive_frame
    calls = []

    def interrupted(sock):
        if not calls:
            calls.append(1)
            real_receive(sock)  # the answer is read, then the interrupt lands
            raise KeyboardInterrupt
        return real_receive(sock)

    monkeypatch.setattr(_zygote, "_receive_frame", interrupted)
    with pytest.raises(KeyboardInterrupt):
        aiovec.VecEnv([CounterEnv] * 2, num_workers=2)
    assert not zygote.alive  # set aside: a new zygote serves the next vector env
    with aiovec.VecEnv([CounterEnv] * 2, num_workers=2) as venv:
        observations, _ = venv.reset()
        assert observations.shape == (2, 2)


def test_ctrl_c_landing_on_another_thread_waits_for_the_zygotes_answer(monkeypatch):
    """A terminal's SIGINT may be delivered to any thread of the agent (Ray's, a user's):
    the KeyboardInterrupt it raises in the main thread still waits until a zygote
    request has its answer, so the zygote is kept and the worker is not lost."""
    with aiovec.VecEnv([CounterEnv] * 2, num_workers=2) as venv:
        venv.reset()
    zygote = _zygote.shared()
    bystander_may_end = threading.Event()
    bystander = threading.Thread(target=bystander_may_end.wait, daemon=True)
    bystander.start()
    real_receive = _zygote._receive_frame
    calls = []

    def interrupted_elsewhere(sock):
        if not calls:
            calls.append(1)
            signal.pthread_kill(bystander.ident, signal.SIGINT)  # not this thread's
            time.sleep(0.05)  # its handler has run: the main thread is due to raise
        return real_receive(sock)

    monkeypatch.setattr(_zygote, "_receive_frame", interrupted_elsewhere)
    try:
        with pytest.raises(KeyboardInterrupt):
            aiovec.VecEnv([CounterEnv] * 2, num_workers=2)
    finally:
        bystander_may_end.set()
    assert calls and zygote.alive  # raised after the answer: requests still in step
    monkeypatch.setattr(_zygote, "_receive_frame", real_receive)
    with aiovec.VecEnv([CounterEnv] * 2, num_workers=2) as venv:
        observations, _ = venv.reset()
        assert observations.shape == (2, 2)
    assert _zygote.shared() is zygote


@pytest.mark.parametrize("handler_does", ["close", "build"])
def test_a_ctrl_c_handler_that_uses_aiovec_runs_after_a_zygote_request(handler_does):
    """A SIGINT handler of the user's that closes or builds a vector env (clean-up on
    Ctrl-C), the Ctrl-C landing while a zygote request waits: the handler runs once,
    after the request, and can itself use the zygote (it deadlocked on its lock)."""
    source = textwrap.dedent(
        f"""
        import os, signal, threading
        from functools import partial
        import aiovec
        import aiovec._worker.zygote as zygote
        from tests.envs import CounterEnv

        first = aiovec.VecEnv([partial(CounterEnv, i) for i in range(2)], num_workers=2)
        first.reset()
        calls = []

        def handler(signum, frame):
            calls.append(signum)
            if {handler_does!r} == "close":
                first.close()
            else:
                aiovec.VecEnv([CounterEnv], num_workers=1).close()

        signal.signal(signal.SIGINT, handler)
        real_receive, fired = zygote._receive_frame, []

        def receive(sock):
            if not fired and threading.current_thread() is threading.main_thread():
                fired.append(1)
                os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, mid-request
            return real_receive(sock)

        zygote._receive_frame = receive
        second = aiovec.VecEnv([partial(CounterEnv, i) for i in range(2)], num_workers=2)
        print(len(calls), signal.getsignal(signal.SIGINT) is handler, second.reset()[0].shape)
        second.close()
        """
    )
    result = run_python(source, timeout=BOUND)
    assert result.stdout.split() == ["1", "True", "(2,", "2)"], result.stderr


def test_a_forked_child_closing_its_copy_leaves_the_parents_workers_alone():
    with aiovec.VecEnv([partial(CounterEnv, i) for i in range(2)], num_workers=2) as venv:
        venv.reset()
        pid = os.fork()
        if pid == 0:  # the child: closes (and garbage-collects) what it inherited
            try:
                venv.close()
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        observations, *_ = venv.step([0, 0])
        assert observations[:, 1].tolist() == [1, 1]


def _max_steps(env) -> int:
    return env.spec.max_episode_steps


def _environment_value(env) -> str | None:
    return os.environ.get("AIOVEC_TEST_SETTING")


def test_workers_see_the_agents_registrations_and_environment(monkeypatch):
    original = gym.registry["CartPole-v1"]
    gym.register("CartPole-v1", entry_point=original.entry_point, max_episode_steps=3)
    try:
        monkeypatch.setenv("AIOVEC_TEST_SETTING", "on")
        with aiovec.make("CartPole-v1", 2, backend="process") as venv:
            assert venv.apply(_max_steps) == (3, 3)
            assert venv.apply(_environment_value) == ("on", "on")
    finally:
        gym.registry["CartPole-v1"] = original


def test_sync_restart_with_step_timeout_and_no_startup_timeout():
    env_fns = [partial(CounterEnv, i) for i in range(2)]
    with aiovec.VecEnv(
        env_fns, num_workers=2, on_failure="restart", step_timeout=5, startup_timeout=None
    ) as venv:
        venv.reset()
        os.kill(venv._backend._processes[1].pid, signal.SIGKILL)
        observations, _, _, truncations, infos = venv.step([0, 0])
        assert truncations[1] and infos["restarted"][1]


def _lock(env):
    return threading.Lock()


def test_a_result_that_cannot_be_pickled_is_an_error_not_a_dead_worker():
    with aiovec.VecEnv([partial(CounterEnv, i) for i in range(2)], num_workers=1) as venv:
        venv.reset()
        with pytest.raises(TypeError, match="could not be sent back"):
            venv.apply(_lock)
        assert venv.call("env_index") == (0, 1)
        assert venv.worker_restarts == (0,)


def test_create_close_cycles_leave_no_descriptors():
    def count() -> int:
        gc.collect()  # descriptors that earlier tests' garbage still holds go first
        return len(os.listdir("/proc/self/fd"))

    with aiovec.VecEnv([CounterEnv] * 2, num_workers=2) as venv:  # zygote started
        venv.reset()
    before = count()
    for _ in range(5):
        with aiovec.VecEnv([CounterEnv] * 2, num_workers=2) as venv:
            venv.reset()
    assert count() == before


def test_step_wait_after_a_timeout_can_be_called_again():
    env_fns = [partial(CounterEnv, 0, delay=0.3)]
    with aiovec.VecEnv(env_fns, backend="process") as venv:
        venv.reset()
        venv.step_async([0])
        with pytest.raises(aiovec.WaitTimeoutError):
            venv.step_wait(timeout=0.01)
        observations, *_ = venv.step_wait(timeout=BOUND)
        assert observations[:, 1].tolist() == [1]
        assert np.asarray(venv.step([0])[0])[:, 1].tolist() == [2]


@pytest.mark.parametrize("next_call", ["step", "reset", "step_async", "call"])
def test_a_new_call_after_a_timeout_drops_the_late_one_as_asyncvectorenv_goes_idle(next_call):
    """``except TimeoutError: envs.reset()`` (or a new step) works, as with
    AsyncVectorEnv; the late step's results are dropped, never handed to the new call
    (AsyncVectorEnv would return them as the new call's)."""
    env_fns = [partial(CounterEnv, 0, delay=0.3), partial(CounterEnv, 1)]
    with aiovec.VecEnv(env_fns, backend="process", num_workers=2) as venv:
        venv.reset()
        venv.step_async([0, 0])
        with pytest.raises(aiovec.WaitTimeoutError):
            venv.step_wait(timeout=0.01)
        if next_call == "reset":
            observations, _ = venv.reset()
            assert observations[:, 1].tolist() == [0, 0]
        elif next_call == "call":
            assert venv.call("count") == (1, 1)  # the late step ran, its results dropped
        else:
            if next_call == "step":
                observations, *_ = venv.step([0, 0])
            else:
                venv.step_async([0, 0])
                observations, *_ = venv.step_wait(timeout=BOUND)
            assert observations[:, 1].tolist() == [2, 2]
        with pytest.raises(NoAsyncCallError):
            venv.step_wait()  # the dropped step is gone


def _timed_out_step(venv) -> None:
    venv.reset()
    venv.step_async([0, 0])
    with pytest.raises(aiovec.WaitTimeoutError):
        venv.step_wait(timeout=0.05)


@pytest.mark.parametrize("next_call", ["reset", "step", "call"])
def test_an_async_call_after_a_timeout_never_waits_for_the_late_one(next_call):
    """``*_async`` returns at once, as AsyncVectorEnv's does, even while the late call
    hangs; its ``*_wait(timeout)`` then times out, and close() ends it all."""
    env_fns = [partial(CounterEnv, 0), partial(FaultyEnv, 1, "hang", at_step=1)]
    venv = aiovec.VecEnv(env_fns, backend="process", num_workers=2, close_timeout=0.2)
    pids = worker_pids(venv)
    try:
        _timed_out_step(venv)
        start, wait = {
            "reset": (venv.reset_async, venv.reset_wait),
            "step": (partial(venv.step_async, [0, 0]), venv.step_wait),
            "call": (partial(venv.call_async, "count"), venv.call_wait),
        }[next_call]
        start()  # waited for the hung step forever
        with pytest.raises(aiovec.WaitTimeoutError):
            wait(timeout=0.05)
        with pytest.raises(aiovec.WaitTimeoutError):  # and again: still pending
            wait(timeout=0.05)
        venv.reset_async()  # a newer call replaces the one never sent
        with pytest.raises(aiovec.WaitTimeoutError):
            venv.reset_wait(timeout=0.05)
    finally:
        venv.close()
    assert not any(pid_alive(pid) for pid in pids)


@pytest.mark.parametrize("next_call", ["reset", "step", "call"])
def test_an_async_call_after_a_timeout_is_sent_once_the_late_one_finished(next_call):
    env_fns = [partial(CounterEnv, 0), partial(CounterEnv, 1, delay=1.0)]
    with aiovec.VecEnv(env_fns, backend="process", num_workers=2) as venv:
        _timed_out_step(venv)
        if next_call == "reset":
            venv.reset_async(seed=[1, 2])
            observations, _ = venv.reset_wait(timeout=BOUND)
            assert observations[:, 1].tolist() == [0, 0]
        elif next_call == "step":
            actions = np.zeros(2, dtype=np.int64)
            venv.step_async(actions)
            actions[:] = 1  # the caller's array is free again, as with AsyncVectorEnv
            observations, rewards, _, _, infos = venv.step_wait(timeout=BOUND)
            assert observations[:, 1].tolist() == [2, 2] and rewards.tolist() == [2.0, 2.0]
            assert infos["action"].tolist() == [0, 0]
        else:
            venv.call_async("count")
            assert venv.call_wait(timeout=BOUND) == (1, 1)  # the late step ran first
        with pytest.raises(NoAsyncCallError):
            venv.step_wait()  # the dropped step is gone


def test_bad_arguments_after_a_timeout_are_refused_at_once_and_change_nothing():
    env_fns = [partial(CounterEnv, 0), partial(CounterEnv, 1, delay=0.5)]
    with aiovec.VecEnv(env_fns, backend="process", num_workers=2) as venv:
        _timed_out_step(venv)
        with pytest.raises(aiovec.InvalidSeedError):
            venv.reset_async(seed=-1)
        with pytest.raises(ValueError, match="shape"):
            venv.step_async(np.zeros(5, dtype=np.int64))
        with pytest.raises(ValueError, match="use `step` directly"):
            venv.call_async("step")
        observations, *_ = venv.step_wait(timeout=BOUND)  # the late step is still there
        assert observations[:, 1].tolist() == [1, 1]


def test_the_async_api_after_a_timed_out_step_wait_drops_the_late_step():
    env_fns = [partial(CounterEnv, 0), partial(CounterEnv, 1, delay=0.5)]
    with aiovec.VecEnv(env_fns, backend="process", num_workers=2) as venv:
        _timed_out_step(venv)

        async def main():
            observations, *_ = await venv.astep(np.zeros(2, dtype=np.int64))
            assert observations[:, 1].tolist() == [2, 2]
            venv.step_async(np.zeros(2, dtype=np.int64))
            with pytest.raises(aiovec.WaitTimeoutError):
                venv.step_wait(timeout=0.05)
            assert await venv.acall("count") == (3, 3)

        aiovec.run(main())


def test_a_call_made_after_a_timeout_is_pending_like_any_other():
    """A second ``*_async`` (or a sync call) while the first, made after a timeout,
    awaits its ``*_wait`` is refused, as AsyncVectorEnv refuses it: neither call is lost."""
    from gymnasium.error import AlreadyPendingCallError

    env_fns = [partial(CounterEnv, 0), partial(CounterEnv, 1, delay=0.5)]
    with aiovec.VecEnv(env_fns, backend="process", num_workers=2) as venv:
        _timed_out_step(venv)
        venv.reset_async(seed=[5, 6])
        with pytest.raises(AlreadyPendingCallError):
            venv.step_async([1, 1])
        with pytest.raises(AlreadyPendingCallError):
            venv.step([1, 1])
        with pytest.raises(AlreadyPendingCallError):
            venv.send([1], env_ids=[0])
        observations, _ = venv.reset_wait(timeout=BOUND)
        assert observations[:, 1].tolist() == [0, 0]
        assert venv.call("np_random_seed") == (5, 6)


def test_send_or_astep_while_a_reset_async_is_pending_is_refused():
    """A step would overwrite the observations reset_wait then returns as its own."""
    from gymnasium.error import AlreadyPendingCallError

    with aiovec.VecEnv([partial(CounterEnv, i) for i in range(2)], num_workers=2) as venv:
        venv.reset()
        venv.step([0, 0])
        venv.reset_async()
        with pytest.raises(AlreadyPendingCallError, match="`send`"):
            venv.send([1], env_ids=[0])

        async def astep():
            return await venv.astep([1, 1])

        with pytest.raises(AlreadyPendingCallError, match="`astep`"):
            aiovec.run(astep())
        observations, _ = venv.reset_wait(timeout=BOUND)
        assert observations[:, 1].tolist() == [0, 0]


def test_cancelling_astep_that_waits_for_a_late_call_keeps_the_late_call_pending():
    env_fns = [partial(CounterEnv, 0), partial(CounterEnv, 1, delay=0.5)]
    with aiovec.VecEnv(env_fns, backend="process", num_workers=2) as venv:
        _timed_out_step(venv)

        async def main():
            waiting = asyncio.create_task(venv.astep(np.zeros(2, dtype=np.int64)))
            await asyncio.sleep(0.05)  # it waits for the late step
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting

        aiovec.run(main())
        observations, *_ = venv.step_wait(timeout=BOUND)  # the late step, still there
        assert observations[:, 1].tolist() == [1, 1]
        observations, *_ = venv.step([0, 0])
        assert observations[:, 1].tolist() == [2, 2]


def test_a_deferred_wait_that_times_out_names_the_timeout_given():
    """The late step ends within the timeout, the new one after it: the error gives
    the timeout passed, not what was left of it."""
    env_fns = [partial(CounterEnv, 0), partial(CounterEnv, 1, delay=0.3)]
    with aiovec.VecEnv(env_fns, backend="process", num_workers=2) as venv:
        _timed_out_step(venv)
        venv.step_async([0, 0])
        with pytest.raises(aiovec.WaitTimeoutError, match=r"within 0\.4 s"):
            venv.step_wait(timeout=0.4)


@pytest.mark.parametrize("concurrent_envs", [False, True], ids=["in-turn", "threads"])
def test_a_step_cannot_overwrite_the_observations_of_a_reset_in_flight(concurrent_envs):
    """The worker would run the step right after the reset and write its observation
    before the agent took the reset's."""
    env_fns = [partial(CounterEnv, i) for i in range(2)]
    with aiovec.VecEnv(env_fns, num_workers=1, concurrent_envs=concurrent_envs) as venv:

        async def main():
            await venv.areset()
            await venv.astep([0, 0])
            mask = np.array([True, False])
            resetting = asyncio.create_task(venv.areset(options={"reset_mask": mask}))
            await asyncio.sleep(0)  # sent
            with pytest.raises(aiovec.EnvBusyError, match="reset is still in flight"):
                venv.send([1], env_ids=[0])
            venv.send([1], env_ids=[1])  # another env: free
            observations, _ = await resetting
            assert observations[0].tolist() == [0, 0]
            venv.send([1], env_ids=[0])  # and now it may
            batch = await venv.recv(min_envs=2, timeout=BOUND)
            assert sorted(batch.observations[:, 1].tolist()) == [1, 2]

        aiovec.run(main())


def test_recv_cannot_take_the_results_of_a_pending_step_async():
    """``step_async``'s results belong to its ``step_wait``: ``recv`` taking them
    delivered every result twice (once by ``recv``, again by ``step_wait``)."""
    from gymnasium.error import AlreadyPendingCallError

    with aiovec.VecEnv([partial(CounterEnv, 0), partial(CounterEnv, 1)], num_workers=2) as venv:

        async def main():
            await venv.areset(seed=0)
            venv.step_async(np.zeros(2, dtype=np.int64))
            with pytest.raises(AlreadyPendingCallError, match="call step_wait\\(\\) first"):
                await venv.recv(timeout=BOUND)
            with pytest.raises(AlreadyPendingCallError, match="`recv_nowait`"):
                venv.recv_nowait()
            observations, *_ = venv.step_wait(timeout=BOUND)
            assert observations[:, 1].tolist() == [1, 1]
            with pytest.raises(aiovec.NothingInFlightError):  # delivered once, not twice
                await venv.recv(timeout=BOUND)

        aiovec.run(main())


CTRL_C_DURING_CONSTRUCTION = textwrap.dedent(
    """
    import gc, os, random, signal, threading, time
    import aiovec
    from tests.envs import CounterEnv

    def descriptors():
        gc.collect()
        found = {}
        for fd in os.listdir("/proc/self/fd"):
            try:
                found[fd] = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                pass
        return found

    def build():
        return aiovec.VecEnv([CounterEnv] * 4, num_workers=4)

    build().close()  # the zygote and the loop library's set-up: not leaks
    started = time.monotonic()
    build().close()
    duration = time.monotonic() - started
    before = descriptors()
    random.seed(SEED)
    interrupted = 0
    for _ in range(20):
        venv = None
        kill = lambda: os.kill(os.getpid(), signal.SIGINT)
        timer = threading.Timer(random.uniform(0, duration * 1.2), kill)
        try:
            timer.start()  # it may fire before start() returns
            venv = build()
            time.sleep(duration * 1.5)  # the interrupt lands here, if not before
        except KeyboardInterrupt:
            interrupted += 1
        timer.join()
        if venv is not None:
            venv.close()
        del venv
    deadline = time.monotonic() + 5
    left = set(descriptors().items()) - set(before.items())
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = set(descriptors().items()) - set(before.items())
    print("interrupted", interrupted, "left", sorted(left))
    """
)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("seed", [1, 2])
def test_ctrl_c_anywhere_in_construction_leaves_no_descriptors(seed):
    """A Ctrl-C landing at any moment of building a vector env leaves no worker's pidfd
    and no shared-memory descriptor open (they pin the workers' memory)."""
    result = run_python(CTRL_C_DURING_CONSTRUCTION.replace("SEED", str(seed)), timeout=150)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "left []" in result.stdout, result.stdout
