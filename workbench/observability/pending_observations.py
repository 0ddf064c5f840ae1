"""Observations recorded on the hot path as one append each, folded into their Prometheus series in bulk.

prometheus_client's ``Histogram.observe`` takes two locks and scans its buckets; ``Counter.inc`` takes a lock. A
served request used to make a dozen such calls (TF Serving's, workbench's and Triton's series, for the request and
for its batch): about a quarter of what a small ``:predict`` cost its event loop. :class:`PendingObservations`
keeps each request's observation as one tuple in a deque (appends are atomic under the GIL, so no lock), and folds
them into their series at once (:func:`fold_histogram`: one bisection per value, one ``inc`` per bucket touched)
when enough are pending, and before anything reads the series: a collector registered first in the registry
(:class:`FoldFirst`) folds what is pending at every scrape, so a reader never sees a value behind its requests.
"""

from __future__ import annotations

import bisect
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, TypeVar

from prometheus_client.metrics_core import Metric

T = TypeVar("T")

# How many observations wait before the thread that adds the next one folds them: few enough that memory stays
# small, enough that a fold's fixed cost (a lock, the series' own locks) is spread thin.
FOLD_EVERY = 256


class PendingObservations(Generic[T]):
    """Observations of type ``T`` waiting to be folded by ``fold`` (called with a batch of them, in arrival order,
    under ``lock``: a reader holding ``lock`` reads the series with every fold complete)."""

    def __init__(self, fold: Callable[[list[T]], None], lock: threading.Lock, every: int = FOLD_EVERY) -> None:
        self._fold = fold
        self._pending: deque[T] = deque()
        self.lock = lock
        self._every = every

    def add(self, item: T) -> None:
        pending = self._pending
        pending.append(item)
        if len(pending) >= self._every:
            self.fold()

    def fold(self) -> None:
        """Fold everything pending now into its series."""
        with self.lock:
            self.fold_locked()

    def fold_locked(self) -> None:
        """:meth:`fold`, for a caller that already holds ``lock``."""
        pending = self._pending
        # popleft, not a swap of deques: an add racing with this fold lands in the deque, never in a lost one.
        items = [pending.popleft() for _ in range(len(pending))]
        if items:
            self._fold(items)


class FoldFirst:
    """A collector that yields nothing and folds ``pending`` when collected: registered before the series it feeds,
    so every read of the registry (an exposition, ``get_sample_value``) sees every observation made before it."""

    def __init__(self, pending: PendingObservations[Any]) -> None:
        self._pending = pending

    def collect(self) -> Iterator[Metric]:
        self._pending.fold()
        return iter(())


def fold_histogram(child: Any, values: Sequence[float]) -> None:
    """``child.observe(v)`` for each of ``values`` (a labelled prometheus_client ``Histogram``), in one ``inc`` per
    bucket touched and one of the sum: the same counts and sum (prometheus_client counts a value in the first bucket
    whose upper bound is at least the value: ``bisect_left``)."""
    # prometheus_client's own fields (since 0.0.x): its public observe() is the per-value cost this fold avoids.
    bounds: Sequence[float] = child._upper_bounds  # noqa: SLF001
    counts: dict[int, int] = {}
    for value in values:
        if value != value:  # NaN: in no bucket, as prometheus_client counts it (its sum becomes NaN below)
            continue
        index = bisect.bisect_left(bounds, value)
        counts[index] = counts.get(index, 0) + 1
    buckets = child._buckets  # noqa: SLF001
    for index, count in counts.items():
        buckets[index].inc(count)
    child._sum.inc(sum(values))  # noqa: SLF001
