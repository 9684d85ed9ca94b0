"""The benchmark workloads W1-W8, spin and the memory workload, as data."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import gymnasium as gym

import aiovec
from aiovec.bench.contenders import (
    AiovecFirstReady,
    BareAsyncioFloor,
    Contender,
    EnvFn,
    GymnasiumLockstep,
    ParallelCeiling,
    RayActorPerEnv,
    SB3Lockstep,
    ThreadsCeiling,
    ensure_ray,
    lockstep_contenders,
    ray_available,
    sb3_available,
)

CORES = os.cpu_count() or 1
LARGE_OBS_BYTES = 84 * 84 * 4


@dataclass
class Workload:
    """What to run and how to read the result.

    ``metric`` is ``"steps/s"`` (higher is better) or ``"us/step"`` (per vector step,
    lower is better). ``ideal`` (steps/s), when set, turns throughput into a fraction
    of what the workload allows on this machine. ``settle`` seconds of untimed stepping
    open each window: first-ready contenders carry envs in flight from one window to
    the next, and envs that finished while other contenders ran would otherwise be
    counted as a burst of free steps.
    """

    key: str
    title: str
    env_fn: Callable[[], gym.Env | aiovec.AsyncEnv]  # W6's envs are async
    num_envs: int
    contenders: Callable[[], list[Contender]]
    metric: str = "steps/s"
    ideal: float | None = None
    bytes_per_step: int = 0
    measure_memory: bool = False  # report memory per env
    #: Keep one extra process busy-looping for the whole workload (a noisy neighbour).
    busy_neighbour: bool = False
    settle: float = 0.0
    notes: list[str] = field(default_factory=list)


def _make(env_id: str, **kwargs: Any) -> EnvFn:
    return partial(gym.make, env_id, **kwargs)


LOCKSTEP = ("auto", "inline", "process", "hybrid", "sync", "async", "sb3")


def w1(num_envs: int, env_id: str = "CartPole-v1", with_ray: bool = False) -> Workload:
    env_fn = _make(env_id)
    include = LOCKSTEP + (("ray",) if with_ray else ())
    return Workload(
        key=f"W1-{num_envs}",
        title=f"W1: {env_id}, {num_envs} envs, random actions (lockstep throughput)",
        env_fn=env_fn,
        num_envs=num_envs,
        contenders=lambda: lockstep_contenders(env_fn, num_envs, env_id=env_id, include=include),
    )


def w2(num_envs: int) -> Workload:
    env_fn = _make("aiovec/NoOp-v0")
    return Workload(
        key=f"W2-{num_envs}",
        title=f"W2: no-op env, {num_envs} env(s) (overhead per vector step)",
        env_fn=env_fn,
        num_envs=num_envs,
        contenders=lambda: lockstep_contenders(
            env_fn, num_envs, include=("inline", "process", "hybrid", "sync", "async", "sb3")
        ),
        metric="us/step",
    )


def _latency_workload(
    key: str,
    title: str,
    num_envs: int,
    mean: float,
    mode: str,
    ideal: float,
    workers: list[int],
    with_ray: bool = False,
) -> Workload:
    env_fn = _make(
        "aiovec/VariableLatency-v0", mean_step_time=mean, sigma=1.0, max_step_time=0.05, mode=mode
    )

    def contenders() -> list[Contender]:
        common: dict[str, Any] = {"env_fn": env_fn, "num_envs": num_envs}
        # What users get without options: VecEnv(fns) (the AsyncVectorEnv replacement)
        # and make(..., backend="auto"), both first-ready one env at a time (EnvPool's
        # batch_size=1); and VecEnv(fns) with recv()'s defaults (whatever is ready, at
        # least one env: Tianshou's wait_num=1).
        result: list[Contender] = [
            AiovecFirstReady(1, {}, label="VecEnv(fns) default", **common),
            AiovecFirstReady(None, {}, label="VecEnv(fns) default", **common),
            AiovecFirstReady(1, {"backend": "auto"}, label="make auto", **common),
            GymnasiumLockstep(
                "aiovec VecEnv(fns) default (lockstep)",
                "aiovec",
                partial(aiovec.VecEnv, [env_fn] * num_envs),
                **common,
            ),
            GymnasiumLockstep(
                "aiovec make auto (lockstep)",
                "aiovec",
                partial(aiovec.VecEnv, [env_fn] * num_envs, backend="auto"),
                **common,
            ),
        ]
        for num_workers in workers:
            result += lockstep_contenders(
                env_fn,
                num_envs,
                include=("process",),
                process_options={"num_workers": num_workers},
            )
            for batch_size in (num_envs // 2, 1):
                result.append(
                    AiovecFirstReady(
                        batch_size, {"backend": "process", "num_workers": num_workers}, **common
                    )
                )
        result += lockstep_contenders(env_fn, num_envs, include=("sync", "async"))
        if mode == "sleep":  # waiting envs: what the machine allows with no runtime at all
            result.append(ThreadsCeiling(**common))
        if sb3_available():
            result.append(SB3Lockstep("SubprocVecEnv", **common))
        if with_ray and ray_available():
            ensure_ray()
            # one actor stepping all its envs concurrently (they mostly sleep), taking
            # no CPU reservation; the agent takes whatever is ready
            for transport in (None, "calls"):  # the default (link), and Ray calls
                ray_options: dict[str, Any] = {
                    "num_cpus": 0,
                    **({"transport": transport} if transport else {}),
                }
                options: dict[str, Any] = {
                    "backend": "ray",
                    "num_workers": 1,
                    "ray_options": ray_options,
                }
                result.append(AiovecFirstReady(num_envs, options, **common))
            result.append(RayActorPerEnv(**common))
        return result

    return Workload(
        key=key,
        title=title,
        env_fn=env_fn,
        num_envs=num_envs,
        contenders=contenders,
        ideal=ideal,
        settle=25 * mean,
    )


def spin_with_busy_neighbour() -> Workload:
    """One no-op env in one worker, lockstep, while another process keeps a core busy:
    the process backend's default (spinning allowed: fewer workers than cores) against
    ``spin=0``. Spinning must never make a step slower than sleeping would."""
    env_fn = _make("aiovec/NoOp-v0")

    def contenders() -> list[Contender]:
        common: dict[str, Any] = {"env_fn": env_fn, "num_envs": 1}
        return [
            GymnasiumLockstep(
                "aiovec process (spin default)",
                "aiovec",
                partial(aiovec.VecEnv, [env_fn], backend="process"),
                **common,
            ),
            GymnasiumLockstep(
                "aiovec process (spin=0)",
                "aiovec",
                partial(aiovec.VecEnv, [env_fn], backend="process", spin=0.0),
                **common,
            ),
        ]

    return Workload(
        key="spin",
        title="Spinning next to a busy process: no-op env, 1 env, 1 worker, lockstep",
        env_fn=env_fn,
        num_envs=1,
        contenders=contenders,
        metric="us/step",
        busy_neighbour=True,
    )


def w3(num_envs: int = 16, with_ray: bool = False) -> Workload:
    mean = 0.002
    return _latency_workload(
        "W3",
        f"W3: IO-like latency (sleep, lognormal mean 2 ms), {num_envs} envs",
        num_envs,
        mean,
        "sleep",
        ideal=num_envs / mean,
        workers=[num_envs],
        with_ray=with_ray,
    )


def w4(num_envs: int = 8) -> Workload:
    mean = 0.0005
    return _latency_workload(
        "W4",
        f"W4: CPU-bound latency (busy, lognormal mean 0.5 ms), {num_envs} envs",
        num_envs,
        mean,
        "busy",
        ideal=CORES / mean,
        workers=sorted({min(CORES, num_envs), num_envs}),
    )


def w5(num_envs: int = 8) -> Workload:
    env_fn = _make("aiovec/LargeObs-v0")

    def contenders() -> list[Contender]:
        result = []
        for copy in (True, False):
            for contender in lockstep_contenders(
                env_fn, num_envs, copy=copy, include=("inline", "process", "sync", "async")
            ):
                contender.name += " copy" if copy else " zero-copy"
                result.append(contender)
        return result

    return Workload(
        key="W5",
        title=f"W5: 84x84x4 uint8 observations, {num_envs} envs (throughput and MB/s)",
        env_fn=env_fn,
        num_envs=num_envs,
        contenders=contenders,
        bytes_per_step=LARGE_OBS_BYTES,
    )


def w6(num_envs: int = 1000) -> Workload:
    """Async envs (asyncio.sleep, lognormal mean 50 ms) on the coroutine backend and in
    worker processes (one loop each), vs the same logic as blocking envs in workers."""
    from aiovec.async_env import SyncEnvAdapter
    from aiovec.envs import AsyncLatencyEnv

    mean = 0.05
    env_fn = partial(AsyncLatencyEnv, mean_step_time=mean)

    def contenders() -> list[Contender]:
        common: dict[str, Any] = {"num_envs": num_envs}
        workers = min(num_envs, 64)
        result: list[Contender] = [
            AiovecFirstReady(num_envs, {"backend": "coroutine"}, env_fn=env_fn, **common),
            # the same async envs, driven concurrently by one event loop per worker process
            AiovecFirstReady(
                num_envs,
                {"backend": "process", "num_workers": min(CORES, num_envs)},
                env_fn=env_fn,
                **common,
            ),
        ]
        if num_envs <= 1000:  # beyond, a thread per blocking env is not a contender
            result.append(
                AiovecFirstReady(
                    num_envs,
                    {"backend": "process", "num_workers": workers},
                    env_fn=SyncEnvAdapter.factory(env_fn),
                    **common,
                )
            )
        result.append(BareAsyncioFloor(mean, 1.0, 1.0, env_fn=env_fn, **common))
        return result

    return Workload(
        key=f"W6-{num_envs}",
        title=f"W6: async envs awaiting lognormal latency (mean 50 ms), {num_envs} envs",
        env_fn=env_fn,
        num_envs=num_envs,
        contenders=contenders,
        ideal=num_envs / mean,
        measure_memory=True,
        settle=6 * mean,  # the lognormal's 99th percentile is ~4 means
    )


def w7(num_envs: int = 4096) -> Workload:
    """Batched envs: CartPole from Gymnasium's vector entry point, in blocks over the
    workers, vs one in-process Gymnasium vector env of ``num_envs`` and vs aiovec with
    ``num_envs`` single-instance CartPoles."""
    env_fn = _make("CartPole-v1")
    common: dict[str, Any] = {"env_fn": env_fn, "num_envs": num_envs}
    batched = partial(aiovec.make, "CartPole-v1", num_envs, vectorization_mode="vector_entry_point")

    def contenders() -> list[Contender]:
        return [
            GymnasiumLockstep("aiovec batched (make auto)", "aiovec", batched, **common),
            GymnasiumLockstep(
                f"aiovec batched process ({CORES} workers, a block each)",
                "aiovec",
                partial(batched, backend="process", num_workers=CORES),
                **common,
            ),
            GymnasiumLockstep(
                "gymnasium vector entry point (in-process)",
                "gymnasium",
                partial(
                    gym.make_vec, "CartPole-v1", num_envs, vectorization_mode="vector_entry_point"
                ),
                **common,
            ),
            GymnasiumLockstep(
                "aiovec single-instance envs (make auto)",
                "aiovec",
                partial(aiovec.make, "CartPole-v1", num_envs),
                **common,
            ),
            ParallelCeiling(
                partial(gym.make_vec, "CartPole-v1", vectorization_mode="vector_entry_point"),
                CORES,
                **common,
            ),
        ]

    return Workload(
        key=f"W7-{num_envs}",
        title=f"W7: CartPole via the vector entry point, {num_envs} envs in blocks (lockstep)",
        env_fn=env_fn,
        num_envs=num_envs,
        contenders=contenders,
    )


def w8(num_envs: int = 4096, horizon: int = 16) -> Workload:
    """Imagination: a torch MLP dynamics model (:mod:`aiovec.imagination`) stepping
    ``num_envs`` imagined rollouts of ``horizon`` steps, in blocks on the workers vs in
    this process; ``torch.set_num_threads(1)`` in every process (a fair split)."""
    import numpy as np
    import torch

    from aiovec.imagination import DynamicsModel, ModelVectorEnv, model_weights

    torch.manual_seed(0)
    start_states = np.random.default_rng(0).uniform(-0.05, 0.05, (256, 4)).astype(np.float32)
    env_kwargs: dict[str, Any] = {
        "weights": model_weights(DynamicsModel(obs_dim=4, num_actions=2)),
        "start_states": start_states,
        "horizon": horizon,
        "threads": 1,  # in every process, this one included: a fair split of the cores
    }
    common: dict[str, Any] = {"env_fn": _make("CartPole-v1"), "num_envs": num_envs}
    blocks = partial(
        aiovec.make,
        ModelVectorEnv.factory,
        num_envs,
        vectorization_mode="vector_entry_point",
        env_kwargs=env_kwargs,
    )

    def contenders() -> list[Contender]:
        return [
            GymnasiumLockstep(
                f"aiovec blocks ({CORES} workers)",
                "aiovec",
                partial(
                    blocks,
                    envs_per_block=num_envs // CORES,
                    backend="process",
                    num_workers=CORES,
                ),
                **common,
            ),
            GymnasiumLockstep("aiovec blocks (make auto)", "aiovec", blocks, **common),
            GymnasiumLockstep(
                "torch model in-process",
                "torch",
                partial(ModelVectorEnv, num_envs, **env_kwargs),
                **common,
            ),
            ParallelCeiling(partial(ModelVectorEnv.factory, **env_kwargs), CORES, **common),
        ]

    return Workload(
        key=f"W8-{num_envs}",
        title=f"W8: imagination, torch MLP, {num_envs} rollouts of horizon {horizon} (lockstep)",
        env_fn=common["env_fn"],
        num_envs=num_envs,
        contenders=contenders,
    )


#: The names :func:`workload` knows, and the two the command line runs itself.
WORKLOAD_KEYS = ("W1", "W2", "W3", "W4", "W5", "W6", "W7", "W8", "SPIN", "MEMORY", "REPLAY")


def workload(
    key: str, num_envs: int | None = None, env_id: str | None = None, with_ray: bool = False
) -> list[Workload]:
    """The workloads named ``key`` (``W1`` expands to 8 and 64 envs unless given);
    ``with_ray`` adds the Ray rows to W1 and W3."""
    key = key.upper()
    if key == "W1":
        counts = [num_envs] if num_envs else [8, 64]
        return [w1(n, env_id or "CartPole-v1", with_ray) for n in counts]
    if key == "W2":
        return [w2(n) for n in ([num_envs] if num_envs else [1, 8])]
    if key == "W3":
        return [w3(num_envs or 16, with_ray)]
    if key == "W4":
        return [w4(num_envs or 8)]
    if key == "W5":
        return [w5(num_envs or 8)]
    if key == "SPIN":
        return [spin_with_busy_neighbour()]
    if key == "W6":
        return [w6(n) for n in ([num_envs] if num_envs else [1000, 10000])]
    if key == "W7":
        return [w7(num_envs or 4096)]
    if key == "W8":
        return [w8(num_envs or 4096)]
    raise ValueError(unknown_workload(key))


def unknown_workload(key: str) -> str:
    """The message for a workload name that is not one of :data:`WORKLOAD_KEYS`."""
    return f"unknown workload {key!r}: choose from W1-W8, spin, memory, replay"
