"""Fixtures shared by the tests: leak checks for processes and shared memory."""

from __future__ import annotations

import os

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
    by design (one per agent process, see ``aiovec._zygote``)."""
    from aiovec import _zygote
    from aiovec.bench.system import descendant_pids

    zygote = _zygote._shared
    zygote_pid = zygote._process.pid if zygote is not None else None
    return {pid for pid in descendant_pids() if pid != zygote_pid and pid_alive(pid)}


def shm_entries() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except FileNotFoundError:
        return set()


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    return request.param


@pytest.fixture
def no_leaks():
    """Fails the test if it leaves a /dev/shm segment behind."""
    before = shm_entries()
    yield
    assert shm_entries() - before == set()
