"""aiovec in a real Jupyter kernel (issue #12: "notebooks can use the sync API").

A notebook runs every cell inside the kernel's event loop and defines its envs in the
kernel's ``__main__``, which workers cannot import: the synchronous API must block there
as Gymnasium's does (no warning in IPython), top-level ``await`` must work, and worker
processes must start without a ``__main__`` guard. The notebook is executed by
``nbclient`` in an ``ipykernel`` kernel running this interpreter; nothing is faked.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")
pytest.importorskip("ipykernel")

pytestmark = pytest.mark.timeout(240)

KERNEL = "aiovec-test-python"

#: An env class of the notebook's own (it lives in the kernel's __main__).
PREAMBLE = """
import json, os, warnings
import numpy as np
import gymnasium as gym
import aiovec

warnings.simplefilter("error")  # any warning from aiovec in a notebook fails the test

def descendants():
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    parents[int(entry)] = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    found, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return sorted(found)

class NotebookEnv(gym.Env):
    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float64)
    action_space = gym.spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.count = 0
        return np.array([float(seed or 0), 0.0]), {}

    def step(self, action):
        self.count += 1
        return np.array([float(action), float(self.count)]), 1.0, False, False, {}
"""

CELLS = [
    PREAMBLE,
    # The synchronous API inside the kernel's running loop, on worker processes.
    """
envs = aiovec.VecEnv([NotebookEnv] * 4, backend="process", num_workers=2)
observations, _ = envs.reset(seed=10)
for _ in range(3):
    observations, rewards, terminations, truncations, infos = envs.step(np.array([0, 1, 2, 1]))
sync_result = {"observations": observations.tolist(), "rewards": rewards.tolist()}
with_workers = descendants()
""",
    # Top-level await (IPython's autoawait) on the same env.
    """
observations, _ = await envs.areset(seed=0)
await_result = (await envs.astep(np.array([2, 2, 2, 2])))[0].tolist()
""",
    # make() by registry id with the default backend choice, then close everything.
    """
cartpole = aiovec.make("CartPole-v1", num_envs=3)
cartpole.reset(seed=1)
cartpole_shape = list(cartpole.step(cartpole.action_space.sample())[0].shape)
cartpole.close()
envs.close()
print(json.dumps({
    "sync": sync_result,
    "await": await_result,
    "cartpole_shape": cartpole_shape,
    "closed": envs.closed,
    "with_workers": with_workers,
    "after_close": descendants(),
}))
""",
]


#: A cell that blocks in a step until the kernel is interrupted (the notebook's
#: "Interrupt" button: SIGINT to the kernel), then one that looks at what is left.
INTERRUPTED_CELLS = [
    PREAMBLE,
    """
import time

class StuckEnv(NotebookEnv):
    def step(self, action):
        time.sleep(600)
        return super().step(action)

stuck = aiovec.VecEnv([StuckEnv] * 2, backend="process", num_workers=2)
stuck.reset(seed=0)
with_workers = descendants()
""",
    "stuck.step(np.array([0, 0]))  # interrupted",
    """
try:
    stuck.step(np.array([0, 0]))
    after = "stepped"
except aiovec.ClosedError as error:
    after = str(error)
print(json.dumps({
    "closed": stuck.closed,
    "after": after,
    "with_workers": with_workers,
    "after_close": descendants(),
}))
""",
]

#: Seconds the interrupted cell runs before the kernel is interrupted.
INTERRUPT_AFTER = 3


def _run_notebook(kernels: Path, cells: list[str]) -> tuple[dict, list]:
    """Run ``cells`` in a fresh kernel: (the JSON the last cell printed, the cells)."""
    # A kernel of this interpreter (its virtualenv), not whatever "python3" kernel the
    # machine has installed: a kernelspec of its own, found through JUPYTER_PATH.
    spec = kernels / "kernels" / KERNEL
    spec.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": KERNEL, "language": "python"})
    )
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source.strip()) for source in cells]

    def cell_timeout(cell: Any) -> int:
        # The cell marked "interrupted" is interrupted when its time is up (and the
        # notebook goes on, its error kept in its outputs); the others have 120 s.
        return INTERRUPT_AFTER if "# interrupted" in cell.source else 120

    client = nbclient.NotebookClient(
        notebook,
        kernel_name=KERNEL,
        timeout_func=cell_timeout,
        interrupt_on_timeout=True,
        allow_errors=True,
    )
    client.execute()
    for cell in notebook.cells:
        errors = [output for output in cell.outputs if output.output_type == "error"]
        if errors and "# interrupted" not in cell.source:
            raise AssertionError(f"cell failed: {cell.source}\n{errors}")
    outputs = notebook.cells[-1].outputs
    text = "".join(output.get("text", "") for output in outputs if output.output_type == "stream")
    return json.loads(text.strip().splitlines()[-1]), notebook.cells


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_notebook_steps_envs_it_defines_with_the_sync_api_and_await(tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    result, _ = _run_notebook(tmp_path, CELLS)
    sync = result["sync"]
    assert sync["observations"] == [[0.0, 3.0], [1.0, 3.0], [2.0, 3.0], [1.0, 3.0]]
    assert sync["rewards"] == [1.0] * 4
    assert result["await"] == [[2.0, 1.0]] * 4
    assert result["cartpole_shape"] == [3, 4]
    assert result["closed"] is True
    _assert_workers_stopped(result)


def test_interrupting_the_kernel_in_a_blocking_step_closes_the_env_and_its_workers(
    tmp_path, monkeypatch
):
    """The notebook's Interrupt button during ``step()``: the cell ends with a
    ``KeyboardInterrupt``, the env is closed with its workers stopped (documented: an
    interrupted call's state is not trusted), and the next cell's call says so."""
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    result, cells = _run_notebook(tmp_path, INTERRUPTED_CELLS)
    interrupted = [o for o in cells[2].outputs if o.output_type == "error"]
    assert [o.ename for o in interrupted] == ["KeyboardInterrupt"]
    assert result["closed"] is True
    assert "Ctrl-C" in result["after"], result["after"]
    _assert_workers_stopped(result)


def _assert_workers_stopped(result: dict) -> None:
    """Workers ran beside the kernel's zygote; closing stopped them, and the kernel's
    shutdown took the rest (the zygote) with it."""
    workers = set(result["with_workers"]) - set(result["after_close"])
    assert len(workers) >= 2, result
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in result["with_workers"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in result["with_workers"] if _alive(pid)]
