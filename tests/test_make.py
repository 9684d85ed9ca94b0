"""aiovec.make: ids, factories, kwargs, wrappers and the automatic backend choice."""

from __future__ import annotations

import os
import threading
from functools import partial

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.envs.registration import WrapperSpec

import aiovec
from aiovec.envs import VariableLatencyEnv
from tests.envs import CounterEnv


def test_registry_id_with_kwargs_and_wrappers(backend):
    with aiovec.make(
        "CartPole-v1",
        3,
        env_kwargs={"max_episode_steps": 5},
        wrappers=[gym.wrappers.TimeAwareObservation],
        backend=backend,
    ) as venv:
        assert venv.spec.id == "CartPole-v1"
        assert venv.single_observation_space.shape == (5,)  # time feature appended
        venv.reset(seed=0)
        for _ in range(5):
            *_, truncations, _ = venv.step(np.zeros(3, dtype=np.int64))
        assert truncations.all()


def test_env_keywords_as_gymnasium_make_vec_takes_them(backend):
    # make_vec(id, num_envs, vector_kwargs=..., **env_kwargs): the same call works here.
    with aiovec.make(
        "FrozenLake-v1", 2, is_slippery=False, vector_kwargs={"copy": False}, backend=backend
    ) as venv:
        # not slippery: one outcome per action (three when slippery)
        assert [len(transitions[0][0]) for transitions in venv.get_attr("P")] == [1, 1]
        assert venv.copy is False
        mode = "sync" if venv.backend == "inline" else "async"  # how aiovec stepped them
        expected = gym.make_vec(
            "FrozenLake-v1", 2, mode, vector_kwargs={"copy": False}, is_slippery=False
        )
        expected.close()
        assert venv.spec.kwargs == expected.spec.kwargs
        assert venv.spec.kwargs["num_envs"] == 2


def test_spec_kwargs_record_env_kwargs_render_mode_and_wrappers():
    wrappers = [gym.wrappers.TimeAwareObservation]
    with aiovec.make(
        "CartPole-v1",
        2,
        env_kwargs={"max_episode_steps": 7},
        wrappers=wrappers,
        render_mode="rgb_array",
        backend="inline",
    ) as venv:
        assert venv.spec.kwargs == {
            "max_episode_steps": 7,
            "render_mode": "rgb_array",
            "num_envs": 2,
            "vectorization_mode": "sync",  # how they ran: in this process, one by one
            "wrappers": wrappers,
        }
        assert gym.spec("CartPole-v1").kwargs == {}  # the registry's spec is untouched


@pytest.mark.parametrize(
    "options, mode",
    [
        ({}, None),  # whatever auto picked, named as make_vec would name it
        ({"backend": "inline"}, "sync"),
        ({"backend": "process"}, "async"),
        ({"vectorization_mode": "async", "backend": "inline"}, "async"),  # as asked
    ],
)
def test_spec_kwargs_say_how_the_envs_were_vectorized(options, mode):
    with aiovec.make("CartPole-v1", 2, **options) as venv:
        expected = mode or ("sync" if venv.backend == "inline" else "async")
        assert venv.spec.kwargs["vectorization_mode"] == expected


def test_spec_kwargs_of_batched_envs_are_make_vecs():
    with aiovec.make(
        "CartPole-v1", 4, vectorization_mode="vector_entry_point", backend="inline"
    ) as venv:
        expected = gym.make_vec("CartPole-v1", 4, "vector_entry_point")
        expected.close()
        assert venv.spec.kwargs == expected.spec.kwargs  # max_episode_steps=500 included


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            {"env_kwargs": {"is_slippery": True}, "is_slippery": False},
            "'is_slippery' is given twice",
        ),
        ({"vector_kwargs": {"copy": False}, "copy": True}, "'copy' is given twice"),
    ],
    ids=["env", "vector"],
)
def test_a_keyword_given_twice_is_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        aiovec.make("FrozenLake-v1", 2, backend="inline", **kwargs)


def test_callable_with_kwargs(backend):
    with aiovec.make(CounterEnv, 2, env_kwargs={"env_index": 7}, backend=backend) as venv:
        observations, _ = venv.reset()
        assert observations[:, 0].tolist() == [7, 7]


@pytest.mark.parametrize("num_envs", [0, -1, 2.5, True])
def test_bad_num_envs(num_envs):
    with pytest.raises(ValueError, match="num_envs"):
        aiovec.make("CartPole-v1", num_envs)


def test_auto_backend_follows_the_cost_of_a_step():
    with aiovec.make("aiovec/NoOp-v0", 4) as venv:  # far cheaper than a round trip
        assert venv.backend == "inline"
    with aiovec.make(
        "aiovec/VariableLatency-v0", 4, env_kwargs={"mean_step_time": 0.005, "sigma": 0.1}
    ) as venv:  # mostly sleeping: a worker per core, stepping its envs in threads (W3:
        # 1.1-1.8x the first-ready rate of a worker per env, in a few processes)
        assert (venv.backend, venv.num_workers) == ("process", min(4, os.cpu_count() or 1))
        venv.reset(seed=0)
        for _ in range(5):
            venv.step(venv.action_space.sample())
        assert all(name.startswith("aiovec-env") for name in venv.apply(_thread_name))
    with aiovec.make(
        "aiovec/VariableLatency-v0",
        4,
        env_kwargs={"mean_step_time": 0.005, "sigma": 0.1},
        on_failure="restart",
    ) as venv:  # ...unless envs are to be restarted: then a worker per env, so that one
        # env's crash or timeout restarts it alone
        assert (venv.backend, venv.num_workers) == ("process", 4)
    with aiovec.make(
        "aiovec/VariableLatency-v0",
        8,
        env_kwargs={"mean_step_time": 0.002, "sigma": 0.1, "mode": "busy"},
    ) as venv:  # CPU-bound, a step dearer than a round trip: a worker per core, no
        # share for this process (stepping it would keep the agent from the workers'
        # results for a whole env step: first-ready stalls)
        cores = os.cpu_count() or 1
        if cores == 1:
            assert venv.backend == "inline"
        else:
            assert venv.backend == "process"
            assert venv.num_workers == min(8, cores)
            assert venv.inline_envs == 0


def test_auto_backend_shares_cheap_cpu_bound_envs_with_this_process(machine):
    """Envs cheaper than a round trip but many: cores - 1 workers and a local share."""
    from aiovec._auto import IPC_ROUND_TRIP, choose_backend

    cores = os.cpu_count() or 1
    # A sixth of a round trip: a loaded machine (hogs beside a CI run) inflated a third's
    # probe past the round trip once (the decision is the probe's timing, as it must be).
    chosen = choose_backend(
        partial(VariableLatencyEnv, mean_step_time=IPC_ROUND_TRIP / 6, sigma=0.1, mode="busy"),
        64,
    )
    if cores == 1:
        assert chosen == {"backend": "inline"}
    else:
        assert chosen == {
            "backend": "process",
            "num_workers": min(64, cores) - 1,
            "inline_envs": 64 // min(64, cores),
        }


def test_the_probe_tells_waiting_from_computing_envs_on_a_loaded_machine(machine):
    from aiovec._auto import probe_step_time

    busy = probe_step_time(partial(VariableLatencyEnv, mean_step_time=5e-4, sigma=0.1, mode="busy"))
    sleepy = probe_step_time(partial(VariableLatencyEnv, mean_step_time=2e-3, sigma=0.1))
    assert not busy.mostly_waits, busy
    assert sleepy.mostly_waits, sleepy


def test_auto_backend_for_async_envs_uses_one_loop_per_core_for_thousands():
    from aiovec._auto import MANY_ASYNC_ENVS, choose_backend
    from aiovec.envs import AsyncLatencyEnv

    assert choose_backend(AsyncLatencyEnv, 10) == {"backend": "coroutine"}
    cores = os.cpu_count() or 1
    expected = (
        {"backend": "process", "num_workers": cores} if cores > 1 else {"backend": "coroutine"}
    )
    assert choose_backend(AsyncLatencyEnv, MANY_ASYNC_ENVS) == expected


def test_vec_env_accepts_auto_and_a_given_worker_count_wins():
    env_fn = partial(VariableLatencyEnv, mean_step_time=0.005, sigma=0.1)
    with aiovec.VecEnv([env_fn] * 3, backend="auto") as venv:  # waiting envs
        assert (venv.backend, venv.num_workers) == ("process", min(3, os.cpu_count() or 1))
    with aiovec.VecEnv([env_fn] * 3, backend="auto", num_workers=1) as venv:
        assert (venv.backend, venv.num_workers) == ("process", 1)
    with pytest.raises(ValueError, match="backend must be one of"):
        aiovec.VecEnv([env_fn], backend="threads")


def _thread_name(env) -> str:
    return threading.current_thread().name


class _CrashesOnThirdStep(CounterEnv):
    def step(self, action):
        if self.count == 2:
            os._exit(3)
        return super().step(action)


class _HangsInStep(CounterEnv):
    def step(self, action):
        import time

        time.sleep(3600)


def test_auto_probe_of_an_env_that_crashes_cannot_kill_the_agent():
    with aiovec.make(_CrashesOnThirdStep, 4) as venv:  # the probe's process died, not us
        assert venv.backend == "process"
        venv.reset()
        venv.step(np.zeros(4, dtype=np.int64))


def test_auto_probe_of_an_env_that_hangs_gives_up(monkeypatch):
    import aiovec._auto

    monkeypatch.setattr(aiovec._auto, "CHILD_PROBE_DEADLINE", 0.5)
    with aiovec.make(_HangsInStep, 2, step_timeout=0.5) as venv:
        assert venv.backend == "process"


class _HangsInInit(CounterEnv):
    def __init__(self):
        import time

        time.sleep(3600)


@pytest.mark.timeout(25)  # the probe's own deadline is 30 s: the user's limits bound it
def test_auto_probe_waits_no_longer_than_startup_timeout_and_step_timeout(no_leaks):
    """``make`` (``backend="auto"``) probes an env before building the vector env: a
    constructor that hangs is given up on within ``startup_timeout``, a step that hangs
    within ``step_timeout``, as the vector env itself would, not after the probe's own
    30 s deadline."""
    with pytest.raises(aiovec.StartupTimeoutError):
        aiovec.make(_HangsInInit, 2, startup_timeout=1)
    with aiovec.make(_HangsInStep, 2, step_timeout=0.5) as venv:
        assert venv.backend == "process"
        with pytest.raises(aiovec.StepTimeoutError):
            venv.reset()
            venv.step(np.zeros(2, dtype=np.int64))


@pytest.mark.parametrize(
    "options", [{"on_failure": "restart"}, {"step_timeout": 5.0}], ids=["restart", "timeout"]
)
def test_auto_keeps_every_env_out_of_the_agent_when_isolation_is_asked_for(options):
    with aiovec.make("CartPole-v1", 8, **options) as venv:
        assert venv.backend == "process"
        assert venv.inline_envs == 0
        venv.reset(seed=0)
        venv.step(venv.action_space.sample())


def test_wrappers_none_as_make_vec_takes_it():
    with aiovec.make("CartPole-v1", 2, wrappers=None, backend="inline") as venv:
        assert venv.reset(seed=0)[0].shape == (2, 4)


def test_num_envs_defaults_to_one_and_an_env_spec_is_taken_as_make_vec_takes_them():
    with aiovec.make("CartPole-v1", backend="inline") as envs:  # make_vec's default: 1
        assert envs.num_envs == 1
    spec = gym.spec("FrozenLake-v1")
    with aiovec.make(spec, 2, backend="inline", is_slippery=False) as envs:
        expected = gym.make_vec(spec, 2, is_slippery=False)
        assert envs.spec.id == expected.spec.id == "FrozenLake-v1"
        assert envs.spec.kwargs["is_slippery"] is False
        assert envs.get_attr("spec")[0].kwargs["is_slippery"] is False
        observations, _ = envs.reset(seed=0)
        np.testing.assert_array_equal(observations, expected.reset(seed=0)[0])
        expected.close()


def test_an_unversioned_id_is_its_latest_version_as_make_vec_finds_it():
    with pytest.warns(UserWarning, match="Using the latest versioned environment `CartPole-v1`"):
        expected = gym.make_vec("CartPole", 2, vectorization_mode="sync")
    with pytest.warns(UserWarning, match="Using the latest versioned environment `CartPole-v1`"):
        envs = aiovec.make("CartPole", 2, backend="inline")
    with envs:
        assert envs.spec.id == expected.spec.id == "CartPole-v1"
        np.testing.assert_array_equal(envs.reset(seed=3)[0], expected.reset(seed=3)[0])
    expected.close()
    with pytest.raises(gym.error.Error) as gymnasiums:
        gym.make_vec("NoSuchEnv", 2)
    with pytest.raises(type(gymnasiums.value), match=str(gymnasiums.value)):
        aiovec.make("NoSuchEnv", 2, backend="inline")


def test_vectorization_mode_sync_or_async_is_where_make_vec_steps_the_envs():
    """``"async"`` keeps every env in worker processes (AsyncVectorEnv's isolation: a
    crashing env cannot take the agent down), ``"sync"`` steps them in this process
    (SyncVectorEnv); left out, aiovec chooses; a backend named explicitly wins."""
    with aiovec.make("CartPole-v1", 4, vectorization_mode="async") as venv:
        assert venv.backend == "process" and venv.inline_envs == 0
        assert venv.spec.kwargs["vectorization_mode"] == "async"
        venv.reset(seed=0)
    with aiovec.make("CartPole-v1", 4, vectorization_mode="sync") as venv:
        assert venv.backend == "inline"
    with aiovec.make("CartPole-v1", 4, vectorization_mode="async", backend="inline") as venv:
        assert venv.backend == "inline"


def test_make_takes_make_vecs_arguments_by_name_and_by_position():
    by_name = aiovec.make(id="FrozenLake-v1", num_envs=2, backend="inline", is_slippery=False)
    by_position = aiovec.make("FrozenLake-v1", 2, "sync", {}, None, backend="inline")
    by_old_name = aiovec.make(env_id="FrozenLake-v1", num_envs=2, backend="inline")
    for envs in (by_name, by_position, by_old_name):
        with envs:
            assert envs.num_envs == 2 and envs.spec.id == "FrozenLake-v1"
    assert by_name.spec.kwargs["is_slippery"] is False
    assert by_position.spec.kwargs["vectorization_mode"] == "sync"
    # beside an id, env_id is the env's keyword, as make_vec passes it on
    with aiovec.make(lambda env_id: CounterEnv(env_id), 2, env_id=3, backend="inline") as envs:
        assert envs.get_attr("env_index") == (3, 3)
    with pytest.raises(TypeError, match="missing"):
        aiovec.make(num_envs=2)


# --- ids registered in the agent only ---------------------------------------------------------


@pytest.fixture
def agent_only_ids(monkeypatch):
    """Ids registered in this process alone, as a script registers its own env: one with
    the class as entry point, one naming a class of ``__main__`` (which no worker
    imports) and wrapped by a wrapper named there too. Dropped afterwards."""
    import sys

    main = sys.modules["__main__"]
    monkeypatch.setattr(main, "AgentOnlyCounter", CounterEnv, raising=False)
    monkeypatch.setattr(main, "AgentOnlyClip", gym.wrappers.ClipReward, raising=False)
    clip = WrapperSpec("ClipReward", "__main__:AgentOnlyClip", {"min_reward": 0, "max_reward": 0.5})
    gym.register("AgentOnlyByClass-v0", entry_point=CounterEnv, kwargs={"env_index": 7})
    gym.register(
        "AgentOnlyByName-v0", entry_point="__main__:AgentOnlyCounter", additional_wrappers=(clip,)
    )
    yield "AgentOnlyByClass-v0", "AgentOnlyByName-v0"
    for env_id in ("AgentOnlyByClass-v0", "AgentOnlyByName-v0"):
        gym.registry.pop(env_id, None)


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_an_id_registered_in_the_agent_alone_builds_in_fresh_workers(agent_only_ids, context):
    # As gymnasium.make_vec does, make() hands the workers the registry's spec, not the
    # id: a worker started fresh (spawn, forkserver) never saw the registration.
    by_class, _ = agent_only_ids
    with aiovec.make(by_class, 2, backend="process", context=context) as venv:
        observations, _ = venv.reset(seed=0)
        assert observations[:, 0].tolist() == [7.0, 7.0]
        assert venv.spec.id == by_class


@pytest.mark.parametrize("backend", ["inline", "process"])
def test_names_in_the_agents_main_reach_the_workers_and_specs_stay_the_registrys(
    agent_only_ids, backend
):
    # The zygote's workers never import the agent's __main__: the objects its
    # registrations name there (an env, a wrapper) are sent along; the envs' specs are
    # the registry's, entry points as registered.
    _, by_name = agent_only_ids
    factories = [partial(gym.make, by_name)]
    for venv in (
        aiovec.make(by_name, 2, backend=backend),
        aiovec.VecEnv(factories * 2, backend=backend),
    ):
        with venv:
            venv.reset(seed=0)
            _, rewards, *_ = venv.step(np.zeros(2, dtype=np.int64))
            assert rewards.tolist() == [0.5, 0.5]  # 1.0, clipped by the named wrapper
            assert {spec.entry_point for spec in venv.get_attr("spec")} == {
                "__main__:AgentOnlyCounter"
            }


def test_a_module_colon_id_imports_the_module_as_gymnasium_make_does(tmp_path, monkeypatch):
    (tmp_path / "aiovec_tmp_registering.py").write_text(
        "import gymnasium as gym\n"
        "gym.register('TmpModuleCounter-v0', entry_point='tests.envs:CounterEnv')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with aiovec.make("aiovec_tmp_registering:TmpModuleCounter-v0", 2) as venv:
            assert venv.reset(seed=0)[0].shape == (2, 2)
            assert venv.spec.id == "TmpModuleCounter-v0"
        with pytest.raises(ModuleNotFoundError, match="aiovec_no_such_module"):
            aiovec.make("aiovec_no_such_module:Nothing-v0", 2)
    finally:
        gym.registry.pop("TmpModuleCounter-v0", None)


def test_a_registration_that_cannot_reach_a_worker_says_so_there(monkeypatch):
    # Its kwargs cannot be pickled: a factory calling gymnasium.make on it in a worker
    # gets why, not Gymnasium's "doesn't exist" (nor, for an id registered there
    # already, the worker's older registration).
    import threading

    gym.register("LockedKwargs-v0", entry_point=CounterEnv, kwargs={"delay": threading.Lock()})
    try:
        with pytest.raises(
            aiovec.EnvError, match=r"LockedKwargs-v0 is registered.*cannot"
        ) as caught:
            aiovec.VecEnv([partial(gym.make, "LockedKwargs-v0")] * 2, backend="process")
        assert "lock" in str(caught.value)
    finally:
        gym.registry.pop("LockedKwargs-v0", None)


@pytest.mark.parametrize(
    "env_kwargs, message",
    [
        (5, r"env_kwargs must be a dict.*got int"),
        ("friction=0.5", r"env_kwargs must be a dict.*got str"),
        (lambda index: "gravity", r"env_kwargs\(0\) returned str, not a dict"),
        ([{"sutton_barto_reward": True}, 3], r"env_kwargs\[1\] is int, not a dict"),
    ],
    ids=["int", "str", "function-returning-none", "list-with-an-int"],
)
def test_env_kwargs_of_the_wrong_kind_are_named_in_the_error(env_kwargs, message):
    with pytest.raises(TypeError, match=message):
        aiovec.make("CartPole-v1", 2, backend="inline", env_kwargs=env_kwargs)


def test_none_stands_for_no_env_kwargs_in_a_list_or_from_a_function():
    for env_kwargs in ([None, {"max_episode_steps": 3}], lambda i: None if i == 0 else {}):
        with aiovec.make("CartPole-v1", 2, backend="inline", env_kwargs=env_kwargs) as venv:
            assert venv.reset(seed=0)[0].shape == (2, 4)


def test_spec_kwargs_record_env_kwargs_given_as_any_mapping():
    from types import MappingProxyType

    env_kwargs = MappingProxyType({"max_episode_steps": 7})
    with aiovec.make("CartPole-v1", 2, backend="inline", env_kwargs=env_kwargs) as venv:
        assert venv.spec.kwargs["max_episode_steps"] == 7
