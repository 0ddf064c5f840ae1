"""A request's batch tasks, and whether its caller still waits for them: the batcher runs no work nobody waits for.

A :class:`BatchTask` is one request (or one piece of a split one) in a queue of the scheduler
(:mod:`workbench.batching.scheduler`); the request's :class:`Interest` holds its tasks, withdraws the queued ones
when the caller gives up or its deadline passes, and counts the ones a batch took until their runs return.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from workbench.batching.merge import Feed, Outputs
from workbench.core.errors import Code, ServingError

T = TypeVar("T")


class Queued(Protocol):
    """The queue a task waits in, as far as a withdrawn task changes it."""

    pending_rows: int


class BatchTask:
    """One request (or one piece of a split one) in a queue; ``queued`` until a batch takes it or it is withdrawn.

    A queued task may be *staged*: put in the batch an inference thread takes next by itself
    (:class:`~workbench.batching.staging.NextBatch`). It is still queued (withdrawn as any other), but it already
    counts as running for its interest, and whether the thread takes it or its caller withdraws it is settled under
    the stage's lock, the one thing the event loop and that thread both touch.
    """

    __slots__ = ("feed", "rows", "key", "future", "enqueued", "queue", "interest", "queued", "stage_lock", "requests")

    def __init__(
        self,
        feed: Feed,
        rows: int,
        key: tuple[Any, ...],
        future: asyncio.Future[Outputs],
        enqueued: float,
        queue: Queued | None,  # None: an unbatched call, never queued
        interest: Interest | None,
        requests: int = 1,
    ) -> None:
        """``requests``: how many requests its rows are (a group's, :mod:`workbench.planes.coalescing`), as the
        batch's records count them."""
        self.feed, self.rows, self.key, self.future, self.enqueued = feed, rows, key, future, enqueued
        self.queue, self.interest = queue, interest
        self.queued = True
        self.stage_lock: threading.Lock | None = None
        self.requests = requests

    def withdraw(self, error: BaseException | None) -> None:
        """Out of its queue unrun (no-op once a batch took it); its awaiter gets ``error`` (None: leave its future)."""
        lock = self.stage_lock
        if lock is None:
            if not self.queued:
                return
            self.queued = False
        else:  # staged: the thread may be taking it right now
            with lock:
                if not self.queued:
                    return
                self.queued = False
        if self.queue is not None:
            self.queue.pending_rows -= self.rows  # the deque entry stays until a batch forms, which skips it
        if error is not None and not self.future.done():
            self.future.set_exception(error)
        if lock is not None:
            self.finished()  # staging counted it as running; it never will run

    def staged(self, lock: threading.Lock) -> None:
        """Put in the next batch a thread takes by itself: its model stays held from now on, as for a taken task,
        until its run returns or it is withdrawn."""
        self.stage_lock = lock
        if self.interest is not None:
            self.interest.running += 1

    def taken(self) -> None:
        """A batch (or, unbatched, a thread) took it: from now on only its run's end lets go of the model."""
        self.queued = False
        if self.interest is not None:
            self.interest.running += 1

    def finished(self) -> None:
        """Its run returned (or was dropped unrun by a stopped executor): nothing runs on its model for it any more."""
        if self.interest is not None:
            self.interest._finished_one()  # noqa: SLF001 - the interest's own bookkeeping


# The interest of the request whose work runs now (set by :meth:`Interest.start`), inherited by member requests.
CURRENT_INTEREST: contextvars.ContextVar[Interest | None] = contextvars.ContextVar(
    "workbench_batching_interest", default=None
)


class Interest:
    """Whether the caller of one request still waits for its answer: the batcher runs no queued work it gave up.

    Every batch task a request's work queues belongs to its interest, reached in one of two ways:

    - a plain servable's request awaits its tasks itself, passing the interest to :meth:`BatchScheduler.run`. Its
      deadline calls :meth:`answer_early`: tasks still queued leave their queues unrun, and those a thread already
      runs are answered with the error at once. :attr:`running` counts the runs not yet returned, and
      :meth:`when_idle` says when the request may let go of its model.
    - a composite's work (several models, code of its own) runs as a task started with :meth:`start`, which the
      caller's deadline and cancellation must not cancel while a thread may run part of it; member requests
      inherit the interest. :meth:`give_up` takes the tasks still queued out of their queues at once (their
      awaiters get the error, and the work ends without waiting for a batch).

    A task whose ``timeout`` (seconds from now, on the event loop's clock) has run out when its batch forms is
    dropped the same way, with DEADLINE_EXCEEDED. A task a batch already took runs to the end.
    """

    __slots__ = ("deadline", "error", "running", "trace", "_on_idle", "_tasks", "_work")

    def __init__(self, timeout: float | None = None, loop: asyncio.AbstractEventLoop | None = None) -> None:
        if timeout is None:
            self.deadline = None
        else:
            self.deadline = (loop or asyncio.get_running_loop()).time() + timeout
        self.error: ServingError | None = None  # set once given up
        self.running = 0  # its tasks a batch or a thread took and whose run has not returned yet
        # The request's spans (workbench.observability.tracing.RequestSpan) when it is traced: its batch's spans
        # link to it. None while tracing is off.
        self.trace: Any = None
        self._on_idle: Callable[[], None] | None = None
        self._tasks: list[BatchTask] = []
        self._work: asyncio.Future[Any] | None = None

    def start(self, work: Awaitable[T]) -> asyncio.Future[T]:
        """``work`` as a task (a future is returned as is) whose batch tasks belong to this interest."""
        token = CURRENT_INTEREST.set(self)
        try:
            future = self._work = asyncio.ensure_future(work)
        finally:
            CURRENT_INTEREST.reset(token)
        return future

    def give_up(self, error: ServingError) -> None:
        """Nobody waits any more: withdraw every queued task, each answered with ``error``.

        The started work's outcome (that error, most often) is read by nobody now: it is consumed when it comes,
        so that asyncio does not report it as never retrieved.
        """
        if self.error is None:
            self.error = error
            if self._work is not None:
                self._work.add_done_callback(_consume)
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.withdraw(error)

    def answer_early(self, error: ServingError) -> None:
        """:meth:`give_up`, and the tasks already running are answered with ``error`` too, without waiting for
        their run: for a caller awaiting its batch tasks itself (``BatchScheduler.run(..., interest=…)``), which
        must keep its model held until :attr:`running` is back to 0 (:meth:`when_idle`)."""
        tasks = list(self._tasks)
        self.give_up(error)
        for task in tasks:
            if not task.future.done():
                task.future.set_exception(error)

    def expire(self) -> None:
        """:meth:`answer_early` with DEADLINE_EXCEEDED: the deadline timer's callback (the error is built only for a
        request whose deadline passes, not for every request that sets one)."""
        self.answer_early(deadline_exceeded())

    def when_idle(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once no run of its tasks is left (at once when none is running)."""
        if self.running == 0:
            callback()
        else:
            self._on_idle = callback

    def _finished_one(self) -> None:
        self.running -= 1
        if self.running == 0 and self._on_idle is not None:
            callback, self._on_idle = self._on_idle, None
            callback()

    def _add(self, task: BatchTask) -> None:
        if self.error is not None:
            task.withdraw(self.error)
        else:
            self._tasks.append(task)


def _consume(work: asyncio.Future[Any]) -> None:
    if not work.cancelled():
        work.exception()


def deadline_exceeded() -> ServingError:
    return ServingError(Code.DEADLINE_EXCEEDED, "Deadline Exceeded")
