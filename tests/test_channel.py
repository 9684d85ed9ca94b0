"""The frame channel between the agent and a worker."""

from __future__ import annotations

import os
import socket
import sys
import textwrap
import threading
import time

import pytest

from aiovec._transport.channel import Channel
from tests.helpers import run_python, voluntary_switches


def test_a_non_blocking_socket_with_a_full_buffer_still_sends_whole_frames():
    # An event loop watching a socket makes it non-blocking; frames bigger than the
    # socket buffer must then wait for room, not fail half-sent.
    left, right = socket.socketpair()
    left.setblocking(False)
    sender, receiver = Channel(left), Channel(right)
    frames = [bytes([i]) * (3 << 20) for i in range(3)]  # far beyond the socket buffer
    received: list[bytes] = []

    def read_slowly() -> None:
        for _ in frames:
            time.sleep(0.05)
            received.append(receiver.receive())

    reader = threading.Thread(target=read_slowly)
    reader.start()
    for frame in frames:
        sender.send(frame)
    reader.join(timeout=30)
    assert received == frames
    left.close()
    right.close()


# --- large frames both ways at once ----------------------------------------------------------

BIG = 4 * 2**20


def _big_info_env(index: int):
    from tests.envs import CounterEnv

    class BigInfoEnv(CounterEnv):
        def step(self, action):
            observation, reward, terminated, truncated, info = super().step(action)
            info["blob"] = b"i" * BIG
            return observation, reward, terminated, truncated, info

    return BigInfoEnv(index)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("concurrent_envs", [False, True])
async def test_large_frames_both_ways_at_once_do_not_deadlock(concurrent_envs):
    """A 4 MB step reply and a 4 MB set_attr cross in the same worker's channel: both
    ends keep reading while they wait to write, so both arrive."""
    import asyncio
    from functools import partial

    import aiovec

    env_fns = [partial(_big_info_env, i) for i in range(2)]
    async with aiovec.VecEnv(env_fns, num_workers=1, concurrent_envs=concurrent_envs) as venv:
        await venv.areset()
        for _ in range(3):
            venv.send([0, 0])
            await asyncio.wait_for(venv.aset_attr("payload", b"s" * BIG), 30)
            assert await venv.acall("payload") == (b"s" * BIG,) * 2
            batch = await asyncio.wait_for(venv.recv(min_envs=2), 30)
            assert [len(blob) for blob in batch.infos["blob"]] == [BIG, BIG]
        venv.send([0, 0])
        venv.set_attr("payload", b"t" * BIG)  # the synchronous path too
        batch = await asyncio.wait_for(venv.recv(min_envs=2), 30)
        assert len(batch.infos["blob"][1]) == BIG


@pytest.mark.timeout(60)
async def test_a_large_frame_to_a_worker_that_does_not_read_never_blocks_the_agent():
    """A 4 MB set_attr to a worker whose env is busy for a while: the agent's loop keeps
    running (other tasks, and the step timeout that kills the hung worker)."""
    import asyncio
    from functools import partial

    import aiovec
    from tests.envs import CounterEnv
    from tests.helpers import Heartbeat

    env_fns = [partial(CounterEnv, 0, delay=2.0)]
    async with aiovec.VecEnv(env_fns, backend="process") as venv:
        await venv.areset()
        heartbeat = Heartbeat(0.01)
        venv.send([0])
        await asyncio.sleep(0.05)
        setting = asyncio.ensure_future(venv.aset_attr("payload", b"x" * BIG))
        await asyncio.sleep(0.5)
        assert heartbeat.beats >= 10  # the loop was not blocked by the send
        await asyncio.wait_for(setting, 30)
        assert (await asyncio.wait_for(venv.recv(), 30)).env_ids.tolist() == [0]
        assert await venv.acall("payload") == (b"x" * BIG,)
        heartbeat.stop()


# --- a blocked receive is woken by input alone ------------------------------------------------


def _blocked(native_id: int) -> bool:
    with open(f"/proc/self/task/{native_id}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "S"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc task counters")
@pytest.mark.timeout(30)
def test_a_blocked_receive_is_not_woken_when_the_other_end_reads_what_this_end_sent():
    # Linux wakes a thread blocked in recv() on a stream socket whenever the other end
    # reads what this end sent (room to write again); a worker waiting for its next
    # command was woken once for every reply the agent read, a context switch for nothing.
    mine, theirs = socket.socketpair()
    channel, other = Channel(mine), Channel(theirs)
    started = threading.Event()
    native_id: list[int] = []
    received: list[bytes] = []

    def wait_for_a_frame() -> None:
        native_id.append(threading.get_native_id())
        started.set()
        received.append(channel.receive())

    channel.send(b"hello")  # this end has sent before it waits, as a worker has
    assert other.receive() == b"hello"
    waiter = threading.Thread(target=wait_for_a_frame)
    waiter.start()
    started.wait()
    (thread,) = native_id
    deadline = time.monotonic() + 10
    while not _blocked(thread) and time.monotonic() < deadline:
        time.sleep(0.001)
    before = voluntary_switches(os.getpid(), thread)
    for index in range(50):  # replies the other end reads while this end waits
        channel.send_frames([bytes([index]) * 100])
        assert other.receive() == bytes([index]) * 100
        time.sleep(0.002)  # a woken waiter would have run by now
    woken = voluntary_switches(os.getpid(), thread) - before
    other.send(b"command")
    waiter.join(timeout=10)
    assert received == [b"command"]
    assert woken <= 2, f"the waiting thread was woken {woken} times by the other end's reads"
    mine.close()
    theirs.close()


def test_a_closed_channel_that_has_sent_refuses_to_receive_at_once():
    # Closed here, even after its descriptor number was given to something else: an
    # OSError at once, never a wait on whatever now holds that number.
    mine, theirs = socket.socketpair()
    channel = Channel(mine)
    channel.send(b"hello")
    channel.close()
    reused_read, reused_write = os.pipe()  # likely takes the number the socket had
    try:
        started = time.monotonic()
        with pytest.raises(OSError):
            channel.receive()
        assert time.monotonic() - started < 1
    finally:
        os.close(reused_read)
        os.close(reused_write)
        theirs.close()


@pytest.mark.timeout(30)
def test_two_threads_may_wait_on_one_channel_that_has_sent():
    mine, theirs = socket.socketpair()
    channel, other = Channel(mine), Channel(theirs)
    channel.send(b"hello")
    received: list[bytes] = []
    errors: list[BaseException] = []

    def wait_for_a_frame() -> None:
        try:
            received.append(channel.receive())
        except BaseException as exc:
            errors.append(exc)

    waiters = [threading.Thread(target=wait_for_a_frame) for _ in range(2)]
    for waiter in waiters:
        waiter.start()
    time.sleep(0.2)  # both wait now
    other.send(b"a")
    time.sleep(0.1)
    other.send(b"b")
    for waiter in waiters:
        waiter.join(timeout=10)
    assert not errors
    assert sorted(received) == [b"a", b"b"]
    mine.close()
    theirs.close()


def test_the_descriptor_limit_is_explained_whichever_descriptor_meets_it():
    """A socket pair refused at the descriptor limit (a worker's channel, many workers),
    inside ``descriptor_limit_explained``, says what to change (it was a bare "Too many
    open files"); other errors pass as they are."""
    result = run_python(
        textwrap.dedent(
            """
        import resource, socket
        from aiovec._transport.channel import channel_pair, descriptor_limit_explained

        resource.setrlimit(resource.RLIMIT_NOFILE, (32, 32))
        held = []
        try:
            while True:
                held.append(socket.socket())
        except OSError:
            pass
        held.pop().close()  # one descriptor free: a pair needs two
        try:
            with descriptor_limit_explained():
                channel_pair()
        except OSError as error:
            print("errno", error.errno, error)
        try:
            with descriptor_limit_explained():
                open("/nonexistent/file")
        except OSError as error:
            print("other", type(error).__name__)
        """
        )
    )
    assert result.returncode == 0, result.stderr
    assert "errno 24" in result.stdout and "ulimit -n" in result.stdout, result.stdout
    assert "other FileNotFoundError" in result.stdout


def test_receive_ready_returns_whole_frames_however_the_bytes_arrive():
    """Frames split across reads, several in one read, a frame larger than one read:
    each comes back whole, once, in order, and the end of the stream is noticed."""
    left, right = socket.socketpair()
    receiver = Channel(right)
    frames = [b"a" * 10, b"", b"b" * 3, b"c" * 200_000, b"d"]
    wire = b"".join(len(frame).to_bytes(4, "little") + frame for frame in frames)
    received: list[bytes] = []
    # pieces cut across headers and bodies: 0..3 bytes of a header, then the rest
    for start, end in [(0, 2), (2, 9), (9, 40), (40, len(wire) - 1), (len(wire) - 1, None)]:
        left.sendall(wire[start:end])
        deadline = time.monotonic() + 10
        expected = sum(1 for _ in _whole_frames(wire[: end or len(wire)]))
        while len(received) < expected and time.monotonic() < deadline:
            received += receiver.receive_ready()
        assert receiver.receive_ready() == []
    assert received == frames
    left.close()
    deadline = time.monotonic() + 10
    while not receiver.eof and time.monotonic() < deadline:
        assert receiver.receive_ready() == []
    assert receiver.eof
    right.close()


def _whole_frames(data: bytes):
    start = 0
    while len(data) - start >= 4:
        end = start + 4 + int.from_bytes(data[start : start + 4], "little")
        if end > len(data):
            return
        yield data[start + 4 : end]
        start = end
