"""Fixtures shared by the tests: leak checks for processes and shared memory."""

from __future__ import annotations

import os
import threading
import time

import pytest

BACKENDS = ["inline", "process"]


def pid_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or the read
        return False


def worker_pids(venv) -> list[int]:
    processes = getattr(venv._backend, "_processes", [])
    return [process.pid for process in processes if process.pid is not None]


def worker_processes() -> set[int]:
    """Live processes below this one, except the zygote that outlives every vector env
    by design (one per agent process, see ``aiovec._worker.zygote``)."""
    from aiovec._worker import zygote as _zygote
    from aiovec.bench.system import descendant_pids

    zygote = _zygote._shared
    zygote_pid = zygote._process.pid if zygote is not None else None
    return {pid for pid in descendant_pids() if pid != zygote_pid and pid_alive(pid)}


def shm_entries() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except FileNotFoundError:
        return set()


@pytest.fixture(autouse=True, scope="session")
def sb3_logs_in_pytest_temp(tmp_path_factory):
    """Stable-Baselines3's ``learn()`` makes a ``SB3-<date>`` folder in the system's temp
    folder for every model it trains; the tests (and the scripts they start, which
    inherit the environment) make theirs under pytest's temp folder instead."""
    previous = os.environ.get("SB3_LOGDIR")
    os.environ["SB3_LOGDIR"] = str(tmp_path_factory.mktemp("sb3-logs"))
    yield
    if previous is None:
        os.environ.pop("SB3_LOGDIR", None)
    else:
        os.environ["SB3_LOGDIR"] = previous


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    return request.param


def open_descriptors() -> set[str]:
    """This process's open file descriptors, with what each points to."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile (e.g. the listing's own descriptor)
            continue
        # A mapping's own copy of its memfd lives as long as numpy views of it do (a
        # caller may keep zero-copy observations): not a leak, freed with the views.
        if not target.startswith("/memfd:aiovec"):
            found.add(f"{fd} -> {target}")
    return found


def _leftovers(before: dict[str, set]) -> dict[str, set]:
    now = {
        "/dev/shm segments": shm_entries(),
        "descriptors": open_descriptors(),
        "threads": {thread.name for thread in threading.enumerate()},
        "child processes": worker_processes(),
    }
    return {kind: now[kind] - before[kind] for kind in now if now[kind] - before[kind]}


@pytest.fixture
def no_leaks():
    """Fails the test if it leaves behind a /dev/shm segment, an open descriptor, a
    thread or a child process (the zygote, one per test process, excepted)."""
    import asyncio
    import gc

    import aiovec
    from aiovec._worker import zygote as _zygote

    _zygote.shared()  # started once per process, by design: not a leak
    aiovec.run(asyncio.sleep(0))  # the loop library's once-per-process set-up (a pipe)
    before = {
        "/dev/shm segments": shm_entries(),
        "descriptors": open_descriptors(),
        "threads": {thread.name for thread in threading.enumerate()},
        "child processes": worker_processes(),
    }
    yield
    deadline = time.monotonic() + 5  # processes being reaped, threads ending
    while (leftovers := _leftovers(before)) and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.05)
    assert leftovers == {}


@pytest.fixture(params=["idle", "loaded"])
def machine(request):
    """The machine as it is, or with two busy processes per core beside the test (the
    probe must tell computing from waiting envs on a loaded machine too)."""
    import subprocess
    import sys

    hogs = []
    if request.param == "loaded":
        hogs = [
            subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(2 * (os.cpu_count() or 1))
        ]
    yield request.param
    for hog in hogs:
        hog.kill()
        hog.wait()
