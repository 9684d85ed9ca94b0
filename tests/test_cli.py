"""Smoke tests of the command line on a tiny budget (no timing is asserted)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest


def run_cli(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "aiovec.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_bench_writes_table_plots_and_json(tmp_path):
    result = run_cli(
        "bench",
        "--workloads", "W1,W3,W6,memory",
        "--num-envs", "2",
        "--seconds", "0.05",
        "--repeats", "1",
        "--out", str(tmp_path / "out"),
        "--json", str(tmp_path / "new" / "results.json"),  # its folder is created
        "--quiet",
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "gymnasium AsyncVectorEnv" in result.stdout
    assert "aiovec process" in result.stdout
    for name in ("results.md", "throughput.png", "recv_latency_cdf.png", "results.json"):
        assert (tmp_path / "out" / name).stat().st_size > 0
    data = json.loads((tmp_path / "new" / "results.json").read_text())
    assert data["machine"]["pipe_round_trip_us"] > 0
    keys = [workload["key"] for workload in data["workloads"]]
    assert keys == ["W1-2", "W3", "W6-2"]
    rates = {r["name"]: r["median_steps_per_s"] for r in data["workloads"][0]["results"]}
    assert rates["aiovec inline"] > 0 and rates["gymnasium SyncVectorEnv"] > 0
    assert {m["name"] for m in data["memory"]} >= {"aiovec process", "gymnasium AsyncVectorEnv"}
    assert {m["num_envs"] for m in data["memory"]} == {2}  # --num-envs counts for memory too
    assert "### Memory: 2 CartPole-v1 envs" in result.stdout
    w6_rates = {r["name"]: r["median_steps_per_s"] for r in data["workloads"][2]["results"]}
    assert w6_rates["bare asyncio tasks, one loop (floor: no env runtime)"] > 0
    # W3's waiting envs are also stepped with no runtime at all, one thread each
    w3_rates = {r["name"]: r["median_steps_per_s"] for r in data["workloads"][1]["results"]}
    assert w3_rates["ceiling: one thread per env, no runtime"] > 0
    # the default VecEnv first-ready one env at a time, and with recv()'s defaults
    assert w3_rates["aiovec VecEnv(fns) default (first-ready 1)"] > 0
    assert w3_rates["aiovec VecEnv(fns) default (first-ready all ready)"] > 0
    # the targets checker reads the same results
    checker = Path(__file__).resolve().parent.parent / "benchmarks" / "targets.py"
    targets = subprocess.run(
        [sys.executable, str(checker), str(tmp_path / "new" / "results.json")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert targets.returncode == 0, targets.stderr
    assert "| Memory, 64 envs: process <= 1/8 of Async's |" in targets.stdout
    assert "PASS" in targets.stdout or "MISS" in targets.stdout
    ceiling_rows = [line for line in targets.stdout.splitlines() if "that ceiling" in line]
    assert len(ceiling_rows) == 1 and "not run" not in ceiling_rows[0]
    all_ready = [line for line in targets.stdout.splitlines() if "(all ready)" in line]
    assert len(all_ready) == 1 and "not run" not in all_ready[0]
    assert "| W4 8 envs: make default lockstep >= 0.88 of the CPU limit | not run | - |" in (
        targets.stdout
    )


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the relay forks its workers")
@pytest.mark.parametrize("codec", [False, True], ids=["bare", "codec"])
def test_the_relay_bound_measures_w3_with_no_runtime(codec):
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "relay_bound.py"
    result = subprocess.run(
        [sys.executable, str(script), "--seconds", "0.2", "--repeats", "1"]
        + (["--codec"] if codec else []),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    label = "relay bound with codec" if codec else "relay bound"
    line = label + r": ([\d,]+) steps/s, ([\d.]+) of ideal \(runs: [\d.]+\)\n"
    match = re.fullmatch(line, result.stdout)
    assert match is not None, result.stdout
    assert float(match[1].replace(",", "")) > 0 and result.stderr == ""


def test_tune_recommends_a_call(tmp_path):
    result = run_cli(
        "tune", "aiovec/NoOp-v0", "--seconds", "0.02", "--repeats", "1", "--quiet", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert 'aiovec.make("aiovec/NoOp-v0", num_envs=' in result.stdout
    # Each configuration's aiovec cost and waiting share come from VecEnv.stats().
    assert "| aiovec us/env-step | waiting |" in result.stdout
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ") and "%" in line]
    assert rows and all(float(row.split("|")[6]) >= 0 for row in rows)


@pytest.mark.parametrize(
    "args, message",
    [
        (["bench", "--workloads", "W2,W9"], "argument --workloads: unknown workload 'W9'"),
        (["bench", "--num-envs", "abc"], "argument --num-envs: 'abc' is not a whole number"),
        (["bench", "--num-envs", "2,-1"], "argument --num-envs: must be at least 1, got -1"),
        (["bench", "--num-envs", "0"], "argument --num-envs: must be at least 1, got 0"),
        (["bench", "--repeats", "0"], "argument --repeats: must be at least 1, got 0"),
        (["bench", "--seconds", "-1"], "argument --seconds: must be a positive number"),
        (["bench", "--seconds", "nan"], "argument --seconds: must be a positive number"),
        (["bench", "--out", "/proc/aiovec-nope"], "argument --out: cannot create"),
        (["bench", "--json", "/proc/aiovec-nope/r.json"], "argument --json: cannot create"),
        (["bench", "--workloads", "W1", "--env-id", "NoSuchEnv-v0"], "argument --env-id: "),
        (["tune", "NoSuchEnv-v0"], "argument env_id: "),
        (["bench", "--workloads", ","], "argument --workloads: names no workload"),
        (["bench", "--num-envs", ","], "argument --num-envs: names no count"),
        (["bench", "--json", "."], "argument --json: . is a folder"),
        # registered, but its entry point cannot be imported (a missing extra, e.g. Box2D)
        (["tune", "brokenreg:Broken-v0"], "argument env_id: cannot load"),
        (["bench", "--env-id", "brokenreg:Broken-v0"], "argument --env-id: cannot load"),
        (["tune", "CartPole-v1", "--repeats", "0"], "argument --repeats: must be at least 1"),
    ],
)
def test_a_mistake_in_the_arguments_is_a_usage_error_before_anything_runs(tmp_path, args, message):
    (tmp_path / "brokenreg.py").write_text(
        "import gymnasium\n"
        "gymnasium.register('Broken-v0', entry_point='aiovec_no_such_module:Env')\n"
    )
    result = run_cli(*args, "--quiet", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert f"usage: aiovec {args[0]}" in result.stderr  # the subcommand's own usage
    assert "Traceback" not in result.stderr
    assert not result.stdout  # nothing measured


def test_bench_replay_workload(tmp_path):
    result = run_cli(
        "bench", "--workloads", "replay", "--seconds", "0.02", "--repeats", "1",
        "--out", str(tmp_path / "out"), "--no-plots", "--quiet", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "| aiovec PrioritizedReplayBuffer |" in result.stdout
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    names = {entry["name"]: entry for entry in data["replay"]}
    assert names["aiovec ReplayBuffer"]["insert_per_s"] > 0
    assert names["aiovec PrioritizedReplayBuffer"]["samples_with_updates_per_s"] > 0


def test_bench_spin_workload_runs_beside_a_busy_process(tmp_path):
    result = run_cli(
        "bench", "--workloads", "spin", "--seconds", "0.05", "--repeats", "1",
        "--out", str(tmp_path / "out"), "--no-plots", "--quiet", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "| aiovec process (spin=0) |" in result.stdout
    # The busy neighbour is gone with the run.
    leftover = subprocess.run(
        ["pgrep", "-f", "while True: pass"], capture_output=True, text=True
    ).stdout.split()
    assert not leftover


class _Interrupted:
    """A bench contender whose measuring window is cut by Ctrl-C (``interrupt``), and
    whose close() fails as a library's may once its workers took the Ctrl-C too."""

    library = "test"

    def __init__(self, name: str, closed: list[str], interrupt: bool) -> None:
        self.name, self._closed, self._interrupt = name, closed, interrupt
        self.recv_latencies: list[float] = []

    def start(self) -> None:
        pass

    def run(self, seconds: float) -> int:
        if self._interrupt and seconds > 0.5:  # a timed window, not the warm-up
            raise KeyboardInterrupt
        return 1

    def stats(self):
        return None

    def close(self) -> None:
        self._closed.append(self.name)
        raise BrokenPipeError("[Errno 32] Broken pipe")

    def abandon(self) -> None:  # (what unwinding calls: see Contender.abandon)
        self.close()


def test_ctrl_c_during_a_bench_window_closes_every_contender_and_stays_a_ctrl_c():
    """The KeyboardInterrupt reaches the caller (exit 130), not a close() error raised
    while unwinding, and every contender started is closed all the same."""
    from aiovec.bench import suite
    from aiovec.bench.workloads import Workload

    closed: list[str] = []
    workload = Workload(
        key="X",
        title="interrupted",
        env_fn=lambda: None,  # type: ignore[arg-type,return-value]
        num_envs=1,
        contenders=lambda: [_Interrupted(n, closed, n == "b") for n in "abc"],  # type: ignore[misc]
    )
    with pytest.raises(KeyboardInterrupt):
        suite.run_workload(workload, seconds=1.0, repeats=1, progress=lambda _: None)
    assert closed == ["a", "b", "c"]


@pytest.mark.timeout(120)
def test_ctrl_c_ends_a_bench_with_one_line_and_exit_130(tmp_path):
    """A user stopping `aiovec bench` sees why it ended, not a traceback of wherever the
    interrupt landed; every process the run started is gone with it."""
    import signal
    import time

    bench = subprocess.Popen(
        [sys.executable, "-m", "aiovec.cli", "bench", "--workloads", "W3", "--repeats", "50",
         "--out", str(tmp_path / "out"), "--no-plots", "--quiet"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip

    def children() -> list[str]:
        found = subprocess.run(["pgrep", "-P", str(bench.pid)], capture_output=True, text=True)
        return found.stdout.split()

    deadline = time.monotonic() + 60
    while len(children()) < 4 and time.monotonic() < deadline:  # contenders started
        time.sleep(0.2)
    time.sleep(1.0)  # into the measuring windows
    bench.send_signal(signal.SIGINT)
    stdout, stderr = bench.communicate(timeout=60)
    assert bench.returncode == 130, stderr[-2000:]
    assert "Traceback" not in stderr, stderr[-2000:]
    assert "interrupted" in stderr
    assert not children()


def _abandon_within(contender, seconds: float) -> None:
    """Unwind ``contender`` as the bench does after a Ctrl-C, failing if that waits
    ``seconds`` (in a daemon thread: a wait forever must not hold the test run)."""
    import threading

    from aiovec.bench import suite

    done = threading.Event()
    closer = threading.Thread(
        target=lambda: (suite._close_all([contender], quietly=True), done.set()), daemon=True
    )
    closer.start()
    assert done.wait(seconds), "closing the interrupted contender waited forever"


@pytest.mark.timeout(120)
def test_unwinding_never_waits_on_a_step_an_interrupt_left_half_sent():
    """Gymnasium's AsyncVectorEnv.close() waits, with no timeout, for the replies to a
    pending step; a Ctrl-C between its sends to two workers leaves one that will never
    come. The bench, unwinding, must end such a contender without waiting for it."""
    import gymnasium as gym

    from aiovec.bench.contenders import GymnasiumLockstep

    contender = GymnasiumLockstep(
        "gymnasium AsyncVectorEnv",
        "gymnasium",
        lambda: gym.vector.AsyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2),
        env_fn=lambda: gym.make("CartPole-v1"),
        num_envs=2,
    )
    contender.start()
    env = contender.env
    env.parent_pipes[0].send(("step", env.action_space.sample()[0]))  # one of two sent
    env._state = type(env._state).WAITING_STEP
    _abandon_within(contender, seconds=30)
    assert not any(process.is_alive() for process in env.processes)


@pytest.mark.timeout(120)
def test_unwinding_stops_sb3_workers_left_with_a_half_sent_step():
    """SB3's SubprocVecEnv.close() reads every worker's reply to a pending step, with no
    timeout: the same cut must not hold the bench either."""
    import gymnasium as gym

    from aiovec.bench.contenders import SB3Lockstep

    contender = SB3Lockstep("SubprocVecEnv", env_fn=lambda: gym.make("CartPole-v1"), num_envs=2)
    contender.start()
    env = contender.env
    env.remotes[0].send(("step", env.action_space.sample()))  # one of two sent
    env.waiting = True
    _abandon_within(contender, seconds=30)
    assert not any(process.is_alive() for process in env.processes)
