"""Requests for a model whose first load is under way wait for it (as scripts written for TF Serving expect),
within their deadline and ``--wait_for_model_load_seconds``: one future per model, shared by its waiting requests."""

from __future__ import annotations

import asyncio
import contextlib

from workbench.core.errors import Code, ServingError
from workbench.models.manager import Manager


class FirstLoadWaits:
    """What waits for first loads, on the server's event loop."""

    def __init__(self, manager: Manager, first_load_wait: float) -> None:
        self._manager = manager
        self.first_load_wait = first_load_wait  # seconds (0: do not wait)
        # Per model whose first load is under way: the future its waiting requests share (one manager callback).
        self._first_loads: dict[str, asyncio.Future[None]] = {}

    async def wait(self, name: str, timeout: float | None) -> None:
        """Return once ``name``'s first load is over, or raise once ``timeout`` (the request's deadline) or
        :attr:`first_load_wait` passes."""
        if self.first_load_wait <= 0:  # told not to wait: answered as the model stands (NOT_FOUND while loading)
            return
        loop = asyncio.get_running_loop()
        over = self._first_loads.get(name)
        if over is None:
            over = self._first_loads[name] = loop.create_future()

            def settled() -> None:  # from a load thread, under the manager's lock
                with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits any more
                    loop.call_soon_threadsafe(self._over, name, over)

            if not self._manager.when_first_loaded(name, settled):
                self._over(name, over)
        bound = self.first_load_wait if timeout is None else min(timeout, self.first_load_wait)
        if over.done():
            return
        try:
            await asyncio.wait_for(asyncio.shield(over), bound)
        except asyncio.TimeoutError:
            if timeout is not None and timeout <= self.first_load_wait:
                raise ServingError(
                    Code.DEADLINE_EXCEEDED, f"Model {name} is still loading: the request's deadline passed first"
                ) from None
            raise ServingError(
                Code.UNAVAILABLE,
                f"Model {name} is still loading after {self.first_load_wait:g}s (--wait_for_model_load_seconds)",
            ) from None

    def _over(self, name: str, over: asyncio.Future[None]) -> None:
        if self._first_loads.get(name) is over:
            del self._first_loads[name]
        if not over.done():
            over.set_result(None)
