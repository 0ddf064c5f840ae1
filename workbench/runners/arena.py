"""A shared-memory area written by one process and read by its peer, carved into blocks on demand.

Each side of a frontend ↔ runner connection owns one arena and is its only allocator: the frontend writes request
tensors into its own, the runner its answers into its own. The peer maps the same memory (the file descriptor of a
``memfd`` passed over the Unix socket, so nothing is named in ``/dev/shm`` and nothing outlives the two processes)
and reads the tensors in place: a batch of requests from several frontends is built from views on their arenas.
The reader says when it is done with a block (the runner by answering the request, the frontend by a free
message), and only then the owner reuses it.

The allocator is first fit over a sorted free list with coalescing: blocks live for one request, so the list stays
short. An arena that is full is no error: the tensor then travels inside the message (:mod:`workbench.runners.wire`).
"""

from __future__ import annotations

import bisect
import mmap
import os

ALIGN = 64  # a cache line: numpy and BLAS read aligned rows faster, and no two blocks share a line


class Arena:
    """``size`` bytes of shared memory: created here (``fd=None``) or mapped from the peer's ``fd``."""

    def __init__(self, size: int, fd: int | None = None, name: str = "workbench-arena") -> None:
        if fd is None:
            fd = os.memfd_create(name, os.MFD_CLOEXEC)
            os.ftruncate(fd, size)  # sparse: pages are backed only once written
        self.fd = fd
        self.size = size
        self._map = mmap.mmap(fd, size)
        self.memory = memoryview(self._map)
        self._free_starts: list[int] = [0]  # sorted offsets of free runs
        self._free_sizes: dict[int, int] = {0: size}
        self._used: dict[int, int] = {}

    def allocate(self, nbytes: int) -> int | None:
        """The offset of a block of at least ``nbytes`` (None: no room)."""
        need = max(ALIGN, -(-nbytes // ALIGN) * ALIGN)
        starts, sizes = self._free_starts, self._free_sizes
        for i, start in enumerate(starts):
            run = sizes[start]
            if run >= need:
                del sizes[start]
                if run == need:
                    del starts[i]
                else:
                    starts[i] = start + need
                    sizes[start + need] = run - need
                self._used[start] = need
                return start
        return None

    def free(self, offset: int) -> None:
        """Give back the block at ``offset`` (merged with free neighbours)."""
        size = self._used.pop(offset)
        starts, sizes = self._free_starts, self._free_sizes
        i = bisect.bisect_left(starts, offset)
        if i < len(starts) and starts[i] == offset + size:  # the run after it
            size += sizes.pop(starts[i])
            del starts[i]
        if i > 0 and starts[i - 1] + sizes[starts[i - 1]] == offset:  # the run before it
            sizes[starts[i - 1]] += size
        else:
            starts.insert(i, offset)
            sizes[offset] = size

    @property
    def used_bytes(self) -> int:
        return sum(self._used.values())

    def close(self) -> None:
        """Unmap it, unless arrays still view it (they keep the mapping alive until they go)."""
        os.close(self.fd)
        try:
            self.memory.release()
            self._map.close()
        except BufferError:
            pass
