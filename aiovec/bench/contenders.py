"""The vector envs a benchmark compares, each driven the way its users drive it.

A contender is built once per workload and then asked for timed windows; whatever it
has in flight at the end of a window carries over to the next one.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any

import gymnasium as gym
import numpy as np

import aiovec
from aiovec._worker.timer_slack import set_timer_slack, timer_slack

EnvFn = Callable[[], gym.Env]


def _run_window(loop: asyncio.AbstractEventLoop, window: Coroutine[Any, Any, int]) -> int:
    """Run one timed window (a coroutine returning its step count) on ``loop``.

    If it is interrupted (a Ctrl-C lands in the loop's own code and leaves the window's
    task pending), the task is cancelled: it ends the next time the loop runs (when
    the contender is closed), rather than failing then with nobody to see it
    (asyncio's "Task exception was never retrieved" and its traceback)."""
    task = loop.create_task(window)
    try:
        return loop.run_until_complete(task)
    except BaseException:
        task.cancel()
        raise


def _reap(process: Any, grace: float = 5.0) -> None:
    """Wait up to ``grace`` seconds for ``process`` to exit (it was told to), then kill
    it (stuck in an env's code that ignores the request) and wait for that."""
    process.join(grace)
    if process.is_alive():
        process.kill()
        process.join()


class Contender:
    """One library in one mode. Subclasses build the env and step it for a while."""

    #: name shown in reports, e.g. "aiovec process (first-ready 8)"
    name: str = ""
    library: str = ""

    def __init__(self, env_fn: EnvFn, num_envs: int, copy: bool = True) -> None:
        self.env_fn, self.num_envs, self.copy = env_fn, num_envs, copy
        self.recv_latencies: list[float] = []

    def start(self) -> None:
        """Build the vector env and reset it."""
        raise NotImplementedError

    def run(self, seconds: float) -> int:
        """Step for about ``seconds``; return how many env steps completed."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def abandon(self) -> None:
        """Close after a window that was cut short (a Ctrl-C, an error): never wait for
        work the cut left pending, which may never finish (a step sent to some of a
        library's workers and not the others). By default the same as :meth:`close`."""
        self.close()

    def stats(self) -> aiovec.Stats | None:
        """The aiovec vector env's :meth:`~aiovec.VecEnv.stats` (``None`` for others)."""
        env = getattr(self, "env", None)
        return env.stats() if isinstance(env, aiovec.VecEnv) else None

    def _action_batches(self, space: gym.Space[Any]) -> list[Any]:
        space.seed(0)
        return [space.sample() for _ in range(16)]


class GymnasiumLockstep(Contender):
    """A ``gymnasium.vector.VectorEnv`` (Gymnasium's or aiovec's) stepped with ``step``."""

    def __init__(self, name: str, library: str, make: Callable[[], Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.name, self.library, self._make = name, library, make

    def start(self) -> None:
        self.env = self._make()
        self.env.reset(seed=0)
        self._actions = self._action_batches(self.env.action_space)

    def run(self, seconds: float) -> int:
        env, actions, steps = self.env, self._actions, 0
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            env.step(actions[steps % len(actions)])
            steps += 1
        return steps * self.num_envs

    def close(self) -> None:
        self.env.close()

    def abandon(self) -> None:
        # Gymnasium's AsyncVectorEnv waits for a pending call's replies unless told to
        # terminate its workers (aiovec's vector envs take the same flag, and never wait
        # past their close timeout; SyncVectorEnv ignores it).
        self.env.close(terminate=True)


class AiovecFirstReady(Contender):
    """aiovec's ``send``/``recv``: re-send to whichever envs finished first."""

    library = "aiovec"

    def __init__(
        self,
        batch_size: int | None,
        options: dict[str, Any],
        label: str | None = None,
        **kwargs: Any,
    ) -> None:
        """``batch_size``: ``recv``'s ``max_envs`` (``None``: whatever is ready, at
        least one env: ``recv()`` with its defaults)."""
        super().__init__(**kwargs)
        self.batch_size, self.options = batch_size, options
        workers = f", {options['num_workers']} workers" if "num_workers" in options else ""
        transport = options.get("ray_options", {}).get("transport")
        backend = options.get("backend", "process") + (f" {transport}" if transport else "")
        size = "all ready" if batch_size is None else batch_size
        self.name = f"aiovec {label or backend} (first-ready {size}{workers})"

    def start(self) -> None:
        self.env = aiovec.VecEnv([self.env_fn] * self.num_envs, copy=self.copy, **self.options)
        self.env.reset(seed=0)
        space = self.env.single_action_space
        space.seed(0)
        self._actions = np.stack([space.sample() for _ in range(self.num_envs)])
        self._loop = aiovec.new_event_loop()  # one loop for every window: async envs live on it

    def run(self, seconds: float) -> int:
        return _run_window(self._loop, self._run(seconds))

    async def _run(self, seconds: float) -> int:
        env, actions, batch_size, steps = self.env, self._actions, self.batch_size, 0
        if not self.recv_latencies:  # first window: start every env
            env.send(actions)
        latencies = self.recv_latencies
        clock = time.perf_counter
        deadline = clock() + seconds
        while clock() < deadline:
            start = clock()
            batch = await env.recv(batch_size)
            latencies.append(clock() - start)
            steps += len(batch.env_ids)
            env.send(actions[: len(batch.env_ids)], batch.env_ids)
        return steps

    def close(self) -> None:
        self._loop.run_until_complete(self.env.aclose())
        self._loop.close()


class BareAsyncioFloor(Contender):
    """Not a vector env: ``num_envs`` bare tasks on one event loop, each sleeping the
    env's lognormal step time, handing its index to a consumer and waiting for the
    next go. What one loop on one core can do before any env runtime is added: the
    floor that async-env throughput is measured against. It runs with the timer slack
    aiovec's workers give their envs (see :mod:`aiovec._worker.timer_slack`)."""

    library = "asyncio"

    def __init__(self, mean: float, sigma: float, max_step_time: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.mu, self.sigma, self.max_step_time = np.log(mean) - sigma**2 / 2, sigma, max_step_time
        self.name = "bare asyncio tasks, one loop (floor: no env runtime)"

    def start(self) -> None:
        self._loop = aiovec.new_event_loop()
        self._ready: list[int] = []
        self._go: list[Any] = [None] * self.num_envs
        self._wakeup: Any = None
        self._tasks = [self._loop.create_task(self._env(i)) for i in range(self.num_envs)]

    async def _env(self, index: int) -> None:
        rng, loop = np.random.default_rng(index), asyncio.get_running_loop()
        while True:
            await asyncio.sleep(min(rng.lognormal(self.mu, self.sigma), self.max_step_time))
            self._ready.append(index)
            if self._wakeup is not None and not self._wakeup.done():
                self._wakeup.set_result(None)
            go = self._go[index] = loop.create_future()
            await go

    def run(self, seconds: float) -> int:
        previous = timer_slack()
        set_timer_slack()
        try:
            return _run_window(self._loop, self._run(seconds))
        finally:
            if previous is not None:
                set_timer_slack(previous)

    async def _run(self, seconds: float) -> int:
        steps, clock = 0, time.perf_counter
        deadline = clock() + seconds
        while clock() < deadline:
            if not self._ready:
                self._wakeup = self._loop.create_future()
                await self._wakeup
            ready, self._ready = self._ready, []
            steps += len(ready)
            for index in ready:
                self._go[index].set_result(None)
        return steps

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*self._tasks, return_exceptions=True))
        self._loop.close()


class ThreadsCeiling(Contender):
    """Not a vector env: each of ``num_envs`` envs stepped by its own thread in this
    process, in a tight loop, with nothing in between. For envs that wait (sleep, IO)
    this is what the machine's timers and scheduler allow before any runtime is added:
    a sleep overruns its time by tens to hundreds of microseconds, and a runtime can
    only add to that. Its threads wait with the timer slack aiovec's workers give
    their envs (see :mod:`aiovec._worker.timer_slack`), so that it stays a ceiling."""

    library = "ceiling"
    name = "ceiling: one thread per env, no runtime"

    def start(self) -> None:
        self._envs = [self.env_fn() for _ in range(self.num_envs)]
        for index, env in enumerate(self._envs):
            env.reset(seed=index)
            env.action_space.seed(index)
        self._actions = [env.action_space.sample() for env in self._envs]

    def run(self, seconds: float) -> int:
        counts = [0] * self.num_envs
        deadline = time.perf_counter() + seconds

        def step_until_deadline(index: int) -> None:
            set_timer_slack()  # this thread's alone
            env, action, steps = self._envs[index], self._actions[index], 0
            while time.perf_counter() < deadline:
                _, _, terminated, truncated, _ = env.step(action)
                if terminated or truncated:
                    env.reset()
                steps += 1
            counts[index] = steps

        threads = [
            threading.Thread(target=step_until_deadline, args=(index,))
            for index in range(self.num_envs)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return sum(counts)

    def close(self) -> None:
        for env in self._envs:
            env.close()


class ParallelCeiling(Contender):
    """Not a vector env: ``processes`` independent processes, each stepping its own
    vector env of ``num_envs / processes`` rows in a tight loop, with no coordination at
    all. The most any split of the batch over that many cores can give on this machine
    (a vectorized step is rarely linear in its rows)."""

    library = "ceiling"

    def __init__(self, make_block: Callable[[int], Any], processes: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.make_block, self.processes = make_block, processes
        self.name = f"ceiling: {processes} processes x {self.num_envs // processes} rows, no IPC"

    def start(self) -> None:
        import multiprocessing

        context = multiprocessing.get_context("fork")  # nothing to pickle, nothing to import
        self._pipes, self._children = [], []
        for _ in range(self.processes):
            parent, child = context.Pipe()
            process = context.Process(
                target=_step_until_told,
                args=(child, self.make_block, self.num_envs // self.processes),
                daemon=True,
            )
            process.start()
            child.close()
            self._pipes.append(parent)
            self._children.append(process)

    def run(self, seconds: float) -> int:
        for pipe in self._pipes:
            pipe.send(seconds)
        return sum(pipe.recv() for pipe in self._pipes)

    def close(self) -> None:
        for pipe, process in zip(self._pipes, self._children):
            pipe.send(None)
            _reap(process)
            pipe.close()


def _step_until_told(pipe: Any, make_block: Callable[[int], Any], rows: int) -> None:
    block = make_block(rows)
    block.reset(seed=0)
    block.action_space.seed(0)
    actions = [block.action_space.sample() for _ in range(16)]
    while (seconds := pipe.recv()) is not None:
        steps, deadline = 0, time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            block.step(actions[steps % 16])
            steps += 1
        pipe.send(steps * rows)
    block.close()


class SB3Lockstep(GymnasiumLockstep):
    """Stable-Baselines3's ``DummyVecEnv`` / ``SubprocVecEnv``."""

    def __init__(self, kind: str, **kwargs: Any) -> None:
        Contender.__init__(self, **kwargs)
        self.kind = kind
        self.name, self.library = f"sb3 {kind}", "sb3"

    def start(self) -> None:
        from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

        env_fns = [self.env_fn] * self.num_envs
        if self.kind == "DummyVecEnv":
            self.env = DummyVecEnv(env_fns)
        else:
            # fork: SB3's worker module imports torch, which takes seconds per process
            # under forkserver/spawn; start-up is not what this benchmark measures.
            self.env = SubprocVecEnv(env_fns, start_method="fork")
        self.env.seed(0)
        self.env.reset()
        space = self.env.action_space
        space.seed(0)
        self._actions = [
            np.stack([space.sample() for _ in range(self.num_envs)]) for _ in range(16)
        ]

    def abandon(self) -> None:
        processes = getattr(self.env, "processes", None)
        if processes is None:  # DummyVecEnv: nothing pending to wait for
            self.close()
            return
        # SubprocVecEnv.close() first reads every worker's reply to a pending step, with
        # no timeout: its workers are stopped instead.
        for process in processes:
            process.terminate()
        for process in processes:
            _reap(process)
        self.env.closed = True


class _StepActor:
    """One env in one Ray actor, the pattern of Tianshou's and PufferLib's Ray backends."""

    def __init__(self, env_fn: EnvFn) -> None:
        self.env = env_fn()

    def reset(self, seed: int) -> Any:
        return self.env.reset(seed=seed)[0]

    def step(self, action: Any) -> Any:
        observation, reward, terminated, truncated, _ = self.env.step(action)
        if terminated or truncated:
            observation, _ = self.env.reset()
        return observation, reward, terminated, truncated


class RayActorPerEnv(Contender):
    """One Ray actor per env, stepped first-ready with ``ray.wait`` (the baseline that
    users of other libraries' Ray backends get)."""

    library = "ray"
    name = "ray, one actor per env (first-ready 1)"

    def start(self) -> None:
        import ray

        ensure_ray()
        # Any: an actor class, whose handles' methods gain .remote (untyped in Ray's stubs)
        actor: Any = ray.remote(num_cpus=0)(_StepActor)
        self.actors = [actor.remote(self.env_fn) for _ in range(self.num_envs)]
        ray.get([a.reset.remote(i) for i, a in enumerate(self.actors)])
        self._refs = {a.step.remote(0): i for i, a in enumerate(self.actors)}

    def run(self, seconds: float) -> int:
        import ray

        refs, steps = self._refs, 0
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            ready, _ = ray.wait(list(refs), num_returns=1)
            for ref in ready:
                index = refs.pop(ref)
                ray.get(ref)
                steps += 1
                refs[self.actors[index].step.remote(0)] = index
        return steps

    def close(self) -> None:
        import ray

        for actor in self.actors:
            ray.kill(actor)


def ensure_ray() -> None:
    """Start one local Ray for the whole benchmark run (so no contender owns it)."""
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)


def ray_available() -> bool:
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


def sb3_available() -> bool:
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        return False
    return True


def lockstep_contenders(
    env_fn: EnvFn,
    num_envs: int,
    *,
    env_id: str | None = None,
    env_kwargs: dict[str, Any] | None = None,
    copy: bool = True,
    include: tuple[str, ...] = (
        "auto",
        "inline",
        "process",
        "hybrid",
        "ray",
        "sync",
        "async",
        "sb3",
    ),  # fmt: skip
    process_options: dict[str, Any] | None = None,
) -> list[Contender]:
    """aiovec (auto, inline, process) and the libraries users would otherwise pick."""
    common = {"env_fn": env_fn, "num_envs": num_envs, "copy": copy}
    contenders: list[Contender] = []
    fns = [env_fn] * num_envs
    if "auto" in include and env_id is not None:
        contenders.append(
            GymnasiumLockstep(
                "aiovec make (auto)",
                "aiovec",
                partial(aiovec.make, env_id, num_envs, env_kwargs=env_kwargs, copy=copy),
                **common,
            )
        )
    if "inline" in include:
        contenders.append(
            GymnasiumLockstep(
                "aiovec inline",
                "aiovec",
                partial(aiovec.VecEnv, fns, backend="inline", copy=copy),
                **common,
            )
        )
    if "hybrid" in include and num_envs > 1:
        cores = min(os.cpu_count() or 1, num_envs)
        options: dict[str, Any] = {
            "num_workers": max(cores - 1, 1),
            "inline_envs": num_envs // max(cores, 2),
        }
        contenders.append(
            GymnasiumLockstep(
                f"aiovec process ({options['num_workers']} workers + main process)",
                "aiovec",
                partial(aiovec.VecEnv, fns, backend="process", copy=copy, **options),
                **common,
            )
        )
    if "process" in include:
        options = process_options or {}
        label = (
            f"aiovec process ({options['num_workers']} workers)" if options else "aiovec process"
        )
        contenders.append(
            GymnasiumLockstep(
                label,
                "aiovec",
                partial(aiovec.VecEnv, fns, backend="process", copy=copy, **options),
                **common,
            )
        )
    if "ray" in include and ray_available():
        ensure_ray()
        contenders.append(
            GymnasiumLockstep(
                "aiovec ray",
                "aiovec",
                partial(aiovec.VecEnv, fns, backend="ray", copy=copy),
                **common,
            )
        )
    if "sync" in include:
        contenders.append(
            GymnasiumLockstep(
                "gymnasium SyncVectorEnv",
                "gymnasium",
                partial(gym.vector.SyncVectorEnv, fns, copy=copy),
                **common,
            )
        )
    if "async" in include:
        contenders.append(
            GymnasiumLockstep(
                "gymnasium AsyncVectorEnv",
                "gymnasium",
                partial(
                    gym.vector.AsyncVectorEnv,
                    fns,
                    shared_memory=True,
                    copy=copy,
                    context="forkserver",
                ),
                **common,
            )
        )
    if "sb3" in include and sb3_available():
        contenders.append(SB3Lockstep("DummyVecEnv", **common))
        contenders.append(SB3Lockstep("SubprocVecEnv", **common))
    return contenders
