"""The Ray backend on a real local Ray cluster (ray.init(num_cpus=2))."""

from __future__ import annotations

import os
import signal
import socket
import textwrap
import time
from functools import partial

import gymnasium as gym
import numpy as np
import pytest
import ray
from gymnasium.vector import AutoresetMode

import aiovec
from tests.envs import CounterEnv, LedgerEnv, SpacesEnv
from tests.helpers import MAIN_MODULE_WALKER
from tests.test_parity import assert_same


@pytest.fixture(scope="module", autouse=True)
def ray_cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def run(venv, mode, steps=25):
    venv.action_space.seed(4)
    record = [venv.reset(seed=9)]
    for _ in range(steps):
        result = venv.step(venv.action_space.sample())
        record.append(result)
        if mode is AutoresetMode.DISABLED and (result[2] | result[3]).any():
            record.append(venv.reset(options={"reset_mask": result[2] | result[3]}))
    record.append(venv.call("scale", 2))
    offset = np.arange(3.0)  # a closure and a numpy argument travel to the actors too
    record.append(venv.apply(lambda env, scale: (offset * scale, type(env).__name__), 2.0))
    venv.close()
    return record


CONCURRENCY = pytest.mark.parametrize(
    "concurrent", [False, True], ids=["envs-one-after-another", "envs-concurrent"]
)
TRANSPORT = pytest.mark.parametrize("transport", ["link", "calls"])


def test_a_link_over_tcp_gives_the_same_results(monkeypatch):
    # As if the actors ran on other nodes: the links go over TCP instead of unix sockets.
    import aiovec.backends.ray as ray_backend

    monkeypatch.setattr(ray_backend, "this_node", lambda: "a node without actors")
    space = gym.spaces.Dict({"x": gym.spaces.Box(-1, 1, (3,)), "k": gym.spaces.Discrete(4)})
    env_fns = [partial(SpacesEnv, space, gym.spaces.MultiDiscrete([2, 3]))] * 4
    mode = AutoresetMode.NEXT_STEP
    expected = run(aiovec.VecEnv(env_fns, backend="process"), mode)
    venv = aiovec.VecEnv(env_fns, backend="ray", num_workers=2)
    assert all(link.sock.family == socket.AF_INET for link in venv._backend._transport._links)
    for index, (a, e) in enumerate(zip(run(venv, mode), expected)):
        assert_same(a, e, f"record[{index}]")


@TRANSPORT
@CONCURRENCY
@pytest.mark.parametrize("mode", list(AutoresetMode), ids=lambda m: m.value)
def test_same_results_as_the_process_backend(mode, concurrent, transport):
    space = gym.spaces.Dict({"x": gym.spaces.Box(-1, 1, (3,)), "k": gym.spaces.Discrete(4)})
    env_fns = [partial(SpacesEnv, space, gym.spaces.MultiDiscrete([2, 3]))] * 4
    expected = run(aiovec.VecEnv(env_fns, backend="process", autoreset_mode=mode), mode)
    options = {"concurrent_envs": concurrent, "transport": transport}
    actual = run(
        aiovec.VecEnv(
            env_fns, backend="ray", num_workers=2, autoreset_mode=mode, ray_options=options
        ),
        mode,
    )
    for index, (a, e) in enumerate(zip(actual, expected)):
        assert_same(a, e, f"record[{index}]")


async def test_waiting_envs_of_one_actor_overlap_and_the_fast_ones_come_first():
    # No option given: the actor measures its first steps, finds that these envs wait,
    # and overlaps them from then on (as a process worker does).
    env_fns = [partial(CounterEnv, i, delay=0.6 if i % 2 == 0 else 0.0) for i in range(4)]
    async with aiovec.VecEnv(env_fns, backend="ray", num_workers=1) as venv:
        await venv.areset()
        assert not venv._backend.steps_concurrently(0)  # nothing measured yet
        for _ in range(2):  # each env's first step is not measured: the second is
            await venv.astep(np.zeros(4, dtype=np.int64))
        assert venv._backend.steps_concurrently(0)  # the agent was told
        await venv.areset()
        started = time.monotonic()
        venv.send(np.zeros(4, dtype=np.int64))
        first = await venv.recv(min_envs=2)
        assert sorted(first.env_ids.tolist()) == [1, 3]  # the slow envs still sleep
        venv.send(np.zeros(2, dtype=np.int64), env_ids=first.env_ids)
        rest = await venv.recv(min_envs=4)
        assert sorted(rest.env_ids.tolist()) == [0, 1, 2, 3]
        assert time.monotonic() - started < 1.0  # envs 0 and 2 slept together, not in turn
        assert rest.observations[np.argsort(rest.env_ids)][:, 1].tolist() == [1, 2, 1, 2]


@pytest.mark.parametrize("mode", list(AutoresetMode), ids=lambda m: m.value)
def test_async_envs_in_actors_match_the_coroutine_backend(mode):
    from tests.async_envs import AsyncCounterEnv

    def record(venv):
        results = [venv.reset(seed=3)]
        for step in range(12):
            result = venv.step(np.array([step % 2, 1, 0, 1]))
            results.append(result)
            if mode is AutoresetMode.DISABLED and (result[2] | result[3]).any():
                results.append(venv.reset(options={"reset_mask": result[2] | result[3]}))
        results.append(venv.call("count", env_ids=[3, 0]))
        venv.close()
        return results

    env_fns = [partial(AsyncCounterEnv, i, delay=0.001 * i, episode_length=5) for i in range(4)]
    expected = record(aiovec.VecEnv(env_fns, backend="coroutine", autoreset_mode=mode))
    actual = record(aiovec.VecEnv(env_fns, backend="ray", num_workers=2, autoreset_mode=mode))
    for index, (a, e) in enumerate(zip(actual, expected)):
        assert_same(a, e, f"record[{index}]")


async def test_first_ready_across_actors():
    env_fns = [partial(CounterEnv, i, delay=0.4 if i < 2 else 0.0) for i in range(4)]
    async with aiovec.VecEnv(env_fns, backend="ray", num_workers=2) as venv:
        assert venv.num_workers == 2
        await venv.areset()
        venv.send(np.zeros(4, dtype=np.int64))
        first = await venv.recv(min_envs=2)
        assert sorted(first.env_ids.tolist()) == [2, 3]  # the fast actor answered first
        rest = await venv.recv(min_envs=2)
        assert sorted(rest.env_ids.tolist()) == [0, 1]


def counter_envs_in_two_actors(concurrent: bool, transport: str, **options) -> aiovec.VecEnv:
    return aiovec.VecEnv(
        [partial(CounterEnv, i) for i in range(4)],
        backend="ray",
        num_workers=2,
        ray_options={"concurrent_envs": concurrent, "transport": transport},
        **options,
    )


@TRANSPORT
@CONCURRENCY
def test_killed_actor_raises_under_raise_policy(concurrent, transport):
    venv = counter_envs_in_two_actors(concurrent, transport)
    venv.reset()
    ray.kill(venv._backend._actors[1], no_restart=True)
    deadline = time.monotonic() + 30  # ray.kill takes effect when Ray gets to it
    with pytest.raises(aiovec.WorkerCrashedError, match=r"worker 1 hosting envs \[2, 3\]"):
        while time.monotonic() < deadline:
            venv.step(np.zeros(4, dtype=np.int64))
            time.sleep(0.05)
    venv.close()


@TRANSPORT
@CONCURRENCY
def test_killed_actor_is_rebuilt_under_restart_policy(concurrent, transport):
    venv = counter_envs_in_two_actors(concurrent, transport, on_failure="restart")
    venv.reset()
    venv.step(np.zeros(4, dtype=np.int64))
    ray.kill(venv._backend._actors[1], no_restart=True)
    truncated_seen = np.zeros(4, dtype=bool)
    restarted_seen = np.zeros(4, dtype=bool)
    reasons: list[str] = []
    deadline = time.monotonic() + 30  # ray.kill takes effect when Ray gets to it
    while time.monotonic() < deadline:
        _, rewards, _, truncations, infos = venv.step(np.zeros(4, dtype=np.int64))
        truncated_seen |= truncations
        if "restarted" in infos:
            restarted = infos["_restarted"] & infos["restarted"].astype(bool)
            restarted_seen |= restarted
            reasons += [infos["restart_reason"][i] for i in np.flatnonzero(restarted)]
        # With concurrent envs, one env may have answered the step the actor died in:
        # its restart notice then comes with the next step, the other's with this one.
        if truncated_seen[2:].all() and restarted_seen[2:].all():
            break
        time.sleep(0.05)
    assert truncated_seen.tolist() == [False, False, True, True]
    assert restarted_seen.tolist() == [False, False, True, True]
    assert all("Ray actor died" in reason for reason in reasons)
    assert venv.restart_counts.tolist() == [0, 0, 1, 1]
    venv.close()


def test_does_not_init_or_shut_down_a_ray_the_user_started():
    venv = aiovec.make("CartPole-v1", 2, backend="ray")
    venv.reset()
    venv.close()
    assert ray.is_initialized()  # the module's cluster is still up


def test_benchmark_rows_for_ray_run():
    import dataclasses

    from aiovec.bench import suite, workloads

    w3 = workloads.w3(4, with_ray=True)
    # The Ray rows only: the others are the CLI bench test's.
    ray_only = dataclasses.replace(
        w3, contenders=lambda: [c for c in w3.contenders() if "ray" in c.name]
    )
    result = suite.run_workload(ray_only, 0.2, 1, progress=lambda _: None)
    rates = {entry.name: entry.rate for entry in result.results}
    assert rates["aiovec ray (first-ready 4, 1 workers)"] > 0
    assert rates["ray, one actor per env (first-ready 1)"] > 0


def _node_of(env) -> str:
    return ray.get_runtime_context().get_node_id()


def test_actors_per_node_places_actors_node_by_node():
    here = ray.get_runtime_context().get_node_id()
    env_fns = [partial(CounterEnv, i) for i in range(4)]
    options = {"actors_per_node": 2, "num_cpus": 0}
    with aiovec.VecEnv(env_fns, backend="ray", num_workers=2, ray_options=options) as venv:
        assert venv.apply(_node_of) == (here,) * 4  # one node here: both actors on it
    with pytest.raises(ValueError, match="2 actors at 1 per node need 2 nodes; the Ray cluster "
                       "has 1 alive"):  # fmt: skip
        aiovec.VecEnv(env_fns, backend="ray", num_workers=2, ray_options={"actors_per_node": 1})
    assert ray.is_initialized()  # the user's Ray is left alone after the error


async def test_a_hanging_async_env_in_an_actor_is_cancelled_alone():
    from tests.async_envs import AsyncCounterEnv

    env_fns = [partial(AsyncCounterEnv, 0, delay=0.01), partial(AsyncCounterEnv, 1, hang_at=1)]
    async with aiovec.VecEnv(
        env_fns, backend="ray", num_workers=1, step_timeout=0.5, ray_options={"num_cpus": 0}
    ) as venv:
        await venv.areset()
        venv.send([0, 0])
        with pytest.raises(aiovec.StepTimeoutError, match="its command was cancelled"):
            while True:
                await venv.recv()
        assert venv.worker_restarts == (0,)  # the actor lives on
        _, rewards, *_ = await venv.astep([0, 0])
        assert rewards.tolist() == [2.0, 1.0]


async def test_step_timeout_bounds_each_env_of_an_actor_stepping_them_in_turn():
    from tests.test_timeouts import BusyEnv

    # Four computing envs in one actor (stepped one after another), each taking half of
    # step_timeout: none is late, although the actor's command takes twice as long.
    async with _one_actor([partial(BusyEnv, i, seconds=0.25) for i in range(4)]) as venv:
        await venv.areset()
        _, rewards, *_ = await venv.astep(np.zeros(4, dtype=np.int64))
        assert rewards.tolist() == [1.0] * 4


def test_a_link_answers_only_the_connection_that_brings_the_token():
    from aiovec._transport import by_value
    from aiovec._transport.channel import Channel
    from aiovec._transport.protocol import Reset, encode
    from aiovec.backends._ray_actor import EnvActor, answer_decoder

    actor = ray.remote(num_cpus=0)(EnvActor).remote(
        by_value.dumps({0: partial(CounterEnv, 0)}), AutoresetMode.NEXT_STEP.value, 0, None
    )
    description = ray.get(actor.describe.remote())
    ray.get(actor.attach.remote(*description[0][0][:2], 1))
    node, host, port, unix_name = ray.get(actor.link.remote(b"s" * 16))
    assert node == ray.get_runtime_context().get_node_id()
    if unix_name is not None:  # Linux: the same node's agent takes the unix socket
        with socket.socket(socket.AF_UNIX) as stranger:
            stranger.connect(unix_name)
            stranger.sendall(b"x" * 16)
            assert stranger.recv(1) == b""  # closed on it: a wrong token drives nothing
    with socket.create_connection((host, port), timeout=10) as stranger:
        stranger.sendall(b"x" * 16)
        assert stranger.recv(1) == b""
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(b"s" * 16)
        link = Channel(sock)
        link.send(encode((Reset(seq=1, env_ids=[0], seeds=[3]), None)))
        concurrent, [(reply, rows)] = answer_decoder.decode(link.receive())
        assert concurrent is False  # one env: nothing to overlap
        assert (reply.seq, reply.env_ids) == (1, [0])
        assert rows[0].tolist() == [[0, 0]]  # CounterEnv 0's first observation
    ray.kill(actor)


def test_an_unknown_transport_is_refused_before_any_actor_starts():
    with pytest.raises(ValueError, match=r"ray_options\['transport'\] must be one of"):
        aiovec.VecEnv([partial(CounterEnv, 0)], backend="ray", ray_options={"transport": "tcp"})


def _fork_a_sleeper(env) -> int:
    """A grandchild of the actor that sleeps, holding a copy of each of the actor's
    descriptors, its link too (a grandchild: Ray kills the actor's own children)."""
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:
        if os.fork() == 0:
            os.write(writer, str(os.getpid()).encode())
            time.sleep(60)
        os._exit(0)
    os.waitpid(child, 0)
    return int(os.read(reader, 32))


def test_a_dead_actor_whose_link_stays_open_is_still_reported():
    # A process forked by an env keeps the link open after the actor dies (as would a
    # node that vanished without closing its connections): Ray's word must be enough.
    venv = counter_envs_in_two_actors(False, "link")
    venv.reset()
    (sleeper,) = venv.apply(_fork_a_sleeper, env_ids=[2])
    try:
        ray.kill(venv._backend._actors[1], no_restart=True)
        with pytest.raises(aiovec.WorkerCrashedError, match="its Ray actor died: "):
            for _ in range(100):
                venv.step(np.zeros(4, dtype=np.int64))
                time.sleep(0.05)
    finally:
        os.kill(sleeper, signal.SIGKILL)
        venv.close()


@TRANSPORT
@pytest.mark.parametrize("fault", ["raise", "sigkill", "hang"])
def test_a_failing_env_in_an_actor_is_rebuilt_and_the_others_go_on(fault, transport):
    from tests.faulty import FaultyEnv

    venv = aiovec.VecEnv(
        [
            partial(FaultyEnv, i, fault if i == 1 else "raise", 2 if i == 1 else 10**6)
            for i in range(3)
        ],  # fmt: skip
        backend="ray",
        num_workers=3,
        on_failure="restart",
        step_timeout=1.0 if fault == "hang" else None,
        # no probe: its throwaway env would meet the fault first
        ray_options={"transport": transport, "num_cpus": 0, "concurrent_envs": False},
    )
    venv.reset()
    venv.step([0, 0, 0])
    observations, rewards, _, truncations, infos = venv.step([0, 0, 0])
    assert observations[1].tolist() == [1, 0] and truncations.tolist() == [False, True, False]
    assert rewards.tolist() == [2.0, 0.0, 2.0]
    reason = infos["restart_reason"][1]
    expected = {"raise": "RuntimeError: simulator diverged", "hang": "did not answer"}
    assert expected.get(fault, "Ray actor died") in reason
    # an env that raised is rebuilt inside its actor; a dead or hung actor is replaced
    assert venv.worker_restarts == ((0, 0, 0) if fault == "raise" else (0, 1, 0))
    _, rewards, *_ = venv.step([0, 0, 0])  # (env 1: the reset that follows truncation)
    assert rewards.tolist() == [3.0, 0.0, 3.0]
    venv.close()


def test_an_actor_that_dies_while_building_its_envs_is_a_clear_error():
    from tests.faulty import DyingConstructorEnv

    env_fns = [partial(DyingConstructorEnv, i) for i in range(2)]
    with pytest.raises(aiovec.WorkerCrashedError, match=r"worker 0 hosting envs \[0\] died "
                       r".*its Ray actor died while building its envs"):  # fmt: skip
        aiovec.VecEnv(env_fns, backend="ray", num_workers=2, ray_options={"num_cpus": 0})
    assert ray.is_initialized()


@TRANSPORT
@pytest.mark.parametrize("concurrent", [None, False, True], ids=["measured", "off", "on"])
def test_an_actor_builds_each_env_once_and_runs_only_what_the_agent_asks(
    tmp_path, transport, concurrent
):
    # Whether envs wait is found from their own steps: no throwaway env is built and
    # stepped (a simulator connection or a side effect of construction, done twice).
    ledger = tmp_path / "ledger"
    env_fns = [partial(LedgerEnv, i, str(ledger), delay=0.003) for i in range(3)]
    options = {"transport": transport, "num_cpus": 0, "concurrent_envs": concurrent}
    with aiovec.VecEnv(env_fns, backend="ray", num_workers=1, ray_options=options) as venv:
        venv.reset(seed=1)
        for _ in range(12):
            venv.step(np.zeros(3, dtype=np.int64))
        assert venv._backend.steps_concurrently(0) is (concurrent is not False)
    lines = ledger.read_text().splitlines()
    for what, count in (("build", 1), ("reset", 1), ("step", 12)):
        assert sorted(line for line in lines if line.startswith(what)) == sorted(
            f"{what} {i}" for i in range(3) for _ in range(count)
        ), lines


@TRANSPORT
def test_large_image_observations_arrive_whole(transport):
    def record(venv):
        venv.action_space.seed(1)
        results = [venv.reset(seed=1)]
        results += [venv.step(venv.action_space.sample()) for _ in range(10)]
        venv.close()
        return results

    expected = record(aiovec.make("aiovec/LargeObs-v0", 4, backend="process"))
    options = {"transport": transport, "num_cpus": 0}
    actual = record(
        aiovec.make("aiovec/LargeObs-v0", 4, backend="ray", num_workers=2, ray_options=options)
    )
    assert actual[0][0].shape == (4, 84, 84, 4)
    for index, (a, e) in enumerate(zip(actual, expected)):
        assert_same(a, e, f"record[{index}]")


def test_closing_after_ray_was_shut_down_starts_no_new_ray():
    venv = aiovec.VecEnv([partial(CounterEnv, 0)], backend="ray")
    venv.reset()
    ray.shutdown()  # e.g. at interpreter exit, before the env's __del__
    venv.close()
    assert not ray.is_initialized()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)  # for later tests


@TRANSPORT
@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_batched_envs_in_actors_match_the_process_backend(transport, mode):
    from tests.batched import point_masses

    def record(backend, **options):
        with aiovec.make(
            point_masses,
            6,
            envs_per_block=3,
            backend=backend,
            env_kwargs=lambda block: {"autoreset_mode": mode, "gain": 1.0 + block},
            **options,
        ) as venv:
            out = [venv.reset(seed=5)]
            actions = np.linspace(-1, 1, 6, dtype=np.float32).reshape(6, 1)
            out += [venv.step(actions) for _ in range(12)]
            out.append(venv.get_attr("gain"))
            return out

    expected = record("process")
    assert_same(record("ray", num_workers=2, ray_options={"transport": transport}), expected)


def test_a_failing_block_in_an_actor_is_restarted():
    from tests.batched import point_masses

    with aiovec.make(
        point_masses,
        4,
        envs_per_block=2,
        backend="ray",
        on_failure="restart",
        env_kwargs=[{}, {"fail_at": 2}],
    ) as venv:
        venv.reset(seed=0)
        venv.step(np.zeros((4, 1), np.float32))
        *_, truncated, infos = venv.step(np.zeros((4, 1), np.float32))
        np.testing.assert_array_equal(truncated, [False, False, True, True])
        np.testing.assert_array_equal(infos["_restarted"], [False, False, True, True])
        np.testing.assert_array_equal(venv.restart_counts, [0, 0, 1, 1])


def test_actors_ray_cannot_place_are_a_startup_timeout_naming_the_cause():
    # 3 actors of num_cpus=1 on a 2-CPU cluster: the third is never placed. Waiting for
    # it had no bound (startup_timeout was ignored): the constructor hung for good.
    with pytest.raises(aiovec.StartupTimeoutError, match="Ray cannot place every actor") as e:
        aiovec.VecEnv(
            [partial(CounterEnv, i) for i in range(3)],
            backend="ray",
            num_workers=3,
            startup_timeout=3,
        )
    assert "need 3 CPUs, and the cluster has 2" in str(e.value)
    # Nothing is left holding the cluster's CPUs: the next vector env starts.
    with aiovec.VecEnv([CounterEnv] * 2, backend="ray", num_workers=2) as venv:
        assert venv.reset(seed=0)[0].shape == (2, 2)


def test_ids_registered_in_the_driver_alone_build_in_the_actors(monkeypatch):
    """A Ray actor starts from a fresh interpreter that never imports the driver's
    ``__main__``: ids the driver registered, by class or by a name in ``__main__``,
    still build there, through make() and through a factory calling gymnasium.make."""
    import sys

    monkeypatch.setattr(sys.modules["__main__"], "DriverOnlyCounter", CounterEnv, raising=False)
    gym.register("DriverOnlyByClass-v0", entry_point=CounterEnv, kwargs={"env_index": 5})
    gym.register("DriverOnlyByName-v0", entry_point="__main__:DriverOnlyCounter")
    try:
        with aiovec.make("DriverOnlyByClass-v0", 2, backend="ray") as venv:
            assert venv.reset(seed=0)[0][:, 0].tolist() == [5.0, 5.0]
        factories = [partial(gym.make, "DriverOnlyByName-v0")] * 2
        with aiovec.VecEnv(factories, backend="ray") as venv:
            venv.reset(seed=0)
            assert venv.step(np.zeros(2, dtype=np.int64))[0][:, 1].tolist() == [1.0, 1.0]
    finally:
        for env_id in ("DriverOnlyByClass-v0", "DriverOnlyByName-v0"):
            gym.registry.pop(env_id, None)


UNGUARDED_RAY = MAIN_MODULE_WALKER + textwrap.dedent(
    """
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    with aiovec.make("MainModuleWalkerByName-v0", 2, backend="ray") as venv:
        venv.reset(seed=0)
        print("by name", venv.step(np.ones(2, dtype=np.int64))[0][:, 0].tolist())
    factories = [Walker, lambda: gym.make("MainModuleWalker-v0")]
    with aiovec.VecEnv(factories, backend="ray") as venv:
        venv.reset(seed=0)
        print("factories", venv.step(np.zeros(2, dtype=np.int64))[0][:, 0].tolist())
    """
)


@pytest.mark.timeout(180)
def test_an_unguarded_script_runs_on_the_ray_backend(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text(UNGUARDED_RAY)
    result = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=170,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "by name [1.0, 1.0]" in result.stdout
    assert "factories [-1.0, -1.0]" in result.stdout


def test_a_registration_that_cannot_travel_is_a_clear_error_before_any_actor_starts():
    import threading

    gym.register(
        "RayLockedCounter-v0", entry_point=CounterEnv, kwargs={"env_index": threading.Lock()}
    )
    try:
        with pytest.raises(aiovec.FactoryPicklingError, match="RayLockedCounter-v0.*Ray actor"):
            aiovec.make("RayLockedCounter-v0", 2, backend="ray")
    finally:
        gym.registry.pop("RayLockedCounter-v0", None)


async def test_a_call_queued_behind_an_envs_step_in_an_actor_is_not_late():
    from tests.test_timeouts import _PausingEnv

    # The actor steps its sleeping envs at once, each env's commands in order: the call
    # waits for the env's step, and each takes 0.35 s of the 0.5 s step_timeout.
    async with _one_actor([partial(_PausingEnv, i, delay=0.35) for i in range(2)]) as venv:
        await venv.areset()
        for _ in range(2):
            venv.send(np.zeros(1, dtype=np.int64), [0])
            assert await venv.acall("pause", 0.35, env_ids=[0]) == (0,)
            assert (await venv.recv()).env_ids.tolist() == [0]


def _one_actor(env_fns) -> aiovec.VecEnv:
    """``env_fns`` in one Ray actor, with a step_timeout of 0.5 s."""
    return aiovec.VecEnv(
        env_fns, backend="ray", num_workers=1, step_timeout=0.5, ray_options={"num_cpus": 0}
    )


@TRANSPORT
def test_an_info_that_cannot_be_sent_back_fails_only_its_env_and_the_actor_goes_on(transport):
    from tests.faulty import UnsendableInfoEnv

    fns = [partial(UnsendableInfoEnv, i, 3) for i in range(4)]
    with aiovec.VecEnv(
        fns, backend="ray", num_workers=1, ray_options={"transport": transport, "num_cpus": 0}
    ) as venv:
        venv.reset(seed=0)
        with pytest.raises(TypeError, match="could not be sent back") as caught:
            venv.step(np.zeros(4, dtype=np.int64))
        assert caught.value.env_index == 3 and "_thread.lock" in str(caught.value)
        assert venv.call("env_index") == (0, 1, 2, 3)  # the actor lives on
        assert venv.worker_restarts == (0,)


def test_envs_of_an_actor_never_share_a_value_they_were_given():
    """As in AsyncVectorEnv, each env owns what it is given (a captured array, a
    set_attr value, a call's arguments, reset options), though one actor hosts it with
    others."""
    from tests.envs import GoalEnv

    goal = np.zeros(2)
    with aiovec.VecEnv([lambda: GoalEnv(goal)] * 4, backend="ray", num_workers=2) as venv:
        venv.reset(seed=0)
        for change in (
            lambda: None,
            lambda: venv.set_attr("goal", np.zeros(2)),
            lambda: venv.call("set_goal", np.zeros(2)),
        ):
            change()
            venv.step([0] * 4)
            observations, *_ = venv.step([0] * 4)
            assert observations[:, 0].tolist() == [2.0] * 4
        venv.reset(options={"level": 3})
        assert venv.get_attr("level") == (3, 3, 3, 3)
