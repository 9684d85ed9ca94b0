"""Length-prefixed frames over a stream socket: the one pipe between the agent and a worker.

Each frame is sent with a single ``sendall``; a reader fetches everything available
with as few ``recv`` calls as possible. Unlike ``multiprocessing.Connection`` there is
no selector built per poll and no second syscall per message.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import select
import socket
import struct
import time
from collections.abc import Iterator
from multiprocessing.reduction import recvfds, sendfds
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aiovec._transport.spin import SpinPolicy

HEADER = struct.Struct("<I")
_CHUNK = 1 << 16
#: Descriptors one message can pass (the kernel's SCM_MAX_FD).
MAX_FDS = 253


class Channel:
    """One end of a socket pair carrying frames (``bytes``) both ways."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.eof = False  # the other end closed (or died); no more frames will come
        self._pending = bytearray()  # read, not yet returned as frames
        self._outgoing = bytearray()  # to send, once the socket has room (send_soon)
        self._has_sent = False  # see _receive_blocking

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, frame: bytes, timeout: float | None = None) -> None:
        """Send one frame, whole (blocking or not, the socket never gets half a frame).

        While the socket buffer is full, what the other end sends meanwhile is read into
        this channel's buffer (see :attr:`buffered`): two ends sending large frames to
        each other at once never wait on each other.

        Raises:
            TimeoutError: ``timeout`` seconds passed before the frame could be sent
                (the other end does not read); part of it may have been sent.
            OSError: the other end is gone.
        """
        self._has_sent = True
        data = memoryview(bytes(self._outgoing) + HEADER.pack(len(frame)) + frame)
        self._outgoing.clear()  # what send_soon left waiting goes first
        sock = self.sock
        deadline = None if timeout is None else time.monotonic() + timeout
        while data:
            try:
                data = data[sock.send(data, socket.MSG_DONTWAIT) :]
                continue
            except (BlockingIOError, InterruptedError):
                pass
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError("the other end of the channel does not read")
            watched = () if self.eof else (sock,)
            readable, _, _ = select.select(watched, (sock,), (), remaining)
            if readable:
                self._read_available()

    def send_frames(self, frames: list[bytes]) -> None:
        """Send ``frames`` whole, with one blocking ``sendall``, never reading.

        For a thread that writes while another one blocks in :meth:`receive` (which
        :meth:`send` would race for the read-ahead buffer): callers must never send
        concurrently, and the other end must keep reading, or this blocks.

        Raises:
            OSError: the other end is gone.
        """
        self._has_sent = True
        if len(frames) == 1:
            (frame,) = frames
            self.sock.sendall(HEADER.pack(len(frame)) + frame)
            return
        pieces = [piece for frame in frames for piece in (HEADER.pack(len(frame)), frame)]
        self.sock.sendall(b"".join(pieces))

    def send_soon(self, frame: bytes) -> bool:
        """Send ``frame`` without ever blocking: what the socket cannot take now waits
        in this channel, in order, until :meth:`flush` (call it when the socket is
        writable). Returns whether everything was sent.

        Raises:
            OSError: the other end is gone.
        """
        self._has_sent = True
        data = HEADER.pack(len(frame)) + frame
        if self._outgoing:
            self._outgoing += data
            return self.flush()
        try:
            sent = self.sock.send(data, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            sent = 0
        if sent < len(data):
            self._outgoing += memoryview(data)[sent:]
            return False
        return True

    def flush(self) -> bool:
        """Send what :meth:`send_soon` left waiting, as far as the socket takes it now;
        whether nothing waits any more."""
        outgoing = self._outgoing
        while outgoing:
            try:
                sent = self.sock.send(outgoing, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return False
            del outgoing[:sent]
        return True

    @property
    def unsent(self) -> bool:
        """Whether bytes wait for room in the socket (see :meth:`send_soon`)."""
        return bool(self._outgoing)

    @property
    def buffered(self) -> bool:
        """Whether bytes were read ahead (by :meth:`send`) that :meth:`receive_ready`
        will return: the socket may no longer look readable to a selector."""
        return bool(self._pending)

    def receive(self, spin: SpinPolicy | None = None) -> bytes:
        """Block until the next frame arrives, first polling for as long as ``spin``
        allows (see :class:`~aiovec._transport.spin.SpinPolicy`: only while polling pays).

        Raises:
            EOFError: the other end closed before a whole frame arrived.
        """
        while True:
            if self._pending:
                frame = self._next_frame()
                if frame is not None:
                    return frame
            if spin is None:
                chunk = self._receive_blocking()
            else:
                seconds = spin.begin()
                polled = self._poll(seconds) if seconds else None
                chunk = self._receive_blocking() if polled is None else polled
                spin.end()
            if not chunk:
                self.eof = True
                raise EOFError("the other end of the channel closed")
            if not self._pending and len(chunk) >= HEADER.size:  # one whole frame: the usual
                (size,) = HEADER.unpack_from(chunk)
                if len(chunk) == HEADER.size + size:
                    return chunk[HEADER.size :]
            self._pending += chunk

    def _poll(self, seconds: float) -> bytes | None:
        deadline = time.perf_counter() + seconds
        recv = self.sock.recv
        while time.perf_counter() < deadline:
            try:
                return recv(_CHUNK, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                continue
        return None

    def _receive_blocking(self) -> bytes:
        """The next bytes the socket holds, waiting for them.

        Once this end has sent, a blocking socket is waited on in ``poll()``, not in
        ``recv()``: Linux wakes a thread blocked in ``recv()`` on a stream socket each
        time the other end reads what this end sent (there is room to write again), which
        ``recv()`` cannot tell from input, so a worker waiting for its next command was
        woken for every reply the agent read (measured: ~2,000 context switches a second
        in the receiving thread of a threaded worker, 16 envs first-ready; 1.65 against
        0.9 voluntary switches per step of a worker stepping CartPole in turn). ``poll()``
        is woken by input alone. A socket with a timeout waits in ``poll()`` already,
        inside ``recv()``.
        """
        sock = self.sock
        descriptor = sock.fileno()  # -1 once closed: recv() then raises, as it always did
        if self._has_sent and descriptor >= 0 and sock.gettimeout() is None:
            waiting = select.poll()  # one per wait: any number of threads may wait at once
            waiting.register(descriptor, select.POLLIN)
            waiting.poll()
        return sock.recv(_CHUNK)

    def receive_ready(self) -> list[bytes]:
        """Every complete frame that has arrived, without blocking (sets :attr:`eof`)."""
        if not self._pending and not self.eof:
            # The usual case: nothing read ahead, and one read holds whole frames: cut
            # them from what was read, without the buffer (a result's latency).
            chunk = self._read_chunk()
            if len(chunk) < _CHUNK:  # all the socket held (or nothing)
                return self._cut_frames(chunk)
            self._pending += chunk
        self._read_available()
        return self._cut_frames(self._pending)

    def _cut_frames(self, pending: bytes | bytearray) -> list[bytes]:
        """The whole frames at the start of ``pending``; what follows them (part of a
        frame) stays in the buffer."""
        available, start, frames = len(pending), 0, []
        while available - start >= HEADER.size:  # each frame cut out once
            (size,) = HEADER.unpack_from(pending, start)
            end = start + HEADER.size + size
            if end > available:
                break
            frames.append(bytes(pending[start + HEADER.size : end]))
            start = end
        if pending is self._pending:
            if start:
                del pending[:start]
        elif start < available:
            self._pending += pending[start:]
        return frames

    def _read_chunk(self) -> bytes:
        """What the socket holds now, up to a chunk, without blocking (``b""``: nothing,
        or the end: then :attr:`eof` is set)."""
        try:
            chunk = self.sock.recv(_CHUNK, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return b""
        except OSError:
            chunk = b""
        if not chunk:
            self.eof = True
        return chunk

    def _read_available(self) -> None:
        """Move what the socket holds into the buffer, without blocking."""
        while not self.eof:
            chunk = self._read_chunk()
            self._pending += chunk
            if len(chunk) < _CHUNK:  # all the socket held, nothing, or the end
                break

    def _next_frame(self) -> bytes | None:
        pending = self._pending
        if len(pending) < HEADER.size:
            return None
        (size,) = HEADER.unpack_from(pending)
        end = HEADER.size + size
        if len(pending) < end:
            return None
        frame = bytes(pending[HEADER.size : end])
        del pending[:end]
        return frame

    def send_fds(self, fds: list[int]) -> None:
        """Pass descriptors to the other process (``SCM_RIGHTS``; at most
        :data:`MAX_FDS`); the receiver takes them with one :meth:`receive_fds`, before
        reading any frame sent after."""
        self._has_sent = True
        sendfds(self.sock, fds)

    def receive_fds(self, limit: int = 0) -> list[int]:
        """The descriptors of one :meth:`send_fds` (at most ``limit``, default
        :data:`MAX_FDS`); call with no frame pending.

        Raises:
            EOFError: the other end closed.
            FrameInsteadOfDescriptors: it sent a frame instead (its ``Close``: it will not
                hand them over).
        """
        assert not self._pending, "a descriptor must not be interleaved with read-ahead frames"
        try:
            fds = list(recvfds(self.sock, limit or MAX_FDS))
        except RuntimeError as exc:  # bytes without descriptors
            raise FrameInsteadOfDescriptors(f"no descriptors came: {exc}") from None
        for fd in fds:  # ours alone: never inherited by a program this process starts
            os.set_inheritable(fd, False)
        return fds

    def close(self) -> None:
        self.sock.close()


class FrameInsteadOfDescriptors(EOFError):
    """A frame came where descriptors were expected: the other end sent its ``Close``
    rather than hand them over (it is closing; it is not gone)."""


def channel_pair() -> tuple[Channel, socket.socket]:
    """A channel for this process and the socket to hand to the worker process."""
    parent, child = socket.socketpair()
    return Channel(parent), child


@contextlib.contextmanager
def descriptor_limit_explained() -> Iterator[None]:
    """Turn an ``OSError`` of this process's descriptor limit (``EMFILE``), whichever
    descriptor met it (a socket, a pipe, a mapping, a pidfd), into one saying what to do."""
    try:
        yield
    except OSError as exc:
        if exc.errno == errno.EMFILE and "ulimit" not in str(exc):
            raise out_of_descriptors() from exc
        raise


def out_of_descriptors() -> OSError:
    """The error for this process at its limit of open descriptors, saying what to do."""
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return OSError(
        errno.EMFILE,
        f"too many open files: this process is at its limit of {limit} descriptors "
        "(each worker takes a few); raise it (ulimit -n, resource.setrlimit) or "
        "start fewer workers (num_workers=)",
    )
