"""The next batch of a queue, formed on the event loop while a thread runs the last one, and taken by that thread
itself the moment it ends.

Without it, a batch thread hands its outcome to the event loop and idles until the loop has formed the next batch and
handed it back: the loop gets to that callback only after the rest of its turn, every other request's socket work.
For a BERT encoder at 32 clients that wait was 1.3–1.6 ms a batch (p90 2–3 ms), about 6% of the thread's time, in
which the model computed nothing. A :class:`NextBatch` is filled by the loop as requests arrive while every thread
is busy; the thread that ends first takes it under its lock and starts it at once, then tells the loop.

A staged task is still queued: its caller may withdraw it (a deadline, a cancellation) until a thread takes it, and
which of the two happens is settled under the lock (see :meth:`BatchTask.withdraw`). It counts as running for its
interest from its staging, so its model stays held while a thread may take it. What the thread finds withdrawn it
skips; what it finds expired or abandoned but not yet withdrawn it leaves to the loop, which alone answers futures.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable

from workbench.batching.interest import BatchTask


class NextBatch:
    """The tasks of one queue's next batch, all with the same merge key, at most the execution batch size's rows.

    Only the event loop adds (:meth:`add`); the loop or a batch thread takes (:meth:`take`). The loop may read
    :attr:`rows` and :attr:`key` without the lock: a thread only ever empties the batch, after which what the loop
    adds starts a new one.
    """

    __slots__ = ("lock", "tasks", "rows", "key")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.tasks: list[BatchTask] = []
        self.rows = 0
        self.key: Hashable | None = None

    def add(self, tasks: list[BatchTask]) -> None:
        """On the event loop: queued ``tasks`` (the same key as those staged, if any) join the batch."""
        lock = self.lock
        for task in tasks:
            task.staged(lock)
        with lock:
            if not self.tasks:
                self.key, self.rows = tasks[0].key, 0
            self.tasks.extend(tasks)
            self.rows += sum(task.rows for task in tasks)

    def take(self, now: float) -> tuple[list[BatchTask], list[BatchTask]]:
        """Empty the batch, on a thread or the loop: (the tasks to run now, no longer queued; the tasks whose awaiter
        went or whose deadline passed by ``now`` on the event loop's clock, still queued, for the loop to withdraw).
        Tasks withdrawn already are dropped."""
        run: list[BatchTask] = []
        back: list[BatchTask] = []
        with self.lock:
            tasks, self.tasks, self.rows, self.key = self.tasks, [], 0, None
            for task in tasks:
                if not task.queued:
                    continue
                interest = task.interest
                deadline = None if interest is None else interest.deadline
                if task.future.done() or (deadline is not None and now >= deadline):
                    back.append(task)
                else:
                    task.queued = False
                    run.append(task)
        return run, back
