"""An event loop on a thread of its own, for one model's coroutines (MLServer's ``async`` runtimes).

A runtime's ``async def predict`` is still the runtime's code: it may compute for seconds without awaiting (the
numpyro example does), or block on a library call. On the server's loop that would hold every request of every
model; on a thread pool each call would need a loop of its own, and what ``load()`` made on its loop (a client
session, a lock, a queue) would not work on another. So each model gets one loop, on one thread, for its life: its
coroutines run there in the order they come, concurrently where they await, as on MLServer's server loop, and the
server's loop only awaits their futures.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class ModelLoop:
    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=f"model-loop-{name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start ``coroutine`` on the model's loop; cancelling the future cancels it there."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    async def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Await ``coroutine`` on the model's loop from another loop (cancelling this cancels it)."""
        return await asyncio.wrap_future(self.submit(coroutine))

    def call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the model's loop and wait for it, from a thread that is not the loop's."""
        return self.submit(coroutine).result()

    def close(self) -> None:
        """Stop the loop once what is running on it returns; cancels what is still pending."""
        if self.loop.is_closed():
            return

        async def cancel_rest() -> None:
            current = asyncio.current_task()
            rest = [task for task in asyncio.all_tasks() if task is not current]
            for task in rest:
                task.cancel()
            await asyncio.gather(*rest, return_exceptions=True)
            await self.loop.shutdown_asyncgens()

        if self._thread.is_alive():
            with contextlib.suppress(concurrent.futures.TimeoutError, RuntimeError):
                self.submit(cancel_rest()).result(timeout=30)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=30)
        if not self._thread.is_alive():
            self.loop.close()
