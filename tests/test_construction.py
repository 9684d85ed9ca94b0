"""The backend plan a VecEnv is built from (aiovec._construction): checks and the worker
layout that follows from the arguments, without starting anything."""

from __future__ import annotations

import pytest

from aiovec._construction import BackendPlan, check_envs_per_block, check_factories, plan_backend
from tests.envs import CounterEnv


def plan(backend="process", n=4, **overrides) -> BackendPlan:
    arguments = dict(
        envs_per_block=None,
        num_workers=None,
        inline_envs=0,
        concurrent_envs=None,
        on_failure="raise",
        max_restarts=3,
        step_timeout=None,
        max_concurrency=None,
    )
    arguments.update(overrides)
    return plan_backend(backend, [CounterEnv] * n, **arguments)


def test_the_users_choices_pass_through_unchanged():
    assert plan(num_workers=3, inline_envs=1, concurrent_envs=True) == BackendPlan(
        "process", 3, 1, True, 0
    )


def test_restarts_count_only_under_on_failure_restart():
    assert plan(on_failure="restart", max_restarts=5).max_restarts == 5
    assert plan(on_failure="raise", max_restarts=5).max_restarts == 0


@pytest.mark.parametrize("user_workers, expected", [(None, 2), (1, 1), (8, 2)])
def test_max_concurrency_caps_the_workers_of_envs_stepped_one_at_a_time(user_workers, expected):
    chosen = plan(num_workers=user_workers, max_concurrency=2, inline_envs=1)
    assert (chosen.num_workers, chosen.inline_envs, chosen.concurrent_envs) == (expected, 0, False)
    assert plan("auto", max_concurrency=2).backend == "process"  # no probe: process it is


def test_max_concurrency_never_exceeds_the_number_of_envs():
    assert plan(n=3, max_concurrency=10).num_workers == 3


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"backend": "threads"}, "backend must be one of"),
        ({"on_failure": "ignore"}, "on_failure must be"),
        ({"backend": "inline", "step_timeout": 1.0}, "step_timeout needs"),
        ({"step_timeout": 0}, "step_timeout needs"),
        ({"max_concurrency": 0}, "must be a positive"),
        ({"max_concurrency": 2.0}, "must be an integer"),
        ({"backend": "ray", "max_concurrency": 2}, "max_concurrency needs"),
        ({"backend": "coroutine", "envs_per_block": 2, "step_timeout": 1.0}, "not enforced"),
    ],
)
def test_arguments_a_backend_cannot_honour_are_refused(overrides, message):
    backend = overrides.pop("backend", "process")
    with pytest.raises(ValueError, match=message):
        plan(backend, **overrides)


def test_factories_and_block_sizes_are_checked():
    assert check_factories(iter([CounterEnv])) == [CounterEnv]
    with pytest.raises(ValueError, match="env_fns is empty"):
        check_factories([])
    with pytest.raises(TypeError, match=r"env_fns\[1\] is 3, not a callable"):
        check_factories([CounterEnv, 3])
    assert check_envs_per_block(None) is None
    assert check_envs_per_block(4) == 4
    for bad in (0, -1, 2.5, "2", True):
        with pytest.raises(ValueError, match="envs_per_block must be a positive int"):
            check_envs_per_block(bad)
