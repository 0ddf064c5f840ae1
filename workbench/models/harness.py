"""A loaded servable as the manager holds it: requests hold it, an unload drains it (TF Serving's LoaderHarness).

Every platform gets the same guarantee this way: a version swap never breaks a request that resolved to the old
version just before it went away, and a model's resources are freed only once no request uses them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from workbench.core.servable import Servable
from workbench.runtime.memory import return_freed_memory


class Harness:
    """Counts the requests holding ``servable``; :meth:`unload` refuses new ones, waits, then closes it.

    It also notes when a request last took it (``last_used``, monotonic: the memory budget evicts the least recently
    used version) and, when ``on_idle`` is set, says when the last request let go (a load waiting for memory may
    evict it now)."""

    __slots__ = ("servable", "_holders", "_unloading", "_lock", "_idle", "last_used", "on_idle")

    def __init__(self, servable: Servable) -> None:
        self.servable = servable
        self._holders = 0
        self._unloading = False
        # Every request takes and lets go of it: ``with`` on the plain lock runs no Python code (a Condition's own
        # __enter__ and notify_all are Python functions), and only an unload ever waits on the Condition.
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self.last_used = time.monotonic()
        self.on_idle: Callable[[], None] | None = None

    @property
    def busy(self) -> bool:
        """Whether a request holds it now."""
        return self._holders > 0

    def acquire(self) -> bool:
        """Hold the servable for one request; False once it is unloading."""
        with self._lock:
            if self._unloading:
                return False
            self._holders += 1
            self.last_used = time.monotonic()
            return True

    def release(self) -> None:
        with self._lock:
            self._holders -= 1
            self.last_used = time.monotonic()  # a long request keeps its version recent until it ends
            idle = self._holders == 0
            if idle and self._unloading:  # set under this lock before unload() waits: it is told
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
