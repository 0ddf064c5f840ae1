"""A serving process's long-lived heap, kept out of the cyclic garbage collector's full collections.

A server holds for good what it imported (TensorFlow's Python side alone is over a hundred thousand objects) and
the models it serves. CPython's collector walks all of it in every full collection, and requests in flight
(their objects survive the young collections they span) set one off every few thousand requests: measured on
half_plus_two over REST, 32 clients, seven full collections of about 0.1 s each in six seconds, a fifth of the event
loop's time. ``gc.freeze()`` moves every object alive at that moment out of the collector's sight; objects are
still freed when their last reference goes, only reference cycles among frozen objects wait for the next
:meth:`LongLivedHeap.settle`, which thaws, collects and freezes again. The server settles once its initial
models are loaded and again shortly after each later load or unload, so an unloaded version's cycles are
collected then and nothing is kept for good that was not.
"""

from __future__ import annotations

import gc
import threading


class LongLivedHeap:
    """Freezes the heap (:meth:`settle`) now, or a little later (:meth:`settle_soon`) after a burst of changes."""

    def __init__(self, delay: float = 1.0) -> None:
        self._delay = delay  # a burst of version changes (a config with many models) settles once
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._stopped = False

    def settle(self) -> None:
        """Collect every cycle (the frozen ones too), then freeze what is left. Takes a full collection's time."""
        gc.unfreeze()
        gc.collect()
        gc.freeze()

    def settle_soon(self) -> None:
        """:meth:`settle` on a thread of its own after ``delay`` seconds, once for every call made until then."""
        with self._lock:
            if self._timer is not None or self._stopped:
                return
            self._timer = threading.Timer(self._delay, self._settle_now)
            self._timer.daemon = True  # a process exiting does not wait for it
            self._timer.start()

    def _settle_now(self) -> None:
        with self._lock:
            self._timer = None
            if self._stopped:
                return
        self.settle()

    def stop(self) -> None:
        """No settling any more; a pending one is cancelled."""
        with self._lock:
            self._stopped = True
            timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
