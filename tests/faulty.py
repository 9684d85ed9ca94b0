"""Envs that fail on purpose, for the fault-injection tests (importable by workers)."""

from __future__ import annotations

import itertools
import os
import signal
import sys
import threading
import time

import numpy as np

from tests.async_envs import AsyncCounterEnv
from tests.envs import CounterEnv

#: "interrupt" and "sys.exit" raise KeyboardInterrupt and SystemExit from the env's own code,
#: "abort" a BaseException of its own (as pytest's, gevent's or a simulator's abort
#: classes are); "stubborn" hangs in a worker that ignores SIGTERM (a simulator with its
#: own handler).
FAULTS = (
    "raise", "exit", "sigkill", "sigsegv", "hang", "interrupt", "sys.exit", "abort", "stubborn"
)  # fmt: skip


class Abort(BaseException):
    """Not an ``Exception``: what ``except Exception`` lets through."""


_instances = itertools.count()  # envs built in this process


class FaultyEnv(CounterEnv):
    """A CounterEnv that fails with ``fault`` on its ``at_step``-th step (counted since
    it was built), or on every step with probability ``rate`` (seeded by env index).

    The counter survives the failure only when the env is rebuilt (a fresh instance
    starts counting again), which the tests use to recognise rebuilt envs.
    """

    def __init__(
        self, env_index: int = 0, fault: str = "raise", at_step: int = 2, rate: float = 0.0
    ) -> None:
        super().__init__(env_index)
        assert fault in FAULTS, fault
        self.fault, self.at_step, self.rate = fault, at_step, rate
        self.steps_since_built = 0
        # A rebuilt env must not replay its predecessor's draws: a fresh env whose first
        # draw fails would otherwise fail the same way on every rebuild (a false crash loop).
        self._fault_rng = np.random.default_rng([env_index, os.getpid(), next(_instances)])
        if fault == "stubborn":  # built in the worker's main thread, where handlers are set
            signal.signal(signal.SIGTERM, signal.SIG_IGN)

    def step(self, action):
        self.steps_since_built += 1
        due = self.steps_since_built == self.at_step
        if self.rate:
            due = self._fault_rng.random() < self.rate
        if due:
            self._fail()
        return super().step(action)

    def _fail(self):
        if self.fault == "raise":
            raise RuntimeError(f"simulator diverged at step {self.steps_since_built}")
        if self.fault == "exit":
            os._exit(7)
        if self.fault == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.fault == "sigsegv":
            signal.signal(signal.SIGSEGV, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGSEGV)
        if self.fault in ("hang", "stubborn"):
            time.sleep(3600)
        if self.fault == "interrupt":
            raise KeyboardInterrupt(f"interrupted at step {self.steps_since_built}")
        if self.fault == "sys.exit":
            sys.exit(f"gave up at step {self.steps_since_built}")
        if self.fault == "abort":
            raise Abort(f"aborted at step {self.steps_since_built}")


class BadObservationEnv(CounterEnv):
    """Returns an observation of the wrong shape on step ``at_step``."""

    def __init__(self, env_index: int = 0, at_step: int = 1) -> None:
        super().__init__(env_index)
        self.at_step = at_step

    def step(self, action):
        observation, *rest = super().step(action)
        if self.count == self.at_step:
            observation = np.zeros(7)
        return (observation, *rest)


class FailingConstructorEnv(CounterEnv):
    def __init__(self, env_index: int = 0) -> None:
        raise OSError(f"cannot connect to simulator {env_index}")


class DyingConstructorEnv(CounterEnv):
    """Its constructor kills its own process (a simulator library that aborts)."""

    def __init__(self, env_index: int = 0) -> None:
        os.kill(os.getpid(), signal.SIGKILL)


class FlakyFactoryEnv(FaultyEnv):
    """A FaultyEnv whose constructor (counted across processes in ``ledger``, a file)
    works ``good_builds`` times, then raises (``on_rebuild="raise"``) or hangs."""

    def __init__(
        self,
        env_index: int = 0,
        ledger: str = "",
        good_builds: int = 1,
        on_rebuild: str = "raise",
        fault: str = "exit",
        at_step: int = 2,
    ) -> None:
        with open(ledger, "a+") as handle:
            handle.seek(0)
            builds = len(handle.read())
            handle.write("x")
        if builds >= good_builds:
            if on_rebuild == "hang":
                time.sleep(3600)
            raise ConnectionError(f"simulator {env_index} refused the connection")
        super().__init__(env_index, fault=fault, at_step=at_step)


class SimulatorEnv(CounterEnv):
    """Starts a simulator process of its own (``sleep``), writes its pid to
    ``pid_file``, and on its first step hangs (``fault="hang"``) or exits
    (``fault="exit"``) without stopping it; ``fault="none"`` steps as a CounterEnv.
    Its close() never stops the simulator either."""

    def __init__(self, env_index: int = 0, pid_file: str = "", fault: str = "hang") -> None:
        super().__init__(env_index)
        import subprocess

        self.fault = fault
        self.simulator = subprocess.Popen(["sleep", "300"])
        with open(pid_file, "w") as out:
            out.write(str(self.simulator.pid))

    def step(self, action):
        if self.fault == "none":
            return super().step(action)
        if self.fault == "hang":
            time.sleep(3600)
        os._exit(3)


class AsyncSimulatorEnv(AsyncCounterEnv):
    """An async env that starts a simulator process (``sleep``) it never stops, and
    writes its pid to ``pid_file``."""

    def __init__(self, env_index: int = 0, pid_file: str = "") -> None:
        super().__init__(env_index)
        import subprocess

        self.simulator = subprocess.Popen(["sleep", "300"])
        with open(pid_file, "w") as out:
            out.write(str(self.simulator.pid))


class GeneratorExitAsyncEnv(AsyncCounterEnv):
    """An async env that raises ``GeneratorExit`` itself (a simulator client built on
    generators that lets one escape) in its ``at_step``-th step, or in ``reset`` when
    ``in_reset``, from its second reset on; also in ``close`` when ``in_close``, and in
    its constructor once rebuilt when given ``builds`` (a file's path)."""

    def __init__(
        self,
        env_index: int = 0,
        at_step: int = 2,
        in_reset: bool = False,
        in_close: bool = False,
        builds: str | None = None,
    ) -> None:
        # builds: a file counting the builds (every copy of a factory writes to it):
        # raise in each rebuild
        if builds is not None:
            with open(builds, "a+") as handle:
                handle.seek(0)
                built = len(handle.read())
                handle.write("x")
            if built >= 1:
                raise GeneratorExit(f"simulator {env_index} gone while rebuilding")
        super().__init__(env_index)
        self.at_step, self.in_reset, self.resets = at_step, in_reset, 0
        self.in_close = in_close

    async def close(self):
        if self.in_close:
            raise GeneratorExit(f"simulator {self.env_index} gone while closing")
        await super().close()

    async def reset(self, *, seed=None, options=None):
        self.resets += 1
        if self.in_reset and self.resets > 1:
            raise GeneratorExit(f"simulator {self.env_index} gone while resetting")
        return await super().reset(seed=seed, options=options)

    async def step(self, action):
        if not self.in_reset and self.steps_since_built + 1 == self.at_step:
            self.steps_since_built += 1
            raise GeneratorExit(f"simulator {self.env_index} gone")
        return await super().step(action)


class GeneratorExitEnv(CounterEnv):
    """A blocking env that raises ``GeneratorExit`` itself in its ``at_step``-th step,
    and in ``close`` when ``in_close``."""

    def __init__(self, env_index: int = 0, at_step: int = 2, in_close: bool = False) -> None:
        super().__init__(env_index)
        self.at_step, self.in_close, self.steps = at_step, in_close, 0

    def step(self, action):
        self.steps += 1
        if self.steps == self.at_step:
            raise GeneratorExit(f"simulator {self.env_index} gone")
        return super().step(action)

    def close(self):
        if self.in_close:
            raise GeneratorExit(f"simulator {self.env_index} gone while closing")


class RebuiltSlowlyEnv(CounterEnv):
    """Starts a simulator (``sleep``) that its close() leaves running, writing the
    simulator's pid to a file in ``pid_dir``; exits its worker on its ``crash_at``-th
    step; when rebuilt (a simulator file is there already), it takes
    ``rebuild_seconds`` more to build."""

    def __init__(
        self, env_index: int = 0, pid_dir: str = "", crash_at: int = 2, rebuild_seconds=1.0
    ) -> None:
        super().__init__(env_index)
        import subprocess

        rebuilt = bool(os.listdir(pid_dir))
        self.crash_at, self.steps = crash_at, 0
        self.simulator = subprocess.Popen(["sleep", "300"])
        with open(os.path.join(pid_dir, f"{self.simulator.pid}.pid"), "w"):
            pass
        if rebuilt:
            time.sleep(rebuild_seconds)

    def step(self, action):
        self.steps += 1
        if self.steps == self.crash_at:
            os._exit(3)
        return super().step(action)


class FlakyResetAfterRebuildEnv(CounterEnv):
    """Built ``builds`` times so far (counted across processes in ``ledger``, a file):
    the first build fails its step ``at_step``; the next ``failing_resets`` builds fail
    their first reset (a simulator still coming back up); later builds work."""

    def __init__(
        self, env_index: int = 0, ledger: str = "", failing_resets: int = 1, at_step: int = 2
    ):
        super().__init__(env_index)
        with open(ledger, "a+") as handle:
            handle.seek(0)
            self.build = len(handle.read())
            handle.write("x")
        self.failing_resets, self.at_step, self.steps = failing_resets, at_step, 0
        self.was_reset = False

    def reset(self, *, seed=None, options=None):
        if 1 <= self.build <= self.failing_resets:
            raise ConnectionError(f"simulator {self.env_index} is still starting")
        self.was_reset = True
        return super().reset(seed=seed, options=options)

    def step(self, action):
        if not self.was_reset:  # what a simulator might crash on, rather than raise
            raise AssertionError(f"simulator {self.env_index} stepped before any reset")
        self.steps += 1
        if self.build == 0 and self.steps == self.at_step:
            raise RuntimeError(f"simulator {self.env_index} diverged")
        return super().step(action)


class FailingResetEnv(CounterEnv):
    """A CounterEnv whose reset with ``options={"fail": True}`` fails (``fault``:
    ``"raise"`` or ``"exit"``) the first ``failures`` times, counted across processes in
    ``ledger`` (a file); its reset info echoes the seed and options it got."""

    def __init__(
        self, env_index: int = 0, ledger: str = "", fault: str = "raise", failures: int = 1
    ) -> None:
        super().__init__(env_index)
        self.ledger, self.fault, self.failures = ledger, fault, failures

    def reset(self, *, seed=None, options=None):
        if options and options.get("fail"):
            with open(self.ledger, "a+") as handle:
                handle.seek(0)
                failed = len(handle.read())
                if failed < self.failures:
                    handle.write("x")
            if failed < self.failures:
                if self.fault == "exit":
                    os._exit(3)
                raise ConnectionError(f"simulator {self.env_index} lost its connection")
        observation, _ = super().reset(seed=seed, options=options)
        return observation, {"seed": seed, "options": options}


class CheckpointEnv(CounterEnv):
    """A CounterEnv whose ``save_checkpoint()`` notes each run in ``ledger`` (a file)
    and then kills its process with SIGSEGV: on its first run (``dies="once"``), on
    every run (``dies="always"``) or never (``"never"``); or hangs (``"hang"``)."""

    def __init__(self, env_index: int = 0, ledger: str = "", dies: str = "once") -> None:
        super().__init__(env_index)
        self.ledger, self.dies = ledger, dies

    def save_checkpoint(self) -> str:
        with open(self.ledger, "a+") as handle:
            handle.seek(0)
            runs = len(handle.read()) + 1
            handle.write("x")
        if self.dies == "hang":
            time.sleep(3600)
        if self.dies == "always" or (self.dies == "once" and runs == 1):
            signal.signal(signal.SIGSEGV, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGSEGV)
        return "saved"

    @property
    def checkpoint(self) -> str:
        """A property that saves one (read through ``get_attr``)."""
        return self.save_checkpoint()


class WatchdogEnv(CounterEnv):
    """Env ``armed`` arms a SIGALRM watchdog in its step and disarms it too late: its
    handler raises while the worker waits for its next command, outside any env call."""

    def __init__(self, env_index: int = 0, armed: int = 1) -> None:
        super().__init__(env_index)
        self.armed = armed
        if env_index == armed:  # (built in the worker's main thread, where handlers run)

            def on_alarm(*_):
                raise TimeoutError("simulator watchdog fired")

            signal.signal(signal.SIGALRM, on_alarm)

    def step(self, action):
        if self.env_index == self.armed:
            signal.setitimer(signal.ITIMER_REAL, 0.05)
        return super().step(action)


class UnsendableInfoEnv(CounterEnv):
    """Env ``bad_env``'s steps return an info that cannot be pickled."""

    def __init__(self, env_index, bad_env):
        super().__init__(env_index)
        self.bad = env_index == bad_env

    def step(self, action):
        observation, reward, terminated, truncated, info = super().step(action)
        return (
            observation,
            reward,
            terminated,
            truncated,
            {"lock": threading.Lock()} if self.bad else info,
        )


class CrashLoopEnv(CounterEnv):
    """A CounterEnv that kills its worker process (SIGKILL): with ``where="step"`` in
    every step; with ``where="reset"`` in each second reset of every instance (each new
    instance resets fine once: a replayed reset succeeds, the next one kills again);
    never with ``where="never"``."""

    level = 1

    def __init__(self, env_index: int = 0, where: str = "step") -> None:
        super().__init__(env_index)
        self.where, self.resets = where, 0

    def reset(self, *, seed=None, options=None):
        self.resets += 1
        if self.where == "reset" and self.resets == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().reset(seed=seed, options=options)

    def step(self, action):
        if self.where == "step":
            os.kill(os.getpid(), signal.SIGKILL)
        return super().step(action)

    def current_level(self) -> int:
        return self.level


class SlowlyDyingEnv(CheckpointEnv):
    """A CheckpointEnv (``dies="never"``) whose first step ever (across processes: the
    ``died`` file) takes ``delay`` seconds and then kills its worker with SIGKILL: a
    command sent meanwhile waits behind that step."""

    def __init__(self, env_index: int = 0, ledger: str = "", died: str = "", delay=0.3):
        super().__init__(env_index, ledger, "never")
        self.died, self.delay = died, delay

    def step(self, action):
        try:
            os.close(os.open(self.died, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return super().step(action)
        time.sleep(self.delay)
        os.kill(os.getpid(), signal.SIGKILL)


class ResetKillsEnv(CounterEnv):
    """A CounterEnv whose first ``failures`` resets (counted across processes in
    ``ledger``, a file) kill its worker with SIGKILL; its reset info echoes the seed."""

    def __init__(self, env_index: int = 0, ledger: str = "", failures: int = 3) -> None:
        super().__init__(env_index)
        self.ledger, self.failures = ledger, failures

    def reset(self, *, seed=None, options=None):
        with open(self.ledger, "a+") as handle:
            handle.seek(0)
            tried = len(handle.read())
            handle.write("x")
        if tried < self.failures:
            os.kill(os.getpid(), signal.SIGKILL)
        observation, _ = super().reset(seed=seed, options=options)
        return observation, {"seed": seed}


class FlakyAutoresetEnv(CounterEnv):
    """A CounterEnv whose episodes end after every step (terminated), and whose
    ``failing_reset``-th reset (counted per instance, 0: none) raises once; its
    observation's second entry counts the resets that worked."""

    def __init__(self, env_index: int = 0, failing_reset: int = 0) -> None:
        super().__init__(env_index)
        self.failing_reset, self.resets, self.good_resets = failing_reset, 0, 0

    def reset(self, *, seed=None, options=None):
        self.resets += 1
        if self.resets == self.failing_reset:
            raise RuntimeError(f"env {self.env_index}: reset {self.resets} failed")
        self.good_resets += 1
        super().reset(seed=seed, options=options)
        return np.array([self.env_index, 100.0 * self.good_resets]), {}

    def step(self, action):
        observation, reward, _, truncated, info = super().step(action)
        return observation, reward, True, truncated, info


class SlowKillEnv(CounterEnv):
    """A CounterEnv that, as env ``doomed``, kills its worker (SIGKILL) ``delay`` s into
    every step; any other index steps as a CounterEnv."""

    def __init__(self, env_index: int = 0, doomed: int = 1, delay: float = 0.2) -> None:
        super().__init__(env_index)
        self.doomed, self.delay_before_death = doomed, delay

    def step(self, action):
        if self.env_index == self.doomed:
            time.sleep(self.delay_before_death)
            os.kill(os.getpid(), signal.SIGKILL)
        return super().step(action)
