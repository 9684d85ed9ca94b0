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

With ``--codec``, each side also does the least a runtime must do per step: the agent
writes the env's action into an array and sends aiovec's encoded ``Step`` command, the
env's thread decodes it, reads the action, writes an observation, reward and flags into
arrays and answers with an encoded ``Reply``, which the agent decodes before copying
the observation out. A few microseconds of CPU on each side, no runtime logic: how much
of the bound such work alone costs on this machine.

Usage: ``python benchmarks/relay_bound.py [--seconds 4] [--repeats 3] [--codec]``
(Linux: fork).
"""

from __future__ import annotations

import argparse
import itertools
import os
import selectors
import socket
import statistics
import struct
import threading
import time

import numpy as np

from aiovec._transport.channel import HEADER
from aiovec._transport.protocol import Reply, Step, decode_command, decode_message, encode
from aiovec._worker.timer_slack import set_timer_slack

NUM_ENVS, NUM_WORKERS = 16, 2
MEAN, SIGMA, CAP = 0.002, 1.0, 0.05
IDEAL = NUM_ENVS / MEAN


def _serve(
    env_sockets: list[tuple[int, socket.socket]], results: socket.socket, codec: bool
) -> None:
    """A worker process: a thread per env, until the agent closes the env's socket."""
    set_timer_slack()
    send_lock = threading.Lock()
    mu = np.log(MEAN) - SIGMA**2 / 2
    rows = _Rows()  # this process's copy (a runtime would share it): the same writes

    def env(index: int, steps: socket.socket) -> None:
        rng = np.random.default_rng(index)
        observation = np.zeros(4, np.float32)
        while frame := steps.recv(64):
            if codec:
                command = decode_command(frame[HEADER.size :])
                rows.actions[index]  # the action, as an env would read it
            time.sleep(min(rng.lognormal(mu, SIGMA), CAP))
            if codec:
                rows.observations[index] = observation
                rows.rewards[index], rows.terminations[index], rows.truncations[index] = 1.0, 0, 0
                reply = encode(Reply(command.seq, [index]))
                answer = HEADER.pack(len(reply)) + reply
            else:
                answer = struct.pack("<i", index)
            with send_lock:
                results.sendall(answer)

    threads = [threading.Thread(target=env, args=pair) for pair in env_sockets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


class _Rows:
    """Per-env rows of actions, observations, rewards and flags."""

    def __init__(self) -> None:
        self.actions = np.zeros(NUM_ENVS, np.int64)
        self.observations = np.zeros((NUM_ENVS, 4), np.float32)
        self.rewards = np.zeros(NUM_ENVS)
        self.terminations = np.zeros(NUM_ENVS, np.bool_)
        self.truncations = np.zeros(NUM_ENVS, np.bool_)


def relay_rate(seconds: float, codec: bool = False) -> float:
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
                _serve(mine[worker::NUM_WORKERS], result_pairs[worker][1], codec)
            finally:
                os._exit(0)
        pids.append(pid)
    for _, worker_end in step_pairs + result_pairs:
        worker_end.close()
    steps = [pair[0] for pair in step_pairs]
    selector = selectors.DefaultSelector()
    for agent_end, _ in result_pairs:
        selector.register(agent_end, selectors.EVENT_READ)
    rows, sequence = _Rows(), itertools.count(1)

    def send_step(index: int) -> None:
        if codec:
            rows.actions[index] = 1
            command = encode(Step(next(sequence), [index], None, True))
            steps[index].sendall(HEADER.pack(len(command)) + command)
        else:
            steps[index].sendall(b"s")

    def finished(data: bytes) -> list[int]:
        if not codec:
            return [index for (index,) in struct.iter_unpack("<i", data)]
        indices, start = [], 0
        while start < len(data):  # whole frames: each reply is sent whole, and is small
            (size,) = HEADER.unpack_from(data, start)
            (index,) = decode_message(
                data[start + HEADER.size : start + HEADER.size + size]
            ).env_ids
            rows.observations[index].copy()  # the observation, as a batch would take it
            indices.append(index)
            start += HEADER.size + size
        return indices

    try:
        for index in range(NUM_ENVS):
            send_step(index)
        count, start, warm = 0, time.perf_counter(), True
        while True:
            for key, _ in selector.select():
                for index in finished(key.fileobj.recv(1 << 16)):  # type: ignore[union-attr]
                    count += 1
                    send_step(index)
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
    parser.add_argument("--codec", action="store_true", help="add the wire codec and row writes")
    args = parser.parse_args()
    rates = [relay_rate(args.seconds, args.codec) for _ in range(args.repeats)]
    shown = ", ".join(f"{rate / IDEAL:.3f}" for rate in rates)
    median = statistics.median(rates)
    label = "relay bound with codec" if args.codec else "relay bound"
    print(f"{label}: {median:,.0f} steps/s, {median / IDEAL:.3f} of ideal (runs: {shown})")


if __name__ == "__main__":
    main()
