"""Dynamic batching: one queue per model version × signature, merged along dimension 0.

The queues live on the event loop (no locks: one thread touches them); the TensorFlow call of each batch
runs on the inference threads. A queue starts a batch as soon as one of its ``num_batch_threads`` slots is
free, so an idle model answers at once and batching adds no latency at low load; under load the next batch
is whatever waited while the running ones ran (or, with ``batch_timeout_micros``, whatever arrives until
the batch is full or its oldest request has waited that long).

A call to a cheap model runs on the event loop itself (:class:`RunCost`): for a model answering in tens of
microseconds, the hop to an inference thread and back (a queue put, a thread wake-up, a GIL hand-over, a
callback to the loop) costs more than the call, and under load it is paid once per request, since the loop
is the bottleneck and a batch thread is always free. Such a call starts exactly when a thread would have
started it, with the same rows, so batches and their records are those of the threaded path.

Requests merge when their inputs have the same aliases, dtypes and trailing dimensions (with
``pad_variable_length_inputs``, the same ranks: shorter ones are padded); anything that cannot be
concatenated along dimension 0 runs alone. Each caller gets exactly its own rows back; padding rows added
for ``allowed_batch_sizes`` are cut off.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import logging
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from typing import Any

import numpy as np

from workbench.engine.batching_config import BatchingParameters
from workbench.engine.servable import Servable
from workbench.errors import Code, ServingError, from_exception
from workbench.signatures import Signature

log = logging.getLogger(__name__)

Feed = Mapping[str, np.ndarray]
Outputs = dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class BatchRecord:
    """What one executed batch looked like, for metrics and stats."""

    model: str
    version: int
    signature: str
    size: int  # rows of real requests
    padded_size: int  # rows sent to TensorFlow
    tasks: int
    queue_seconds: Sequence[float]  # per task: enqueue → batch start
    run_seconds: float


BatchListener = Callable[[BatchRecord], None]


@dataclasses.dataclass(eq=False)
class _Task:
    feed: Feed
    rows: int
    key: tuple[Any, ...]
    future: asyncio.Future[Outputs]
    enqueued: float


# Platforms whose calls are native compute that never waits on I/O or on the event loop; a Python model's
# (user code) always runs on a thread.
INLINE_PLATFORMS = frozenset({"tensorflow", "onnx", "sklearn", "xgboost", "lightgbm", "workbench_null"})


class RunCost:
    """Whether one signature's calls are cheap enough to run on the event loop rather than on a thread.

    Calls start on the inference threads. There a call's wall time also counts its wait for the GIL (long while
    the loop is busy, which is when this matters), so a slow call there proves nothing, and :data:`SETTLE_RUNS`
    calls under :data:`INLINE_BUDGET_SECONDS` prove the model cheap. On the loop a call's time is its own: one
    over the budget (a bigger batch, a model grown slow, the machine busy) sends the calls back to the threads
    until they prove cheap again. Only :data:`INLINE_PLATFORMS` qualify at all.
    """

    INLINE_BUDGET_SECONDS = 200e-6  # one call on the loop delays every other request by this much at most
    SETTLE_RUNS = 8

    __slots__ = ("inline", "_cheap_runs", "_allowed")

    def __init__(self, allowed: bool = True) -> None:
        self.inline = False
        self._cheap_runs = 0
        self._allowed = allowed

    def record(self, seconds: float, on_loop: bool) -> None:
        """One call took ``seconds`` (wall time), on the loop or on a thread."""
        cheap = seconds < self.INLINE_BUDGET_SECONDS
        if on_loop:
            if not cheap:
                self.inline, self._cheap_runs = False, 0
        elif cheap and self._allowed:
            self._cheap_runs += 1
            self.inline = self._cheap_runs >= self.SETTLE_RUNS


class _Queue:
    def __init__(
        self,
        servable: Servable,
        signature: Signature,
        outputs: tuple[str, ...],
        params: BatchingParameters,
        cost: RunCost,
    ):
        self.servable, self.signature, self.outputs, self.params = servable, signature, outputs, params
        self.cost = cost
        self.pending: collections.deque[_Task] = collections.deque()
        self.pending_rows = 0
        self.running = 0
        self.timer: asyncio.TimerHandle | None = None
        self.dispatch_pending = False


def batch_key(feed: Feed, pad: bool) -> tuple[Any, ...] | None:
    """Tasks with equal keys can be concatenated along dimension 0; None: this one cannot batch at all."""
    rows = None
    key = []
    for alias in sorted(feed):
        value = feed[alias]
        if value.ndim == 0:
            return None
        if rows is None:
            rows = value.shape[0]
        elif value.shape[0] != rows:
            return None
        key.append((alias, value.dtype.str, value.ndim if pad else value.shape[1:]))
    return tuple(key) if rows else None


def _pad_to(value: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    if value.shape[1:] == shape:
        return value
    widths = [(0, 0)] + [(0, target - have) for have, target in zip(value.shape[1:], shape, strict=True)]
    fill: Any = b"" if value.dtype.kind == "O" else 0
    return np.pad(value, widths, constant_values=fill)


def merge(feeds: Sequence[Feed], pad_variable_length: bool, padded_rows: int) -> dict[str, np.ndarray]:
    """Concatenate the tasks' inputs along dimension 0 (padding as asked) up to ``padded_rows`` rows."""
    merged: dict[str, np.ndarray] = {}
    for alias in feeds[0]:
        parts = [feed[alias] for feed in feeds]
        if pad_variable_length:
            shape = tuple(max(dims) for dims in zip(*(p.shape[1:] for p in parts), strict=True))
            parts = [_pad_to(p, shape) for p in parts]
        value = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)
        extra = padded_rows - value.shape[0]
        if extra > 0:  # allowed_batch_sizes: repeat the last row; its results are cut off again
            value = np.concatenate([value, np.repeat(value[-1:], extra, axis=0)], axis=0)
        merged[alias] = value
    return merged


def split(outputs: Outputs, sizes: Sequence[int], padded_rows: int) -> list[Outputs]:
    """Each task's own rows of every output."""
    for alias, value in outputs.items():
        if value.ndim == 0 or value.shape[0] != padded_rows:
            raise ServingError(
                Code.INVALID_ARGUMENT,
                f"Batched output tensor {alias} has shape {list(value.shape)}: its 0th dimension does not equal "
                f"the {padded_rows} rows of the batched inputs, so results cannot be split between requests "
                "(turn batching off for this model)",
            )
    results: list[Outputs] = []
    start = 0
    for size in sizes:
        results.append({alias: value[start : start + size] for alias, value in outputs.items()})
        start += size
    return results


def padded_size(rows: int, allowed: Sequence[int]) -> int:
    for size in allowed:
        if size >= rows:
            return size
    return rows


class BatchScheduler:
    """All batch queues of a server; ``params_for(servable)`` says whether and how a servable batches."""

    def __init__(
        self,
        executor: Executor,
        params_for: Callable[[Servable], BatchingParameters | None],
        listener: BatchListener | None = None,
        inline_cheap_models: bool = False,
    ) -> None:
        """``inline_cheap_models`` lets models that proved cheap run on the event loop (:class:`RunCost`). Off by
        default: a model whose calls are cheap until one is not (a data-dependent loop, a wait on I/O) would hold the
        loop, and every request and probe with it, for that whole call."""
        self._inline_cheap_models = inline_cheap_models
        self._executor = executor
        self._params_for = params_for
        self._listener = listener
        self._queues: dict[tuple[int, str, tuple[str, ...]], _Queue] = {}
        # Per servable and signature; outlives the queues (one is dropped whenever it empties), not the servable.
        self._costs: weakref.WeakKeyDictionary[Servable, dict[str, RunCost]] = weakref.WeakKeyDictionary()
        self._said_unbatched: set[tuple[str, int, str]] = set()

    def queue_depths(self) -> list[tuple[str, int, int]]:
        """(model, version, rows waiting) for every servable with a live queue."""
        depths: dict[tuple[str, int], int] = {}
        for queue in list(self._queues.values()):
            key = (queue.servable.name, queue.servable.version)
            depths[key] = depths.get(key, 0) + queue.pending_rows
        return [(model, version, rows) for (model, version), rows in depths.items()]

    async def run(self, servable: Servable, signature: Signature, feed: Feed, outputs: Sequence[str]) -> Outputs:
        """Run ``feed`` through ``servable``, batched with other requests when its parameters allow."""
        loop = asyncio.get_running_loop()
        params = self._params_for(servable)
        if params is not None and not signature.batchable:
            # A signature that cannot be concatenated along dimension 0 (its platform says so) runs request by
            # request; say so once, where a user who turned batching on for it will look.
            unbatched = (servable.name, servable.version, signature.name)
            if unbatched not in self._said_unbatched:
                self._said_unbatched.add(unbatched)
                log.info(
                    "%s version %d: signature %s cannot be batched (dimension 0 is fixed, or its inputs are "
                    "parsed per request); its requests run one by one",
                    *unbatched,
                )
            params = None
        key = batch_key(feed, params.pad_variable_length_inputs) if params is not None else None
        if params is None or key is None:
            cost = self._cost(servable, signature)
            on_loop = cost.inline
            if on_loop:
                result, seconds = self._run_alone(servable, signature, feed, outputs)
            else:
                work = loop.run_in_executor(self._executor, self._run_alone, servable, signature, feed, outputs)
                result, seconds = await work
            cost.record(seconds, on_loop)
            return result
        rows = next(iter(feed.values())).shape[0]
        if rows > params.max_batch_size:
            raise ServingError(
                Code.INVALID_ARGUMENT,
                f"Task size {rows} is larger than maximum input batch size {params.max_batch_size}",
            )
        queue = self._queue(servable, signature, tuple(outputs), params)
        if queue.pending_rows + rows > params.max_enqueued_rows:
            raise ServingError(Code.UNAVAILABLE, "The batch scheduling queue to which this task was submitted is full")
        step = params.execution_batch_size
        pieces = (
            [feed]
            if rows <= step
            else [
                {alias: value[start : start + step] for alias, value in feed.items()} for start in range(0, rows, step)
            ]
        )
        futures = []
        now = time.perf_counter()
        for piece in pieces:
            task = _Task(piece, next(iter(piece.values())).shape[0], key, loop.create_future(), now)
            queue.pending.append(task)
            queue.pending_rows += task.rows
            futures.append(task.future)
        if not queue.dispatch_pending:
            # Dispatch at the end of this event-loop turn, not now: requests whose handlers run in the same
            # turn (they arrived together) share one batch and one thread hop, at no added latency.
            queue.dispatch_pending = True
            loop.call_soon(self._dispatch, queue)
        if len(futures) == 1:
            return await futures[0]
        parts = await asyncio.gather(*futures)
        return {alias: np.concatenate([part[alias] for part in parts], axis=0) for alias in parts[0]}

    def _run_alone(
        self, servable: Servable, signature: Signature, feed: Feed, outputs: Sequence[str]
    ) -> tuple[Outputs, float]:
        """One unbatched call: its outputs and how long it took."""
        started = time.perf_counter()
        result = servable.run(signature, feed, outputs)
        seconds = time.perf_counter() - started
        if self._listener is not None:
            rows = next((v.shape[0] for v in feed.values() if v.ndim), 1)
            self._listener(BatchRecord(servable.name, servable.version, signature.name, rows, rows, 1, [0.0], seconds))
        return result, seconds

    def _cost(self, servable: Servable, signature: Signature) -> RunCost:
        by_signature = self._costs.get(servable)
        if by_signature is None:
            by_signature = self._costs[servable] = {}
        cost = by_signature.get(signature.name)
        if cost is None:
            cost = by_signature[signature.name] = RunCost(
                allowed=self._inline_cheap_models and servable.platform in INLINE_PLATFORMS
            )
        return cost

    def _queue(
        self, servable: Servable, signature: Signature, outputs: tuple[str, ...], params: BatchingParameters
    ) -> _Queue:
        key = (id(servable), signature.name, outputs)
        queue = self._queues.get(key)
        if queue is None or queue.servable is not servable:
            queue = self._queues[key] = _Queue(servable, signature, outputs, params, self._cost(servable, signature))
        return queue

    def _schedule(self, queue: _Queue) -> None:
        params = queue.params
        loop = asyncio.get_running_loop()
        while queue.pending and queue.running < params.num_batch_threads:
            if params.batch_timeout_micros > 0 and queue.pending_rows < params.execution_batch_size:
                waited = time.perf_counter() - queue.pending[0].enqueued
                remaining = params.batch_timeout_micros / 1e6 - waited
                if remaining > 0:
                    if queue.timer is None:
                        queue.timer = loop.call_later(remaining, self._on_timer, queue)
                    return
            if queue.timer is not None:  # this batch starts now: its timer has nothing left to do
                queue.timer.cancel()
                queue.timer = None
            batch = self._take(queue)
            if not batch:
                continue
            started = time.perf_counter()
            if queue.cost.inline:  # a cheap call: here and now (this loop turn goes on with the next batch)
                try:
                    outcome: tuple[list[Outputs], int, float] | BaseException = self._execute(queue, batch)
                except BaseException as exc:  # noqa: BLE001 - every caller of the batch gets the error
                    outcome = exc
                self._deliver(queue, batch, started, outcome, on_loop=True)
                continue
            queue.running += 1
            future = loop.run_in_executor(self._executor, self._execute, queue, batch)
            future.add_done_callback(functools.partial(self._finish, queue, batch, started))
        if not queue.pending and queue.running == 0 and not queue.dispatch_pending:
            key = (id(queue.servable), queue.signature.name, queue.outputs)
            if self._queues.get(key) is queue:  # a newer queue under the same key stays
                del self._queues[key]

    def _dispatch(self, queue: _Queue) -> None:
        queue.dispatch_pending = False
        self._schedule(queue)

    def _on_timer(self, queue: _Queue) -> None:
        queue.timer = None
        self._schedule(queue)

    def _take(self, queue: _Queue) -> list[_Task]:
        """The oldest task and every waiting task that merges with it, up to the execution batch size."""
        limit = queue.params.execution_batch_size
        first = queue.pending.popleft()
        while first.future.done():  # its caller gave up (deadline): do not run it
            queue.pending_rows -= first.rows
            if not queue.pending:
                return []
            first = queue.pending.popleft()
        batch, rows, skipped = [first], first.rows, []
        while queue.pending and rows < limit:
            task = queue.pending.popleft()
            if task.future.done():
                queue.pending_rows -= task.rows
                continue
            if task.key == first.key and rows + task.rows <= limit:
                batch.append(task)
                rows += task.rows
            else:
                skipped.append(task)
                if rows + task.rows > limit and task.key == first.key:
                    break
        queue.pending.extendleft(reversed(skipped))
        queue.pending_rows -= rows
        return batch

    def _execute(self, queue: _Queue, batch: list[_Task]) -> tuple[list[Outputs], int, float]:
        params = queue.params
        rows = sum(task.rows for task in batch)
        target = padded_size(rows, params.allowed_batch_sizes)
        started = time.perf_counter()
        feed = merge([task.feed for task in batch], params.pad_variable_length_inputs, target)
        outputs = queue.servable.run(queue.signature, feed, queue.outputs)
        results = split(outputs, [task.rows for task in batch], target)
        return results, target, time.perf_counter() - started

    def _finish(self, queue: _Queue, batch: list[_Task], started: float, future: asyncio.Future[Any]) -> None:
        """A batch thread is done: answer its callers and start what waited for the thread."""
        queue.running -= 1
        try:
            outcome: tuple[list[Outputs], int, float] | BaseException = future.result()
        except BaseException as exc:  # noqa: BLE001 - every caller of the batch gets the error
            outcome = exc
        self._deliver(queue, batch, started, outcome, on_loop=False)
        self._schedule(queue)

    def _deliver(
        self,
        queue: _Queue,
        batch: list[_Task],
        started: float,
        outcome: tuple[list[Outputs], int, float] | BaseException,
        on_loop: bool,
    ) -> None:
        """Answer every caller of ``batch`` with its rows (or the batch's error), and record the batch."""
        if isinstance(outcome, BaseException):
            error = from_exception(outcome)
            for task in batch:
                if not task.future.done():
                    task.future.set_exception(error)
        else:
            results, target, run_seconds = outcome
            queue.cost.record(run_seconds, on_loop)
            for task, result in zip(batch, results, strict=True):
                if not task.future.done():
                    task.future.set_result(result)
            if self._listener is not None:
                self._listener(
                    BatchRecord(
                        model=queue.servable.name,
                        version=queue.servable.version,
                        signature=queue.signature.name,
                        size=sum(t.rows for t in batch),
                        padded_size=target,
                        tasks=len(batch),
                        queue_seconds=[started - t.enqueued for t in batch],
                        run_seconds=run_seconds,
                    )
                )
