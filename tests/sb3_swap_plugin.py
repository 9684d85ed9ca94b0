"""A pytest plugin that runs Stable-Baselines3's own tests with aiovec in place of
``SubprocVecEnv`` (issue #12; driven by ``tests/test_sb3_upstream.py``).

It is loaded with ``-p tests.sb3_swap_plugin`` into a pytest run of SB3's test files.
When it is imported, before any test module is collected, every module attribute
``SubprocVecEnv`` that is SB3's class (``stable_baselines3.common.vec_env``, its
``subproc_vec_env`` module, ``env_util``, ...) becomes
:class:`aiovec.integrations.sb3.AiovecSubprocVecEnv`: SB3's adapter over
``aiovec.VecEnv(env_fns, autoreset_mode=SAME_STEP, context=start_method)``, with
``SubprocVecEnv``'s constructor ``(env_fns, start_method=None)``. So the test modules'
``from stable_baselines3.common.vec_env import SubprocVecEnv`` (and the lists and
``partial`` objects they build from it) get the aiovec class, and collection refuses to
run if a test module still holds SB3's own class.
"""

from __future__ import annotations

import os
import sys

import pytest
import stable_baselines3.common.env_util
import stable_baselines3.common.vec_env
import stable_baselines3.common.vec_env.subproc_vec_env
import stable_baselines3.common.vec_env.vec_video_recorder  # noqa: F401 (has the name too)

import aiovec
from aiovec.integrations.sb3 import AiovecSubprocVecEnv

ORIGINAL = stable_baselines3.common.vec_env.subproc_vec_env.SubprocVecEnv


def _swap_module_attributes() -> None:
    for module in list(sys.modules.values()):
        if getattr(module, "SubprocVecEnv", None) is ORIGINAL:
            module.SubprocVecEnv = AiovecSubprocVecEnv


_swap_module_attributes()
assert stable_baselines3.common.vec_env.SubprocVecEnv is AiovecSubprocVecEnv


def pytest_report_header(config: pytest.Config) -> str:
    return (
        "sb3_swap_plugin: SubprocVecEnv is aiovec.integrations.sb3.AiovecSubprocVecEnv, "
        f"aiovec {aiovec.__version__} ({os.path.dirname(aiovec.__file__)}), "
        f"stable-baselines3 {stable_baselines3.__version__}"
    )


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    _swap_module_attributes()
    for module in {item.module for item in items if getattr(item, "module", None)}:
        if getattr(module, "SubprocVecEnv", None) is ORIGINAL:
            raise pytest.UsageError(f"{module.__name__} still holds SB3's own SubprocVecEnv")
