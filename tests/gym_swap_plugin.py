"""A pytest plugin that runs Gymnasium's own vector tests with aiovec in place of
``gymnasium.vector.AsyncVectorEnv`` (issue #12; driven by ``tests/test_gymnasium_upstream.py``).

It is loaded with ``-p gym_swap_plugin`` into a pytest run of Gymnasium's test files, from
the root of a Gymnasium source tree (their helpers are imported as ``tests.testing_env``,
``tests.vector.testing_utils``, ...; this repository's own ``tests`` package must not be
importable there, so the harness puts a copy of this file alone on ``PYTHONPATH``).

What it does, in order:

1. **Swap.** When the plugin is imported (before any test module is), every module
   attribute ``AsyncVectorEnv`` that is Gymnasium's class -- ``gymnasium.vector``,
   ``gymnasium.vector.async_vector_env`` and anything imported so far -- becomes
   :class:`AiovecAsyncVectorEnv`, so the test modules' ``from gymnasium.vector import
   AsyncVectorEnv`` (and the ``partial(AsyncVectorEnv, ...)`` objects they parametrize
   with) get the aiovec class, and ``gymnasium.make_vec(..., vectorization_mode="async")``,
   which looks up ``gymnasium.vector.AsyncVectorEnv`` when called, builds it too.
   Collection then refuses to run if a test module still holds Gymnasium's class.
2. **Selection.** Only tests that build an AsyncVectorEnv run; the others are deselected
   (see :func:`builds_async_vector_env`).
3. **Report.** Each selected test's outcome, how many AsyncVectorEnvs it built, and for a
   failure the exception type (with its base classes), message, location and a short
   traceback, are appended as JSON lines to ``$AIOVEC_GYM_SWAP_REPORT`` (one line per
   test as it ends, so a run killed on a timeout still leaves what it did).

Environment variables:

- ``AIOVEC_GYM_SWAP=0``: baseline run. Gymnasium's own AsyncVectorEnv stays (seen through
  a subclass that only counts constructions), with the same selection and report. The
  harness uses it to leave out tests that fail with Gymnasium itself on this machine.
- ``AIOVEC_GYM_SWAP_KWARGS``: a JSON object of extra ``aiovec.VecEnv`` keyword arguments
  (e.g. ``{"num_workers": 1}`` or ``{"backend": "inline"}``) for experiments.
- ``AIOVEC_GYM_SWAP_REPORT``: where to append the JSON lines (nothing is written without it).

How AsyncVectorEnv's constructor maps onto ``aiovec.VecEnv``
(``AsyncVectorEnv(env_fns, shared_memory=True, copy=True, context=None, daemon=True,
worker=None, observation_mode="same", autoreset_mode=NEXT_STEP, max_concurrency=None)``;
the adapter builds ``aiovec.VecEnv(env_fns, **mapped)`` with VecEnv's defaults otherwise,
i.e. the process backend, as a user replacing AsyncVectorEnv by ``aiovec.VecEnv(fns)`` gets):

- ``env_fns`` -> ``env_fns``.
- ``copy`` -> ``copy``.
- ``autoreset_mode`` -> ``autoreset_mode`` (the enum or its string value).
- ``context`` -> ``context`` when given (a multiprocessing start method: aiovec accepts
  ``"fork"``, ``"spawn"``, ``"forkserver"``); ``None`` -> aiovec's default start method.
- ``shared_memory`` -> ignored: it has no meaning for aiovec, which always puts
  fixed-size observations and actions in shared memory and sends other values (custom,
  Text, Graph, Sequence spaces) in its control messages. So aiovec never refuses a space
  for ``shared_memory=True`` as Gymnasium does.
- ``daemon`` -> ignored: aiovec's workers always die with the process that started them.
- ``worker`` -> not supported: a custom worker function runs Gymnasium's pipe protocol,
  which aiovec does not speak. Anything but ``None`` raises :class:`UnmappedArgument`
  (a deliberate difference).
- ``observation_mode`` and ``max_concurrency`` -> passed on (``aiovec.VecEnv`` has both).

Any of these arguments that ``aiovec.VecEnv`` does accept (checked on its signature when
the adapter is called) is passed on unchanged instead, so this plugin keeps up as the
runtime gains them (``shared_memory``, ``observation_mode``, ``max_concurrency``, ...).
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import re
import sys
import time
from typing import Any

import gymnasium
import gymnasium.envs.registration
import gymnasium.vector
import gymnasium.vector.async_vector_env
import pytest
from gymnasium.envs.registration import VectorizeMode
from gymnasium.vector import AutoresetMode, VectorEnv

GENUINE = gymnasium.vector.AsyncVectorEnv
SWAP = os.environ.get("AIOVEC_GYM_SWAP", "1") != "0"
REPORT = os.environ.get("AIOVEC_GYM_SWAP_REPORT")
EXTRA_KWARGS: dict[str, Any] = json.loads(os.environ.get("AIOVEC_GYM_SWAP_KWARGS") or "{}")

#: AsyncVectorEnvs built during the test that is running.
_built = [0]


class UnmappedArgument(Exception):  # noqa: N818 (reads as what it is in a test report)
    """An AsyncVectorEnv argument that ``aiovec.VecEnv`` cannot honour.

    A plain ``Exception``: Gymnasium's tests expect ``ValueError``, ``TypeError``,
    ``RuntimeError`` or ``AssertionError`` in places, and must not pass by catching the
    harness's own refusal.
    """


if SWAP:
    import aiovec

    #: AsyncVectorEnv arguments that aiovec may lack, with the value that means
    #: "aiovec's behaviour" (None: any value is meaningless for aiovec and dropped).
    _OPTIONAL = {
        "shared_memory": None,
        "daemon": None,
        "worker": (None,),
        "observation_mode": ("same",),
        "max_concurrency": (None,),
    }

    class AiovecAsyncVectorEnv(aiovec.VecEnv):
        """``aiovec.VecEnv`` with ``gymnasium.vector.AsyncVectorEnv``'s constructor."""

        def __init__(
            self,
            env_fns,
            shared_memory=True,
            copy=True,
            context=None,
            daemon=True,
            worker=None,
            observation_mode="same",
            autoreset_mode=AutoresetMode.NEXT_STEP,
            max_concurrency=None,
        ) -> None:
            _built[0] += 1
            accepted = inspect.signature(aiovec.VecEnv.__init__).parameters
            kwargs: dict[str, Any] = {"copy": copy, "autoreset_mode": autoreset_mode}
            if context is not None:
                kwargs["context"] = context
            given = {
                "shared_memory": shared_memory,
                "daemon": daemon,
                "worker": worker,
                "observation_mode": observation_mode,
                "max_concurrency": max_concurrency,
            }
            for name, value in given.items():
                if name in accepted:
                    kwargs[name] = value
                    continue
                neutral = _OPTIONAL[name]
                if neutral is None or any(type(value) is type(n) and value == n for n in neutral):
                    continue
                raise UnmappedArgument(
                    f"AsyncVectorEnv(..., {name}={value!r}): aiovec.VecEnv has no "
                    f"{name!r} argument (gym_swap_plugin cannot map it)"
                )
            kwargs.update(EXTRA_KWARGS)
            super().__init__(env_fns, **kwargs)

    REPLACEMENT: type = AiovecAsyncVectorEnv
else:

    class RecordingAsyncVectorEnv(GENUINE):
        """Gymnasium's own AsyncVectorEnv, counting constructions (baseline runs)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            _built[0] += 1
            super().__init__(*args, **kwargs)

    REPLACEMENT = RecordingAsyncVectorEnv


def _swap_module_attributes() -> None:
    for module in list(sys.modules.values()):
        if getattr(module, "AsyncVectorEnv", None) is GENUINE:
            module.AsyncVectorEnv = REPLACEMENT


_swap_module_attributes()
assert gymnasium.vector.AsyncVectorEnv is REPLACEMENT
assert gymnasium.vector.async_vector_env.AsyncVectorEnv is REPLACEMENT


# --- selection ---------------------------------------------------------------------------

_ASYNC_IN_SOURCE = re.compile(
    r"AsyncVectorEnv|VectorizeMode\.ASYNC|vectorization_mode\s*=\s*[\"']async[\"']"
)


def _parameter_kind(value: Any) -> str | None:
    """``"async"`` for a parameter that makes the test build an AsyncVectorEnv (the class,
    a ``partial`` of it, the ``"async"`` vectorization mode), ``"other"`` for another
    vector env class or vectorization mode, else ``None``."""
    target = value.func if isinstance(value, functools.partial) else value
    if target is REPLACEMENT or target is GENUINE:
        return "async"
    if isinstance(target, type) and issubclass(target, VectorEnv):
        return "other"
    if isinstance(value, (str, VectorizeMode)):
        try:
            mode = VectorizeMode(value)
        except ValueError:
            return None
        return "async" if mode is VectorizeMode.ASYNC else "other"
    return None


def builds_async_vector_env(item: pytest.Item) -> bool:
    """Whether a collected test builds an AsyncVectorEnv.

    A parametrized test is decided by its parameters: it is selected when one of them is
    AsyncVectorEnv (or a ``partial`` of it) or the ``"async"`` vectorization mode, and
    left out when one is another vector env class or mode (``[Sync]`` variants). Any
    other test is selected when its source names ``AsyncVectorEnv`` or the async
    vectorization mode. Each run reports how many AsyncVectorEnvs every selected test
    really built.
    """
    callspec = getattr(item, "callspec", None)
    if callspec is not None:
        kinds = {_parameter_kind(value) for value in callspec.params.values()}
        if "async" in kinds:
            return True
        if "other" in kinds:
            return False
    function = getattr(item, "function", None)
    if function is None:
        return False
    try:
        source = inspect.getsource(function)
    except (OSError, TypeError):
        return False
    return bool(_ASYNC_IN_SOURCE.search(source))


# --- report ------------------------------------------------------------------------------


def _write(record: dict[str, Any]) -> None:
    if REPORT:
        with open(REPORT, "a", encoding="utf-8") as report:
            report.write(json.dumps(record, default=repr) + "\n")


def pytest_report_header(config: pytest.Config) -> str:
    if SWAP:
        where = f"aiovec {aiovec.__version__} ({os.path.dirname(aiovec.__file__)})"
        return f"gym_swap_plugin: AsyncVectorEnv is aiovec.VecEnv, {where}, extra {EXTRA_KWARGS}"
    return "gym_swap_plugin: baseline, AsyncVectorEnv is Gymnasium's own"


@pytest.hookimpl(trylast=True)  # after -k / -m, so "selected" is what runs
def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    _swap_module_attributes()
    selected, deselected = [], []
    for item in items:
        (selected if builds_async_vector_env(item) else deselected).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = selected
    for module in {item.module for item in selected if getattr(item, "module", None)}:
        if getattr(module, "AsyncVectorEnv", None) is GENUINE:
            raise pytest.UsageError(f"{module.__name__} still holds Gymnasium's AsyncVectorEnv")
    _write(
        {
            "type": "session",
            "swap": SWAP,
            "gymnasium": gymnasium.__version__,
            "aiovec": getattr(sys.modules.get("aiovec"), "__version__", None),
            "extra_kwargs": EXTRA_KWARGS,
            "selected": [item.nodeid for item in selected],
            "deselected": len(deselected),
        }
    )


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _write({"type": "collect_error", "nodeid": report.nodeid, "text": str(report.longrepr)})


_results: dict[str, dict[str, Any]] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    _built[0] = 0
    start = time.monotonic()
    result = _results[item.nodeid] = {"type": "test", "nodeid": item.nodeid, "outcome": "passed"}
    yield
    result["built"] = _built[0]
    result["duration"] = round(time.monotonic() - start, 3)
    _write(result)
    del _results[item.nodeid]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    result = _results.get(item.nodeid)
    if result is None:
        return
    if report.skipped and report.when in ("setup", "call") and result["outcome"] == "passed":
        result["outcome"] = "skipped"
        result["skip_reason"] = str(report.longrepr[-1]) if report.longrepr else ""
    if report.failed and result["outcome"] in ("passed", "skipped"):
        result["outcome"] = "failed" if report.when == "call" else "error"
        result["when"] = report.when
        excinfo = call.excinfo
        if excinfo is not None:
            exc_type = excinfo.type
            result["exc_type"] = exc_type.__qualname__
            result["exc_bases"] = [
                f"{cls.__module__}.{cls.__qualname__}" for cls in exc_type.__mro__[1:-2]
            ]
            result["message"] = str(excinfo.value)[:2000]
            for entry in reversed(excinfo.traceback):  # the innermost frame outside pytest
                if not re.search(r"[/\\](_pytest|pluggy)[/\\]", str(entry.path)):
                    result["raised_at"] = f"{entry.path}:{entry.lineno + 1}"
                    break
        crash = getattr(report.longrepr, "reprcrash", None)
        if crash is not None:
            result["crash"] = f"{crash.path}:{crash.lineno}: {crash.message[:500]}"
        text = report.longreprtext
        result["traceback"] = text if len(text) <= 6000 else text[:1500] + "\n...\n" + text[-4500:]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _write({"type": "end", "exitstatus": int(exitstatus)})
