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
