"""Sections that a Ctrl-C must not cut: it is raised once they are done.

Python runs a SIGINT handler between bytecodes, so a ``KeyboardInterrupt`` can land
right after a call that returned a raw descriptor (a pidfd, a memfd) and before the
code that keeps it: the descriptor is then lost, open, for the life of the process.
"""

from __future__ import annotations

import signal
import threading
from typing import Any


class no_interrupt:
    """Defers Ctrl-C to the end of the block, so that an interrupt never lands between
    a call that creates something (a zygote's answer, a descriptor) and the code that
    keeps it. A SIGINT may be delivered to any thread of the agent (Ray's, a user's),
    but its handler runs in the main thread: while the main thread is in the block, the
    handler in place only notes it; the interrupt is raised again at the end. A block
    in another thread is never interrupted (nothing is raised there)."""

    def __enter__(self) -> None:
        self._previous: Any = None
        self._interrupted = False
        if threading.current_thread() is threading.main_thread():
            previous = signal.getsignal(signal.SIGINT)
            if callable(previous):  # not SIG_IGN, nor SIG_DFL (which raises nothing)
                self._previous = previous
                signal.signal(signal.SIGINT, self._note)

    def _note(self, signum: int, frame: Any) -> None:
        self._interrupted = True

    def __exit__(self, *exc_info: Any) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            if self._interrupted:  # delivered again, to the handler now in place
                signal.raise_signal(signal.SIGINT)
