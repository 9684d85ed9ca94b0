"""The scheduler on its own, against a backend that only records commands: per-env
state, the ready-queue, streamed (partial) replies, errors that stand for several envs,
dead and restarted workers. No processes; each test runs in milliseconds."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces

from aiovec._scheduler import BUSY, IDLE, READY, Scheduler
from aiovec._transport.protocol import ErrorInfo, Reply, Step
from aiovec.backends._base import Backend, WorkerEvent, WorkerExit
from aiovec.errors import EnvError, WorkerCrashedError


class RecordingBackend(Backend):
    """Hosts nothing: ``groups`` of env ids, the commands sent, messages fed by the test."""

    def __init__(self, groups: list[list[int]]) -> None:
        self.groups = groups
        self.descriptions = []
        self.sent: list[tuple[int, object]] = []
        self.inbox: list[WorkerEvent] = []
        self.restarted: list[int] = []

    def attach(self, observation_space: spaces.Space, action_space: spaces.Space):
        raise NotImplementedError

    def submit(self, worker: int, command: object) -> None:
        self.sent.append((worker, command))

    def poll(self) -> list[WorkerEvent]:
        messages, self.inbox = self.inbox, []
        return messages

    async def wait(self, timeout: float | None = None) -> list[WorkerEvent]:
        return self.poll()

    def wait_blocking(self, timeout: float | None = None) -> list[WorkerEvent]:
        return self.poll()

    def restart(self, worker: int, reason: str) -> None:
        self.restarted.append(worker)

    def close(self, timeout: float) -> None:
        pass


def make_scheduler(groups=([0, 1], [2, 3]), **options):
    backend = RecordingBackend([list(group) for group in groups])
    return Scheduler(backend, sum(len(g) for g in groups), **options), backend


def step_all(scheduler):
    return scheduler.submit(
        scheduler.all_env_ids, lambda seq, group: Step(seq, group, None), is_step=True
    )


def test_a_step_marks_envs_busy_then_ready_in_the_order_they_finish():
    scheduler, backend = make_scheduler()
    tickets = step_all(scheduler)
    assert [worker for worker, _ in backend.sent] == [0, 1]  # one command per worker
    assert list(scheduler.state) == [BUSY] * 4 and scheduler.num_stepping == 4
    second = tickets[1].command
    scheduler.dispatch([(1, Reply(second.seq, [3, 2]))])  # worker 1 first, its own order
    assert list(scheduler.ready_queue) == [3, 2]
    assert list(scheduler.state) == [BUSY, BUSY, READY, READY]
    assert tickets[1].done and not tickets[0].done
    assert scheduler.take_ready(1) == [3]
    assert scheduler.state[3] == IDLE
    scheduler.give_back([3])
    assert list(scheduler.ready_queue) == [3, 2] and scheduler.state[3] == READY


def test_a_streamed_step_is_answered_in_parts():
    scheduler, _ = make_scheduler(groups=([0, 1, 2],))
    (ticket,) = step_all(scheduler)
    seq = ticket.command.seq
    scheduler.dispatch([(0, Reply(seq, [1]))])
    assert not ticket.done and ticket.unanswered() == 2 and list(scheduler.ready_queue) == [1]
    scheduler.dispatch([(0, Reply(seq, [0, 2]))])
    assert ticket.done and list(scheduler.ready_queue) == [1, 0, 2]
    assert scheduler.num_stepping == 0 and scheduler.num_busy == 0


def test_a_compact_reply_stands_for_the_whole_command():
    scheduler, _ = make_scheduler()
    tickets = step_all(scheduler)
    scheduler.dispatch([(0, Reply(tickets[0].command.seq, []))])  # sent without env ids
    assert tickets[0].done and sorted(scheduler.ready_queue) == [0, 1]


def test_one_error_for_a_block_is_every_row_s_error():
    scheduler, _ = make_scheduler(groups=([0, 1, 2, 3],))
    (ticket,) = step_all(scheduler)
    error = ErrorInfo(2, "step", "RuntimeError", "boom", "", exc_module="builtins", env_ids=[2, 3])
    scheduler.dispatch([(0, Reply(ticket.command.seq, [0, 1, 2, 3], errors=[error]))])
    assert scheduler.errors[2] is scheduler.errors[3]  # one exception, raised once
    assert isinstance(scheduler.errors[2], EnvError) and 0 not in scheduler.errors


def test_a_dead_worker_fails_its_tickets_and_is_remembered():
    scheduler, _ = make_scheduler()
    tickets = step_all(scheduler)
    scheduler.dispatch([(1, WorkerExit(exitcode=-9))])
    # A step's failure goes to its envs, for the recv taking their results (not kept on
    # the ticket: see raise_alone).
    assert tickets[1].done and tickets[1].failure is None
    assert sorted(scheduler.errors) == [2, 3] and sorted(scheduler.ready_queue) == [2, 3]
    assert all(isinstance(scheduler.errors[env_id], WorkerCrashedError) for env_id in (2, 3))
    with pytest.raises(WorkerCrashedError, match="worker 1"):
        scheduler.check_alive([3])
    scheduler.check_alive([0, 1])  # the other worker's envs are fine


def test_a_restarted_worker_is_sent_what_it_still_owed():
    scheduler, backend = make_scheduler(groups=([0, 1, 2],), restart=True, max_restarts=2)
    (ticket,) = step_all(scheduler)
    seq = ticket.command.seq
    scheduler.dispatch([(0, Reply(seq, [1]))])  # one env answered before the crash
    backend.sent.clear()
    scheduler.dispatch([(0, WorkerExit(exitcode=1))])
    assert backend.restarted == [0] and scheduler.worker_restarts == [1]
    ((worker, resent),) = backend.sent
    assert worker == 0 and resent.env_ids == [0, 2]  # only the unanswered envs
    assert not ticket.done
    scheduler.dispatch([(0, Reply(seq, [0, 2]))])
    assert ticket.done and sorted(scheduler.ready_queue) == [0, 1, 2]


def test_a_late_reply_to_a_finished_command_is_ignored():
    scheduler, _ = make_scheduler(groups=([0],))
    (ticket,) = step_all(scheduler)
    seq = ticket.command.seq
    scheduler.dispatch([(0, Reply(seq, [0]))])
    scheduler.take_ready(1)
    scheduler.dispatch([(0, Reply(seq, [0]))])  # e.g. a duplicate after a restart
    assert list(scheduler.ready_queue) == [] and scheduler.state[0] == IDLE


def test_infos_are_kept_until_taken_and_dropped_when_a_later_result_has_none():
    scheduler, _ = make_scheduler(groups=([0, 1],))
    (ticket,) = step_all(scheduler)
    scheduler.dispatch([(0, Reply(ticket.command.seq, [0, 1], infos=[{"a": 1}, None]))])
    assert scheduler.infos == {0: {"a": 1}}
    scheduler.take_ready(2)
    (ticket,) = step_all(scheduler)
    scheduler.dispatch([(0, Reply(ticket.command.seq, [0, 1]))])
    assert scheduler.infos == {}
    assert np.array_equal(scheduler.worker_of, [0, 0])
