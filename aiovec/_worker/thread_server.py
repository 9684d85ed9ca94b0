"""Serves blocking envs that mostly wait, a thread each, without an event loop.

A worker's receiving thread hands each env its part of a command through that env's
queue; the env's own thread runs it on the host (which writes the results to shared
memory) and sends the reply itself.

Why not an event loop (:class:`~aiovec._worker.async_server.AsyncEnvServer` driving
:class:`~aiovec._worker.threads.EnvThreads`): there a step crosses threads twice (loop -> env
thread -> loop, the way back through the loop's self-pipe) and passes through a task, a
future and a flush callback before its reply leaves. Here a step wakes one thread less
and runs no loop machinery. Measured with 16 envs sleeping 2 ms on average, 2 workers
on 2 cores, first-ready one env at a time: worker CPU per env-step 163 -> 126 us, 0.62
-> 0.71 of the ideal rate (medians of 5 interleaved runs). What is left is mostly the
wake-ups themselves (a receive, a hand-off, the env's sleep), not Python.
"""

from __future__ import annotations

import queue
import socket
import threading
from collections import deque
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, NamedTuple, Union, cast

from aiovec._transport.channel import Channel
from aiovec._transport.lines import TOKEN
from aiovec._transport.protocol import (
    EnvCommand,
    Reply,
    Step,
    decode_command,
    encode_reply,
    expand_command,
    merge_replies,
)
from aiovec._worker.host import EnvHost, StepOutcome

#: An env's part of a command: the command and the env's position in its ``env_ids``.
_Request = tuple[EnvCommand, int]
#: A finished step of one env (its command's seq, its outcome, its observation when
#: observations travel in replies), or a whole reply ready to go.
_Finished = Union[tuple[int, StepOutcome, Any], Reply]


class EnvLine(NamedTuple):
    """An env's line (:mod:`aiovec._transport.lines`) in its worker: the env's thread
    reads ``incoming``; the receiving thread writes a token to ``tokens`` for each
    command it queues for the env."""

    incoming: Channel
    tokens: socket.socket


class ThreadedEnvServer:
    """Executes commands on ``host``'s blocking envs, each env in a thread of its own
    (named ``{name}-{env_id}``); replies go to ``send`` as encoded frames, those that
    are ready together in one call (one write, one wake-up of the agent).

    Guarantees:

    - commands to one env run in the order :meth:`submit` got them; different envs
      overlap;
    - a step is answered env by env as envs finish; the outcomes of envs that finish
      while a reply is being sent travel together in the next reply (of each command);
    - any other command is answered once, when all its envs are done;
    - replies reach ``send`` one at a time, never two concurrently, and each env's
      replies in the order of its commands (a multi-env command other than a step is
      answered when its last env is done, as the event-loop server does);
    - an env's exception (``KeyboardInterrupt`` and ``SystemExit`` included, see
      :func:`~aiovec._worker.host.catch_env_exits`) fails only that env's part (the host
      captures it and applies its restart policy); anything else escaping an env's
      thread (a bug, a ``BaseException`` nothing expects) is kept in :attr:`failure` and
      reported to ``on_failure``, and the threads stop serving.
    """

    def __init__(
        self,
        host: EnvHost,
        send: Callable[[list[bytes]], None],
        on_failure: Callable[[], None] = lambda: None,
        name: str = "aiovec-env",
        lines: dict[int, EnvLine] | None = None,
    ) -> None:
        self.host = host
        self._lines = lines or {}
        # Envs whose line holds a token their thread has not read yet (see _wake).
        self._tokens_unread: set[int] = set()
        self._token_lock = threading.Lock()
        self._send = send
        self._on_failure = on_failure
        #: What ended the server other than an env's own error (see the class docstring).
        self.failure: BaseException | None = None
        self._closed = False
        # Guards the outbox, the sender role and the replies being gathered.
        self._lock = threading.Lock()
        self._outbox: list[_Finished] = []  # finished, not yet sent, in the order finished
        self._sending = False  # a thread is sending the outbox: others leave theirs to it
        self._gathering: dict[int, list[Reply | None]] = {}  # seq -> each env's part
        self._queues: dict[int, queue.SimpleQueue[_Request | None]] = {}
        self._threads: list[threading.Thread] = []
        for env_id in host.envs:
            requests = self._queues[env_id] = queue.SimpleQueue()
            thread = threading.Thread(
                target=self._serve_env,
                args=(env_id, requests),
                name=f"{name}-{env_id}",
                daemon=True,  # an env blocked forever cannot keep the process alive
            )
            thread.start()
            self._threads.append(thread)

    def submit(self, command: EnvCommand) -> None:
        """Queue each env's part of ``command`` in that env's thread (call from one
        thread only: the order of calls is the order commands run in)."""
        if type(command) is not Step:
            with self._lock:
                self._gathering[command.seq] = [None] * len(command.env_ids)
        queues, lines = self._queues, self._lines
        for position, env_id in enumerate(command.env_ids):
            queues[env_id].put((command, position))
            if lines:  # the env's thread waits on its line: tell it where to look
                self._wake(env_id)

    def answer(self, reply: Reply) -> None:
        """Send ``reply`` (one the caller made itself, e.g. for an undecodable command)
        in turn with the envs' replies."""
        self._post(reply)

    def shutdown(self) -> None:
        """Stop every thread once its current call returns; what is still queued is
        dropped unanswered (the agent closes the worker, or it is gone)."""
        self._closed = True
        for env_id, requests in self._queues.items():
            requests.put(None)
            if env_id in self._lines:
                self._wake(env_id)

    def _wake(self, env_id: int) -> None:
        """Make env ``env_id``'s thread look at its queue: a token on its line, unless
        one is there unread (for each token the thread takes its whole queue, so one
        is enough, and however many commands wait, a line never fills up)."""
        with self._token_lock:
            if env_id in self._tokens_unread:
                return
            self._tokens_unread.add(env_id)
        try:
            self._lines[env_id].tokens.sendall(TOKEN)
        except OSError:  # closed: the env's thread has ended (see _line_requests)
            pass

    def join(self) -> None:
        """Wait until every env's thread has ended (after :meth:`shutdown`): an env is
        then never closed while its own thread is still inside one of its calls. An env
        that never returns keeps this waiting; the agent kills the worker at its
        ``close_timeout``."""
        for thread in self._threads:
            thread.join()

    # --- in the envs' threads ----------------------------------------------------------

    def _serve_env(self, env_id: int, requests: queue.SimpleQueue[_Request | None]) -> None:
        host = self.host
        line = self._lines.get(env_id)
        next_request: Callable[[], _Request | None] = (
            requests.get
            if line is None
            else partial(next, self._line_requests(env_id, line, requests))
        )
        in_replies = host.observations_in_replies
        try:
            while (request := next_request()) is not None and not self._closed:
                command, position = request
                if type(command) is Step:
                    outcome = host.step(env_id, host.action_of(command, position))
                    # Taken now: by the time the reply is built, a later command of this
                    # env could have replaced it.
                    observation = host.observations_of([env_id]) if in_replies else None
                    self._post((command.seq, outcome, observation))
                else:
                    self._part_done(command, position, host.execute(command.subset([position])))
        except BaseException as exc:  # not an env's error (the host captures those)
            self._fail(exc)

    def _line_requests(
        self, env_id: int, line: EnvLine, requests: queue.SimpleQueue[_Request | None]
    ) -> Iterator[_Request | None]:
        """The env's commands in the order the agent sent them, from its line (steps)
        and its queue (the rest, handed over by the receiving thread); ``None`` once
        the server shuts down or the line is gone.

        The two are merged by sequence number. A step on the line is there before any
        later command reaches the queue (the agent sends them in order, each send
        whole), so reading all the line holds after taking the queue, and before
        choosing, never runs a queued command ahead of an earlier step.
        """
        group, incoming = self.host.group, line.incoming
        steps: deque[Step] = deque()  # read from the line, not yet run
        queued: deque[_Request | None] = deque()  # taken from the queue, not yet run
        while True:
            if not steps and not queued and requests.empty():  # nothing else to run: the
                try:  # next frame on the line, a step (the usual) run as soon as read
                    frame = incoming.receive()
                except (EOFError, OSError):
                    yield None
                    return
                if frame:
                    yield cast(Step, expand_command(decode_command(frame), group)), 0
                    continue
                self._token_read(env_id)
            taken = False  # checked with empty(): raising queue.Empty costs more, each step
            while not requests.empty():  # this thread alone takes from it
                queued.append(requests.get_nowait())
                taken = True
            frames: list[bytes] = []
            if taken:  # the line after the queue: any step sent before what was just
                try:  # taken from the queue is on the line now
                    frames = incoming.receive_ready()
                except OSError:
                    pass
            if not frames and not steps and not queued:
                if incoming.eof:
                    yield None
                    return
                try:  # wait for the next step or token
                    frames = [incoming.receive()]
                except (EOFError, OSError):
                    yield None
                    return
            for frame in frames:
                if frame:
                    steps.append(cast(Step, expand_command(decode_command(frame), group)))
                else:
                    self._token_read(env_id)
            if queued and queued[0] is None:
                yield None  # shut down: what is left is dropped
                return
            if steps and (not queued or steps[0].seq < queued[0][0].seq):  # type: ignore[index]
                yield steps.popleft(), 0  # a step of this env alone
            elif queued:
                yield queued.popleft()

    def _token_read(self, env_id: int) -> None:
        """Env ``env_id``'s thread read the token on its line: the next command queued
        for it finds none unread, and sends one (see :meth:`_wake`)."""
        with self._token_lock:
            self._tokens_unread.discard(env_id)

    def _part_done(self, command: EnvCommand, position: int, reply: Reply) -> None:
        """Env ``position`` of ``command`` is done: the last one sends the whole reply."""
        with self._lock:
            parts = self._gathering[command.seq]
            parts[position] = reply
            if any(part is None for part in parts):
                return
            del self._gathering[command.seq]
        self._post(merge_replies(parts))  # type: ignore[arg-type]  # none is None now

    def _post(self, finished: _Finished) -> None:
        """Queue ``finished`` for sending; send it (and whatever else is queued) unless
        another thread is sending already, which then sends it too."""
        with self._lock:
            if self._sending:
                self._outbox.append(finished)
                return
            self._sending = True
            alone = not self._outbox and self.failure is None
            if not alone:
                self._outbox.append(finished)
        if alone:  # the usual: nothing else waits, so nothing to merge
            if isinstance(finished, Reply):
                reply = finished
            else:  # one env's step
                seq, outcome, observation = finished
                reply = self._step_reply(seq, [(outcome, observation)])
            try:
                self._send([encode_reply(reply, self.host.group)])
            except OSError:  # the agent is gone: keep the role (see _send_outbox)
                with self._lock:
                    self._outbox.clear()
                return
            with self._lock:
                if not self._outbox:  # nothing posted meanwhile: give up the role
                    self._sending = False
                    return
        self._send_outbox()

    def _send_outbox(self) -> None:
        """As the sender: send the outbox until it is found empty, then give up the role
        (under the lock, so that nothing posted meanwhile is left behind)."""
        group = self.host.group
        while True:
            with self._lock:
                finished, self._outbox = self._outbox, []
                if not finished or self.failure is not None:
                    self._sending = False
                    return
            frames = [encode_reply(reply, group) for reply in self._replies(finished)]
            try:
                self._send(frames)
            except OSError:  # the agent is gone: the receiving thread sees the end
                with self._lock:
                    self._outbox.clear()  # nobody will read them; keep the role, so
                return  # later posts are dropped rather than sent to a closed socket

    def _replies(self, finished: list[_Finished]) -> list[Reply]:
        """The replies for ``finished``, in order: the step outcomes of one command
        merged into one reply, but never two outcomes of one env in a run of merged
        replies, so that each env's replies keep the order of its commands."""
        if len(finished) == 1 and type(finished[0]) is tuple:  # one env's step: the usual
            seq, outcome, observation = finished[0]
            return [self._step_reply(seq, [(outcome, observation)])]
        replies: list[Reply] = []
        steps: dict[int, list[tuple[StepOutcome, Any]]] = {}  # seq -> its outcomes
        in_steps: set[int] = set()  # the envs in ``steps``

        def flush_steps() -> None:
            for seq, outcomes in steps.items():
                replies.append(self._step_reply(seq, outcomes))
            steps.clear()
            in_steps.clear()

        for item in finished:
            if isinstance(item, Reply):
                flush_steps()
                replies.append(item)
                continue
            seq, outcome, observation = item
            if outcome.env_id in in_steps:
                flush_steps()
            steps.setdefault(seq, []).append((outcome, observation))
            in_steps.add(outcome.env_id)
        flush_steps()
        return replies

    def _step_reply(self, seq: int, outcomes: list[tuple[StepOutcome, Any]]) -> Reply:
        reply = self.host.step_reply(seq, [outcome for outcome, _ in outcomes])
        if reply.observations is not None:  # they travel in replies: the ones taken
            reply.observations = [observation[0] for _, observation in outcomes]
        return reply

    def _fail(self, exc: BaseException) -> None:
        with self._lock:
            if self.failure is None:
                self.failure = exc
        self.shutdown()
        self._on_failure()
