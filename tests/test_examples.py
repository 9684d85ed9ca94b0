"""Every example runs end to end on a tiny budget (outputs are checked, not timings)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
CASES = {
    "quickstart.py": (["--seconds", "0.2"], "first-ready"),
    "async_agent.py": (["--seconds", "0.3", "--num-envs", "4"], "first-ready (<= 2)"),
    "domain_randomization.py": (["--rounds", "2", "--steps", "50"], "pole lengths"),
    "ppo_cartpole.py": (
        ["--total-timesteps", "1024", "--num-envs", "4", "--num-steps", "64"],
        "done: average return",
    ),
    "dqn_first_ready.py": (
        [
            "--total-timesteps",
            "3000",
            "--learning-starts",
            "500",
            "--eval-every",
            "1500",
            "--eval-episodes",
            "2",
            "--buffer-size",
            "5000",
        ],
        "done: ",
    ),  # fmt: skip
    "population.py": (
        [
            "--iterations",
            "2",
            "--exploit-every",
            "1",
            "--members",
            "2",
            "--envs-per-member",
            "2",
            "--episodes-per-iteration",
            "2",
        ],
        "exploit: member",
    ),  # fmt: skip
    "curriculum.py": (["--seconds", "2", "--num-envs", "4", "--check-every", "0.2"], "done: "),
    "batched_cartpole.py": (["--num-envs", "256", "--seconds", "0.3"], "ratio: "),
    "numpy_sim.py": (
        ["--blocks", "2", "--envs-per-block", "64", "--seconds", "0.5"],
        "first-ready: ",
    ),
    "imagination.py": (
        [
            "--real-steps",
            "100",
            "--train-seconds",
            "0.5",
            "--rollouts",
            "256",
            "--seconds",
            "0.3",
        ],
        "imagined steps/s, aiovec blocks on 2 workers",
    ),  # fmt: skip
    "sb3_ppo.py": (["--total-timesteps", "512", "--num-envs", "2"], "mean return"),
    "ray_cluster.py": (["--seconds", "0.5", "--num-envs", "4"], "first-ready on backend='ray'"),
    "tcp_simulator.py": (
        ["--num-envs", "20", "--seconds", "0.5"],
        "TCP envs on backend='coroutine'",
    ),
}


def _temp_dir(script: str, tmp_path) -> dict[str, str]:
    """SB3's learn() leaves a log folder in the temp dir: in pytest's for its example.
    (Not for all: Ray's socket paths under a long temp dir pass the 107-byte limit.)"""
    return {"TMPDIR": str(tmp_path)} if script == "sb3_ppo.py" else {}


@pytest.mark.parametrize("script", list(CASES))
def test_example_runs(script, tmp_path):
    args, expected = CASES[script]
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(EXAMPLES.parent), **_temp_dir(script, tmp_path)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert expected in result.stdout
