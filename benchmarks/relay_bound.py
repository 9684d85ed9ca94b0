"""What W3's first-ready loop can reach across two processes with no runtime at all.

W3 (16 envs sleeping lognormal, mean 2 ms, sigma 1, cap 50 ms) stepped by 16 threads
in 2 worker processes, each thread blocking on a socket of its own, sleeping its step
time and answering on its worker's socket; one agent thread waits on the workers'
sockets (``selectors``) and writes each env's next step straight back to that env's
socket. No shared memory, no checks, no bookkeeping: the same wake-ups as aiovec's
first-ready one env at a time (a step wakes the env's thread, a result wakes the agent),
and nothing else. The worker threads wait with aiovec's timer slack.

The gap between this and ``aiovec bench --workloads W3``'s default ``VecEnv(fns)``
first-ready row is what aiovec's own work costs; the gap between this and the
``ceiling`` row is what the machine's cross-process wake-ups cost.

Usage: ``python benchmarks/relay_bound.py [--seconds 4] [--repeats 3]`` (Linux: fork).
"""

from __future__ import annotations

import argparse
import os
import selectors
import socket
import statistics
import struct
import threading
import time

import numpy as np

from aiovec._worker.timer_slack import set_timer_slack

NUM_ENVS, NUM_WORKERS = 16, 2
MEAN, SIGMA, CAP = 0.002, 1.0, 0.05
IDEAL = NUM_ENVS / MEAN


def _serve(env_sockets: list[tuple[int, socket.socket]], results: socket.socket) -> None:
    """A worker process: a thread per env, until the agent closes the env's socket."""
    set_timer_slack()
    send_lock = threading.Lock()
    mu = np.log(MEAN) - SIGMA**2 / 2

    def env(index: int, steps: socket.socket) -> None:
        rng = np.random.default_rng(index)
        while steps.recv(64):
            time.sleep(min(rng.lognormal(mu, SIGMA), CAP))
            with send_lock:
                results.sendall(struct.pack("<i", index))

    threads = [threading.Thread(target=env, args=pair) for pair in env_sockets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def relay_rate(seconds: float) -> float:
    """Env-steps per second of one timed window (after a 1 s warm-up)."""
    step_pairs = [socket.socketpair() for _ in range(NUM_ENVS)]
    result_pairs = [socket.socketpair() for _ in range(NUM_WORKERS)]
    pids = []
    for worker in range(NUM_WORKERS):
        pid = os.fork()
        if pid == 0:  # the worker: its ends only
            try:
                for agent_end, _ in step_pairs + result_pairs:
                    agent_end.close()
                mine = [(i, pair[1]) for i, pair in enumerate(step_pairs)]
                _serve(mine[worker::NUM_WORKERS], result_pairs[worker][1])
            finally:
                os._exit(0)
        pids.append(pid)
    for _, worker_end in step_pairs + result_pairs:
        worker_end.close()
    steps = [pair[0] for pair in step_pairs]
    selector = selectors.DefaultSelector()
    for agent_end, _ in result_pairs:
        selector.register(agent_end, selectors.EVENT_READ)
    try:
        for step in steps:
            step.sendall(b"s")
        count, start, warm = 0, time.perf_counter(), True
        while True:
            for key, _ in selector.select():
                for (index,) in struct.iter_unpack("<i", key.fileobj.recv(4096)):  # type: ignore[union-attr]
                    count += 1
                    steps[index].sendall(b"s")
            now = time.perf_counter()
            if warm and now - start >= 1.0:
                warm, count, start = False, 0, now
            elif not warm and now - start >= seconds:
                return count / (now - start)
    finally:
        for step in steps:  # each env's thread ends at its next read
            step.close()
        for pid in pids:
            os.waitpid(pid, 0)
        for agent_end, _ in result_pairs:  # after: a thread may still answer meanwhile
            agent_end.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rates = [relay_rate(args.seconds) for _ in range(args.repeats)]
    shown = ", ".join(f"{rate / IDEAL:.3f}" for rate in rates)
    median = statistics.median(rates)
    print(f"relay bound: {median:,.0f} steps/s, {median / IDEAL:.3f} of ideal (runs: {shown})")


if __name__ == "__main__":
    main()
