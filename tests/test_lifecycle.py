"""Construction, errors, closing, and what is left behind (nothing)."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import weakref
from functools import partial

import gymnasium as gym
import numpy as np
import pytest

import aiovec
from tests.conftest import pid_alive, worker_pids
from tests.envs import CounterEnv, SpacesEnv
from tests.faulty import FaultyEnv
from tests.helpers import run_python, start_agent, workers


class RaisingEnv(CounterEnv):
    """Raises on its ``fail_at``-th step."""

    def __init__(self, env_index: int = 0, fail_at: int = 2) -> None:
        super().__init__(env_index)
        self.fail_at = fail_at

    def step(self, action):
        if self.count + 1 == self.fail_at:
            raise ValueError(f"boom at step {self.fail_at}")
        return super().step(action)


class ExitingEnv(CounterEnv):
    def step(self, action):
        os._exit(3)


def failing_factory():
    raise RuntimeError("simulator licence not found")


def test_close_is_idempotent_and_leaves_nothing(backend, no_leaks):
    venv = aiovec.make("CartPole-v1", 4, backend=backend, **workers(backend, 2))
    pids = worker_pids(venv)
    assert len(pids) == (2 if backend == "process" else 0)
    venv.reset(seed=0)
    venv.step(np.zeros(4, dtype=np.int64))
    venv.close()
    venv.close()
    assert venv.closed
    assert not any(pid_alive(pid) for pid in pids)
    for call in (venv.reset, lambda: venv.step([0] * 4), lambda: venv.send([0] * 4)):
        with pytest.raises(aiovec.ClosedError, match="closed"):
            call()
    with pytest.raises(gym.error.ClosedEnvironmentError):  # what gymnasium users catch
        venv.call("render")


async def test_async_context_manager_closes(no_leaks):
    async with aiovec.make("CartPole-v1", 2, backend="process") as venv:
        await venv.areset()
        pids = worker_pids(venv)
    assert venv.closed
    assert not any(pid_alive(pid) for pid in pids)
    with pytest.raises(aiovec.ClosedError):
        await venv.recv()


class _HangingCloseEnv(CounterEnv):
    """An env whose close() does not return (a simulator that never answers)."""

    def close(self):
        time.sleep(3600)


async def test_aclose_gives_the_loop_turns_while_workers_take_their_time(no_leaks):
    venv = aiovec.VecEnv([_HangingCloseEnv] * 2, num_workers=2, close_timeout=1.5)
    await venv.areset()
    pids = worker_pids(venv)
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.02)
            ticks += 1

    task = asyncio.create_task(ticker())
    await venv.aclose()  # the workers are killed after close_timeout
    task.cancel()
    assert venv.closed and not any(pid_alive(pid) for pid in pids)
    assert ticks >= 5  # (~75 expected: it used to be 0, the loop blocked throughout)


async def test_a_cancelled_aclose_kills_the_workers_at_once(no_leaks):
    # What Ctrl-C under asyncio.run() does to the task awaiting aclose(): the workers
    # are killed and reaped then, not after close_timeout (60 s here).
    venv = aiovec.VecEnv([_HangingCloseEnv] * 2, num_workers=2, close_timeout=60)
    await venv.areset()
    pids = worker_pids(venv)
    closing = asyncio.create_task(venv.aclose())
    await asyncio.sleep(0.3)
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert venv.closed and not any(pid_alive(pid) for pid in pids)


def test_close_while_steps_are_in_flight(no_leaks):
    venv = aiovec.VecEnv([partial(CounterEnv, i, delay=5.0) for i in range(2)], num_workers=2)
    pids = worker_pids(venv)
    venv.reset()
    venv.send([0, 0])
    started = time.monotonic()
    venv.close(timeout=0.2)
    assert time.monotonic() - started < 4.0
    assert not any(pid_alive(pid) for pid in pids)


def test_env_error_names_env_and_carries_traceback(backend):
    env_fns = [partial(CounterEnv, 0), partial(RaisingEnv, 1, fail_at=2), partial(CounterEnv, 2)]
    with aiovec.VecEnv(env_fns, backend=backend) as venv:
        venv.reset()
        venv.step([0, 0, 0])
        with pytest.raises(aiovec.EnvError) as caught:
            venv.step([0, 0, 0])
        error = caught.value
        assert error.env_index == 1 and error.operation == "step"
        assert error.exc_type == "ValueError" and error.exc_message == "boom at step 2"
        assert "raise ValueError" in error.worker_traceback
        assert "env 1 raised ValueError in step(): boom at step 2" in str(error)
        # the other envs were not disturbed
        assert venv.get_attr("count") == (2, 1, 2)


async def test_env_error_in_first_ready_mode_keeps_other_results(backend):
    env_fns = [partial(RaisingEnv, 0, fail_at=1), partial(CounterEnv, 1)]
    async with aiovec.VecEnv(env_fns, backend=backend, **workers(backend, 1)) as venv:
        await venv.areset()
        venv.send([0, 0])
        with pytest.raises(aiovec.EnvError, match="env 0"):
            await venv.recv(min_envs=2)
        batch = await venv.recv()
        assert batch.env_ids.tolist() == [1]


def _aiovec_memory_segments() -> int:
    """This process's open descriptors of aiovec's shared memory."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += "aiovec" in os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass
    return count


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="reads /proc")
@pytest.mark.parametrize("fault", ["raise", "sigkill"])
def test_a_closed_env_whose_errors_were_raised_is_freed_at_once(backend, fault):
    """Errors raised (and caught) leave no reference cycle holding the vector env: once
    closed and dropped, it and its shared memory are gone without waiting for the
    garbage collector."""
    if fault == "sigkill" and backend != "process":
        pytest.skip("only a worker process can be killed")
    env_fns = [partial(FaultyEnv, 0, fault, rate=1.0), partial(CounterEnv, 1)]  # every step
    gc.collect()  # what earlier tests left
    before = _aiovec_memory_segments()
    gc.disable()
    try:
        venv = aiovec.VecEnv(env_fns, backend=backend)
        venv.reset(seed=0)
        for _ in range(3):  # lockstep: the env's error each time, or its worker's crash
            with pytest.raises((aiovec.EnvError, aiovec.WorkerCrashedError)):
                venv.step(np.zeros(2, dtype=np.int64))
        if fault == "sigkill":
            with pytest.raises(aiovec.WorkerCrashedError):
                venv.reset(seed=1)  # a reset's failure (kept on its ticket)

        async def first_ready(venv):
            venv.send(np.zeros(1, dtype=np.int64), [1])
            await venv.recv()
            with pytest.raises((aiovec.EnvError, aiovec.WorkerCrashedError)):
                venv.send(np.zeros(1, dtype=np.int64), [0])
                await venv.recv()

        aiovec.run(first_ready(venv))
        alive = weakref.ref(venv)
        venv.close()
        del venv
        assert alive() is None
        assert _aiovec_memory_segments() == before
    finally:
        gc.enable()


def test_factory_error_names_env(backend):
    env_fns = [partial(CounterEnv, 0), failing_factory]
    with pytest.raises(aiovec.EnvError, match="env 1 raised RuntimeError in make") as caught:
        aiovec.VecEnv(env_fns, backend=backend)
    assert "simulator licence not found" in caught.value.worker_traceback


def test_unpicklable_factory_is_rejected_before_start():
    lock = threading.Lock()

    def factory():
        with lock:
            return CounterEnv()

    with pytest.raises(aiovec.FactoryPicklingError, match="env 0") as caught:
        aiovec.VecEnv([factory])
    assert "backend='inline'" in str(caught.value)
    assert "context='fork'" in str(caught.value)


def test_forked_workers_inherit_factories_that_cannot_be_pickled():
    # As AsyncVectorEnv's under fork: nothing is pickled, the worker has the factory.
    lock = threading.Lock()

    def factory():
        with lock:
            return CounterEnv(7)

    with aiovec.VecEnv([factory] * 2, context="fork") as venv:
        observations, _ = venv.reset(seed=0)
        assert observations[:, 0].tolist() == [7, 7]
        venv.step(np.zeros(2, dtype=np.int64))
        assert venv.get_attr("count") == (1, 1)


@pytest.mark.parametrize("context, level", [(None, 1), ("fork", 7)], ids=["zygote", "fork"])
def test_module_state_changed_at_run_time_reaches_forked_workers_only(monkeypatch, context, level):
    # Documented (README, How workers start): zygote workers import modules afresh.
    from tests import envs

    monkeypatch.setitem(envs.SETTINGS, "level", 7)
    with aiovec.VecEnv([envs.SettingsEnv] * 2, context=context) as venv:
        assert venv.get_attr("level") == (level, level)
    with aiovec.VecEnv([envs.SettingsEnv] * 2, backend="inline") as venv:
        assert venv.get_attr("level") == (7, 7)  # this process's envs always see it


def test_unknown_env_id_is_rejected():
    with pytest.raises(gym.error.Error, match="NotAnEnv"):
        aiovec.make("NotAnEnv-v0", 2)


def test_mismatched_spaces_are_rejected(backend):
    from gymnasium import spaces

    env_fns = [SpacesEnv, partial(SpacesEnv, spaces.Box(0, 1, (4,)))]
    with pytest.raises(RuntimeError, match="env 1 has observation_space"):
        aiovec.VecEnv(env_fns, backend=backend)


@pytest.mark.parametrize(
    "actions, error",
    [
        (np.zeros(3, dtype=np.int64), ValueError),  # wrong batch size
        (np.zeros((2, 1), dtype=np.int64), ValueError),  # wrong shape
        (np.array([0.5, 1.0]), ValueError),  # not whole numbers for a discrete space
        (np.array(["a", "b"]), TypeError),  # not numbers
        (np.array([0, 7]), ValueError),  # outside Discrete(3)
    ],
)
def test_bad_actions_are_rejected_before_anything_changes(backend, actions, error):
    with aiovec.VecEnv([SpacesEnv, SpacesEnv], backend=backend) as venv:
        venv.reset(seed=0)
        with pytest.raises(error, match="actions"):
            venv.step(actions)
        assert venv.get_attr("steps") == (0, 0)
        venv.step(np.array([1, 2]))
        assert venv.get_attr("steps") == (1, 1)


def test_bad_observation_is_reported_not_written(backend):
    class WrongShapeEnv(CounterEnv):
        def step(self, action):
            observation, *rest = super().step(action)
            return np.zeros(5), *rest

    with aiovec.VecEnv([WrongShapeEnv], backend=backend) as venv:
        venv.reset()
        with pytest.raises(aiovec.EnvError, match="observation_space"):
            venv.step([0])


def test_worker_crash_is_reported_with_exit_code():
    env_fns = [partial(CounterEnv, 0), partial(ExitingEnv, 1)]
    with aiovec.VecEnv(env_fns, num_workers=2) as venv:
        venv.reset()
        with pytest.raises(
            aiovec.WorkerCrashedError, match=r"worker 1 hosting envs \[1\].*exit code 3"
        ):
            venv.step([0, 0])
        with pytest.raises(aiovec.WorkerCrashedError):
            venv.step([0, 0])


def test_workers_die_when_the_parent_is_killed(tmp_path):
    before = set(os.listdir("/dev/shm"))
    agent, pids = start_agent(
        tmp_path,
        """
            import sys, time
            import aiovec

            if __name__ == "__main__":
                venv = aiovec.make("CartPole-v1", 4, backend="process", num_workers=2)
                venv.reset()
                pids = [p.pid for p in venv._backend._processes]
                print(" ".join(map(str, pids)), flush=True)
                time.sleep(60)
        """,
    )
    try:
        assert len(pids) == 2 and all(pid_alive(pid) for pid in pids)
        agent.send_signal(signal.SIGKILL)
        agent.wait(10)
        deadline = time.monotonic() + 10
        while any(pid_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(pid_alive(pid) for pid in pids)
        assert set(os.listdir("/dev/shm")) - before == set()
    finally:
        agent.kill()
        agent.wait()


def _wait_gone(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while any(pid_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    return [pid for pid in pids if pid_alive(pid)]


@pytest.mark.parametrize(
    "parent_signal, context",
    [
        (signal.SIGKILL, None),
        (signal.SIGTERM, None),
        # Every start method: a forkserver's workers are not the agent's children, so
        # the kernel's parent-death signal alone would leave them running.
        (signal.SIGKILL, "fork"),
        (signal.SIGKILL, "spawn"),
        (signal.SIGKILL, "forkserver"),
    ],
)
@pytest.mark.parametrize("where", ["step", "constructor"])
def test_workers_die_with_the_agent_while_an_env_is_hung(tmp_path, parent_signal, context, where):
    """Every helper process (workers and whatever starts them) is gone within about a
    second of the agent, even while an env is stuck in its step or its constructor."""
    from aiovec.bench.system import descendant_pids

    agent, _ = start_agent(
        tmp_path,
        f"""
            import time
            import aiovec

            import gymnasium as gym
            import numpy as np

            class HangingEnv(gym.Env):
                observation_space = gym.spaces.Box(-1, 1, (1,))
                action_space = gym.spaces.Discrete(2)

                def __init__(self):
                    if {where == "constructor"!r}:
                        print("", flush=True)
                        while True:
                            pass  # busy, never sleeping: only a signal stops it

                def reset(self, *, seed=None, options=None):
                    return np.zeros(1, dtype=np.float32), {{}}

                def step(self, action):
                    print("", flush=True)
                    while True:
                        pass

            if __name__ == "__main__":
                venv = aiovec.VecEnv([HangingEnv, HangingEnv], num_workers=2, context={context!r})
                venv.reset()
                print("", flush=True)
                venv.step([0, 0])
        """,
    )
    try:
        time.sleep(0.5)  # the envs are inside their step or constructor by now
        helpers = descendant_pids(agent.pid)
        assert len(helpers) >= 2
        agent.send_signal(parent_signal)
        agent.wait(10)
        assert _wait_gone(helpers, 3.0) == []
    finally:
        agent.kill()
        agent.wait()


def test_the_leak_check_sees_descriptors_threads_and_processes():
    """The no_leaks fixture can fail: it sees what a test leaves behind."""

    from tests.conftest import _leftovers, open_descriptors, shm_entries, worker_processes

    before = {
        "/dev/shm segments": shm_entries(),
        "descriptors": open_descriptors(),
        "threads": {thread.name for thread in threading.enumerate()},
        "child processes": worker_processes(),
    }
    read_end, write_end = os.pipe()
    release = threading.Event()
    thread = threading.Thread(target=release.wait, name="left-behind")
    thread.start()
    child = subprocess.Popen(["sleep", "30"])
    try:
        leftovers = _leftovers(before)
        assert {"descriptors", "threads", "child processes"} <= set(leftovers)
        assert "left-behind" in leftovers["threads"]
        assert child.pid in leftovers["child processes"]
    finally:
        release.set()
        thread.join()
        child.kill()
        child.wait()
        os.close(read_end)
        os.close(write_end)


def _child_answer(queue) -> None:
    queue.put(42)


class ProcessStartingEnv(CounterEnv):
    """Starts a multiprocessing child in each step (a simulator launched that way)."""

    def step(self, action):
        import multiprocessing

        context = multiprocessing.get_context("fork")
        queue = context.Queue()
        child = context.Process(target=_child_answer, args=(queue,))
        child.start()
        answer = queue.get(timeout=10)
        child.join()
        observation, *rest = super().step(action)
        return observation * 0 + answer, *rest


@pytest.mark.parametrize("context", [None, "fork"])
def test_daemon_false_lets_envs_start_processes_as_in_async_vector_env(context):
    with aiovec.VecEnv([ProcessStartingEnv] * 2, context=context, daemon=False) as venv:
        venv.reset(seed=0)
        observations, *_ = venv.step(np.zeros(2, dtype=np.int64))
    assert observations.tolist() == [[42, 42], [42, 42]]


def test_daemonic_multiprocessing_workers_refuse_children_as_gymnasiums_do():
    with aiovec.VecEnv([ProcessStartingEnv] * 2, context="fork") as venv:
        venv.reset(seed=0)
        with pytest.raises(AssertionError, match="daemonic processes are not allowed"):
            venv.step(np.zeros(2, dtype=np.int64))


DAEMON_FALSE_EXIT_SCRIPT = """
import aiovec
from tests.envs import CounterEnv
venv = aiovec.VecEnv([CounterEnv] * 2, context="fork", daemon=False)
venv.reset()
print("leaving without close")
"""


def test_daemon_false_workers_never_hold_up_the_agents_exit():
    # multiprocessing joins non-daemonic children at exit: workers waiting for commands
    # would hang it. They stay daemonic to the agent; daemon=False acts in the worker.
    result = run_python(DAEMON_FALSE_EXIT_SCRIPT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "leaving without close"


@pytest.mark.parametrize("copier", ["pickle", "copy", "deepcopy"])
def test_a_vec_env_cannot_be_pickled_or_copied_and_says_why(copier):
    import copy
    import pickle

    copiers = {"pickle": pickle.dumps, "copy": copy.copy, "deepcopy": copy.deepcopy}
    with aiovec.VecEnv([CounterEnv] * 2, backend="inline") as venv:
        venv.reset(seed=0)
        with pytest.raises(TypeError, match="cannot be pickled or copied: it owns worker"):
            copiers[copier](venv)
        venv.step(np.zeros(2, dtype=np.int64))  # still usable


def test_a_forked_child_cannot_drive_the_parents_workers_but_may_close_its_copy():
    """Both processes driving the same workers would each wait for replies the other
    took (a hang): the child gets a clear error, the parent's envs are untouched."""
    import multiprocessing

    def child(venv, answers):
        try:
            venv.step([0, 0])
            answers.send("stepped")
        except RuntimeError as error:
            answers.send(str(error))
        venv.close()  # drops the inherited descriptors only

    with aiovec.VecEnv([partial(CounterEnv, 0), partial(CounterEnv, 1)], num_workers=2) as venv:
        venv.reset()
        receiver, sender = multiprocessing.Pipe(duplex=False)
        process = multiprocessing.get_context("fork").Process(target=child, args=(venv, sender))
        process.start()
        answer = receiver.recv() if receiver.poll(30) else "no answer"
        process.join(30)
        assert "a forked child" in answer and "cannot use them" in answer
        assert process.exitcode == 0
        observations, *_ = venv.step([0, 0])
        assert observations[:, 1].tolist() == [1, 1]  # the child stepped nothing


def test_running_out_of_file_descriptors_says_so(tmp_path):
    """A worker's pidfd lost to the descriptor limit is an OSError(EMFILE) saying what
    to change, not an unpacking error; nothing is left behind and later envs work."""
    script = tmp_path / "agent.py"
    script.write_text(
        textwrap.dedent(
            """
            import resource
            import aiovec
            from tests.envs import CounterEnv

            if __name__ == "__main__":
                resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
                try:
                    aiovec.VecEnv([CounterEnv] * 60, num_workers=60)
                except OSError as error:
                    print("error:", error)
                with aiovec.VecEnv([CounterEnv] * 2, num_workers=2) as venv:
                    venv.reset()
                    print("then:", venv.step([0, 0])[0][:, 1].tolist())
            """
        )
    )
    result = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "error: [Errno 24]" in result.stdout and "ulimit -n" in result.stdout, result.stdout
    assert "then: [1.0, 1.0]" in result.stdout


def _shared_mappings() -> int:
    """How many of this process's mappings are aiovec's shared regions."""
    with open("/proc/self/maps") as maps:
        return sum("/memfd:aiovec" in line for line in maps)


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="memfd regions: Linux")
def test_close_frees_the_shared_memory_while_the_closed_env_lives():
    """close() unmaps the shared region (it may be hundreds of MB of observations) even
    though the closed vector env is still referenced; a zero-copy observation kept by
    the caller keeps its memory valid until it is dropped."""
    before = _shared_mappings()
    venv = aiovec.make("CartPole-v1", 4, backend="process", num_workers=2)
    venv.reset(seed=0)
    venv.step(np.zeros(4, dtype=np.int64))
    assert _shared_mappings() > before
    venv.close()
    assert _shared_mappings() == before  # venv is alive: only its memory went

    venv = aiovec.make("CartPole-v1", 2, backend="process", copy=False)
    observations, _ = venv.reset(seed=0)
    venv.close()
    assert observations.sum() == observations.sum()  # still readable after close
    del observations
    assert _shared_mappings() == before


@pytest.mark.parametrize(
    "backend, how",
    [
        ("process", "sync"),
        ("process", "async"),
        ("inline", "sync"),
        ("inline", "async"),  # send() steps inline envs itself: it raises
        ("coroutine", "sync"),
        ("coroutine", "sync, blocking envs"),  # the handler runs inside an env's step
        ("coroutine", "async"),
    ],
)
def test_close_from_a_signal_handler_ends_the_call_that_waits_with_closed_error(backend, how):
    """A SIGTERM handler calling close() (a preempted cluster job) while the main thread
    waits in step() or an awaited recv(): the wait ends with ClosedError (it hung on an
    event loop blocked in select(), and the inline backend's step failed inside), and
    every env is closed."""
    source = f"""
import asyncio, signal, time
from functools import partial
import numpy as np
import aiovec
from tests.async_envs import AsyncCounterEnv
from tests.envs import CounterEnv

blocking = {backend!r} != "coroutine" or "blocking" in {how!r}
env_class = CounterEnv if blocking else AsyncCounterEnv
venv = aiovec.VecEnv([partial(env_class, i, delay=1.0) for i in range(2)], backend={backend!r})
venv.reset(seed=0)
signal.signal(signal.SIGALRM, lambda *_: venv.close())
signal.setitimer(signal.ITIMER_REAL, 0.3)
started = time.monotonic()
try:
    if {how!r}.startswith("sync"):
        venv.step(np.zeros(2, dtype=np.int64))
    else:
        async def main():
            venv.send(np.zeros(2, dtype=np.int64))
            return await venv.recv(min_envs=2)
        asyncio.run(main())
    print("returned")
except aiovec.ClosedError as exc:
    print("ClosedError", venv.closed, round(time.monotonic() - started))
"""
    result = run_python(source, timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[:2] == ["ClosedError", "True"], (result.stdout, result.stderr)


@pytest.mark.parametrize("backend", ["process", "inline", "coroutine"])
@pytest.mark.parametrize("calls", ["step", "step_async/step_wait", "reset", "call"])
def test_close_from_a_signal_handler_landing_anywhere_in_a_call_is_closed_error(backend, calls):
    """A handler's close() lands at a random point of a run of calls, aiovec's own code
    included (assembling results, preparing a command): the call in progress ends
    with ClosedError, never an internal error, and every env is closed once."""
    source = f"""
import random, signal
from functools import partial
import numpy as np
import aiovec
from tests.async_envs import AsyncCounterEnv
from tests.envs import CounterEnv

class Counted(AsyncCounterEnv if {backend!r} == "coroutine" else CounterEnv):
    def get_count(self):
        return self.count

random.seed(7)
outcomes = []
for _ in range(12):
    venv = aiovec.VecEnv([partial(Counted, i) for i in range(3)], backend={backend!r})
    venv.reset(seed=0)
    signal.signal(signal.SIGALRM, lambda *_: venv.close())
    signal.setitimer(signal.ITIMER_REAL, random.uniform(0.0005, 0.02))
    actions = np.zeros(3, dtype=np.int64)
    try:
        while True:
            if {calls!r} == "step":
                venv.step(actions)
            elif {calls!r} == "reset":
                venv.reset()
            elif {calls!r} == "call":
                venv.call("get_count")
            else:
                venv.step_async(actions)
                venv.step_wait()
    except aiovec.ClosedError:
        outcomes.append("ClosedError" if venv.closed else "not closed")
    except Exception as exc:
        outcomes.append(f"{{type(exc).__name__}}: {{exc}}")
    signal.setitimer(signal.ITIMER_REAL, 0)
print(sorted(set(outcomes)))
"""
    result = run_python(source, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['ClosedError']", (result.stdout, result.stderr)


def test_every_descriptor_limit_failure_at_construction_says_what_to_do():
    """Whichever descriptor the limit hits first while a vector env starts (the shared
    region's mapping, a pipe of the zygote, a socket pair, a pidfd), the error says what
    to change (a bare "Too many open files" came from the mapping)."""
    source = textwrap.dedent(
        """
        import resource
        import aiovec
        from tests.envs import CounterEnv

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        for limit in range(8, 48):
            resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
            try:
                aiovec.VecEnv([CounterEnv] * 32, num_workers=4).close()
            except OSError as error:
                said = "hint" if "ulimit -n" in str(error) else repr(error)
                print("limit", limit, "errno", error.errno, said)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        with aiovec.VecEnv([CounterEnv] * 2, num_workers=2) as venv:
            venv.reset()
            print("then:", venv.step([0, 0])[0][:, 1].tolist())
        """
    )
    result = run_python(source, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    failures = [line for line in result.stdout.splitlines() if line.startswith("limit")]
    assert failures, result.stdout  # the low limits do fail
    assert all(line.endswith("errno 24 hint") for line in failures), result.stdout
    assert "then: [1.0, 1.0]" in result.stdout
