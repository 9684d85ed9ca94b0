"""Anonymous shared memory: one region per vector env, carved into numpy arrays.

The region is a file descriptor with no name in ``/dev/shm`` (``memfd_create`` on
Linux, an unlinked temporary file elsewhere), so it disappears when the last process
holding it exits -- even when the parent is killed with SIGKILL. Nothing can leak.
"""

from __future__ import annotations

import mmap
import os
import tempfile
from collections.abc import Callable

import numpy as np

from aiovec._interrupts import no_interrupt

_ALIGNMENT = 64  # one cache line: rows written by different workers never share one


def _align(offset: int) -> int:
    return (offset + _ALIGNMENT - 1) // _ALIGNMENT * _ALIGNMENT


class ArrayAllocator:
    """Hands out consecutive, aligned numpy arrays from one flat byte buffer.

    With ``buffer=None`` it only measures: it returns empty placeholders while ``nbytes``
    grows, so a layout can be sized before the region exists. The same sequence of requests
    against a real buffer yields the same offsets in every process.
    """

    def __init__(self, buffer: mmap.mmap | None = None) -> None:
        self._buffer = buffer
        self.nbytes = 0

    def __call__(self, shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
        dtype = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        offset = _align(self.nbytes)
        self.nbytes = offset + count * dtype.itemsize
        if self._buffer is None:
            return np.empty((0,), dtype=dtype)
        return np.frombuffer(self._buffer, dtype=dtype, count=count, offset=offset).reshape(shape)


class SharedRegion:
    """A zero-filled anonymous shared mapping of ``size`` bytes backed by a file descriptor."""

    def __init__(self, size: int, fd: int | None = None) -> None:
        size = max(size, 1)
        self.fd = -1  # until the region is whole (see __del__)
        with no_interrupt():  # a Ctrl-C never lands between the descriptor and its owner
            created = fd is None
            if fd is None:
                fd = _anonymous_fd()
            try:
                if created:
                    os.ftruncate(fd, size)
                self.buffer = mmap.mmap(fd, size)
            except BaseException:
                if created:
                    os.close(fd)
                raise
            self.fd = fd
        self.size = size

    def allocator(self) -> Callable[..., np.ndarray]:
        """An allocator carving arrays from this region, starting at offset 0."""
        return ArrayAllocator(self.buffer)

    def close(self) -> None:
        """Unmap and close the descriptor; arrays created from it must no longer be used."""
        if self.fd < 0:
            return
        try:
            self.buffer.close()
        except BufferError:
            # Some numpy view is still alive (a user kept a zero-copy observation);
            # the mapping is freed when that view is garbage collected.
            pass
        os.close(self.fd)
        self.fd = -1

    def __del__(self) -> None:
        # A region dropped unclosed (a Ctrl-C before its owner kept it) keeps no descriptor.
        if getattr(self, "fd", -1) >= 0:
            try:
                os.close(self.fd)
            except Exception:  # at interpreter exit, after os is torn down: the OS closes it
                pass
            self.fd = -1


def _anonymous_fd() -> int:
    if hasattr(os, "memfd_create"):
        return os.memfd_create("aiovec", os.MFD_CLOEXEC)
    # macOS and others: a temporary file that is unlinked at once has no name either.
    with tempfile.TemporaryFile(prefix="aiovec-") as handle:
        return os.dup(handle.fileno())
