"""Backends by name: the registry builds each backend from its own typed options, and
the vector env's keyword arguments reach the right ones."""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import pytest
from gymnasium.vector import AutoresetMode

import aiovec
from aiovec.backends import (
    REGISTRY,
    CoroutineOptions,
    Hosting,
    InlineOptions,
    ProcessOptions,
    RayOptions,
    backend_options,
    build_backend,
)


def test_every_backend_is_registered_with_frozen_options():
    assert set(REGISTRY) == {"process", "inline", "coroutine", "ray"}
    for entry in REGISTRY.values():
        assert dataclasses.is_dataclass(entry.options)
        with pytest.raises(dataclasses.FrozenInstanceError):
            entry.options().__setattr__("anything", 1)


def test_keyword_arguments_are_sorted_into_each_backend_s_options():
    settings = {
        "num_workers": 3,
        "context": "spawn",
        "spin": 0.0,
        "inline_envs": 1,
        "concurrent_envs": True,
        "startup_timeout": 10.0,
        "ray_options": None,
        "daemon": False,
    }
    assert backend_options("process", **settings) == ProcessOptions(
        3, "spawn", 0.0, 1, True, 10.0, daemon=False
    )
    assert backend_options("ray", **settings) == RayOptions(
        num_workers=3, ray_options={}, startup_timeout=10.0
    )
    assert backend_options("inline", **settings) == InlineOptions()
    assert backend_options("coroutine", **settings) == CoroutineOptions()


def test_build_backend_checks_the_name_and_the_options_type():
    hosting = Hosting([lambda: gym.make("CartPole-v1")], AutoresetMode.NEXT_STEP)
    with pytest.raises(ValueError, match="backend must be one of"):
        build_backend("threads", hosting, InlineOptions())
    with pytest.raises(TypeError, match="takes ProcessOptions"):
        build_backend("process", hosting, InlineOptions())
    backend = build_backend("inline", hosting, InlineOptions())
    try:
        assert backend.groups == [[0]] and backend.completes_inline
    finally:
        backend.close(1.0)


def test_the_vector_env_refuses_an_unknown_backend_by_name():
    with pytest.raises(ValueError, match=r"backend must be one of \('process', 'inline'"):
        aiovec.VecEnv([lambda: gym.make("CartPole-v1")], backend="threads")


@pytest.mark.parametrize(
    "backend, option, hint",
    [
        ("inline", {"num_workers": 3}, "'process' or 'ray'"),
        ("coroutine", {"inline_envs": 1}, "'process'"),
        ("inline", {"spin": 0.0}, "'process'"),
        ("process", {"ray_options": {"num_cpus": 1}}, "'ray'"),
        ("ray", {"concurrent_envs": True}, "ray_options={'concurrent_envs': ...}"),
    ],
)
def test_an_option_the_named_backend_does_not_take_is_refused_not_ignored(backend, option, hint):
    """aiovec's own per-backend options, given with a backend that has no use for them:
    a clear ValueError before anything starts (they were silently ignored)."""
    (name,) = option
    with pytest.raises(ValueError, match=rf"{name}=.* backend={backend!r}") as raised:
        aiovec.VecEnv([lambda: gym.make("CartPole-v1")], backend=backend, **option)
    assert hint in str(raised.value)


def test_with_backend_auto_options_for_backends_it_did_not_pick_are_fine():
    # The user did not name the backend: whichever auto picks, the call stands.
    with aiovec.VecEnv(
        [lambda: gym.make("CartPole-v1")] * 2, backend="auto", num_workers=None, spin=0.0
    ) as venv:
        assert venv.backend == "inline"
