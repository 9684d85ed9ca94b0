"""A bounded soak: several tasks at once (stepping first-ready, calling with large
payloads) while envs crash, raise and hang at random under the restart policy. Every
sent action yields exactly one result, nothing hangs, nothing leaks."""

from __future__ import annotations

import asyncio
import random
from functools import partial

import pytest

import aiovec
from tests.faulty import FaultyEnv
from tests.helpers import random_traffic

PAYLOAD = b"p" * (1 << 20)  # 1 MB each way, beside the steps


@pytest.mark.timeout(120)
async def test_soak_concurrent_tasks_with_crashes_hangs_and_big_frames(no_leaks):
    faults = ["exit", "raise", "hang", "sigkill", "raise", "exit"]
    env_fns = [partial(FaultyEnv, i, fault, rate=0.003) for i, fault in enumerate(faults)]
    async with aiovec.VecEnv(
        env_fns, num_workers=3, on_failure="restart", max_restarts=50, step_timeout=1.0
    ) as venv:
        await venv.areset()
        stop = asyncio.Event()
        calls = 0

        async def calling() -> None:
            nonlocal calls
            rng = random.Random(1)
            while not stop.is_set():
                env_id = rng.randrange(len(faults))
                try:
                    await venv.aset_attr("payload", PAYLOAD, env_ids=[env_id])
                    (echo,) = await venv.acall("payload", env_ids=[env_id])
                    assert echo == PAYLOAD
                    calls += 1
                except (aiovec.WorkerCrashedError, aiovec.EnvError):
                    pass  # the env's worker died under the call: it is rebuilt
                await asyncio.sleep(0.01)

        def check(batch, row, env_id, count):
            assert batch.observations[row][0] == env_id

        caller = asyncio.ensure_future(calling())
        sent, received = await random_traffic(venv, 100_000, seed=3, check=check, seconds=15)
        stop.set()
        await asyncio.wait_for(caller, 30)
        assert received == sent and sum(sent) > 100
        assert calls > 10
        assert sum(venv.restart_counts) + sum(venv.worker_restarts) > 0
