"""The worker side: where envs live and are stepped.

A worker is whatever hosts envs for the agent: a subprocess (:mod:`.main`, started by
:mod:`.zygote`), a Ray actor, or the agent's own process for the inline and coroutine
backends. :mod:`.host` runs commands on single envs, :mod:`.blocks` on batched envs,
:mod:`.async_server` awaits async envs (and, through :mod:`.threads`, blocking envs
that mostly wait in a Ray actor), :mod:`.thread_server` steps a worker process's
blocking envs that mostly wait a thread each, and :mod:`.thread_clock` tells waiting
envs from computing ones. Nothing here
imports the agent side (``vector_env``, the scheduler, the backends); it speaks to it
through :mod:`aiovec._transport`.
"""

_hosting_for_another_process = False


def mark_worker_process() -> None:
    """Record that this process hosts envs for an agent in another process (a worker
    subprocess, a Ray actor): see :func:`in_worker_process`."""
    global _hosting_for_another_process
    _hosting_for_another_process = True


def in_worker_process() -> bool:
    """Whether this process is one of aiovec's workers (a subprocess or a Ray actor), not
    the agent's: process-wide settings an env may take for itself (its number of torch
    threads) are its own here, and the learner's in the agent's process."""
    return _hosting_for_another_process
