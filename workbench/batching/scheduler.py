"""Dynamic batching: one queue per model version × signature, merged along dimension 0.

The queues live on the event loop (no locks: one thread touches them); the TensorFlow call of each batch runs on the
inference threads. A queue starts a batch as soon as one of its ``num_batch_threads`` slots is free, so an idle
model answers at once and batching adds no latency at low load; under load the next batch is whatever waited while
the running ones ran (or, with ``batch_timeout_micros``, whatever arrives until the batch is full or its oldest
request has waited that long). For a model whose batches cost mostly their rows, that next batch is formed as its
requests arrive, and the thread ending first takes it itself (:class:`~workbench.batching.staging.NextBatch`, behind
the one lock the loop and the threads share), without waiting for the loop's turn to come round. An idle model costs
what the unbatched path does: the request goes to a thread from its own handler (no extra turn of the loop), a batch
of one is neither merged nor split, and the thread hands its outcome straight back to the loop.

Where a model's calls cost mostly a fixed part whatever their rows (:class:`CostCurve`, fitted from the batches
run), a second batch does not start beside a running one while it would be small: it waits for that one to end
and grows meanwhile, as Ray Serve's and TorchServe's batches fill, instead of paying a whole call for a few rows.

A call to a cheap model runs on the event loop itself (:class:`RunCost`): for a model answering in tens of
microseconds, the hop to an inference thread and back (a queue put, a thread wake-up, a GIL hand-over, a
callback to the loop) costs more than the call, and under load it is paid once per request, since the loop
is the bottleneck and a batch thread is always free. Such a call starts exactly when a thread would have
started it, with the same rows, so batches and their records are those of the threaded path.

Requests merge when their inputs have the same aliases, dtypes and trailing dimensions (with
``pad_variable_length_inputs``, the same ranks: shorter ones are padded); anything that cannot be
concatenated along dimension 0 runs alone. Each caller gets exactly its own rows back; padding rows added
for ``allowed_batch_sizes`` are cut off.

A queued request nobody waits for any more never reaches the model: its caller gave up (:class:`Interest`), its
deadline passed before its batch formed, or the coroutine awaiting it was cancelled. Once a request is in a
batch a thread runs, it runs to the end (nothing can stop the thread); its answer is dropped.

The pure parts live beside it (:mod:`~workbench.batching.merge`: merge, split, pad; :mod:`~workbench.batching.interest`:
a request's tasks; :mod:`~workbench.batching.run_cost`). What stays here, over 450 lines, is one class on purpose:
its queues, their dispatch and the delivery of outcomes share state only the event loop touches, and every path that
changes a queue reads in one place.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import functools
import logging
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import Protocol, TypeVar

import numpy as np

from workbench.batching.interest import CURRENT_INTEREST, BatchTask, Interest, deadline_exceeded
from workbench.batching.merge import Feed, Outputs, batch_key, check_batched_outputs, merge, padded_size, split
from workbench.batching.run_cost import Contention, CostCurve, RunCost, since, thread_mark
from workbench.batching.staging import NextBatch
from workbench.batching.threads import caller
from workbench.config.batching_parameters import BatchingParameters
from workbench.core.errors import Code, ServingError, from_exception
from workbench.core.servable import PerRequestServable, Servable
from workbench.core.signatures import Signature
from workbench.observability import tracing as _tracing
from workbench.platforms import INLINE_PLATFORMS

log = logging.getLogger(__name__)

# What running a batch gave: each task's answer (its outputs, or its own error), the rows run, the seconds taken.
Ran = tuple[list[Outputs | ServingError], int, float]
T = TypeVar("T")


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


class Batcher(Protocol):
    """What the data plane runs requests through: :class:`BatchScheduler`, or a frontend's dispatch to its model
    runners (:class:`workbench.runners.remote.RunnerDispatch`)."""

    async def run(
        self,
        servable: Servable,
        signature: Signature,
        feed: Feed,
        outputs: Sequence[str],
        interest: Interest | None = None,
        one_client: bool = False,
        requests: int = 1,
    ) -> Outputs:
        """``requests``: how many requests ``feed``'s rows are (a group's, which fits in one batch: see
        :meth:`largest_batch`)."""
        ...

    def run_now(
        self, servable: Servable, signature: Signature, feed: Feed, outputs: Sequence[str], one_client: bool = False
    ) -> Outputs | None:
        """The answer at once when the call needs neither a queue nor a thread (see :meth:`BatchScheduler.run_now`);
        None when it must be awaited through :meth:`run`."""
        ...

    def queue_depths(self) -> list[tuple[str, int, int]]: ...

    def largest_batch(self, servable: Servable) -> int:
        """The most rows one batch of ``servable`` runs (one call of its model); 0 when its requests are not
        batched."""
        ...


class _SignatureState:
    """What the scheduler knows of one signature of a servable; it outlives the queues (one is dropped whenever it
    empties), not the servable."""

    __slots__ = (
        "cost",
        "curve",
        "last_batch_tasks",
        "expected_back",
        "contention",
        "alone_running",
        "alone_overlapped",
        "turns",
        "last_progress",
        "stall_check",
    )

    def __init__(self, cost: RunCost) -> None:
        self.cost = cost
        self.curve = CostCurve()  # what its batches cost by size: whether a second concurrent batch should wait
        self.last_batch_tasks = 0  # requests the last batch ran together: more than one, the model is under load
        # After a batch of several emptied the queue, the answered callers' next requests are awaited together (see
        # BatchScheduler._finish): None, or (rows expected, the time by which the first must arrive, quiet, longest).
        self.expected_back: tuple[int, float, float, float] | None = None
        # Unbatched calls: whether they slow each other down, how many run, and those waiting for their turn.
        self.contention = Contention()
        self.alone_running = 0
        self.alone_overlapped = False
        self.turns: collections.deque[BatchTask] = collections.deque()
        self.last_progress = 0.0  # time.monotonic() a call last ended, or a waiter last stopped waiting on a stall
        self.stall_check: asyncio.TimerHandle | None = None  # armed while waiters wait


class _Queue:
    def __init__(
        self,
        servable: Servable,
        signature: Signature,
        outputs: tuple[str, ...],
        params: BatchingParameters,
        known: _SignatureState,
    ):
        self.servable, self.signature, self.outputs, self.params = servable, signature, outputs, params
        self.known = known
        self.cost = known.cost
        self.pending: collections.deque[BatchTask] = collections.deque()  # with withdrawn tasks, skipped when met
        self.pending_rows = 0  # of the queued tasks only
        self.running = 0
        self.timer: asyncio.TimerHandle | None = None
        self.dispatch_pending = False
        self.overlapped = False  # a batch started while another ran: the next batch to end ran beside one
        # The next batch, formed while every thread is busy, for the first thread to end to take (see staging.py).
        # Its tasks are still queued: counted in pending_rows, no longer in pending.
        self.staged: NextBatch | None = None


class BatchScheduler:
    """All batch queues of a server; ``params_for(servable)`` says whether and how a servable batches."""

    def __init__(
        self,
        executor: Executor,
        params_for: Callable[[Servable], BatchingParameters | None],
        listener: BatchListener | None = None,
        inline_cheap_calls: bool = False,
    ) -> None:
        """``inline_cheap_calls`` lets models that proved cheap run on the event loop (:class:`RunCost`). Off by
        default here (a model whose calls are cheap until one is not holds the loop, and every request and probe
        with it, for that one call); `workbench serve` turns it on for the native platforms, whose calls never wait
        on I/O."""
        self._inline_cheap_calls = inline_cheap_calls
        self._call = caller(executor)
        self._params_for = params_for
        self._listener = listener
        self._queues: dict[tuple[int, str, tuple[str, ...]], _Queue] = {}
        # By id(servable): a WeakKeyDictionary's get is Python code, on every request. An entry goes when its servable
        # is collected (weakref.finalize), before its id can be reused.
        self._known: dict[int, dict[str, _SignatureState]] = {}
        self._said_unbatched: set[tuple[str, int, str]] = set()

    def largest_batch(self, servable: Servable) -> int:
        params = self._params_for(servable)
        return params.execution_batch_size if params is not None else 0

    def queue_depths(self) -> list[tuple[str, int, int]]:
        """(model, version, rows waiting) for every servable with a live queue."""
        depths: dict[tuple[str, int], int] = {}
        for queue in list(self._queues.values()):
            key = (queue.servable.name, queue.servable.version)
            depths[key] = depths.get(key, 0) + queue.pending_rows
        return [(model, version, rows) for (model, version), rows in depths.items()]

    async def run(
        self,
        servable: Servable,
        signature: Signature,
        feed: Feed,
        outputs: Sequence[str],
        interest: Interest | None = None,
        one_client: bool = False,
        requests: int = 1,
    ) -> Outputs:
        """Run ``feed`` through ``servable``, batched with other requests when its parameters allow.

        The run's tasks belong to ``interest`` (by default, the one the calling task was started under, if any).
        ``requests``: how many requests ``feed``'s rows are (a group's: one task, counted as that many).
        ``one_client``: the request is the server's one client's (:mod:`workbench.planes.one_client`), and a call
        that runs now may run on the loop (:meth:`RunCost.runs_for_one_client`).
        """
        loop = asyncio.get_running_loop()
        if interest is None:
            interest = CURRENT_INTEREST.get()
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
            return await self._run_unbatched(loop, servable, signature, feed, outputs, interest, one_client)
        rows = next(iter(feed.values())).shape[0]
        if rows > params.max_batch_size:
            raise ServingError(
                Code.INVALID_ARGUMENT,
                f"Task size {rows} is larger than maximum input batch size {params.max_batch_size}",
            )
        queue = self._queue(servable, signature, tuple(outputs), params)
        if queue.pending_rows + rows > params.max_enqueued_rows:
            raise ServingError(Code.UNAVAILABLE, "The batch scheduling queue to which this task was submitted is full")
        now = time.perf_counter()
        step = params.execution_batch_size
        if rows <= step:
            tasks = [BatchTask(feed, rows, key, loop.create_future(), now, queue, interest, requests)]
        else:
            tasks = [
                BatchTask(piece, next(iter(piece.values())).shape[0], key, loop.create_future(), now, queue, interest)
                for piece in (
                    {alias: value[start : start + step] for alias, value in feed.items()}
                    for start in range(0, rows, step)
                )
            ]
        # Idle: nothing runs or waits, and the last batch ran one request (a batch of several says requests come
        # together: the next ones may be on their way in this very loop turn).
        idle = (
            not queue.pending
            and queue.running == 0
            and not queue.dispatch_pending
            and queue.known.last_batch_tasks <= 1
        )
        for task in tasks:
            queue.pending.append(task)
            queue.pending_rows += task.rows
            if interest is not None:
                interest._add(task)  # noqa: SLF001 - may withdraw it at once: its caller already gave up
        if idle:
            # An idle model runs the request now, with no hop through the loop.
            self._schedule(queue, one_client)
        elif not queue.dispatch_pending:
            # Under load, dispatch at the end of this event-loop turn, not now: requests whose handlers run in the
            # same turn (they arrived together) share one batch and one thread hop.
            queue.dispatch_pending = True
            back = queue.known.expected_back
            queue.known.expected_back = None
            if back is not None and now <= back[1]:  # the first of the answered callers back: gather the others
                expected, _, quiet, longest = back
                loop.call_soon(self._gathered, queue, queue.pending_rows, now, quiet, now + longest, expected)
            else:
                loop.call_soon(self._dispatch, queue)
        try:
            if len(tasks) == 1:
                return await tasks[0].future
            parts = await asyncio.gather(*(task.future for task in tasks))
        except BaseException:  # cancelled, or a piece failed: the request's pieces still queued never run
            for task in tasks:
                task.withdraw(None)
            raise
        return {alias: np.concatenate([part[alias] for part in parts], axis=0) for alias in parts[0]}

    def run_now(
        self, servable: Servable, signature: Signature, feed: Feed, outputs: Sequence[str], one_client: bool = False
    ) -> Outputs | None:
        """The answer here and now when :meth:`run` would run the call on the loop without queueing it: an unbatched
        call (no batching for the servable, or a signature that cannot batch) of a signature proven cheap
        (:class:`RunCost`), or cheap enough for the server's ``one_client``; None otherwise, and the caller awaits
        :meth:`run`.

        For the data plane's hot path: a call answered here costs no coroutine, no interest and no deadline timer,
        none of which a call that never waits can use. It runs and is recorded exactly as :meth:`run` would.
        """
        # The cost first: a model not proven cheap (most batched ones) is left to run() without reading its
        # batching parameters here too, which run() reads again.
        known = self._know(servable, signature)
        for_one_client = False
        if not known.cost.runs_on_loop():
            if not (one_client and known.cost.runs_for_one_client()):
                return None
            for_one_client = True
        params = self._params_for(servable)
        if params is not None and signature.batchable:
            return None
        return self._alone_here(known, servable, signature, feed, outputs, for_one_client=for_one_client)

    def _alone_here(
        self,
        known: _SignatureState,
        servable: Servable,
        signature: Signature,
        feed: Feed,
        outputs: Sequence[str],
        interest: Interest | None = None,
        for_one_client: bool = False,
    ) -> Outputs:
        """One unbatched call of a cheap signature, on the loop: run, timed for its cost, traced where ``interest``
        is; ``for_one_client``: run there only because the server has one client (recorded as such)."""
        mark = thread_mark()
        result, seconds = self._run_alone(servable, signature, feed, outputs)
        if for_one_client:
            known.cost.record_for_one_client(seconds)
        else:
            known.cost.record(seconds, True, *since(mark))
        spans = _tracing.batches
        if spans is not None and interest is not None and interest.trace is not None:
            spans.ran_alone(interest.trace, time.perf_counter() - seconds, seconds)
        return result

    async def _run_unbatched(
        self,
        loop: asyncio.AbstractEventLoop,
        servable: Servable,
        signature: Signature,
        feed: Feed,
        outputs: Sequence[str],
        interest: Interest | None,
        one_client: bool = False,
    ) -> Outputs:
        """One call on its own, on an inference thread (or, for a model proven cheap, or cheap enough for the
        server's ``one_client``, here on the loop).

        A task of its own, never queued, so that its caller's deadline answers it early and its interest knows
        when the thread has returned, exactly as for a batched request.
        """
        known = self._know(servable, signature)
        if known.cost.runs_on_loop():
            return self._alone_here(known, servable, signature, feed, outputs, interest)
        if one_client and not known.alone_running and known.cost.runs_for_one_client():
            return self._alone_here(known, servable, signature, feed, outputs, interest, for_one_client=True)
        if interest is not None and interest.error is not None:  # its caller already gave up
            raise interest.error
        submitted = time.perf_counter()  # its wait for a turn and a thread is its queue time, as Triton's
        if known.alone_running and known.contention.takes_turns():
            await self._turn(loop, known, interest)  # its calls slow each other down: one at a time
        else:
            known.alone_running += 1
        if known.alone_running > 1:
            known.alone_overlapped = True
        task = BatchTask(feed, 0, (), loop.create_future(), submitted, None, interest)
        if interest is not None:
            interest._add(task)  # noqa: SLF001
        task.taken()
        try:
            self._call(
                self._alone_on_thread,
                *(loop, task, known, servable, signature, feed, outputs),
                dropped=functools.partial(self._alone_dropped, loop, task, known),
            )
        except BaseException:  # the executor is shut down
            task.finished()
            self._alone_ended(known, None)
            raise
        return await task.future

    @staticmethod
    async def _turn(loop: asyncio.AbstractEventLoop, known: _SignatureState, interest: Interest | None) -> None:
        """Wait until no other unbatched call of the signature runs (the one ending hands its turn over: the count of
        running calls is already this one's). A waiter whose caller gives up (deadline, cancellation) leaves."""
        waiting = BatchTask({}, 0, (), loop.create_future(), 0.0, None, interest)
        if interest is not None:
            interest._add(waiting)  # noqa: SLF001 - a deadline or a cancellation withdraws it
        known.turns.append(waiting)
        if known.stall_check is None:
            known.last_progress = time.monotonic()
            BatchScheduler._arm_stall_check(loop, known)
        try:
            await waiting.future
        except BaseException:
            waiting.queued = False
            if waiting.future.done() and not waiting.future.cancelled() and waiting.future.exception() is None:
                known.alone_running -= 1  # handed the turn just as its caller gave up: pass it on
                BatchScheduler._next_turn(known)
            raise

    @staticmethod
    def _arm_stall_check(loop: asyncio.AbstractEventLoop, known: _SignatureState) -> None:
        delay = known.last_progress + known.contention.patience() - time.monotonic()
        known.stall_check = loop.call_later(max(0.0, delay), BatchScheduler._stall_check, loop, known)

    @staticmethod
    def _stall_check(loop: asyncio.AbstractEventLoop, known: _SignatureState) -> None:
        """Waiters wait, and no call has ended for the calls' patience: the running ones are waiting on something
        other than the cores (a lock, a file, a remote service), so the next waiter runs beside them."""
        known.stall_check = None
        if not any(waiting.queued for waiting in known.turns):
            known.turns.clear()
            return
        if time.monotonic() >= known.last_progress + known.contention.patience():
            while known.turns:
                waiting = known.turns.popleft()
                if waiting.queued and not waiting.future.done():
                    waiting.queued = False
                    known.alone_running += 1
                    waiting.future.set_result({})
                    break
            known.last_progress = time.monotonic()
        if known.turns:
            BatchScheduler._arm_stall_check(loop, known)

    @staticmethod
    def _next_turn(known: _SignatureState) -> None:
        """Start what waits for a turn: one call once none runs while the calls take turns (those that ran side by
        side before turns began finish first), every waiter once they no longer need to."""
        one_at_a_time = known.contention.takes_turns()
        while known.turns:
            if one_at_a_time and known.alone_running > 0:
                return
            waiting = known.turns.popleft()
            if waiting.queued and not waiting.future.done():
                waiting.queued = False
                known.alone_running += 1
                waiting.future.set_result({})

    def _alone_ended(self, known: _SignatureState, seconds: float | None, cpu_seconds: float | None = None) -> None:
        """An unbatched call returned (``seconds`` long; None: it never ran): record it, and give the next its turn."""
        beside = known.alone_running > 1 or known.alone_overlapped
        known.alone_running -= 1
        known.alone_overlapped = known.alone_running > 0
        known.last_progress = time.monotonic()
        if seconds is not None:
            known.contention.record(seconds, beside, cpu_seconds)
        self._next_turn(known)

    def _alone_on_thread(
        self,
        loop: asyncio.AbstractEventLoop,
        task: BatchTask,
        known: _SignatureState,
        servable: Servable,
        signature: Signature,
        feed: Feed,
        outputs: Sequence[str],
    ) -> None:
        """On an inference thread: one call, its outcome handed straight to the loop."""
        cpu_started = time.thread_time()
        waited = time.perf_counter() - task.enqueued
        try:
            outcome: tuple[Outputs, float] | BaseException = self._run_alone(servable, signature, feed, outputs, waited)
        except BaseException as exc:  # noqa: BLE001 - the caller's to raise
            outcome = exc
        cpu_seconds = time.thread_time() - cpu_started
        tracing = _tracing.batches
        if tracing is not None and task.interest is not None and task.interest.trace is not None:
            run_seconds = None if isinstance(outcome, BaseException) else outcome[1]
            tracing.ran_alone(task.interest.trace, task.enqueued, run_seconds)
        with contextlib.suppress(RuntimeError):  # the loop is closed (the server stopped): nobody waits any more
            loop.call_soon_threadsafe(self._alone_done, task, known, outcome, cpu_seconds)

    def _alone_done(
        self,
        task: BatchTask,
        known: _SignatureState,
        outcome: tuple[Outputs, float] | BaseException,
        cpu_seconds: float | None = None,
    ) -> None:
        future = task.future
        seconds = None
        if isinstance(outcome, asyncio.CancelledError):
            future.cancel()
        elif isinstance(outcome, BaseException):
            if not future.done():
                future.set_exception(outcome)
        else:
            result, seconds = outcome
            known.cost.record(seconds, False, cpu_seconds)
            if not future.done():
                future.set_result(result)
        task.finished()
        self._alone_ended(known, seconds, cpu_seconds)

    def _alone_dropped(self, loop: asyncio.AbstractEventLoop, task: BatchTask, known: _SignatureState) -> None:
        """The executor dropped the call unrun (it shut down): its caller gets the cancellation."""
        with contextlib.suppress(RuntimeError):  # the loop is closed too
            loop.call_soon_threadsafe(self._alone_done, task, known, asyncio.CancelledError())

    def _run_alone(
        self, servable: Servable, signature: Signature, feed: Feed, outputs: Sequence[str], waited: float = 0.0
    ) -> tuple[Outputs, float]:
        """One unbatched call: its outputs and how long it took (``waited``: for its turn and a thread)."""
        started = time.perf_counter()
        result = servable.run(signature, feed, outputs)
        seconds = time.perf_counter() - started
        if self._listener is not None:
            rows = next((v.shape[0] for v in feed.values() if v.ndim), 1)
            record = BatchRecord(servable.name, servable.version, signature.name, rows, rows, 1, [waited], seconds)
            self._listener(record)
        return result, seconds

    def _know(self, servable: Servable, signature: Signature) -> _SignatureState:
        by_signature = self._known.get(id(servable))
        if by_signature is None:
            by_signature = self._known[id(servable)] = {}
            weakref.finalize(servable, self._known.pop, id(servable), None)
        known = by_signature.get(signature.name)
        if known is None:
            known = by_signature[signature.name] = _SignatureState(
                RunCost(allowed=self._inline_cheap_calls and servable.platform in INLINE_PLATFORMS)
            )
        return known

    def _queue(
        self, servable: Servable, signature: Signature, outputs: tuple[str, ...], params: BatchingParameters
    ) -> _Queue:
        key = (id(servable), signature.name, outputs)
        queue = self._queues.get(key)
        if queue is None or queue.servable is not servable:
            queue = self._queues[key] = _Queue(servable, signature, outputs, params, self._know(servable, signature))
        return queue

    def _schedule(self, queue: _Queue, one_client: bool = False) -> None:
        """Start what may start of ``queue``; ``one_client``: its one request is the server's one client's (a call
        cheap enough for that runs on the loop)."""
        params = queue.params
        pending = queue.pending
        staged = queue.staged
        if staged is not None and staged.tasks and queue.running < params.num_batch_threads:
            # A thread is free and none took the staged batch: it goes first, its tasks having waited longest.
            run, back = staged.take(asyncio.get_running_loop().time())
            self._give_back(back)
            if run:
                self._staged_taken(queue, run)
                self._start_on_thread(queue, run, time.perf_counter())
        while pending and queue.running < params.num_batch_threads:
            while pending and not pending[0].queued:  # withdrawn: its caller gave up
                pending.popleft()
            if not pending:
                break
            if params.batch_timeout_micros > 0 and queue.pending_rows < params.execution_batch_size:
                waited = time.perf_counter() - pending[0].enqueued
                remaining = params.batch_timeout_micros / 1e6 - waited
                if remaining > 0:
                    if queue.timer is None:
                        queue.timer = asyncio.get_running_loop().call_later(remaining, self._on_timer, queue)
                    return
            if (
                queue.running
                and queue.pending_rows < params.execution_batch_size
                and queue.known.curve.fills_first(queue.pending_rows)
            ):
                return  # a call costs mostly its fixed part: the running batch's end starts a fuller one
            if queue.timer is not None:  # this batch starts now: its timer has nothing left to do
                queue.timer.cancel()
                queue.timer = None
            batch = self._take(queue)
            if not batch:
                continue
            queue.known.last_batch_tasks = _requests_in(batch)
            started = time.perf_counter()
            # A cheap call runs here and now (this loop turn goes on with the next batch), and so does one cheap enough
            # for the server's one client (it is this queue's only request, and it starts at once).
            on_loop = queue.cost.runs_on_loop()
            for_one_client = not on_loop and one_client and queue.cost.runs_for_one_client()
            if on_loop or for_one_client:
                mark = thread_mark()
                try:
                    outcome: Ran | BaseException = self._execute(queue, batch)
                except BaseException as exc:  # noqa: BLE001 - every caller of the batch gets the error
                    outcome = exc
                cpu_seconds, preempted = since(mark)
                self._deliver(
                    queue, batch, started, outcome, True, cpu_seconds=cpu_seconds, preempted=preempted,
                    for_one_client=for_one_client,
                )  # fmt: skip
                continue
            self._start_on_thread(queue, batch, started)
        if pending and queue.running >= params.num_batch_threads and self._stages(queue):
            self._stage(queue)
        staged = queue.staged
        if not pending and queue.running == 0 and not queue.dispatch_pending and not (staged and staged.tasks):
            key = (id(queue.servable), queue.signature.name, queue.outputs)
            if self._queues.get(key) is queue:  # a newer queue under the same key stays
                del self._queues[key]

    def _start_on_thread(self, queue: _Queue, batch: list[BatchTask], started: float) -> None:
        queue.running += 1
        if queue.running > 1:
            queue.overlapped = True
        loop = asyncio.get_running_loop()
        try:
            self._call(
                self._run_batch,
                *(loop, queue, batch, started),
                dropped=functools.partial(self._batch_dropped, loop, queue, batch, started),
            )
        except BaseException as exc:  # noqa: BLE001 - the executor is shut down: the batch's callers get it
            queue.running -= 1
            self._deliver(queue, batch, started, exc, on_loop=False)

    @staticmethod
    def _stages(queue: _Queue) -> bool:
        """Whether the requests waiting while every thread is busy form the next batch now, for a thread to take the
        moment it ends (:class:`NextBatch`): only where a batch of them is known to cost mostly its rows' own part
        (:meth:`CostCurve.rows_dominate`), so that starting it at once loses nothing. A call costing mostly its fixed
        part is better started by the loop: by then more requests have joined it for the same cost, and its thread does
        not take the GIL back from the loop for a few rows. Not with a batch timeout either, whose batch waits for
        company from its first request's arrival, nor for a call that runs on the loop (no thread waits for it)."""
        return (
            queue.params.batch_timeout_micros == 0
            and not queue.cost.runs_on_loop()
            and queue.known.curve.rows_dominate(queue.pending_rows)
        )

    def _stage(self, queue: _Queue) -> None:
        staged = queue.staged
        if staged is None:
            staged = queue.staged = NextBatch()
        room = queue.params.execution_batch_size - staged.rows
        if room > 0:
            tasks = self._take(queue, room, staged.key if staged.tasks else None, staging=True)
            if tasks:
                staged.add(tasks)

    @staticmethod
    def _staged_taken(queue: _Queue, batch: list[BatchTask]) -> None:
        """A staged batch was taken to run: its rows left the queue."""
        queue.pending_rows -= sum(task.rows for task in batch)
        queue.known.last_batch_tasks = _requests_in(batch)

    @staticmethod
    def _give_back(tasks: Sequence[BatchTask]) -> None:
        """Withdraw the staged tasks a thread (or the loop) found abandoned or past their deadline when it took the
        staged batch."""
        for task in tasks:
            task.withdraw(None if task.future.done() else deadline_exceeded())

    def _dispatch(self, queue: _Queue) -> None:
        queue.dispatch_pending = False
        self._schedule(queue)

    def _on_timer(self, queue: _Queue) -> None:
        queue.timer = None
        self._schedule(queue)

    def _take(
        self, queue: _Queue, limit: int | None = None, key: object | None = None, staging: bool = False
    ) -> list[BatchTask]:
        """The oldest wanted task and every waiting one that merges with it (or with ``key``), up to ``limit`` rows
        (the execution batch size).

        Tasks nobody waits for any more (withdrawn, their deadline passed, their awaiter cancelled) leave the
        queue here, unrun. Those taken for ``staging`` stay queued (see :class:`NextBatch`).
        """
        if limit is None:
            limit = queue.params.execution_batch_size
        pending = queue.pending
        now: float | None = None
        batch: list[BatchTask] = []
        skipped: list[BatchTask] = []
        rows = 0
        want = key
        while pending and rows < limit:
            task = pending.popleft()
            if not task.queued:
                continue
            if task.future.done():  # its awaiter was cancelled
                task.withdraw(None)
                continue
            interest = task.interest
            if interest is not None and interest.deadline is not None:
                if now is None:
                    now = asyncio.get_running_loop().time()
                if now >= interest.deadline:
                    task.withdraw(deadline_exceeded())
                    continue
            if want is None:
                want = task.key
            if task.key != want or rows + task.rows > limit:
                skipped.append(task)
                if rows + task.rows > limit and task.key == want:
                    break
                continue
            batch.append(task)
            rows += task.rows
        pending.extendleft(reversed(skipped))
        if not staging:
            for task in batch:
                task.taken()
            queue.pending_rows -= rows
        return batch

    def _execute(self, queue: _Queue, batch: list[BatchTask]) -> Ran:
        params = queue.params
        started = time.perf_counter()
        if isinstance(queue.servable, PerRequestServable):
            # It takes the grouped requests as they came (never merged, never padded) and answers each.
            answers = queue.servable.run_requests(queue.signature, [task.feed for task in batch], queue.outputs)
            if len(answers) != len(batch):
                raise ServingError(Code.INTERNAL, f"{len(answers)} answers for a batch of {len(batch)} requests")
            return answers, sum(task.rows for task in batch), time.perf_counter() - started
        if len(batch) == 1:
            task = batch[0]
            target = padded_size(task.rows, params.allowed_batch_sizes)
            if target == task.rows:  # a batch of one, unpadded: its own feed and outputs, nothing to merge or cut
                outputs = queue.servable.run(queue.signature, task.feed, queue.outputs)
                check_batched_outputs(outputs, target)
                return [outputs], target, time.perf_counter() - started
        rows = sum(task.rows for task in batch)
        target = padded_size(rows, params.allowed_batch_sizes)
        feed = merge([task.feed for task in batch], params.pad_variable_length_inputs, target)
        outputs = queue.servable.run(queue.signature, feed, queue.outputs)
        results: list[Outputs | ServingError] = list(split(outputs, [task.rows for task in batch], target))
        return results, target, time.perf_counter() - started

    def _run_batch(
        self, loop: asyncio.AbstractEventLoop, queue: _Queue, batch: list[BatchTask], started: float
    ) -> None:
        """On an inference thread: run the batch and record it, then hand its outcome straight to the loop (one hop
        back). The record is made here, off the event loop that every request shares. A batch the loop staged
        meanwhile runs next on this thread, at once (:class:`NextBatch`)."""
        while True:
            outcome: Ran | BaseException
            cpu_started = time.thread_time()
            try:
                outcome = ran = self._execute(queue, batch)
            except BaseException as exc:  # noqa: BLE001 - every caller of the batch gets the error
                outcome = exc
            else:
                self._record(queue, batch, started, ran)
            cpu_seconds = time.thread_time() - cpu_started
            following: list[BatchTask] | None = None
            back: list[BatchTask] = []
            staged = queue.staged
            if staged is not None and staged.tasks:
                # The loop's clock, as deadlines are set on it (asyncio's and uvloop's are both CLOCK_MONOTONIC).
                following, back = staged.take(time.monotonic())
            try:
                loop.call_soon_threadsafe(
                    self._finish, queue, batch, started, outcome, cpu_seconds, following or None, back
                )
            except RuntimeError:  # the loop is closed (the server stopped): nobody waits any more
                return
            if not following:
                return
            batch, started = following, time.perf_counter()

    def _batch_dropped(
        self, loop: asyncio.AbstractEventLoop, queue: _Queue, batch: list[BatchTask], started: float
    ) -> None:
        """The executor dropped the batch unrun (it shut down): its callers get the cancellation."""
        with contextlib.suppress(RuntimeError):  # the loop is closed too
            loop.call_soon_threadsafe(self._finish, queue, batch, started, asyncio.CancelledError())

    def _finish(
        self,
        queue: _Queue,
        batch: list[BatchTask],
        started: float,
        outcome: Ran | BaseException,
        cpu_seconds: float | None = None,
        following: list[BatchTask] | None = None,
        back: Sequence[BatchTask] = (),
    ) -> None:
        """A batch thread is done: answer its callers and start what waited for the thread. ``following``: the
        staged batch the thread went on with (it is busy still); ``back``: the staged tasks it left to withdraw."""
        # Whether another batch of the queue ran beside it (started before it ended): the cost curve keeps those
        # runs apart, to learn whether the model's calls slow each other down.
        beside = queue.running > 1 or queue.overlapped
        if following is None:
            queue.running -= 1
            queue.overlapped = queue.running > 0  # those still running ran beside this one
        else:  # the thread runs the staged batch
            queue.overlapped = queue.running > 1
            self._staged_taken(queue, following)
        self._deliver(queue, batch, started, outcome, on_loop=False, beside=beside, cpu_seconds=cpu_seconds)
        self._give_back(back)
        if following is not None:
            self._schedule(queue)  # stage what arrived meanwhile
            return
        rows = queue.pending_rows
        if rows == 0 and len(batch) > 1 and not queue.dispatch_pending:
            self._expect_back(queue, batch)
        waiting = rows > 0 and not queue.dispatch_pending and rows < queue.params.execution_batch_size
        gathering = queue.known.curve.gathering(rows) if waiting else None
        if gathering is not None:
            # A call costs mostly its fixed part: before the next batch starts, the loop takes in what reached its
            # sockets while this one ran (its thread held the GIL, so much of it is still unread), and the batch
            # fills with those rows for the same cost; so do the callers this batch answered, whose next requests
            # are on their way (clients in a closed loop). Requests queued meanwhile wait for this dispatch rather
            # than start one (see _gathered).
            queue.dispatch_pending = True
            quiet, longest = gathering
            expected = _rows_back(queue, batch, rows)
            deadline = time.perf_counter() + longest
            asyncio.get_running_loop().call_soon(self._gathered, queue, rows, None, quiet, deadline, expected)
            return
        self._schedule(queue)

    @staticmethod
    def _expect_back(queue: _Queue, batch: list[BatchTask]) -> None:
        """A batch of several requests ended with none waiting: its callers are likely to send their next ones
        (clients in a closed loop), each a trip away, so they arrive over several loop turns. For a model whose call
        costs mostly its fixed part, the first of them to arrive waits for the others (:meth:`_gathered`) instead of
        starting a batch of one, after which the rest would run as a second batch, each call costing the whole
        fixed cost: batches that alternate between one request and all the others, half the answers a second. A
        first arrival later than the wait's longest is no answered caller's: it runs as usual."""
        answered = _rows_back(queue, batch)
        gathering = queue.known.curve.gathering(answered)
        if gathering is not None:
            quiet, longest = gathering
            queue.known.expected_back = (answered, time.perf_counter() + longest, quiet, longest)

    def _gathered(
        self, queue: _Queue, rows_before: int, grew: float | None, quiet: float, deadline: float, expected: int = 0
    ) -> None:
        """Start the gathered batch once it is full or holds the ``expected`` rows, once the queue has not grown
        for ``quiet`` seconds since it last grew (each loop turn reads the sockets or runs the handlers of what the
        last one read), or at ``deadline``.

        ``grew`` is None while nothing has arrived since the batch before ended: the loop then writes that batch's
        answers before it reads a socket again (a gRPC answer costs it more than a REST one), so a silence that
        long says nothing of whether the callers come back; only ``deadline`` bounds it."""
        rows, now = queue.pending_rows, time.perf_counter()
        if rows != rows_before:
            grew = now
        if (
            (grew is not None and now - grew >= quiet)
            or rows >= queue.params.execution_batch_size
            or (expected and rows >= expected)
            or now > deadline
        ):
            self._dispatch(queue)
            return
        asyncio.get_running_loop().call_soon(self._gathered, queue, rows, grew, quiet, deadline, expected)

    def _deliver(
        self,
        queue: _Queue,
        batch: list[BatchTask],
        started: float,
        outcome: Ran | BaseException,
        on_loop: bool,
        beside: bool = False,
        cpu_seconds: float | None = None,
        preempted: bool = False,
        for_one_client: bool = False,
    ) -> None:
        """Answer every caller of ``batch`` with its rows (or the batch's error); a batch run on the loop is recorded
        here too (a thread records its own). ``cpu_seconds`` and ``preempted``: see :meth:`RunCost.record`;
        ``for_one_client``: it ran on the loop only because the server has one client."""
        if isinstance(outcome, BaseException):
            if _tracing.batches is not None:
                self._trace(queue, batch, started, outcome)
            error = from_exception(outcome)
            for task in batch:
                if not task.future.done():
                    task.future.set_exception(error)
                task.finished()
            return
        results, rows, run_seconds = outcome
        if for_one_client:
            queue.cost.record_for_one_client(run_seconds)
        else:
            queue.cost.record(run_seconds, on_loop, cpu_seconds, preempted)
        queue.known.curve.record(rows, run_seconds, beside)
        for task, result in zip(batch, results, strict=True):
            if task.future.done():
                pass
            elif isinstance(result, ServingError):  # that request's own error (PerRequestServable)
                task.future.set_exception(result)
            else:
                task.future.set_result(result)
            task.finished()
        if on_loop:
            self._record(queue, batch, started, outcome)

    def _record(self, queue: _Queue, batch: list[BatchTask], started: float, outcome: Ran) -> None:
        """Tell the listener (metrics, stats) what a batch that ran looked like."""
        if _tracing.batches is not None:
            self._trace(queue, batch, started, outcome)
        if self._listener is not None:
            _, target, run_seconds = outcome
            self._listener(
                BatchRecord(
                    model=queue.servable.name,
                    version=queue.servable.version,
                    signature=queue.signature.name,
                    size=sum(t.rows for t in batch),
                    padded_size=target,
                    tasks=_requests_in(batch),
                    queue_seconds=[started - t.enqueued for t in batch for _ in range(t.requests)],
                    run_seconds=run_seconds,
                )
            )

    @staticmethod
    def _trace(queue: _Queue, batch: list[BatchTask], started: float, outcome: Ran | BaseException) -> None:
        """Record a batch's spans (tracing is on): linked to its requests, each of which gets its queue's wait."""
        tracing = _tracing.batches
        if tracing is None:
            return
        servable, rows = queue.servable, sum(task.rows for task in batch)
        if isinstance(outcome, BaseException):
            padded, run_seconds, error = rows, None, outcome
        else:
            _, padded, run_seconds = outcome
            error = None
        tracing.batch_ran(
            servable.name, servable.version, queue.signature.name, batch, started, rows, padded, run_seconds, error
        )


def _rows_back(queue: _Queue, batch: list[BatchTask], waiting: int = 0) -> int:
    """The rows a gather after ``batch`` may expect: ``waiting`` and the next requests of the callers it answered
    (clients in a closed loop send one as each answer arrives), at most a batch."""
    return min(waiting + sum(task.rows for task in batch), queue.params.execution_batch_size)


def _requests_in(batch: list[BatchTask]) -> int:
    """The requests a batch runs (a group's task is as many as its members)."""
    return sum(task.requests for task in batch)
