"""The inference threads: model calls off the event loop, with nothing per call but a queue entry.

The batcher hands each batch (or unbatched call) to a thread and gets its outcome back through the loop itself
(``call_soon_threadsafe``); it never waits on a ``concurrent.futures.Future``. A ThreadPoolExecutor makes one per
call all the same, and with it a Condition and its lock: about a tenth of the Python time of a small model's
request, on the event loop thread that every request shares. :meth:`InferenceThreads.call` queues the call
alone; :meth:`~InferenceThreads.submit` keeps the Executor interface for everything else (a composite's code, a
MultiInference request) at the usual price.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

# One queued call: what to run with what, and what to tell if it never runs (the threads were shut down first).
_Call = tuple[Callable[..., Any], tuple[Any, ...], Callable[[], object] | None]


class InferenceThreads(Executor):
    """Up to ``threads`` threads named ``{name}_{i}`` that run queued calls in order.

    A thread starts only when a call finds none idle, as ThreadPoolExecutor's do: at low load one thread takes every
    call, which is faster than waking a different sleeping thread each time. A call *claims* the idle thread it
    finds, so a burst of calls sent while one thread idles starts threads for the rest rather than queueing them all
    for that one (where a slow call would hold every call behind it).
    """

    def __init__(self, threads: int, name: str) -> None:
        if threads < 1:
            raise ValueError("at least one inference thread is needed")
        self._count, self._name = threads, name
        self._queue: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        # One entry per thread waiting for a call that no call has claimed yet. A deque, not a Semaphore: its append
        # and pop are atomic without a lock (the GIL's), where a Semaphore takes a Condition and its lock on both
        # sides, on the event loop's thread and the inference thread's, for every call.
        self._idle: collections.deque[None] = collections.deque()
        self._lock = threading.Lock()
        self._shut_down = False

    @property
    def threads(self) -> int:
        """How many calls run at once, at most."""
        return self._count

    def call(self, fn: Callable[..., Any], *args: Any, dropped: Callable[[], object] | None = None) -> None:
        """Run ``fn(*args)`` on a thread; its outcome is its own to hand back (what it raises is only logged).

        ``dropped`` is called instead, on the thread shutting down, if the call is still queued when
        :meth:`shutdown` cancels what waits. Raises RuntimeError once shut down, as an Executor does.
        """
        if not self._claim_idle() and len(self._threads) < self._count:
            self._start_one()  # it takes this call first; at the limit the call waits for a thread to finish one
        with self._lock:  # not after shutdown's end marks, where no thread would ever take it
            if self._shut_down:
                raise RuntimeError("cannot schedule new calls after shutdown")
            self._queue.put((fn, args, dropped))

    def _claim_idle(self) -> bool:
        """Claim a thread that waits for a call, if one does (any thread may call this at any time)."""
        idle = self._idle
        if idle:  # nearly always empty under load: no exception raised and caught for nothing
            try:
                idle.pop()
            except IndexError:  # another caller claimed it in between
                return False
            return True
        return False

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - the future's to raise
                future.set_exception(exc)
            else:
                future.set_result(result)

        self.call(run, dropped=future.cancel)
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No new calls; with ``cancel_futures``, queued calls are dropped (their ``dropped`` is called); the threads
        end once they have run what is left. ``wait`` waits for them."""
        with self._lock:
            self._shut_down = True
            threads = list(self._threads)
        if cancel_futures:
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None and item[2] is not None:
                    item[2]()
        for _ in threads:
            self._queue.put(None)  # one end mark a thread, after every call still queued
        if wait:
            for thread in threads:
                thread.join()

    def _start_one(self) -> None:
        with self._lock:
            if self._shut_down or len(self._threads) >= self._count:
                return
            # Daemon threads: a server never stopped (a notebook kernel exiting) must not keep the process;
            # ModelServer.stop() shuts them down.
            thread = threading.Thread(target=self._work, name=f"{self._name}_{len(self._threads)}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _work(self) -> None:
        # A new thread was started for the call that found no idle one: it takes a call before it counts as idle.
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, args, _ = item
            try:
                fn(*args)
            except BaseException:  # a call hands its own outcome back; a bug must not end the thread
                log.exception("An inference thread's call failed")
            self._idle.append(None)


Caller = Callable[..., None]  # call(fn, *args, dropped=None), as InferenceThreads.call


def caller(executor: Executor) -> Caller:
    """``executor``'s way to run a call whose outcome hands itself back: :meth:`InferenceThreads.call`, or any
    Executor's ``submit`` (``dropped`` is told when the executor cancels the call unrun)."""
    if isinstance(executor, InferenceThreads):
        return executor.call

    def call(fn: Callable[..., Any], *args: Any, dropped: Callable[[], object] | None = None) -> None:
        work = executor.submit(fn, *args)
        if dropped is not None:
            work.add_done_callback(lambda done: dropped() if done.cancelled() else None)

    return call
