"""The frame channel between the agent and a worker."""

from __future__ import annotations

import socket
import threading
import time

from aiovec._channel import Channel


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
