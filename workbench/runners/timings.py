"""What a model runner records of a traced request, for the frontend that sent it to turn into spans.

A runner is another process, with no tracer of its own: its requests' spans belong to the frontend's trace, and one
exporter per frontend keeps a trace whole. So in a runner, :data:`workbench.observability.tracing.batches` (what the
batcher reports its batches to) is a :class:`RunnerTimings`: for each request the frontend marked as traced (its
``Interest.trace`` is a list here), it appends what happened to it as plain tuples, ``(name, start_ns, end_ns,
attributes)``: its ``queue`` wait, the ``batch`` it joined and the batch's ``model run``. The runner sends the list
back with the answer (``wire.TIMINGS``), and the frontend makes them children of its ``model runner`` span
(:meth:`workbench.observability.tracing.Tracing.ran_remotely`). Times are the wall clock's (``time.time_ns``), which
the frontend, on the same machine, shares.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from workbench.observability.tracing import TracedTask, batch_attributes

# One thing that happened to a request in the runner: its span's name, start and end (ns since the epoch), attributes.
Record = tuple[str, int, int, dict[str, Any]]


class RunnerTimings:
    """The batcher's span recorder in a model runner process (see the module's docstring)."""

    def __init__(self) -> None:
        # perf_counter (the batcher's clock) to the wall clock's nanoseconds, as the frontend's tracer converts.
        self._epoch_offset_ns = time.time_ns() - time.perf_counter_ns()

    def _ns(self, perf_seconds: float) -> int:
        return int(perf_seconds * 1e9) + self._epoch_offset_ns

    def batch_ran(
        self,
        model: str,
        version: int,
        signature: str,
        tasks: Sequence[TracedTask],
        started: float,
        rows: int,
        padded_rows: int,
        run_seconds: float | None,
        error: BaseException | None = None,
    ) -> None:
        """A batch ran (called on the thread that ran it): each traced request in it gets its ``queue``, the
        ``batch`` and its ``model run``."""
        traced = [(task, task.interest.trace) for task in tasks if task.interest is not None]
        traced = [(task, records) for task, records in traced if isinstance(records, list)]
        if not traced:
            return
        # Every time from the batcher's clock, converted once: the spans nest exactly as the batch ran.
        ended = time.perf_counter()
        end_ns, start_ns = self._ns(ended), self._ns(started)
        attributes = batch_attributes(model, version, signature, len(tasks), rows, padded_rows)
        if error is not None:
            attributes["workbench.error"] = type(error).__name__
        batch: Record = ("batch", start_ns, end_ns, attributes)
        run: Record | None = None
        if run_seconds is not None:
            run = ("model run", self._ns(ended - run_seconds), end_ns, {})
        for task, records in traced:
            records.append(("queue", self._ns(task.enqueued), start_ns, {}))
            records.append(batch)
            if run is not None:
                records.append(run)

    def ran_alone(self, records: Any, enqueued: float, run_seconds: float | None) -> None:
        """An unbatched call of a traced request ran: its wait for a thread (``queue``) and its ``model run``."""
        if not isinstance(records, list):
            return
        ended = time.perf_counter()
        end_ns = self._ns(ended)
        run_ns = self._ns(ended - run_seconds) if run_seconds is not None else end_ns
        records.append(("queue", self._ns(enqueued), run_ns, {}))
        if run_seconds is not None:
            records.append(("model run", run_ns, end_ns, {}))
