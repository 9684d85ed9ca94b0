"""Runs commands on async envs, each env as a task of the running event loop.

One implementation for both places async envs live: the coroutine backend (the agent's
own loop) and a subprocess worker (one loop per worker). Commands to one env run in
order; different envs overlap their waits. Step results are answered as envs finish,
gathered into one reply per command per loop iteration, so a thousand envs that wake
together cost one message, not a thousand. Other commands answer once all their envs
are done.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from aiovec._host import EnvHost, StepOutcome
from aiovec._protocol import Command, Reply, Step, merge_replies
from aiovec._spaces import read_row


class AsyncEnvServer:
    """Executes commands on ``host``'s envs; every reply goes to ``emit``.

    ``on_cancelled(env_id)`` is called when :meth:`kill` cancelled a command in flight
    (its env's queue is dropped; the env itself stays and may be rebuilt).
    """

    def __init__(
        self,
        host: EnvHost,
        emit: Callable[[Reply], None],
        on_cancelled: Callable[[int], None] | None = None,
    ) -> None:
        self.host = host
        self._emit = emit
        self._on_cancelled = on_cancelled
        self._queues: dict[int, deque[tuple[Command, int]]] = {e: deque() for e in host.envs}
        self.runners: dict[int, asyncio.Task] = {}
        self._parked: dict[int, asyncio.Future] = {}  # idle runners wait on these
        self._killed: set[int] = set()
        self._gathering: dict[int, list[Reply | None]] = {}  # seq -> per-position replies
        self._finished_steps: dict[int, list[StepOutcome]] = {}  # seq -> not yet emitted
        self._flush_scheduled = False
        #: Runners end instead of parking when idle (a loop that only runs during calls).
        self.park = True

    def submit(self, command: Command, loop: asyncio.AbstractEventLoop) -> None:
        """Queue ``command`` on each of its envs; runners start on ``loop``."""
        if not isinstance(command, Step):
            self._gathering[command.seq] = [None] * len(command.env_ids)
        queues, parked = self._queues, self._parked
        for position, env_id in enumerate(command.env_ids):
            queues[env_id].append((command, position))
            waiting = parked.pop(env_id, None)
            if waiting is not None:
                waiting.set_result(None)  # cheaper than starting a task
            elif env_id not in self.runners:
                self.runners[env_id] = loop.create_task(self._run(env_id, loop))

    def busy(self) -> bool:
        """Whether some env has a command queued or running."""
        return any(self._queues[env_id] for env_id in self.runners)

    def kill(self, env_id: int) -> bool:
        """Cancel env ``env_id``'s command in flight; False when it had none."""
        runner = self.runners.get(env_id)
        if runner is None or not self._queues[env_id]:
            return False
        self._killed.add(env_id)
        runner.cancel()
        return True

    def retire(self) -> list[asyncio.Task]:
        """Cancel every runner (idle ones on a loop being left, or all at shutdown)."""
        if self._finished_steps:  # its flush was scheduled on the loop being left
            self._flush()
        runners = list(self.runners.values())
        for runner in runners:
            runner.cancel()
        self.runners.clear()
        self._parked.clear()
        return runners

    async def _run(self, env_id: int, loop: asyncio.AbstractEventLoop) -> None:
        queue, host = self._queues[env_id], self.host
        try:
            while True:
                while queue:
                    command, position = queue[0]
                    if type(command) is Step:
                        actions = command.actions
                        action = (
                            read_row(host.buffers.actions, env_id)
                            if actions is None
                            else actions[position]
                        )
                        outcome = await host.step_async(env_id, action)
                        queue.popleft()
                        self._step_done(command.seq, outcome, loop)
                    else:
                        reply = await host.execute_async(command.subset([position]))
                        queue.popleft()
                        self._part_done(command, position, reply)
                if not self.park:
                    return
                parked = self._parked[env_id] = loop.create_future()
                await parked
        except asyncio.CancelledError:
            self._parked.pop(env_id, None)
            queue.clear()
            if env_id in self._killed:  # not a loop shutting down: report the lost command
                self._killed.discard(env_id)
                if self._on_cancelled is not None:
                    self._on_cancelled(env_id)
            raise
        finally:
            if self.runners.get(env_id) is asyncio.current_task():
                del self.runners[env_id]

    def _step_done(self, seq: int, outcome: StepOutcome, loop: asyncio.AbstractEventLoop) -> None:
        finished = self._finished_steps.get(seq)
        if finished is None:
            self._finished_steps[seq] = [outcome]
        else:
            finished.append(outcome)
        if not self._flush_scheduled:
            # After the other envs woken in this iteration had their turn.
            self._flush_scheduled = True
            loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        finished, self._finished_steps = self._finished_steps, {}
        for seq, outcomes in finished.items():
            env_ids = [outcome.env_id for outcome in outcomes]
            infos = [outcome.info for outcome in outcomes]
            errors = [outcome.error for outcome in outcomes if outcome.error is not None]
            self._emit(
                Reply(
                    seq=seq,
                    env_ids=env_ids,
                    infos=infos if any(infos) else None,
                    observations=self.host.observations_of(env_ids),
                    errors=errors or None,
                    progressed=any(outcome.progressed for outcome in outcomes),
                )
            )

    def _part_done(self, command: Command, position: int, reply: Reply) -> None:
        parts = self._gathering[command.seq]
        parts[position] = reply
        if all(part is not None for part in parts):
            del self._gathering[command.seq]
            self._emit(merge_replies(parts))
