"""Native async envs on the coroutine backend."""

from __future__ import annotations

import asyncio
import textwrap
import time
from functools import partial

import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import aiovec
from tests.async_envs import AsyncCounterEnv
from tests.helpers import assert_cancelled_recv_loses_nothing, random_traffic, run_python
from tests.test_parity import assert_same


def async_envs(count: int, **kwargs) -> list:
    return [partial(AsyncCounterEnv, i, **kwargs) for i in range(count)]


async def test_fast_envs_come_first():
    env_fns = [partial(AsyncCounterEnv, i, delay=0.3 if i % 2 == 0 else 0.0) for i in range(4)]
    async with aiovec.VecEnv(env_fns, backend="coroutine") as venv:
        observations, infos = await venv.areset()
        assert observations[:, 0].tolist() == [0, 1, 2, 3]
        assert infos["start"].tolist() == [0, 1, 2, 3]
        venv.send(np.zeros(4, dtype=np.int64))
        first = await venv.recv(min_envs=2, max_envs=2)
        assert sorted(first.env_ids.tolist()) == [1, 3]
        rest = await venv.recv(min_envs=2)
        assert sorted(rest.env_ids.tolist()) == [0, 2]


async def test_thousand_envs_step_concurrently():
    async with aiovec.make(AsyncCounterEnv, 1000, env_kwargs={"delay": 0.05}) as venv:
        assert venv.backend == "coroutine"
        await venv.areset()
        started = time.monotonic()
        result = await venv.astep(np.zeros(1000, dtype=np.int64))
        assert time.monotonic() - started < 2.0  # concurrent: not 1000 x 50 ms
        assert result[1].tolist() == [1.0] * 1000


@pytest.mark.parametrize("mode", list(AutoresetMode), ids=lambda m: m.value)
def test_same_results_as_the_process_backend_running_the_same_logic(mode):
    """The async env through the coroutine backend, and the same env made blocking
    (SyncEnvAdapter) through worker processes, give identical results."""

    def run(venv):
        record = [venv.reset(seed=3)]
        for step in range(20):
            result = venv.step(np.array([step % 2, 1, 0]))
            record.append(result)
            if mode is AutoresetMode.DISABLED and (result[2] | result[3]).any():
                record.append(venv.reset(options={"reset_mask": result[2] | result[3]}))
        record.append(venv.get_attr("count"))
        venv.close()
        return record

    async_fns = async_envs(3, episode_length=5)
    expected = run(aiovec.VecEnv(async_fns, backend="coroutine", autoreset_mode=mode))
    blocking = [aiovec.SyncEnvAdapter.factory(fn) for fn in async_fns]
    actual = run(aiovec.VecEnv(blocking, backend="process", num_workers=2, autoreset_mode=mode))
    for index, (a, e) in enumerate(zip(actual, expected)):
        assert_same(a, e, f"record[{index}]")


async def test_every_action_gets_exactly_one_result():
    async with aiovec.VecEnv(async_envs(8, mean_delay=0.002), backend="coroutine") as venv:
        await venv.areset(seed=0)

        def check(batch, row, env_id, count):
            assert batch.observations[row][0] == env_id  # results reach the right env

        sent, received = await random_traffic(venv, 1500, seed=1, check=check)
        assert sent == received


async def test_raising_env_is_reported_and_the_others_keep_going():
    env_fns = [partial(AsyncCounterEnv, 0), partial(AsyncCounterEnv, 1, fail_at=1)]
    async with aiovec.VecEnv(env_fns, backend="coroutine") as venv:
        await venv.areset()
        venv.send([0, 0])
        with pytest.raises(aiovec.EnvError, match="env 1 raised ConnectionError in step") as caught:
            await venv.recv(min_envs=2)
        assert "dropped the connection" in caught.value.worker_traceback
        batch = await venv.recv()
        assert batch.env_ids.tolist() == [0]


# Async envs are cancelled alone on both backends that run them on a loop: the
# coroutine backend, and a worker process (which is then neither killed nor restarted).
ONE_LOOP = pytest.mark.parametrize(
    "options",
    [{"backend": "coroutine"}, {"backend": "process", "num_workers": 1}],
    ids=["coroutine", "worker"],
)


@ONE_LOOP
async def test_hanging_env_is_cancelled_alone_after_step_timeout(options):
    env_fns = [partial(AsyncCounterEnv, 0, delay=0.01), partial(AsyncCounterEnv, 1, hang_at=1)]
    async with aiovec.VecEnv(env_fns, step_timeout=0.3, **options) as venv:
        await venv.areset()
        venv.send([0, 0])
        first = await venv.recv()
        assert first.env_ids.tolist() == [0]
        venv.send([0], env_ids=[0])  # env 0 keeps stepping while env 1 hangs
        with pytest.raises(aiovec.StepTimeoutError, match=r"envs \[1\] did not answer"):
            while True:
                await venv.recv()
        assert not any(venv.worker_restarts)
        _, rewards, *_ = await venv.astep([0, 0])  # both envs still step
        assert rewards.tolist() == [3.0, 1.0]


async def test_a_worker_whose_async_env_blocks_its_loop_is_killed_as_a_backstop():
    env_fns = [partial(AsyncCounterEnv, 0), partial(AsyncCounterEnv, 1, block_at=1)]
    async with aiovec.VecEnv(env_fns, backend="process", num_workers=1, step_timeout=0.3) as venv:
        await venv.areset()
        started = time.monotonic()
        with pytest.raises(aiovec.StepTimeoutError, match=r"worker 0 hosting envs \[0, 1\]"):
            await venv.astep([0, 0])
        assert time.monotonic() - started < 10  # killed after step_timeout + a grace


@ONE_LOOP
async def test_a_hanging_reset_is_cancelled_alone_and_the_env_stays_usable(options):
    env_fns = [partial(AsyncCounterEnv, 0), partial(AsyncCounterEnv, 1, reset_delay=60)]
    async with aiovec.VecEnv(env_fns, step_timeout=0.3, **options) as venv:
        with pytest.raises(aiovec.StepTimeoutError, match=r"envs \[1\] did not answer") as caught:
            await venv.areset()
        assert caught.value.timed_out == [1] and caught.value.worker_index is None
        await venv.aset_attr("reset_delay", 0.0)
        observations, _ = await venv.areset()
        assert observations.tolist() == [[0, 0], [1, 0]]


@ONE_LOOP
async def test_restart_policy_rebuilds_a_failing_async_env(options):
    env_fns = [partial(AsyncCounterEnv, 0), partial(AsyncCounterEnv, 1, hang_at=2)]
    async with aiovec.VecEnv(env_fns, on_failure="restart", step_timeout=0.3, **options) as venv:
        await venv.areset()
        await venv.astep([0, 0])
        observations, rewards, _, truncations, infos = await venv.astep([0, 0])
        assert truncations.tolist() == [False, True]
        assert infos["restarted"].tolist() == [False, True]
        assert "did not answer" in infos["restart_reason"][1]
        assert observations[1].tolist() == [1, 0]
        assert venv.restart_counts.tolist() == [0, 1]
        assert not any(venv.worker_restarts)  # the env alone was rebuilt


async def test_cancelling_recv_loses_nothing():
    async with aiovec.VecEnv(async_envs(2, delay=0.2), backend="coroutine") as venv:
        await venv.areset()
        await assert_cancelled_recv_loses_nothing(venv)


def test_sync_api_and_close():
    venv = aiovec.VecEnv(async_envs(3, delay=0.01), backend="coroutine")
    venv.reset(seed=1)
    _, rewards, *_ = venv.step([0, 1, 0])
    assert rewards.tolist() == [1.0, 1.0, 1.0]
    assert venv.call("count", env_ids=[2]) == (1,)
    venv.set_attr("delay", 0.0)
    assert venv.get_attr("delay") == (0.0, 0.0, 0.0)
    envs = venv._backend._host.envs
    venv.close()
    assert all(env.closed for env in envs.values())


def test_async_envs_must_be_received_on_the_loop_that_started_them():
    venv = aiovec.VecEnv(async_envs(2, delay=0.01), backend="coroutine")
    venv.reset()
    venv.send([0, 0])  # no loop running: the envs start on the private loop

    async def receive():
        return await venv.recv()

    with pytest.raises(RuntimeError, match="same loop"):
        aiovec.run(receive())
    venv.close()


@pytest.mark.parametrize("mode", list(AutoresetMode), ids=lambda m: m.value)
def test_async_envs_in_worker_processes_match_the_coroutine_backend(mode):
    def run(venv):
        record = [venv.reset(seed=3, options=[{"a": i} for i in range(4)])]
        for step in range(16):
            result = venv.step(np.array([step % 2, 1, 0, 1]))
            record.append(result)
            if mode is AutoresetMode.DISABLED and (result[2] | result[3]).any():
                record.append(venv.reset(options={"reset_mask": result[2] | result[3]}))
        record.append(venv.call("count", env_ids=[3, 0, 2]))
        venv.set_attr("delay", [0.0, 0.001, 0.0, 0.001])
        record.append(venv.get_attr("delay"))
        venv.close()
        return record

    fns = async_envs(4, episode_length=5)
    expected = run(aiovec.VecEnv(fns, backend="coroutine", autoreset_mode=mode))
    actual = run(aiovec.VecEnv(fns, backend="process", num_workers=2, autoreset_mode=mode))
    for index, (a, e) in enumerate(zip(actual, expected)):
        assert_same(a, e, f"record[{index}]")


@pytest.mark.parametrize(
    "options",
    [{"backend": "coroutine"}, {"backend": "process", "num_workers": 1}],
    ids=["coroutine", "process"],
)
async def test_infos_follow_their_env_when_envs_finish_out_of_order(options):
    # Env 0 takes one loop iteration more than env 1: both land in one reply, env 1 first.
    env_fns = [partial(AsyncCounterEnv, 0, yields=2), partial(AsyncCounterEnv, 1, yields=1)]
    async with aiovec.VecEnv(env_fns, **options) as venv:
        await venv.areset()
        for _ in range(3):
            _, _, _, _, infos = await venv.astep(np.array([0, 1]))
            assert infos["action"].tolist() == [0, 1]


async def test_a_worker_overlaps_the_waits_of_its_async_envs():
    async with aiovec.VecEnv(async_envs(20, delay=0.3), backend="process", num_workers=1) as venv:
        await venv.areset()
        started = time.monotonic()
        _, rewards, *_ = await venv.astep(np.zeros(20, dtype=np.int64))
        assert time.monotonic() - started < 2.0  # concurrent in the worker, not 20 x 0.3 s
        assert rewards.tolist() == [1.0] * 20
    env_fns = [partial(AsyncCounterEnv, 0, delay=0.01), partial(AsyncCounterEnv, 1, delay=0.5)]
    async with aiovec.VecEnv(env_fns, backend="process", num_workers=1) as venv:
        await venv.areset()
        venv.send([0, 0])
        first = await venv.recv()
        assert first.env_ids.tolist() == [0]  # the fast env is back while the slow one waits
        venv.send([1], env_ids=[0])
        rest = await venv.recv(min_envs=2)
        assert sorted(rest.env_ids.tolist()) == [0, 1]


async def test_envs_finishing_together_are_answered_in_one_reply():
    from gymnasium.vector import AutoresetMode as Mode

    from aiovec._transport.buffers import build_buffers
    from aiovec._transport.protocol import Step
    from aiovec._worker.async_server import AsyncEnvServer
    from aiovec._worker.host import EnvHost

    envs = {i: AsyncCounterEnv(i, fail_at=1 if i == 7 else None) for i in range(50)}
    host = EnvHost(envs, Mode.NEXT_STEP, None)
    host.attach(build_buffers(envs[0].observation_space, envs[0].action_space, 50, np.zeros))
    replies = []
    server = AsyncEnvServer(host, emit=replies.append)
    loop = asyncio.get_running_loop()
    server.submit(Step(seq=1, env_ids=list(range(0, 50, 2))), loop)
    server.submit(Step(seq=2, env_ids=list(range(1, 50, 2))), loop)
    for _ in range(5):
        await asyncio.sleep(0)
    # one reply per command, each listing all its envs; env 7's error travels in it
    assert [(reply.seq, reply.env_ids) for reply in replies] == [
        (1, list(range(0, 50, 2))),
        (2, list(range(1, 50, 2))),
    ]
    assert [error.env_id for error in replies[1].errors] == [7]
    assert host.buffers.observations[:, 1].tolist() == [0 if i == 7 else 1 for i in range(50)]
    await asyncio.gather(*server.retire(), return_exceptions=True)


def test_a_loop_that_ends_with_steps_in_flight_fails_them_clearly():
    from aiovec.envs import AsyncLatencyEnv

    env_fn = partial(AsyncLatencyEnv, mean_step_time=5.0)
    with aiovec.VecEnv([env_fn] * 3, backend="coroutine") as venv:

        async def start():
            await venv.areset(seed=0)
            venv.send(np.zeros(3, dtype=np.int64))  # then asyncio.run returns

        asyncio.run(start())

        async def collect():
            for _ in range(3):  # one error per env, never a hang
                with pytest.raises(aiovec.EnvError, match="event loop running this async env"):
                    await asyncio.wait_for(venv.recv(max_envs=1), 10)

        asyncio.run(collect())


def _polled_env_ids(venv, count: int, pause: float = 0.0) -> list[int]:
    """The env ids of the results ``recv_nowait()`` polling collects from synchronous
    code, until ``count`` came (or 10 s passed), sorted."""
    got: list[int] = []
    deadline = time.monotonic() + 10
    while len(got) < count and time.monotonic() < deadline:
        batch = venv.recv_nowait()
        if batch is not None:
            got += batch.env_ids.tolist()
        time.sleep(pause)
    return sorted(got)


def test_recv_nowait_polling_from_synchronous_code_makes_progress():
    with aiovec.VecEnv([AsyncCounterEnv] * 2, backend="coroutine") as venv:
        venv.reset(seed=0)
        venv.send(np.zeros(2, dtype=np.int64))
        assert _polled_env_ids(venv, 2, pause=0.001) == [0, 1]


def test_recv_nowait_polling_collects_every_result_of_envs_finishing_apart():
    """Envs that finish at different times: once the last env's step is done its
    reply waits for a flush on the private loop, which a poll must still turn (it
    turned the loop only while an env had a command queued, and the last result of a
    round could stay there for good: 7 of 8 results, EnvBusyError on that env)."""
    fns = [partial(AsyncCounterEnv, i, mean_delay=0.001) for i in range(8)]
    with aiovec.VecEnv(fns, backend="coroutine") as venv:
        venv.reset(seed=0)
        for _ in range(30):
            venv.send(np.zeros(8, dtype=np.int64))
            assert _polled_env_ids(venv, 8) == list(range(8))


def test_closing_with_async_steps_in_flight_leaves_no_pending_tasks(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    code = """
import gc, numpy as np, aiovec
from tests.batched import async_point_masses
from tests.async_envs import AsyncCounterEnv
v = aiovec.make(async_point_masses, 4, envs_per_block=2, backend="coroutine",
                env_kwargs={"await_time": 5.0})
v.reset(seed=0)
v.step_async(np.zeros((4, 1), np.float32))
v.close(terminate=True)  # as Ctrl-C does: timeout 0
w = aiovec.VecEnv([AsyncCounterEnv] * 2, backend="coroutine")
w.reset(seed=0)
w.send(np.zeros(2, np.int64))
del w  # __del__ with a step in flight
gc.collect()
print("closed")
"""
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and "closed" in done.stdout, done.stderr
    assert "Task was destroyed" not in done.stderr
    assert "never awaited" not in done.stderr


def _blocking_then_async():
    from tests.envs import CounterEnv

    return [partial(CounterEnv, 0), partial(AsyncCounterEnv, 1)]


def test_auto_hosts_a_mix_whose_first_env_is_blocking():
    """``auto`` probes the first factory only: a later async env must not be stepped by
    blocking code (its coroutine taken for a result)."""
    with aiovec.VecEnv(_blocking_then_async(), backend="auto") as venv:
        assert venv.backend in ("coroutine", "process")
        observations, _ = venv.reset(seed=0)
        assert observations[1].tolist() == [1, 0]
        observations, *_ = venv.step(np.zeros(2, np.int64))
        assert observations[1].tolist() == [1, 1]


@pytest.mark.parametrize(
    "options",
    [{"backend": "inline"}, {"backend": "process", "num_workers": 1, "inline_envs": 1}],
    ids=["inline", "process+main"],
)
def test_async_envs_stepped_in_this_process_by_blocking_code_are_refused(options):
    with pytest.raises(TypeError, match=r"env 1 is an async env.*backend='coroutine'"):
        aiovec.VecEnv(_blocking_then_async(), **options)


@pytest.mark.parametrize("backend", ["coroutine", "process"])
@pytest.mark.parametrize("on_failure", ["raise", "restart"])
async def test_a_cancelled_error_raised_by_the_env_itself_is_that_envs_error(backend, on_failure):
    """A ``CancelledError`` out of the env's own step (a cancelled transport request),
    not out of a cancelled task, fails that env like any exception: reported with its
    index, or restarted; the other envs go on."""
    env_fns = [partial(AsyncCounterEnv, i, cancel_at=2 if i == 1 else None) for i in range(3)]
    options = {"num_workers": 1} if backend == "process" else {}
    async with aiovec.VecEnv(env_fns, backend=backend, on_failure=on_failure, **options) as venv:
        await venv.areset(seed=0)
        await venv.astep(np.zeros(3, np.int64))
        if on_failure == "raise":
            with pytest.raises(aiovec.EnvError, match="env 1.*cancelled") as caught:
                await venv.astep(np.zeros(3, np.int64))
            assert caught.value.env_index == 1
        else:
            observations, _, _, truncated, infos = await venv.astep(np.zeros(3, np.int64))
            assert truncated.tolist() == [False, True, False]
            assert venv.restart_counts.tolist() == [0, 1, 0]
            assert "cancelled" in infos["restart_reason"][1]
            assert observations[[0, 2], 1].tolist() == [2, 2]


def test_a_vector_env_left_on_a_closed_loop_is_collected_quietly():
    """Async envs stepping on a loop that its owner closed without closing the vector
    env: garbage-collecting it raises nothing from aiovec's own code (it raised
    'Event loop is closed' and 'no running event loop' as ignored exceptions)."""
    result = run_python(
        textwrap.dedent(
            """
            import asyncio, gc
            from functools import partial
            import numpy as np
            import aiovec
            from tests.async_envs import AsyncCounterEnv

            async def main():
                env_fns = [partial(AsyncCounterEnv, i, delay=5) for i in range(2)]
                venv = aiovec.VecEnv(env_fns, backend="coroutine")
                await venv.areset()
                venv.send(np.zeros(2, dtype=np.int64))
                await asyncio.sleep(0.1)
                return venv

            loop = asyncio.new_event_loop()
            venv = loop.run_until_complete(main())
            loop.close()  # its runners still pending
            del venv, loop
            gc.collect()
            print("collected")
            """
        )
    )
    assert result.stdout.strip() == "collected"
    assert "Exception ignored" not in result.stderr, result.stderr


@pytest.mark.parametrize("how", ["ctrl-c in a blocking env", "sys.exit in an async env"])
def test_an_interrupt_from_an_env_on_the_loop_reaches_the_caller_without_asyncio_noise(how):
    """A Ctrl-C landing in a blocking env's step (or an async env's own sys.exit) on the
    coroutine backend reaches the caller as itself, as from SyncVectorEnv, once: no
    "Task exception was never retrieved" for the env's task afterwards (it was logged
    at garbage collection)."""
    source = textwrap.dedent(
        f"""
        import gc, os, signal, threading, time
        import numpy as np
        import aiovec
        from tests.async_envs import AsyncCounterEnv
        from tests.envs import CounterEnv

        class Exiting(AsyncCounterEnv):
            async def step(self, action):
                raise SystemExit("simulator gave up")

        if {how!r} == "ctrl-c in a blocking env":
            envs = aiovec.VecEnv([AsyncCounterEnv, lambda: CounterEnv(1, delay=2.0)],
                                 backend="coroutine")
            expected = KeyboardInterrupt
            threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
        else:
            envs = aiovec.VecEnv([AsyncCounterEnv, Exiting], backend="coroutine")
            expected = SystemExit  # in this process, an env's exit is the program's
        envs.reset()
        try:
            envs.step(np.zeros(2, dtype=np.int64))
        except expected as exc:
            print("caught", type(exc).__name__)
        envs.close()
        del envs
        gc.collect()
        print("done")
        """
    )
    result = run_python(source)
    assert result.returncode == 0, result.stderr
    assert "caught" in result.stdout and "done" in result.stdout
    assert "never retrieved" not in result.stderr, result.stderr


@pytest.mark.parametrize("how", ["close", "aclose"])
def test_close_from_another_thread_while_the_envs_loop_idles_in_its_own(how):
    """Async envs live on the loop of the thread that stepped them; closed from another
    thread while no call runs, they are closed there, promptly, each once (close() raised
    'This event loop is already running' and left every env open; aclose() from the
    other thread's own loop waited out the whole close_timeout)."""
    import threading

    closed: list[int] = []

    class Recorded(AsyncCounterEnv):
        async def close(self):
            closed.append(self.env_index)

    built = threading.Event()
    holder: dict = {}

    def thread_a() -> None:
        loop = holder["loop"] = asyncio.new_event_loop()

        async def setup() -> None:
            venv = aiovec.VecEnv([partial(Recorded, i) for i in range(2)], backend="coroutine")
            await venv.areset(seed=0)
            await venv.astep(np.zeros(2, dtype=np.int64))
            holder["venv"] = venv

        loop.run_until_complete(setup())
        built.set()
        loop.run_forever()
        loop.close()

    a = threading.Thread(target=thread_a, daemon=True)
    a.start()
    assert built.wait(20)
    venv = holder["venv"]
    started = time.monotonic()
    if how == "close":
        venv.close()
    else:
        asyncio.run(venv.aclose())
    assert time.monotonic() - started < venv.close_timeout / 2
    assert venv.closed and sorted(closed) == [0, 1]
    venv.close()  # again: nothing more
    assert sorted(closed) == [0, 1]
    holder["loop"].call_soon_threadsafe(holder["loop"].stop)
    a.join(10)


class SlowToClose(AsyncCounterEnv):
    """Records its close, which awaits (a connection's goodbye) before it is done."""

    closed_indices: list[int] = []

    async def close(self):
        await asyncio.sleep(0.02)
        await asyncio.sleep(0)
        SlowToClose.closed_indices.append(self.env_index)


@pytest.mark.parametrize("where", ["end of main", "callback during recv"])
def test_a_sync_close_on_the_running_loop_closes_every_env_before_asyncio_run_returns(where):
    """close() (not aclose()) inside asyncio.run(): the async envs' close, scheduled on
    the running loop, still runs to its end, though asyncio.run() cancels every task it
    finds on the way out (0 of the envs were closed: a handler's or a callback's close
    while recv() waited, or a close() just before main returned)."""
    SlowToClose.closed_indices = []

    async def main() -> None:
        envs = aiovec.VecEnv(
            [
                partial(SlowToClose, i, delay=0.0 if where == "end of main" else 0.3)
                for i in range(4)
            ],
            backend="coroutine",
        )
        await envs.areset(seed=0)
        if where == "end of main":
            envs.send(np.zeros(4, dtype=np.int64))
            await envs.recv(min_envs=4)
            envs.close()
            return
        envs.send(np.zeros(4, dtype=np.int64)[:2], [0, 1])
        asyncio.get_running_loop().call_later(0.01, envs.close)
        with pytest.raises(aiovec.ClosedError):
            await envs.recv(min_envs=4)

    asyncio.run(main())
    assert sorted(SlowToClose.closed_indices) == [0, 1, 2, 3]


async def test_aclose_after_a_sync_close_awaits_the_envs_close():
    """close() on a running loop schedules the envs' close; an aclose() after it waits
    for that close to end (it returned at once, the envs still open)."""
    SlowToClose.closed_indices = []
    envs = aiovec.VecEnv([partial(SlowToClose, i) for i in range(3)], backend="coroutine")
    await envs.areset(seed=0)
    envs.close()
    await envs.aclose()
    assert sorted(SlowToClose.closed_indices) == [0, 1, 2]


class ResetFailsAfterRebuild(AsyncCounterEnv):
    """Env 1's first build fails its second step; its next two builds fail their reset."""

    builds = 0

    def __init__(self, env_index: int = 0) -> None:
        super().__init__(env_index)
        if env_index == 1:
            ResetFailsAfterRebuild.builds += 1
        self.build = ResetFailsAfterRebuild.builds if env_index == 1 else 0

    async def reset(self, *, seed=None, options=None):
        if self.build in (2, 3):
            raise ConnectionError("simulator 1 is still starting")
        return await super().reset(seed=seed, options=options)

    async def step(self, action):
        if self.build == 1 and self.steps_since_built == 1:
            raise RuntimeError("simulator 1 diverged")
        return await super().step(action)


def test_a_rebuilt_async_env_whose_reset_fails_is_rebuilt_again_within_max_restarts():
    ResetFailsAfterRebuild.builds = 0
    env_fns = [partial(ResetFailsAfterRebuild, i) for i in range(2)]
    with aiovec.VecEnv(env_fns, backend="coroutine", on_failure="restart", max_restarts=3) as venv:
        venv.reset(seed=0)
        venv.step(np.zeros(2, dtype=np.int64))
        _, _, _, truncations, infos = venv.step(np.zeros(2, dtype=np.int64))
        assert truncations[1] and infos["restarted"][1]
        assert ResetFailsAfterRebuild.builds == 4


@pytest.mark.parametrize("runner", ["asyncio", "aiovec"])
@pytest.mark.parametrize(
    "when", ["finally of a task cancelled on the way out", "call_soon at the end"]
)
def test_a_sync_close_as_asyncio_run_ends_still_closes_every_env(runner, when):
    """close() that lands while asyncio.run() is shutting down (in the finally of a task
    it cancels; scheduled just before main returns, so that its task is cancelled
    before it starts): every async env's close runs to its end, and no task is left
    pending (0 envs were closed, and asyncio said "Task was destroyed but it is
    pending!")."""
    source = textwrap.dedent(
        f"""
        import asyncio, gc
        from functools import partial
        import numpy as np
        import aiovec
        from tests.test_coroutine import SlowToClose

        async def main():
            envs = aiovec.VecEnv(
                [partial(SlowToClose, i, delay=0.5) for i in range(3)], backend="coroutine"
            )
            await envs.areset(seed=0)
            if {when!r} == "call_soon at the end":
                asyncio.get_running_loop().call_soon(envs.close)
                return

            async def collector():
                try:
                    envs.send(np.zeros(3, dtype=np.int64))
                    await envs.recv(min_envs=3)
                finally:
                    envs.close()

            asyncio.get_running_loop().create_task(collector())
            await asyncio.sleep(0.05)

        {"asyncio.run" if runner == "asyncio" else "aiovec.run"}(main())
        gc.collect()
        print("closed", sorted(SlowToClose.closed_indices))
        """
    )
    result = run_python(source)
    assert result.returncode == 0, result.stderr
    assert "closed [0, 1, 2]" in result.stdout, (result.stdout, result.stderr)
    assert "destroyed but it is pending" not in result.stderr, result.stderr


def test_a_sync_close_after_the_envs_loop_is_gone_still_runs_their_close():
    """The envs stepped under asyncio.run(), closed with close() after it returned (their
    loop closed): their async close runs (on a loop of its own) instead of being dropped
    unawaited; with no loop ever run, too."""
    SlowToClose.closed_indices = []

    async def main():
        envs = aiovec.VecEnv([partial(SlowToClose, i) for i in range(2)], backend="coroutine")
        await envs.areset(seed=0)
        await envs.astep(np.zeros(2, dtype=np.int64))
        return envs

    envs = asyncio.run(main())
    envs.close()
    assert sorted(SlowToClose.closed_indices) == [0, 1]
    SlowToClose.closed_indices = []
    aiovec.VecEnv([partial(SlowToClose, i) for i in range(2)], backend="coroutine").close()
    assert sorted(SlowToClose.closed_indices) == [0, 1]


def test_a_close_inside_another_loop_after_sync_sends_is_quiet():
    """Steps sent from synchronous code (on the private loop), then close() inside
    asyncio.run(): the private loop cannot run there, and its runners are dropped
    quietly (asyncio said "Task was destroyed but it is pending!" and "coroutine ...
    was never awaited")."""
    source = textwrap.dedent(
        """
        import asyncio, gc
        from functools import partial
        import numpy as np
        import aiovec
        from tests.test_coroutine import SlowToClose

        envs = aiovec.VecEnv(
            [partial(SlowToClose, i, delay=5.0) for i in range(3)], backend="coroutine"
        )
        envs.reset(seed=0)
        envs.send(np.zeros(3, dtype=np.int64))

        async def main():
            envs.close()

        asyncio.run(main())
        gc.collect()
        print("closed", envs.closed)
        """
    )
    result = run_python(source)
    assert result.returncode == 0, result.stderr
    assert "closed True" in result.stdout
    assert "destroyed but it is pending" not in result.stderr, result.stderr
    assert "never awaited" not in result.stderr, result.stderr


def test_a_close_while_the_loop_shuts_down_its_generators_says_to_await_aclose():
    """close() in the finally of an async generator that asyncio.run() finalizes on its
    way out comes after the loop stopped taking new work: a RuntimeWarning says so and
    names `await envs.aclose()` (a ResourceWarning about aiovec's own generator, and
    envs silently left unclosed, before)."""
    source = textwrap.dedent(
        """
        import asyncio, warnings
        from functools import partial
        import aiovec
        from tests.test_coroutine import SlowToClose

        warnings.simplefilter("always")

        async def rollouts(envs):
            try:
                while True:
                    yield 1
            finally:
                envs.close()

        async def main():
            envs = aiovec.VecEnv([partial(SlowToClose, i) for i in range(2)], backend="coroutine")
            await envs.areset(seed=0)
            main.gen = rollouts(envs)
            await main.gen.__anext__()

        asyncio.run(main())
        """
    )
    result = run_python(source)
    assert result.returncode == 0, result.stderr
    assert "RuntimeWarning" in result.stderr and "await envs.aclose()" in result.stderr
    assert "closing_at_shutdown" not in result.stderr, result.stderr


def test_ctrl_c_in_sync_calls_leaves_no_event_loop_behind():
    """Ctrl-C during synchronous steps of async envs (a notebook cell interrupted, again
    and again): each time the env closes and its private event loop is closed with it
    (uvloop's was left "running" and open, ~5 descriptors per interrupted cell); a Ctrl-C
    while an env computes without awaiting is raised at once (uvloop held it back until
    every other ready env had run)."""
    source = textwrap.dedent(
        """
        import asyncio, gc, os, signal, threading, time
        import numpy as np, gymnasium as gym
        import aiovec

        class Echo(aiovec.AsyncEnv):
            observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
            action_space = gym.spaces.Discrete(2)
            async def reset(self, *, seed=None, options=None):
                return np.zeros(4, np.float32), {}
            async def step(self, action):
                await asyncio.sleep(0)
                if action == 1:  # computes 1 s without awaiting
                    deadline = time.monotonic() + 1.0
                    while time.monotonic() < deadline:
                        pass
                return np.zeros(4, np.float32), 1.0, False, False, {}

        def descriptors():
            return len(os.listdir("/proc/self/fd"))

        start = descriptors()
        for attempt in range(12):
            envs = aiovec.VecEnv([Echo] * 4, backend="coroutine")
            envs.reset(seed=0)
            timer = threading.Timer(0.05 + 0.02 * attempt, os.kill, (os.getpid(), signal.SIGINT))
            timer.start()
            try:
                while True:
                    envs.step(np.zeros(4, np.int64))
            except KeyboardInterrupt:
                pass
            timer.join()
            assert envs.closed
            del envs
        gc.collect()
        loops = [o for o in gc.get_objects() if isinstance(o, asyncio.AbstractEventLoop)]
        print("growth", descriptors() - start, "open loops", sum(not l.is_closed() for l in loops))
        envs = aiovec.VecEnv([Echo] * 3, backend="coroutine")
        envs.reset(seed=0)
        timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        started = time.monotonic()
        try:
            envs.step(np.ones(3, np.int64))  # three envs computing 1 s each
        except KeyboardInterrupt:
            print("interrupted after", round(time.monotonic() - started, 1))
        timer.join()
        """
    )
    result = run_python(source)
    assert result.returncode == 0, result.stderr
    words = result.stdout.split()
    growth, open_loops = int(words[1]), int(words[4])
    assert growth <= 2 and open_loops == 0, result.stdout
    interrupted = float(result.stdout.split("interrupted after")[1].split()[0])
    assert interrupted < 2.0, result.stdout  # within the env computing, not all three


class _Interrupted(Exception):
    """What a signal handler raises (a timeout decorator's), here inside aiovec's own
    code running an async env's command."""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("api", ["sync", "async"])
def test_an_exception_inside_the_runner_of_an_env_fails_its_command_never_hangs(api, monkeypatch):
    from aiovec._worker.async_server import AsyncEnvServer

    finish = AsyncEnvServer._finish
    raised = []

    def interrupted_once(self, command, position, result, loop):
        if not raised and type(command).__name__ == "Step":
            raised.append(True)
            raise _Interrupted("alarm")
        return finish(self, command, position, result, loop)

    monkeypatch.setattr(AsyncEnvServer, "_finish", interrupted_once)
    venv = aiovec.VecEnv([partial(AsyncCounterEnv, i) for i in range(2)], backend="coroutine")

    async def step(actions):
        return await venv.astep(actions)

    def run(call):
        return call() if api == "sync" else aiovec.run(call())

    try:
        run(venv.reset if api == "sync" else venv.areset)
        with pytest.raises(aiovec.EnvError, match="alarm") as caught:
            run(lambda: venv.step([0, 0]) if api == "sync" else step([0, 0]))
        assert caught.value.env_index in (0, 1) and isinstance(caught.value, _Interrupted)
        run(venv.reset if api == "sync" else venv.areset)  # the env goes on
        _, rewards, *_ = run(lambda: venv.step([0, 0]) if api == "sync" else step([0, 0]))
        assert rewards.tolist() == [1.0, 1.0]
    finally:
        venv.close()
