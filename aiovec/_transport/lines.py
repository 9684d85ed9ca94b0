"""Env lines: a socket per env of a worker that steps its envs in threads, carrying each
step from the agent straight to that env's thread.

Why: through the worker's one socket a step wakes the worker's receiving thread, which
then wakes the env's thread, two wake-ups in a row; the first also waits for a free
core, as the receiving thread yields to the agent (measured on 2 cores, 16 envs
sleeping 2 ms, first-ready one env at a time: 200-350 us from ``send`` to the env's
thread, against 2.1 ms of step). On its own line, a step wakes the env's thread itself.

Guarantees:

- Two processes write to a line's sending end: the agent a step, the worker's receiving
  thread a token (an empty frame: "take the commands in your queue") when it hands the
  env any other command and no token is there unread. Each frame is a few dozen bytes
  written by one ``send``, so frames never interleave.
- A step never overtakes an earlier command of its env: the agent sends a step on a
  line only while nothing but steps is in flight to that worker, and a step only to an
  env with nothing in flight (see :class:`~aiovec.backends.process.ProcessBackend`);
  what the receiving thread hands the env later is queued behind the step on the line.
- A line holds at most one step (the env's) and one token: a send never finds it
  full (a socket pair takes only a few hundred small writes, whatever their size).
"""

from __future__ import annotations

import errno
import os
import resource
import socket
from typing import Final

from aiovec._interrupts import no_interrupt
from aiovec._transport.channel import HEADER

#: Lines per vector env at most (each is a descriptor in the agent's process, and two
#: in the worker's, for as long as the vector env lives, whether its envs turn out to
#: wait or not); beyond that, steps go through the workers' sockets.
MAX_LINES: Final = 64
#: Descriptors left free for everything else when lines are opened: a process near its
#: limit (``ulimit -n``) gets no lines rather than failing later on.
SPARE_FDS: Final = 256
#: Lines per worker at most: a worker gets its lines' descriptors, and the shared
#: region's, in one message (see aiovec._worker.main).
MAX_WORKER_LINES: Final = 126

#: A line's token frame: the receiving thread queued commands for the env.
TOKEN: Final = HEADER.pack(0)


def open_lines(count: int) -> tuple[list[socket.socket], list[list[int]]]:
    """``count`` lines: the agent's sending ends, and for each line the descriptors the
    worker needs (its receiving end, and a sending end of the worker's own, for tokens).
    The caller closes the worker's receiving ends once it has passed them on.

    None at all (two empty lists) when this process is short of descriptors: lines only
    save a wake-up."""
    agent_ends: list[socket.socket] = []
    worker_fds: list[list[int]] = []
    if count and _free_fds() < 2 * count + SPARE_FDS:
        return agent_ends, worker_fds
    try:
        with no_interrupt():  # each raw descriptor is kept before a Ctrl-C lands
            for _ in range(count):
                sending, receiving = socket.socketpair()
                agent_ends.append(sending)
                worker_fds.append([receiving.detach(), sending.fileno()])
    except BaseException as exc:
        for end in agent_ends:
            end.close()
        for receiving_fd, _ in worker_fds:
            socket.close(receiving_fd)
        if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
            return [], []  # out of descriptors after all: no lines
        raise
    return agent_ends, worker_fds


def _free_fds() -> int:
    """How many more descriptors this process may open (a large number where that
    cannot be known)."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        in_use = len(os.listdir("/proc/self/fd"))
    except (OSError, ValueError, AttributeError):
        return 1 << 30
    return (1 << 30) if soft == resource.RLIM_INFINITY else soft - in_use
