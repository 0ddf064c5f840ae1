"""A loaded servable as the manager holds it: requests hold it, an unload drains it (TF Serving's LoaderHarness).

Every platform gets the same guarantee this way: a version swap never breaks a request that resolved to the old
version just before it went away, and a model's resources are freed only once no request uses them.
"""

from __future__ import annotations

import threading

from workbench.engine.servable import Servable


class Harness:
    """Counts the requests holding ``servable``; :meth:`unload` refuses new ones, waits, then closes it."""

    __slots__ = ("servable", "_holders", "_unloading", "_idle")

    def __init__(self, servable: Servable) -> None:
        self.servable = servable
        self._holders = 0
        self._unloading = False
        self._idle = threading.Condition()

    def acquire(self) -> bool:
        """Hold the servable for one request; False once it is unloading."""
        with self._idle:
            if self._unloading:
                return False
            self._holders += 1
            return True

    def release(self) -> None:
        with self._idle:
            self._holders -= 1
            if self._holders == 0:
                self._idle.notify_all()

    def unload(self, drain_timeout: float = 60.0) -> None:
        """Refuse new holders, wait for the current ones (bounded), then close the servable."""
        with self._idle:
            if self._unloading:
                return
            self._unloading = True
            self._idle.wait_for(lambda: self._holders == 0, timeout=drain_timeout)
        self.servable.close()
