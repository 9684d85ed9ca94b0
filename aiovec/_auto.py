"""``backend="auto"``: pick the backend and worker count from a short probe of the env.

One throwaway env is built in a child process and stepped for a few milliseconds. From
its step time and the share of that time spent on the CPU:

- cheap envs, where the whole batch steps faster in this process than one
  cross-process round trip costs, run inline (IPC cannot pay for itself);
- envs that mostly wait (sleep, IO) get a worker per core, each stepping its envs
  concurrently in threads (one worker per env, up to a cap, when restarts or step
  timeouts are asked for, so that one env's failure restarts it alone);
- async envs (:class:`aiovec.AsyncEnv`) run as coroutines on the event loop, or, by
  the thousands on a machine with several cores, on one event loop per core in
  worker processes (one loop saturates its core well before 10,000 envs);
- CPU-bound envs cheaper than a round trip are split evenly between ``cores - 1``
  workers and this process, which steps its share while the workers step theirs (no
  core sleeps through a wake-up); dearer ones get a worker per core, as a local share
  would keep the agent from the workers' results for whole env steps.
"""

from __future__ import annotations

import inspect
import math
import os
import pickle
import socket
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import cloudpickle
import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv

from aiovec._worker import thread_clock
from aiovec._worker import zygote as _zygote
from aiovec.async_env import AsyncEnv

#: Cost of one lockstep round trip through the process backend (seconds), a conservative
#: figure for a loaded 2-core machine; `aiovec bench` measures the real one.
IPC_ROUND_TRIP = 150e-6
#: From this many async envs on, one event loop per core beats one loop for all (W6).
MANY_ASYNC_ENVS = 2000
MAX_WAITING_WORKERS = 64
PROBE_SECONDS = 0.02
PROBE_MAX_STEPS = 200


class Probe(NamedTuple):
    """How one env steps: see :func:`probe_step_time`."""

    step_time: float  #: seconds per step while running (a batched env: the whole batch's)
    cpu_share: float  #: CPU time over the time the env could run (preemption left out)
    blocks_per_step: float | None  #: voluntary waits in the kernel per step (``None``: unknown)

    @property
    def mostly_waits(self) -> bool:
        """Whether the env mostly waits (see :func:`aiovec._worker.thread_clock.mostly_waits`)."""
        return thread_clock.mostly_waits(self.cpu_share, self.blocks_per_step)


def probe_step_time(
    env_fn: Callable[[], gym.Env], on_built: Callable[[], None] = lambda: None
) -> Probe:
    """Step one env built by ``env_fn`` for about :data:`PROBE_SECONDS` and say how it
    spends its time (see :class:`Probe`); ``on_built()`` once the env is built."""
    env = env_fn()
    on_built()
    asynchronous = isinstance(env, AsyncEnv) or (
        isinstance(env, VectorEnv) and inspect.iscoroutinefunction(env.step)
    )
    if asynchronous:  # nothing to time: async envs always run as coroutines
        raise _AsyncEnvFound
    try:
        env.reset(seed=0)
        env.action_space.seed(0)
        # A batched env (gymnasium VectorEnv) resets its rows itself, unless DISABLED.
        batched = isinstance(env, VectorEnv)
        resets_itself = batched and env.metadata.get("autoreset_mode") != AutoresetMode.DISABLED
        # Sampled beforehand: sampling a batch of thousands of actions is no step cost.
        actions = [env.action_space.sample() for _ in range(8)]
        steps = 0
        start = thread_clock.read()
        while steps < PROBE_MAX_STEPS and time.perf_counter() - start.wall < PROBE_SECONDS:
            _, _, terminated, truncated, _ = env.step(actions[steps % 8])
            steps += 1
            if not resets_itself and np.any(np.logical_or(terminated, truncated)):
                env.reset()
        spent = thread_clock.since(start)
    finally:
        env.close()
    steps = max(steps, 1)
    blocks = None if spent.blocks is None else spent.blocks / steps
    # The env's own time per step, not other processes': a thread that never blocks is
    # running or preempted, so its CPU time is its step time; else queued time is left out.
    never_blocks = blocks is not None and blocks < 0.5
    own_time = spent.cpu if never_blocks else spent.wall - spent.queued
    return Probe(own_time / steps, spent.cpu_share, blocks)


class _AsyncEnvFound(Exception):
    pass


def backend_for_async_envs(num_envs: int) -> dict[str, Any]:
    """``VecEnv`` options for ``num_envs`` envs of which some are async: one event loop,
    or one per core from :data:`MANY_ASYNC_ENVS` on."""
    cores = os.cpu_count() or 1
    if num_envs >= MANY_ASYNC_ENVS and cores > 1:
        return {"backend": "process", "num_workers": cores}
    return {"backend": "coroutine"}


def choose_backend(
    env_fn: Callable[[], gym.Env],
    num_envs: int,
    isolate: bool = False,
    limits: ProbeLimits | None = None,
) -> dict[str, Any]:
    """``VecEnv`` options (``backend``, ``num_workers``) suited to ``num_envs`` such envs.

    The probe runs in a child process where possible: an env that crashes or hangs
    while probed cannot take the agent with it. With ``isolate`` (restarts or step
    timeouts asked for), no env is placed in the agent's process. Falls back to the
    process backend when the probe fails, so that the real construction reports the
    error with the env's index. ``limits``: how long the probe may build and step the
    env (the caller's ``startup_timeout`` and ``step_timeout``).
    """
    cores = os.cpu_count() or 1
    try:
        probe = _probe(env_fn, limits)
    except _AsyncEnvFound:
        return backend_for_async_envs(num_envs)
    except Exception:
        return {"backend": "process"}
    if probe.mostly_waits:
        if isolate:  # a crash or a timeout restarts that env alone
            return {"backend": "process", "num_workers": min(num_envs, MAX_WAITING_WORKERS)}
        # A worker per core, each stepping its envs in threads once it finds them
        # waiting (concurrent_envs): W3, 16 and 64 envs sleeping 2 ms on average, 2
        # cores, first-ready one at a time: 1.1x and 1.8x the rate of a worker per env,
        # lockstep 1.0x and 1.2x, in 2 processes instead of 16 or 64.
        return {"backend": "process", "num_workers": min(cores, num_envs)}
    step_time = probe.step_time
    if isolate:
        return {"backend": "process", "num_workers": min(cores, num_envs)}
    inline_time = num_envs * step_time
    parallel_time = inline_time / min(cores, num_envs) + IPC_ROUND_TRIP
    if cores == 1 or inline_time <= parallel_time:
        return {"backend": "inline"}
    processes = min(cores, num_envs)
    if step_time >= IPC_ROUND_TRIP:
        # A share stepped here would keep the agent from the workers' results for whole
        # env steps (first-ready stalls, measured: 0.61 vs 0.78 of the CPU limit for
        # 0.5 ms envs), for a small lockstep gain (0.67 vs 0.62): a worker per core.
        return {"backend": "process", "num_workers": processes}
    return {
        "backend": "process",
        "num_workers": processes - 1,
        "inline_envs": num_envs // processes,
    }


def choose_block_layout(
    block_fn_of: Callable[[int], Callable[[], Any]],
    num_envs: int,
    isolate: bool = False,
    envs_per_block: int | None = None,
    limits: ProbeLimits | None = None,
) -> dict[str, Any]:
    """``VecEnv`` options (``backend``, ``num_workers``, ``inline_envs``) and
    ``envs_per_block`` for ``num_envs`` rows of batched envs; ``block_fn_of(k)`` is a
    factory of a batched env of ``k`` rows.

    Probes a block of ``num_envs`` and a block of a core's share: one block per core
    (as many as divide ``num_envs``) when the share's step plus what splitting costs
    is faster than the whole batch's step, else one block of ``num_envs`` stepped in
    this process. (A vectorized step is rarely linear in its rows: CartPole's vector
    entry point takes ~300 us for 4,096 envs and ~200 us for 2,048 here, so two cores
    cannot halve it.) Of one block per core, this process steps the last while
    ``cores - 1`` workers step the others (measured on 2 cores, a torch model: 1.71 vs
    1.46 M steps/s with a worker per block), unless ``isolate`` keeps every block out of
    this process. Async batched envs (``async def step``) run as coroutines, one
    block of ``num_envs`` unless ``envs_per_block`` says otherwise; with
    ``envs_per_block`` given, only the backend is chosen.
    """
    cores = os.cpu_count() or 1
    blocks = max(d for d in range(1, min(cores, num_envs) + 1) if num_envs % d == 0)
    size = num_envs // blocks
    failed = False
    try:
        _probe(block_fn_of(envs_per_block or size), limits)
    except _AsyncEnvFound:
        return {"backend": "coroutine", "envs_per_block": envs_per_block or num_envs}
    except Exception:  # the real construction reports the error, with the env's index
        failed = True  # (and no more probes: one that hangs would hang each time)
    if envs_per_block is not None:
        local = envs_per_block == num_envs and not isolate
        return {"backend": "inline" if local else "process", "envs_per_block": envs_per_block}
    if blocks == 1:
        return {"backend": "process" if isolate else "inline", "envs_per_block": num_envs}
    if failed:
        return {"backend": "process", "num_workers": blocks, "envs_per_block": size}
    try:
        # The faster of two probes each: noise on a shared machine only ever slows one.
        share_time = min(_probe(block_fn_of(size), limits).step_time for _ in range(2))
        whole_time = (
            math.inf
            if isolate
            else min(_probe(block_fn_of(num_envs), limits).step_time for _ in range(2))
        )
    except Exception:  # the real construction reports the error, with the env's index
        return {"backend": "process", "num_workers": blocks, "envs_per_block": size}
    if isolate:
        return {"backend": "process", "num_workers": blocks, "envs_per_block": size}
    # What the split costs on top of the share's step, measured on 2 cores: the other
    # core's slowdown (~25%) and the agent's work per step for thousands of rows (two
    # round trips' worth).
    if whole_time <= 1.25 * share_time + 2 * IPC_ROUND_TRIP:
        return {"backend": "inline", "envs_per_block": num_envs}
    return {
        "backend": "process",
        "num_workers": blocks - 1,
        "inline_envs": size,
        "envs_per_block": size,
    }


#: Seconds a probe in a child process may take to build the env, and then to step it.
CHILD_PROBE_DEADLINE = 30.0


class ProbeLimits(NamedTuple):
    """Seconds a probe may take to build its env, and then to step it: at most
    :data:`CHILD_PROBE_DEADLINE` each, less when the vector env's own limits are
    shorter (a probe never waits longer for an env than the vector env would)."""

    build: float
    run: float

    @classmethod
    def of(cls, startup_timeout: float | None, step_timeout: float | None) -> ProbeLimits:
        """The limits under a vector env's ``startup_timeout`` and ``step_timeout``: a
        build within the first; a reset and the probe's steps, each within the second."""
        build, run = CHILD_PROBE_DEADLINE, CHILD_PROBE_DEADLINE
        if startup_timeout is not None:
            build = min(build, startup_timeout)
        if step_timeout is not None:  # a reset and a step may take it, and the steps
            run = min(run, 2 * step_timeout + PROBE_SECONDS + 1.0)
        return cls(build, run)


def _probe(env_fn: Callable[[], gym.Env], limits: ProbeLimits | None = None) -> Probe:
    """:func:`probe_step_time` in a child process forked by the zygote (in this
    process where there is no zygote), within ``limits`` (``TimeoutError`` past them)."""
    if not _zygote.available():
        return probe_step_time(env_fn)
    limits = limits or ProbeLimits.of(None, None)
    payload = cloudpickle.dumps(env_fn)  # a factory that cannot travel: the caller falls back
    parent, child = socket.socketpair()
    try:
        process = _zygote.shared().spawn(_probe_in_child, child, (payload,))
    finally:
        child.close()
    try:
        parent.settimeout(limits.build)
        answer = parent.recv(1 << 16)  # first, the env is built: its marker
        if answer[:1] == _BUILT:
            parent.settimeout(limits.run)
            answer = answer[1:]
        while chunk := parent.recv(1 << 16):
            answer += chunk
        kind, value = pickle.loads(answer)
    finally:
        parent.close()
        process.kill()  # gone already, unless it hangs
        process.join(1.0)
        process.close()
    if kind == "async":
        raise _AsyncEnvFound
    if kind != "ok":
        raise RuntimeError(f"the probe failed: {value}")
    return Probe(*value)  # what probe_step_time returned in the child


#: What a probe's child sends once its env is built (before the probe's result).
_BUILT = b"B"


def _probe_in_child(sock: socket.socket, payload: bytes) -> None:
    try:
        env_fn = cloudpickle.loads(payload)
        result: tuple[str, Any] = ("ok", probe_step_time(env_fn, lambda: sock.sendall(_BUILT)))
    except _AsyncEnvFound:
        result = ("async", None)
    except Exception as exc:
        result = ("error", f"{type(exc).__name__}: {exc}")
    sock.sendall(pickle.dumps(result))
    sock.close()
