"""A loaded servable as the manager holds it: requests hold it, an unload drains it (TF Serving's LoaderHarness).

Every platform gets the same guarantee this way: a version swap never breaks a request that resolved to the old
version just before it went away, and a model's resources are freed only once no request uses them.
"""

from __future__ import annotations

import ctypes
import functools
import threading
import time
from collections.abc import Callable

from workbench.core.servable import Servable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none (macOS, musl)."""
    return getattr(ctypes.CDLL(None), "malloc_trim", None)


def return_freed_memory() -> None:
    """Hand the memory malloc keeps after a servable closes back to the system (``malloc_trim(0)``).

    A closed model's tensors go back to malloc, which keeps them in its arenas; later loads allocate beside them
    rather than in them, so a server that reloads grows (TF Serving's users report it: tensorflow/serving#1664,
    #1346). Measured on 100 load/unload cycles of a TensorFlow model with 16 MiB of weights, with TensorFlow's
    plain CPU allocator (``TF_ENABLE_ONEDNN_OPTS=0``): without this, resident memory ended 90 to 140 MB above where
    it started (up to eight versions' weights kept) and peaked up to 180 MB above; with it, within one or two
    versions' weights. oneDNN's allocator, TensorFlow's default on x86, keeps a freed version's memory in its own
    pool for the next load to reuse: no growth, and nothing here to return. A call takes well under a millisecond,
    once per unload.
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


class Harness:
    """Counts the requests holding ``servable``; :meth:`unload` refuses new ones, waits, then closes it.

    It also notes when a request last took it (``last_used``, monotonic: the memory budget evicts the least recently
    used version) and, when ``on_idle`` is set, says when the last request let go (a load waiting for memory may
    evict it now)."""

    __slots__ = ("servable", "_holders", "_unloading", "_idle", "last_used", "on_idle")

    def __init__(self, servable: Servable) -> None:
        self.servable = servable
        self._holders = 0
        self._unloading = False
        self._idle = threading.Condition()
        self.last_used = time.monotonic()
        self.on_idle: Callable[[], None] | None = None

    @property
    def busy(self) -> bool:
        """Whether a request holds it now."""
        return self._holders > 0

    def acquire(self) -> bool:
        """Hold the servable for one request; False once it is unloading."""
        with self._idle:
            if self._unloading:
                return False
            self._holders += 1
            self.last_used = time.monotonic()
            return True

    def release(self) -> None:
        with self._idle:
            self._holders -= 1
            self.last_used = time.monotonic()  # a long request keeps its version recent until it ends
            idle = self._holders == 0
            if idle:
                self._idle.notify_all()
        if idle and self.on_idle is not None:
            self.on_idle()

    def unload(self, drain_timeout: float = 60.0) -> None:
        """Refuse new holders, wait for the current ones (bounded), then close the servable."""
        with self._idle:
            if self._unloading:
                return
            self._unloading = True
            self._idle.wait_for(lambda: self._holders == 0, timeout=drain_timeout)
        self.servable.close()
        return_freed_memory()
