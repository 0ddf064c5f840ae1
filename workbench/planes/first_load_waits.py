"""Requests for a model whose first load is under way wait for it (as scripts written for TF Serving expect),
within their deadline and ``--wait_for_model_load_seconds``: one future per model, shared by its waiting requests.
So do requests naming a version (or a label of one) of the model's first listing still in its first load: TF
Serving's clients never saw one of those missing either (one future per version)."""

from __future__ import annotations

import asyncio
import contextlib

from workbench.core.errors import Code, ServingError
from workbench.models.served import ServedModels

# What a wait is for: a model's first load (version None), or one version's.
_Key = tuple[str, int | None]


class FirstLoadWaits:
    """What waits for first loads, on the server's event loop."""

    def __init__(self, models: ServedModels, first_load_wait: float) -> None:
        self._models = models
        self.first_load_wait = first_load_wait  # seconds (0: do not wait)
        # Per model (or version) whose first load is under way: the future its waiting requests share (one manager
        # callback).
        self._first_loads: dict[_Key, asyncio.Future[None]] = {}

    async def wait(self, name: str, timeout: float | None, version: int | None = None) -> None:
        """Return once ``name``'s first load (or its ``version``'s) is over, or raise once ``timeout`` (the request's
        deadline) or :attr:`first_load_wait` passes."""
        if self.first_load_wait <= 0:  # told not to wait: answered as the model stands (NOT_FOUND while loading)
            return
        loop = asyncio.get_running_loop()
        key: _Key = (name, version)
        over = self._first_loads.get(key)
        if over is None:
            over = self._first_loads[key] = loop.create_future()

            def settled() -> None:  # from a load thread, under the manager's lock
                with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits any more
                    loop.call_soon_threadsafe(self._over, key, over)

            if version is None:
                registered = self._models.when_first_loaded(name, settled)
            else:
                registered = self._models.when_version_loaded(name, version, settled)
            if not registered:
                self._over(key, over)
        bound = self.first_load_wait if timeout is None else min(timeout, self.first_load_wait)
        if over.done():
            return
        try:
            await asyncio.wait_for(asyncio.shield(over), bound)
        except asyncio.TimeoutError:
            what = f"Model {name}" if version is None else f"Version {version} of model {name}"
            if timeout is not None and timeout <= self.first_load_wait:
                raise ServingError(
                    Code.DEADLINE_EXCEEDED, f"{what} is still loading: the request's deadline passed first"
                ) from None
            raise ServingError(
                Code.UNAVAILABLE,
                f"{what} is still loading after {self.first_load_wait:g}s (--wait_for_model_load_seconds)",
            ) from None

    def _over(self, key: _Key, over: asyncio.Future[None]) -> None:
        if self._first_loads.get(key) is over:
            del self._first_loads[key]
        if not over.done():
            over.set_result(None)
