"""The event loop every workbench process runs on: uvloop where available (faster I/O), else asyncio's."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


def new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - uvloop is a dependency on every supported platform
        return asyncio.new_event_loop()


def run_to_completion(make: Callable[[], Awaitable[T]]) -> T:
    """Run the coroutine ``make()`` on a fresh event loop, and return its result.

    A Jupyter kernel already runs an asyncio loop in its main thread, and a thread can run only one loop: there it
    runs on a worker thread of its own.
    """

    def run() -> T:
        loop = new_event_loop()
        try:
            return loop.run_until_complete(make())
        finally:
            loop.close()

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return run()
    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="workbench-load") as pool:
        return pool.submit(run).result()
