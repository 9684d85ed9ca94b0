"""Gymnasium-style code runs unchanged: scripts without a ``__main__`` guard, code from
``python -c`` or stdin, envs registered in the main module."""

from __future__ import annotations

import builtins
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from functools import partial

import numpy as np
import pytest

from tests.envs import CounterEnv
from tests.helpers import MAIN_MODULE_WALKER

UNGUARDED = MAIN_MODULE_WALKER + textwrap.dedent(
    """
    venv = aiovec.make("CartPole-v1", 64)  # auto: probes, then may start workers
    venv.reset(seed=0)
    venv.step(venv.action_space.sample())
    venv.close()
    with aiovec.make("MainModuleWalker-v0", 4, backend="process", num_workers=2) as venv:
        venv.reset(seed=0)
        observations, *_ = venv.step(np.ones(4, dtype=np.int64))
        print("walker", observations[:, 0].tolist())
    with aiovec.make("MainModuleWalkerByName-v0", 2, backend="process") as venv:
        venv.reset(seed=0)
        print("by name", venv.step(np.ones(2, dtype=np.int64))[0][:, 0].tolist())
    with aiovec.VecEnv([lambda: Walker() for _ in range(3)], num_workers=3) as venv:
        venv.reset()
        print("factories", venv.step(np.zeros(3, dtype=np.int64))[0][:, 0].tolist())
    """
)


def _run(args: list[str], tmp_path, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=90,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )


@pytest.mark.parametrize("how", ["file", "-c", "stdin"])
def test_unguarded_script_starts_workers(tmp_path, how):
    if how == "file":
        script = tmp_path / "train.py"
        script.write_text(UNGUARDED)
        result = _run([str(script)], tmp_path)
    elif how == "-c":
        result = _run(["-c", UNGUARDED], tmp_path)
    else:
        result = _run(["-"], tmp_path, stdin=UNGUARDED)
    assert result.returncode == 0, result.stderr
    assert "walker [1.0, 1.0, 1.0, 1.0]" in result.stdout
    assert "factories [-1.0, -1.0, -1.0]" in result.stdout
    assert "by name [1.0, 1.0]" in result.stdout


def test_stdin_with_spawn_context_gets_a_clear_error(tmp_path):
    source = (
        "import aiovec\n"
        "try:\n"
        "    aiovec.make('CartPole-v1', 2, backend='process', context='spawn')\n"
        "except RuntimeError as error:\n"
        "    print(error)\n"
    )
    result = _run(["-"], tmp_path, stdin=source)
    assert "cannot re-import the main module" in result.stdout, result.stderr


def test_unknown_context_is_refused():
    import aiovec

    with pytest.raises(ValueError, match="context must be one of"):
        aiovec.VecEnv([lambda: None], context="threads")


# --- Gymnasium's exception contract ------------------------------------------------------


class _ValueErrorEnv(__import__("tests.envs", fromlist=["CounterEnv"]).CounterEnv):
    def step(self, action):
        raise ValueError(f"bad action {action}")


def test_an_env_exception_is_caught_by_its_own_class(backend):
    import aiovec

    with aiovec.VecEnv([_ValueErrorEnv, _ValueErrorEnv], backend=backend) as venv:
        venv.reset()
        with pytest.raises(ValueError, match="bad action 1") as caught:
            venv.step([1, 1])
        assert isinstance(caught.value, aiovec.EnvError)
        assert caught.value.env_index == 0
        assert "in step" in caught.value.worker_traceback


class _RetryableError(RuntimeError):
    """Sets an attribute of its own in ``__init__``, as many libraries' errors do."""

    def __init__(self, message, retryable=True):
        super().__init__(message)
        self.retryable = retryable
        self.handle = __import__("threading").Lock()  # cannot travel: left out
        self.frame = np.zeros(300_000)  # 2.4 MB: over the limit, left out alone


class _AttributeErrorEnv(__import__("tests.envs", fromlist=["CounterEnv"]).CounterEnv):
    def step(self, action):
        if action:
            import subprocess

            raise subprocess.CalledProcessError(3, ["sim", "--fast"], output=b"log")
        raise _RetryableError("solver diverged")


def test_an_env_exceptions_own_attributes_reach_the_caller(backend):
    """Gymnasium re-creates the env's exception, so what its ``__init__`` sets is
    there (``CalledProcessError.returncode``, a library's ``retryable``); aiovec's
    EnvError of that class carries the attributes that can travel, its own kept."""
    import copy
    import pickle
    import subprocess

    import aiovec

    with aiovec.VecEnv([_AttributeErrorEnv] * 2, backend=backend) as venv:
        venv.reset()
        with pytest.raises(_RetryableError) as caught:
            venv.step([0, 0])
        assert caught.value.retryable is True and not hasattr(caught.value, "handle")
        assert not hasattr(caught.value, "frame")  # too big; the others still came
        assert caught.value.env_index == 0 and "solver diverged" in str(caught.value)
        for copied in (pickle.loads(pickle.dumps(caught.value)), copy.deepcopy(caught.value)):
            assert isinstance(copied, _RetryableError) and copied.retryable is True
        venv.reset()
        with pytest.raises(subprocess.CalledProcessError) as failed:
            venv.step([1, 1])
        assert (failed.value.returncode, failed.value.cmd) == (3, ["sim", "--fast"])
        assert failed.value.output == b"log" and failed.value.env_index == 0


class _LockInMetadataEnv(__import__("tests.envs", fromlist=["CounterEnv"]).CounterEnv):
    metadata = {"render_modes": ["ansi"], "render_fps": 4, "lock": __import__("threading").Lock()}


def test_an_env_whose_metadata_cannot_travel_still_starts(backend):
    """Gymnasium reads metadata in the caller's process; aiovec's workers send it, and a
    value that cannot be pickled (a lock) killed the worker as it started. The entries
    that can travel make ``metadata``; the env works."""
    import aiovec

    with aiovec.VecEnv([_LockInMetadataEnv] * 2, backend=backend) as venv:
        assert venv.metadata["render_fps"] == 4 and venv.metadata["render_modes"] == ["ansi"]
        venv.reset(seed=0)
        assert venv.step([0, 0])[0].tolist() == [[0, 1], [0, 1]]


def test_close_extras_called_directly_closes_the_env(backend):
    """Gymnasium's ``close()`` calls ``close_extras()`` and then marks the env closed;
    code calling ``close_extras()`` itself got aiovec's internals (WorkerGone,
    AttributeError) from later calls: it is a whole close now, later calls ClosedError."""
    import aiovec

    with aiovec.VecEnv([_LockInMetadataEnv] * 2, backend=backend) as venv:
        venv.reset(seed=0)
        venv.close_extras()
        assert venv.closed
        for call in (venv.reset, lambda: venv.step([0, 0]), lambda: venv.get_attr("spec")):
            with pytest.raises(aiovec.ClosedError):
                call()


class _PickyError(Exception):
    """An exception class whose ``__new__`` needs its arguments, as ExceptionGroup's."""

    def __new__(cls, code, detail):
        return super().__new__(cls, code, detail)


class _UnprintableError(Exception):
    def __str__(self):
        raise RuntimeError("__str__ exploded")


class _Sealed(Exception):
    def __init_subclass__(cls, **kwargs):
        raise RuntimeError("no subclasses")


class _NewReturnsAnother(Exception):
    def __new__(cls, *args):
        return ValueError("another object")


class _UnusualErrorEnv(__import__("tests.envs", fromlist=["CounterEnv"]).CounterEnv):
    fault = None  # set by the test: which exception the next step raises

    def step(self, action):
        if self.fault == "group":  # Python 3.11+ (the test skips it before)
            raise builtins.ExceptionGroup("the simulator failed", [ValueError("bad")])
        if self.fault == "picky":
            raise _PickyError(7, "no")
        if self.fault == "stop":
            raise StopIteration("the replay ran out")
        if self.fault == "unprintable":
            raise _UnprintableError()
        if self.fault == "sealed":
            raise _Sealed("sealed")
        if self.fault == "new-returns-another":
            raise Exception.__new__(_NewReturnsAnother)  # made without its own __new__
        if self.fault == "task-group":  # what asyncio.TaskGroup raises for a Ctrl-C inside
            raise builtins.BaseExceptionGroup("tasks failed", [KeyboardInterrupt()])
        return super().step(action)


@pytest.mark.parametrize(
    ("fault", "exc_type", "caught_as"),
    [
        ("group", "ExceptionGroup", Exception),
        ("picky", "_PickyError", _PickyError),
        # An EnvError alone: Python turns a StopIteration raised in a coroutine into
        # a RuntimeError (a documented difference).
        ("stop", "StopIteration", Exception),
        ("unprintable", "_UnprintableError", _UnprintableError),
        ("sealed", "_Sealed", Exception),  # a class that refuses subclasses: EnvError alone
        ("new-returns-another", "_NewReturnsAnother", Exception),
        ("task-group", "BaseExceptionGroup", Exception),
    ],
)
def test_any_exception_an_env_raises_is_its_envs_error_and_the_envs_go_on(
    backend, fault, exc_type, caught_as
):
    # Whatever the class (one whose __new__ needs arguments, a StopIteration crossing
    # aiovec's generators), the error names the env, and the vector env goes on.
    import aiovec

    if fault in ("group", "task-group") and not hasattr(builtins, "ExceptionGroup"):
        pytest.skip("ExceptionGroup is Python 3.11's")
    if fault == "task-group" and backend != "process":
        pytest.skip("in the agent's process a KeyboardInterrupt is the user's Ctrl-C")

    with aiovec.VecEnv([_UnusualErrorEnv, _UnusualErrorEnv], backend=backend) as venv:
        venv.reset()
        venv.set_attr("fault", [fault, None])
        with pytest.raises(caught_as) as caught:
            venv.step(np.array([0, 0]))
        assert isinstance(caught.value, aiovec.EnvError)
        assert not isinstance(caught.value, (RuntimeError, StopIteration))
        assert (caught.value.env_index, caught.value.exc_type) == (0, exc_type)
        venv.set_attr("fault", None)
        observations, *_ = venv.step(np.array([0, 0]))
        assert observations[:, 1].tolist() == [1, 2]  # env 0 was not counted in its failed step


class _RaisesOnPositiveEnv(__import__("tests.envs", fromlist=["CounterEnv"]).CounterEnv):
    """Raises in reset for seed 1 and in step for actions >= 1, as Gymnasium's own test."""

    def reset(self, *, seed=None, options=None):
        if seed == 1:
            raise ValueError("Error in reset")
        return super().reset(seed=seed, options=options)

    def step(self, action):
        if action >= 1:
            raise ValueError(f"Error in step with {action}")
        return super().step(action)


def _messages(caught) -> list[str]:
    return [str(warning.message) for warning in caught]


def test_a_failed_reset_is_logged_as_gymnasium_logs_it(backend):
    import warnings

    import aiovec

    with aiovec.VecEnv([_RaisesOnPositiveEnv] * 2, backend=backend) as venv:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            venv.reset(seed=[0, 0])
        assert _messages(caught) == []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(ValueError, match="Error in reset"):
                venv.reset(seed=[1, 0])
    messages = _messages(caught)
    assert len(messages) == 3, messages
    assert "Received the following error from Worker-0 - Shutting it down" in messages[0]
    assert 'raise ValueError("Error in reset")\nValueError: Error in reset' in messages[1]
    assert messages[2] == (
        "\x1b[31mERROR: Raising the last exception back to the main process.\x1b[0m"
    )


class _PercentInTracebackEnv(__import__("tests.envs", fromlist=["CounterEnv"]).CounterEnv):
    def step(self, action):
        raise ValueError("step %d failed" % action)  # noqa: UP031  # a % in the traceback


def test_a_percent_sign_in_the_logged_traceback_does_not_replace_the_envs_error(backend):
    # gymnasium.logger.error formats its message with %: a traceback logged as the
    # message itself raised TypeError (not enough arguments) instead of the env's error.
    import warnings

    import aiovec

    with aiovec.VecEnv([_PercentInTracebackEnv] * 2, backend=backend) as venv:
        venv.reset(seed=0)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(ValueError, match="step 1 failed"):
                venv.step([1, 1])
    messages = _messages(caught)
    assert 'raise ValueError("step %d failed" % action)' in messages[1]
    assert "Raising the last exception back to the main process." in messages[-1]


@pytest.mark.parametrize("api", ["step", "astep", "step_async"])
def test_every_env_failing_in_a_step_is_logged_and_the_raised_one_last(api):
    import asyncio
    import warnings

    import aiovec

    with aiovec.VecEnv([_RaisesOnPositiveEnv] * 3, backend="process") as venv:
        venv.reset(seed=[0, 0, 0])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(ValueError, match="Error in step with") as raised:
                if api == "step":
                    venv.step([0, 1, 1])
                elif api == "astep":
                    asyncio.run(venv.astep([0, 1, 1]))
                else:
                    venv.step_async([0, 1, 1])
                    venv.step_wait()
    messages = _messages(caught)
    assert len(messages) == 5, messages
    logged = [int(m.split("Worker-")[1].split(" ")[0]) for m in messages[0:4:2]]
    assert sorted(logged) == [1, 2]
    assert logged[-1] == raised.value.env_index  # the exception raised is the last logged
    assert "Error in step with 1" in messages[3]
    assert "Raising the last exception back to the main process." in messages[4]


def test_a_crash_raised_with_env_errors_logs_them_without_claiming_it_raises_them():
    import warnings

    from aiovec._results import log_failures
    from aiovec.errors import EnvError, WorkerCrashedError

    crash = WorkerCrashedError(0, [0], -9)
    env_error = EnvError.create(1, "step", "ValueError", "bad", "Traceback ...\n", "builtins")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        log_failures([crash, env_error], crash)
    messages = _messages(caught)
    assert len(messages) == 2 and "Worker-1" in messages[0], messages
    assert not [m for m in messages if "Raising the last exception" in m]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        log_failures([crash], crash)
    assert _messages(caught) == []


def test_errors_that_are_not_raised_are_not_logged():
    import warnings

    import aiovec

    with aiovec.VecEnv([_RaisesOnPositiveEnv] * 2, on_failure="restart") as venv:
        venv.reset(seed=[0, 0])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _, _, _, truncations, infos = venv.step([1, 0])
    assert truncations.tolist() == [True, False] and infos["restarted"][0]
    assert not [m for m in _messages(caught) if "Worker-" in m]


def test_timeouts_are_multiprocessing_timeout_errors():
    import multiprocessing
    from functools import partial

    import aiovec
    from tests.envs import CounterEnv

    with aiovec.VecEnv([partial(CounterEnv, 0, delay=0.5)], backend="process") as venv:
        venv.reset()
        venv.step_async([0])
        with pytest.raises(multiprocessing.TimeoutError) as caught:
            venv.step_wait(timeout=0.01)
        assert isinstance(caught.value, TimeoutError)
        assert isinstance(caught.value, aiovec.WaitTimeoutError)


class _Interrupted(Exception):
    """What a signal handler raises (a timeout decorator's, say)."""


@contextlib.contextmanager
def _interrupt_after(seconds):
    """Raise ``_Interrupted`` in the main thread after ``seconds``, from a signal handler
    (SIGUSR1: pytest-timeout may hold SIGALRM)."""

    def handler(signum, frame):
        raise _Interrupted

    previous = signal.signal(signal.SIGUSR1, handler)
    timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGUSR1))
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        timer.join()
        signal.signal(signal.SIGUSR1, previous)


class _SlowCallsEnv(CounterEnv):
    """CounterEnv whose steps, resets and ``pause`` calls take ``delay`` seconds."""

    def reset(self, *, seed=None, options=None):
        time.sleep(self.delay)
        return super().reset(seed=seed, options=options)

    def pause(self):
        time.sleep(self.delay)
        return self.env_index


_INTERRUPTED_CALLS = {
    "step": lambda venv: venv.step(np.zeros(2, dtype=np.int64)),
    "step_async": lambda venv: (venv.step_async(np.zeros(2, dtype=np.int64)), venv.step_wait()),
    "reset": lambda venv: venv.reset(seed=1),
    "call": lambda venv: venv.call("pause"),
}


def _slow_calls_envs():
    import aiovec

    return aiovec.VecEnv([partial(_SlowCallsEnv, 0, delay=0.4)] * 2, num_workers=2)


def _interrupt(venv, call):
    """``call`` on ``venv``, ended 0.1 s in by a signal handler's exception."""
    with pytest.raises(_Interrupted), _interrupt_after(0.1):
        _INTERRUPTED_CALLS[call](venv)


@pytest.mark.parametrize("how", ["step", "step_async"])
def test_a_step_whose_wait_a_signal_handler_interrupts_stays_pending(how):
    # AsyncVectorEnv's step is step_async + step_wait: interrupted, the step stays
    # pending, step_wait returns it, and the env goes on. It used to be forgotten while
    # in flight: step_wait said nothing was pending, step and reset raised EnvBusyError.
    with _slow_calls_envs() as venv:
        venv.reset(seed=0)
        _interrupt(venv, how)
        _, rewards, *_ = venv.step_wait()
        assert rewards.tolist() == [1.0, 1.0]  # that step's results
        _, rewards, *_ = venv.step(np.zeros(2, dtype=np.int64))
        assert rewards.tolist() == [2.0, 2.0]


@pytest.mark.parametrize("call", ["step", "reset", "call"])
def test_the_next_call_drops_a_call_whose_wait_a_signal_handler_interrupted(call):
    with _slow_calls_envs() as venv:
        venv.reset(seed=0)
        _interrupt(venv, call)
        # As after a *_wait timeout: a call now waits for the late one, drops it, goes on.
        observations, _ = venv.reset(seed=2)
        assert observations[:, 1].tolist() == [0.0, 0.0]
        assert venv.call("pause") == (0, 0)
        _, rewards, *_ = venv.step(np.zeros(2, dtype=np.int64))
        assert rewards.tolist() == [1.0, 1.0]


@pytest.mark.parametrize("call", ["reset", "call"])
def test_a_reset_or_call_whose_wait_a_signal_handler_interrupted_is_its_waits(call):
    with _slow_calls_envs() as venv:
        venv.reset(seed=0)
        _interrupt(venv, call)
        if call == "reset":
            observations, _ = venv.reset_wait()
            assert observations[:, 1].tolist() == [0.0, 0.0]
        else:
            assert venv.call_wait() == (0, 0)


def test_pending_call_errors_are_gymnasiums(backend):
    from gymnasium.error import AlreadyPendingCallError, NoAsyncCallError

    import aiovec
    from tests.envs import CounterEnv

    with aiovec.VecEnv([CounterEnv, CounterEnv], backend=backend) as venv:
        with pytest.raises(NoAsyncCallError):
            venv.step_wait()
        venv.reset_async()
        with pytest.raises(AlreadyPendingCallError, match="pending call to `reset`"):
            venv.step_async([0, 0])
        venv.reset_wait()
        venv.step_async([0, 0])
        with pytest.raises(AlreadyPendingCallError):
            venv.reset_async()
        with pytest.warns(UserWarning, match="pending call to `step`"):
            venv.close()


# --- max_concurrency, and multiprocessing objects captured by factories ----------------


@pytest.mark.parametrize("value", [2.5, "2", 2.0, True])
def test_max_concurrency_must_be_an_integer(value):
    import aiovec
    from tests.envs import CounterEnv

    with pytest.raises(ValueError, match="`max_concurrency` must be an integer or None"):
        aiovec.VecEnv([CounterEnv] * 2, max_concurrency=value)


@pytest.mark.parametrize("value", [0, -1])
def test_max_concurrency_must_be_positive(value):
    import aiovec
    from tests.envs import CounterEnv

    with pytest.raises(ValueError, match="`max_concurrency` must be a positive or None"):
        aiovec.VecEnv([CounterEnv] * 2, max_concurrency=value)


class _CountingEnv(__import__("tests.envs", fromlist=["CounterEnv"]).CounterEnv):
    """Counts the steps running at once in a Manager's shared values."""

    def __init__(self, env_index, active, peak, lock):
        super().__init__(env_index)
        self.active, self.peak, self.lock = active, peak, lock

    def step(self, action):
        import time

        with self.lock:
            self.active.value += 1
            self.peak.value = max(self.peak.value, self.active.value)
        time.sleep(0.02)
        with self.lock:
            self.active.value -= 1
        return super().step(action)


@pytest.mark.parametrize("limit", [1, 2])
def test_max_concurrency_caps_the_envs_running_at_once(limit):
    """Manager proxies captured by the factories work in the workers (they carry the
    agent's multiprocessing authkey), and no more than ``limit`` envs step at once."""
    import multiprocessing
    from functools import partial

    import numpy as np

    import aiovec

    with multiprocessing.Manager() as manager:
        active, peak, lock = manager.Value("i", 0), manager.Value("i", 0), manager.Lock()
        env_fns = [partial(_CountingEnv, i, active, peak, lock) for i in range(4)]
        with aiovec.VecEnv(env_fns, max_concurrency=limit) as venv:
            venv.reset()
            for _ in range(3):
                venv.step(np.zeros(4, dtype=np.int64))
            assert venv.num_workers == limit
        assert 1 <= peak.value <= limit


# --- AsyncVectorEnv's shared_memory= and worker= -----------------------------------------


class _EvenNumbers(__import__("gymnasium").spaces.Space):
    """A custom space: Gymnasium cannot lay it out in shared memory."""

    def __init__(self):
        super().__init__(shape=(), dtype=None)

    def sample(self, mask=None, probability=None):
        return 2 * int(self.np_random.integers(10))

    def contains(self, x):
        return isinstance(x, int) and x % 2 == 0

    def __eq__(self, other):
        return isinstance(other, _EvenNumbers)


def _custom_space_env():
    from tests.envs import SpacesEnv

    return SpacesEnv(observation_space=_EvenNumbers())


@pytest.mark.parametrize("shared_memory", [None, False])
def test_shared_memory_false_or_absent_sends_custom_spaces_by_value(shared_memory):
    import aiovec

    with aiovec.VecEnv([_custom_space_env] * 2, shared_memory=shared_memory) as venv:
        observations, _ = venv.reset(seed=0)
        assert all(venv.single_observation_space.contains(obs) for obs in observations)


def test_shared_memory_true_refuses_a_custom_space_as_gymnasium_does(no_leaks):
    import aiovec

    with pytest.raises(ValueError, match="shared_memory=False"):
        aiovec.VecEnv([_custom_space_env] * 2, shared_memory=True)


def test_shared_memory_true_refuses_dynamic_shapes_as_gymnasium_does():
    import gymnasium as gym

    import aiovec
    from tests.envs import SpacesEnv

    space = gym.spaces.Dict({"items": gym.spaces.Sequence(gym.spaces.Discrete(3))})
    with pytest.raises(TypeError, match="dynamic shape"):
        aiovec.VecEnv([lambda: SpacesEnv(observation_space=space)] * 2, shared_memory=True)


def test_shared_memory_true_accepts_what_gymnasium_shares():
    import gymnasium as gym

    import aiovec
    from tests.envs import SpacesEnv

    space = gym.spaces.Tuple([gym.spaces.Box(0, 1, (2,)), gym.spaces.Text(4)])
    with aiovec.VecEnv(
        [lambda: SpacesEnv(observation_space=space)] * 2, shared_memory=True
    ) as venv:
        observations, _ = venv.reset(seed=0)
        assert venv.observation_space.contains(observations)


def _seven_argument_worker(index, env_fn, pipe, parent_pipe, shared_memory, error_queue, mode):
    pass


def _eight_argument_worker(
    index, env_fn, pipe, parent_pipe, shared_memory, error_queue, mode, semaphore
):
    pass


def test_custom_worker_with_a_wrong_signature_gets_gymnasiums_error():
    import aiovec
    from tests.envs import CounterEnv

    with pytest.raises(ValueError, match="A custom `worker` must accept 8 arguments"):
        aiovec.VecEnv([CounterEnv] * 2, worker=_seven_argument_worker)


def test_custom_worker_is_refused_before_any_worker_starts(no_leaks):
    import aiovec
    from tests.envs import CounterEnv

    with pytest.raises(ValueError, match="do not run Gymnasium's pipe protocol"):
        aiovec.VecEnv([CounterEnv] * 2, worker=_eight_argument_worker)


@pytest.mark.parametrize("api", ["step", "send"])
def test_stepping_an_ended_env_without_autoreset_is_gymnasiums_assertion_error(backend, api):
    from gymnasium.vector import AutoresetMode

    import aiovec
    from tests.envs import CounterEnv

    class OneStepEnv(CounterEnv):
        def step(self, action):
            observation, reward, _, truncated, info = super().step(action)
            return observation, reward, self.env_index == 1, truncated, info

    env_fns = [partial(OneStepEnv, i) for i in range(2)]
    with aiovec.VecEnv(env_fns, backend=backend, autoreset_mode=AutoresetMode.DISABLED) as venv:
        venv.reset(seed=0)
        _, _, terminations, _, _ = venv.step([0, 0])
        assert terminations.tolist() == [False, True]
        with pytest.raises(AssertionError, match=r"envs \[1\] ended their episode") as caught:
            if api == "step":
                venv.step([0, 0])
            else:
                venv.send([0, 0])
        assert isinstance(caught.value, aiovec.NeedsResetError)
        assert isinstance(caught.value, RuntimeError)  # what aiovec raised before
        assert venv.get_attr("count") == (1, 1)  # nothing was sent
        venv.reset(options={"reset_mask": np.array([False, True])})
        venv.step([0, 0])
        assert venv.get_attr("count") == (2, 1)


@pytest.mark.parametrize("name", ["reset", "step", "close", "_setattr", "_check_spaces"])
def test_call_refuses_the_names_asyncvectorenv_reserves(name, backend):
    """``call("step")`` would step the envs behind the vector env's back (no autoreset,
    no buffers): refused with AsyncVectorEnv's ``ValueError`` and text, nothing sent."""
    import aiovec
    from tests.envs import CounterEnv

    with aiovec.VecEnv([CounterEnv, CounterEnv], backend=backend) as venv:
        venv.reset(seed=0)
        with pytest.raises(
            ValueError, match=rf"Trying to call function `{name}` with `call`, use `{name}`"
        ):
            venv.call(name)
        assert venv.call("count") == (0, 0)  # nothing ran; other names still go through


def test_the_attributes_asyncvectorenv_code_reads_are_there():
    import aiovec
    from tests.envs import CounterEnv

    env_fns = [partial(CounterEnv, 0), partial(CounterEnv, 1)]
    with aiovec.VecEnv(env_fns, shared_memory=False, context="spawn", daemon=False) as venv:
        assert venv.env_fns == env_fns  # e.g. envs.env_fns[0]() builds an evaluation env
        assert venv.env_fns[1]().env_index == 1
        assert venv.shared_memory is False
        assert venv.context == "spawn"
        assert venv.daemon is False
    with aiovec.VecEnv(env_fns, backend="inline") as venv:
        assert venv.shared_memory is True and venv.context is None and venv.daemon is True


def test_an_env_with_gymnasiums_api_need_not_subclass_gymnasium_env(backend):
    """Gymnasium's vector envs step any object with the env API (duck typing)."""
    import gymnasium as gym

    import aiovec
    from tests.envs import DuckEnv

    expected = gym.vector.SyncVectorEnv([DuckEnv] * 2)
    with aiovec.VecEnv([DuckEnv] * 2, backend=backend) as venv:
        for got, want in zip(venv.reset(seed=[1, 2]), expected.reset(seed=[1, 2])):
            np.testing.assert_equal(got, want)
        for step in range(5):
            actions = np.array([step % 2, 1])
            for got, want in zip(venv.step(actions), expected.step(actions)):
                np.testing.assert_equal(got, want)
        assert venv.get_attr("steps") == expected.get_attr("steps")
    expected.close()


@pytest.mark.parametrize(
    "made, named",
    [(lambda: None, "NoneType"), (lambda: (1, 2), "tuple")],
    ids=["None", "tuple"],
)
def test_a_factory_returning_no_env_is_refused_naming_what_it_returned(made, named):
    import aiovec

    with pytest.raises(aiovec.EnvError, match=f"returned {named}, not a gymnasium.Env"):
        aiovec.VecEnv([made, made], backend="inline")


def test_an_env_without_spaces_is_refused_naming_them(backend):
    """A gymnasium.Env subclass that never sets its spaces: a TypeError naming them,
    raised for building the env (it named an "unpickle" that never happened)."""
    import gymnasium as gym

    import aiovec

    class _NoSpaces(gym.Env):
        def reset(self, *, seed=None, options=None):
            return 0, {}

        def step(self, action):
            return 0, 0.0, False, False, {}

    with pytest.raises(
        aiovec.EnvError, match=r"in make\(\).*_NoSpaces has no observation_space, action_space"
    ):
        aiovec.VecEnv([_NoSpaces, _NoSpaces], backend=backend)


def test_a_factory_returning_a_vector_env_is_pointed_to_batched_envs():
    import gymnasium as gym

    import aiovec

    def vector_env():
        return gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2)

    with pytest.raises(aiovec.EnvError, match="envs_per_block"):
        aiovec.VecEnv([vector_env], backend="inline")


@pytest.mark.parametrize("options", ["hard", frozenset({"level-2"})], ids=["str", "set"])
def test_reset_options_that_are_no_dict_reach_every_env_as_given(backend, options):
    """Gymnasium passes any ``options`` value on to each env; aiovec splits only a list
    or tuple (one entry per env: see the differences table)."""
    import gymnasium as gym

    import aiovec
    from tests.envs import OptionsEcho

    expected = gym.vector.SyncVectorEnv([OptionsEcho] * 2)
    with aiovec.VecEnv([OptionsEcho] * 2, backend=backend) as venv:
        _, infos = venv.reset(seed=0, options=options)
        _, expected_infos = expected.reset(seed=0, options=options)
        assert list(infos["options"]) == list(expected_infos["options"]) == [options] * 2
    expected.close()


def test_a_reward_that_is_no_number_is_the_envs_error_naming_it(backend):
    """As in ``SyncVectorEnv``, a reward that is an array fails the env's step (a
    ``ValueError``), with a message that says which value and what it must be."""
    import aiovec
    from tests.envs import ArrayRewardEnv

    with aiovec.VecEnv([ArrayRewardEnv] * 2, backend=backend) as venv:
        venv.reset(seed=0)
        with pytest.raises(ValueError, match=r"reward .*shape \(1,\).*a number") as raised:
            venv.step(np.zeros(2, dtype=np.int64))
        assert isinstance(raised.value, aiovec.EnvError) and raised.value.env_index == 0


# --- AsyncVectorEnv's signature, the agent's argv and source in workers --------------------


def test_asyncvectorenv_positional_arguments_mean_the_same():
    """``AsyncVectorEnv(env_fns, shared_memory, copy, context, daemon, worker,
    observation_mode, autoreset_mode, max_concurrency)``: the same positions."""
    import gymnasium as gym

    import aiovec

    fns = [partial(gym.make, "CartPole-v1")] * 2
    same_step = gym.vector.AutoresetMode.SAME_STEP
    args = (False, False, "spawn", False, None, "same", same_step, 1)
    with aiovec.VecEnv(fns, *args) as venv:
        assert (venv.shared_memory, venv.copy, venv.context, venv.daemon) == args[:4]
        assert venv.observation_mode == "same"
        assert (venv.autoreset_mode, venv.max_concurrency) == (same_step, 1)
        venv.reset(seed=0)
    with pytest.raises(TypeError, match="positional"):
        aiovec.VecEnv(fns, *args, "process")  # aiovec's own options are keywords


ARGV_AND_SOURCE = textwrap.dedent(
    """
    import inspect, sys
    import gymnasium as gym
    import numpy as np
    import aiovec

    class Sim(gym.Env):
        observation_space = gym.spaces.Box(0, 1, (1,), np.float32)
        action_space = gym.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            return np.zeros(1, np.float32), {}

        def step(self, action):
            raise RuntimeError("the simulator diverged")  # the step's line

        def argv(self):
            return sys.argv

        def source(self):
            return inspect.getsource(type(self).step)

    with aiovec.VecEnv([Sim] * 2, num_workers=2) as venv:
        print("argv", venv.call("argv")[0])
        print("source", "the step's line" in venv.call("source")[1])
        venv.reset(seed=0)
        try:
            venv.step(np.zeros(2, np.int64))
        except RuntimeError as error:
            print("traceback", error.worker_traceback)
    """
)


def test_workers_see_the_agents_argv_and_the_source_of_its_main_module(tmp_path):
    """As in AsyncVectorEnv's workers: ``sys.argv`` is the agent's (envs that read flags),
    and code defined in the agent's script keeps its file and lines (tracebacks show
    them; ``inspect.getsource``, which TorchScript needs, works)."""
    script = tmp_path / "train.py"
    script.write_text(ARGV_AND_SOURCE)
    result = _run([str(script), "--level", "7"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"argv [{str(script)!r}, '--level', '7']" in result.stdout
    assert "source True" in result.stdout
    assert f'File "{script}", line 16, in step' in result.stdout
    assert "the step's line" in result.stdout.split("traceback", 1)[1]


def test_code_of_a_notebook_cell_keeps_its_source_in_workers():
    """A notebook's cells live in ``linecache`` under names no other process can read:
    their lines travel with the code defined in them."""
    import linecache

    import aiovec

    filename = "<aiovec-test-cell-1>"
    cell = textwrap.dedent(
        """
        import inspect
        from tests.envs import CounterEnv

        class CellEnv(CounterEnv):
            def source(self):  # defined in a cell
                return inspect.getsource(type(self).source)
        """
    )
    linecache.cache[filename] = (len(cell), None, cell.splitlines(True), filename)
    namespace = {"__name__": "__aiovec_test_cell__"}  # no module to import: by value
    exec(compile(cell, filename, "exec"), namespace)
    try:
        with aiovec.VecEnv([namespace["CellEnv"]], backend="process") as venv:
            assert "# defined in a cell" in venv.call("source")[0]
    finally:
        del linecache.cache[filename]


def test_call_async_forwards_a_keyword_called_name():
    """``call_async(name, /, *args, **kwargs)`` as in Gymnasium: a method's own ``name``
    keyword reaches it."""
    import aiovec
    from tests.envs import CounterEnv

    class Greeter(CounterEnv):
        def greet(self, name):
            return f"hello {name}"

    with aiovec.VecEnv([Greeter] * 2, backend="inline") as venv:
        venv.call_async("greet", name="bob")
        assert venv.call_wait() == ("hello bob", "hello bob")


@pytest.mark.parametrize("in_reset", [False, True], ids=["step", "reset"])
async def test_an_info_that_is_no_dict_is_the_envs_error_and_no_result_is_lost(backend, in_reset):
    """An env returning its info as a list fails that env (a TypeError naming the env
    and what it returned), first-ready or not; the other envs' results of the same batch
    are delivered, and the vector env goes on."""
    import aiovec
    from tests.envs import ListInfoEnv

    fns = [partial(ListInfoEnv, i, at_step=1 if i == 1 else 0) for i in range(4)]
    if in_reset:
        fns[1] = partial(ListInfoEnv, 1, at_step=0, in_reset=True)
    async with aiovec.VecEnv(fns, backend=backend) as venv:
        if in_reset:
            with pytest.raises(TypeError, match=r"info of type list.*dict") as raised:
                await venv.areset(seed=0)
            assert isinstance(raised.value, aiovec.EnvError) and raised.value.env_index == 1
            return
        await venv.areset(seed=0)
        venv.send(np.zeros(4, dtype=np.int64))
        delivered, failed = [], []
        while len(delivered) + len(failed) < 4:
            try:
                batch = await venv.recv()
            except aiovec.EnvError as error:
                assert isinstance(error, TypeError)
                assert "info of type list" in str(error)
                failed.append(error.env_index)
            else:
                delivered += batch.env_ids.tolist()
        assert failed == [1] and sorted(delivered) == [0, 2, 3]
        observations, *_ = await venv.astep(np.zeros(4, dtype=np.int64))
        assert observations.shape[0] == 4


def test_a_dict_action_with_extra_keys_reaches_the_env_with_its_spaces_keys(backend):
    """As Gymnasium's vector envs do, keys a Dict action space does not have (a
    policy's extra outputs) are left out; a missing key is still refused."""
    import aiovec
    from tests.envs import DictActionEnv

    with aiovec.VecEnv([partial(DictActionEnv, i) for i in range(2)], backend=backend) as venv:
        venv.reset(seed=0)
        actions = {"move": np.array([0, 2]), "logits": np.zeros((2, 3))}
        infos = venv.step(actions)[4]
        assert infos["keys"].tolist() == [["move"], ["move"]]
        with pytest.raises(ValueError, match=r"move"):
            venv.step({"logits": np.zeros((2, 3))})


@pytest.mark.parametrize("argv", ["del sys.argv", "sys.argv = None"])
def test_an_agent_without_argv_still_starts_workers(tmp_path, argv):
    """An embedded interpreter may have no ``sys.argv``: workers start all the same."""
    script = textwrap.dedent(
        f"""
        import sys
        {argv}
        import numpy as np
        import aiovec
        from tests.envs import CounterEnv
        with aiovec.VecEnv([CounterEnv] * 2, num_workers=2) as venv:
            venv.reset(seed=0)
            print("stepped", venv.step(np.zeros(2, dtype=np.int64))[1].tolist())
        """
    )
    result = _run(["-c", script], tmp_path)
    assert result.returncode == 0, result.stderr
    assert "stepped [1.0, 1.0]" in result.stdout


def test_same_step_infos_keep_async_vector_envs_key_order():
    """Code that reads ``list(infos)`` (loggers, DictInfoToList) sees AsyncVectorEnv's
    order: the finished episode's info, then its observation, then the reset's keys."""
    import gymnasium as gym
    from gymnasium.vector import AsyncVectorEnv, AutoresetMode

    import aiovec

    def keys(vector_env_class) -> list[list[str]]:
        fns = [lambda: gym.make("Blackjack-v1")] * 2
        envs = vector_env_class(fns, autoreset_mode=AutoresetMode.SAME_STEP)
        try:
            envs.reset(seed=0)
            return [list(envs.step(np.ones(2, dtype=np.int64))[4]) for _ in range(4)]
        finally:
            envs.close()

    expected = keys(AsyncVectorEnv)
    assert any("final_obs" in step for step in expected)  # episodes did end
    assert keys(aiovec.VecEnv) == expected


class _TreeEnv(CounterEnv):
    """Holds a tree whose child points back to its parent."""

    def __init__(self, env_index=0):
        super().__init__(env_index)
        self.tree = {"name": "root", "children": []}
        self.tree["children"].append({"name": "leaf", "parent": self.tree})


def test_values_with_reference_cycles_travel_both_ways_as_pickle_sends_them(backend):
    import aiovec

    with aiovec.VecEnv([_TreeEnv] * 2, backend=backend) as venv:
        trees = venv.get_attr("tree")
        assert trees[0]["children"][0]["parent"] is trees[0]
        looped = {}
        looped["self"] = looped
        venv.set_attr("looped", looped)
        assert all(value["self"] is value for value in venv.get_attr("looped"))


# --- each env owns what it is given, as in AsyncVectorEnv ----------------------------------

ISOLATION_LAYOUTS = [
    pytest.param({"num_workers": 2}, id="2-workers"),
    pytest.param({"num_workers": 1, "concurrent_envs": True}, id="threads"),
    pytest.param({"num_workers": 2, "context": "fork"}, id="fork"),
]
FORK = {"num_workers": 2, "context": "fork"}


def _goals_after_two_steps(venv) -> list[float]:
    venv.step([0] * venv.num_envs)
    observations, *_ = venv.step([0] * venv.num_envs)
    return observations[:, 0].tolist()


@pytest.mark.parametrize("layout", ISOLATION_LAYOUTS)
def test_envs_of_a_worker_never_share_a_value_they_were_given(layout):
    """AsyncVectorEnv gives every env its own copy of what it sends it (each env is in
    a process of its own): an env changing such a value in place changes no other env.
    aiovec's workers host several envs each, and gave them one object: the envs of a
    worker drifted together (goals 3, 4, ... instead of 2)."""
    import aiovec
    from tests.envs import GoalEnv

    goal = np.zeros(2)
    with aiovec.VecEnv([lambda: GoalEnv(goal)] * 4, **layout) as venv:  # a captured value
        venv.reset(seed=0)
        if layout != FORK:  # a fork's envs share what it captured (see the test below)
            assert _goals_after_two_steps(venv) == [2.0] * 4
        venv.set_attr("goal", np.zeros(2))  # one value for every env
        assert _goals_after_two_steps(venv) == [2.0] * 4
        venv.call("set_goal", np.zeros(2))  # a call's arguments
        assert _goals_after_two_steps(venv) == [2.0] * 4
        shared = np.zeros(2)
        venv.set_attr("goal", [shared] * 4)  # one object in every env's place
        assert _goals_after_two_steps(venv) == [2.0] * 4
        venv.reset(options={"level": 3})  # each env pops it from its own dict
        assert venv.get_attr("level") == (3, 3, 3, 3)
        level = {"level": 5}
        venv.reset(options=[level] * 4)
        assert venv.get_attr("level") == (5, 5, 5, 5)
    assert goal.tolist() == [0.0, 0.0] and shared.tolist() == [0.0, 0.0]


def test_envs_built_by_make_own_their_keyword_arguments():
    import aiovec
    from tests.envs import GoalEnv

    with aiovec.make(GoalEnv, 4, backend="process", num_workers=2, goal=np.zeros(2)) as venv:
        venv.reset(seed=0)
        assert _goals_after_two_steps(venv) == [2.0] * 4


def test_a_rebuilt_env_is_built_from_its_own_copy_of_the_factory():
    """A restart rebuilds an env from that env's own copy of its factory: what another
    env of the worker changed in place is not in it."""
    import aiovec
    from tests.faulty import FaultyEnv

    start = np.zeros(2)

    def build() -> FaultyEnv:
        env = FaultyEnv(0, fault="raise", at_step=3)
        env.start = start  # a value the factory captured
        return env

    with aiovec.VecEnv([build] * 2, num_workers=1, on_failure="restart") as venv:
        venv.reset(seed=0)
        venv.apply(lambda env: env.start.__iadd__(7), env_ids=[0])
        assert [value.tolist() for value in venv.get_attr("start")] == [[7.0, 7.0], [0.0, 0.0]]
        venv.step([0, 0])
        venv.step([0, 0])
        *_, infos = venv.step([0, 0])  # both fail on their third step, and are rebuilt
        assert infos["_restarted"].all()
        assert [value.tolist() for value in venv.get_attr("start")] == [[7.0, 7.0], [0.0, 0.0]]
    assert start.tolist() == [0.0, 0.0]


@pytest.mark.parametrize("backend", ["inline", "process"])
def test_a_numpy_array_of_text_actions_is_a_batch_of_texts(backend):
    """``np.array(["hello", "hi", ""])`` is a batch of Text actions in Gymnasium's vector
    envs (``iterate`` walks any sequence); aiovec refused anything but a list or tuple."""
    import aiovec
    from tests.envs import ChatEnv

    with aiovec.VecEnv([ChatEnv] * 3, backend=backend) as venv:
        venv.reset(seed=0)
        _, rewards, *_, infos = venv.step(np.array(["hello", "hi", ""]))
        assert rewards.tolist() == [5.0, 2.0, 0.0]
        assert infos["got"].tolist() == ["hello", "hi", ""]


@pytest.mark.parametrize("backend", ["inline", "process"])
def test_a_tuple_observation_returned_as_an_array_is_taken(backend):
    import aiovec
    from tests.envs import GridEnv

    with aiovec.VecEnv([GridEnv] * 2, backend=backend) as venv:
        observations, _ = venv.reset(seed=0)
        assert [part.tolist() for part in observations] == [[1, 1], [2, 2]]
        observations, *_ = venv.step([0, 3])
        assert [part.tolist() for part in observations] == [[3, 3], [0, 3]]
        assert observations in venv.observation_space


@pytest.mark.parametrize("backend", ["inline", "process"])
async def test_observations_sent_by_value_are_the_callers_own(backend):
    """Observations that are not in shared memory (Sequence, Graph) are the caller's
    own with ``copy=True`` and in first-ready batches, as SyncVectorEnv deep-copies
    them: an env in this process rewriting its arrays changed what it had returned."""
    import aiovec
    from tests.envs import PointCloudEnv

    async with aiovec.VecEnv([PointCloudEnv] * 2, backend=backend) as venv:
        await venv.areset(seed=0)
        first, *_ = await venv.astep([0, 0])
        venv.send([0, 0])
        batch = await venv.recv(min_envs=2)
        await venv.astep([0, 0])
        assert first[0][0, 0] == 1.0 and batch.observations[0][0, 0] == 2.0


def test_with_fork_what_factories_capture_stays_shared():
    """``context="fork"`` is chosen to share memory with the envs (a shared array, a
    model in shared memory): factories are inherited as they are, so an env writing to
    a ``multiprocessing.RawArray`` it captured writes to the agent's."""
    import multiprocessing

    import aiovec
    from tests.envs import GoalEnv

    shared = multiprocessing.RawArray("d", 4)
    view = np.frombuffer(shared, dtype=np.float64)

    def build(index: int) -> GoalEnv:
        env = GoalEnv()
        env.mark = lambda: view.__setitem__(index, index + 1)  # noqa: B023 (index bound)
        return env

    env_fns = [partial(build, index) for index in range(4)]
    with aiovec.VecEnv(env_fns, num_workers=2, context="fork") as venv:
        venv.apply(lambda env: env.mark())
    assert view.tolist() == [1.0, 2.0, 3.0, 4.0]
