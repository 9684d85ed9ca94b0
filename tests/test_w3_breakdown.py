"""benchmarks/w3_breakdown.py: the split of each env's cycle, and a short real run."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "w3_breakdown.py"


def load_script():
    spec = importlib.util.spec_from_file_location("w3_breakdown", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_cycle_splits_into_its_stages_even_when_a_step_starts_before_send_returns():
    breakdown = load_script()
    # One env, three cycles of 1 s: step 0.6, to the agent 0.2, agent 0.15, back 0.05;
    # in the third the env's next step starts 0.01 before the agent's send returned.
    stamps = [np.array([[0.0, 0.6], [1.0, 1.6], [2.0, 2.6], [2.94, 3.5]])]
    agent = np.array([[0, 0.8, 0.95], [0, 1.8, 1.95], [0, 2.8, 2.95]])
    durations = breakdown.split(agent, stamps)
    np.testing.assert_allclose(durations["worker -> agent"], [0.2, 0.2, 0.2])
    np.testing.assert_allclose(durations["agent"], [0.15, 0.15, 0.15])
    np.testing.assert_allclose(durations["agent -> worker"], [0.05, 0.05, -0.01])
    # Steps wholly inside the agent's timed rows only.
    np.testing.assert_allclose(durations["env step"], [0.6, 0.6])


def test_the_report_gives_each_stage_its_share_of_the_cycle():
    breakdown = load_script()
    durations = {
        "env step": np.array([0.002]),
        "worker -> agent": np.array([0.0001]),
        "agent": np.array([0.00005]),
        "agent -> worker": np.array([0.00005]),
    }
    text = breakdown.report(0.9, durations)
    assert text.startswith("W3 first-ready one env at a time: 0.900 of ideal")
    shares = dict(re.findall(r"^\| ([^|]+?) \|.*\| ([\d.]+)% \|$", text, re.M))
    assert shares == {
        "env step": "90.9",
        "worker -> agent": "4.5",
        "agent": "2.3",
        "agent -> worker": "2.3",
        "cycle (sum of means)": "100",
    }
    assert "| cycle (sum of means) | | 2,200 |" in text


@pytest.mark.timeout(120)
def test_a_short_run_reports_every_stage():
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--seconds", "0.3"],
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert result.returncode == 0, result.stderr
    assert re.match(r"W3 first-ready one env at a time: [\d.]+ of ideal\n", result.stdout)
    for stage in ("env step", "worker -> agent", "agent", "agent -> worker"):
        # (an env's thread may start its step before the agent's send is back: below 0)
        row = re.search(rf"^\| {stage} \| (-?[\d,]+) \| (-?[\d,]+) \|", result.stdout, re.M)
        assert row is not None, result.stdout
    env_step = re.search(r"^\| env step \| [\d,]+ \| ([\d,]+) \|", result.stdout, re.M)
    assert float(env_step[1].replace(",", "")) > 0  # a mean in microseconds
