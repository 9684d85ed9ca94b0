"""The worker side: where envs live and are stepped.

A worker is whatever hosts envs for the agent: a subprocess (:mod:`.main`, started by
:mod:`.zygote`), a Ray actor, or the agent's own process for the inline and coroutine
backends. :mod:`.host` runs commands on single envs, :mod:`.blocks` on batched envs,
:mod:`.async_server` awaits async envs (and, through :mod:`.threads`, blocking envs
that mostly wait), and :mod:`.thread_clock` tells the two kinds apart. Nothing here
imports the agent side (``vector_env``, the scheduler, the backends); it speaks to it
through :mod:`aiovec._transport`.
"""
