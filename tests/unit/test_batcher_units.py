"""The dynamic batcher in-process on fakes: what :class:`~workbench.batching.scheduler.BatchScheduler` merges, splits,
pads, refuses, drops and records, with no framework and no sockets.

Requests go through a real scheduler on a real thread pool to a :class:`Gated` fake servable, which answers
``y = x * 10 + 3`` (so every row of an answer says which input row it came from), records the ``x`` values of each
call as the call starts, and may hold its calls at a gate: while a call waits there with ``num_batch_threads=1``,
the next requests queue, and what the next batch holds is decided by the scheduler alone, not by timing. Timeouts
are tested with a short ``batch_timeout_micros`` (or a long one that no test waits for). Covered: merging up to
``max_batch_size`` in arrival order, large-batch splitting, padding to ``allowed_batch_sizes``, the batch timeout,
deadlines (when the batch forms, and the dataplane's early answer), a failing call, a full queue,
``num_batch_threads``, unbatchable signatures, separate queues per signature and output set, the batch records,
and which calls may run on the event loop; plus the pure merge/split round trip and the parameters' derived sizes.

Every wait is on a condition with a deadline; the wire-level behaviour on real SavedModels is
tests/wire/test_batching.py.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from fakes import FakeServable, X, Y

from workbench.batching import run_cost
from workbench.batching.interest import BatchTask, Interest, deadline_exceeded
from workbench.batching.merge import merge, padded_size, split
from workbench.batching.run_cost import Contention, CostCurve, RunCost
from workbench.batching.scheduler import BatchRecord, BatchScheduler
from workbench.batching.staging import NextBatch
from workbench.config.batching_parameters import BatchingParameters
from workbench.core.errors import Code, ServingError
from workbench.core.signatures import PREDICT_METHOD, Signature

ROUNDS_UNTIL_STAGED = 8
WAIT = 5.0  # seconds any one wait may take before a test fails (they take milliseconds)
LONG = 30_000_000  # a batch_timeout_micros no test waits for: those batches start because they are full
FACTOR, VERSION = 10.0, 3
THREAD_PREFIX = "unit-batch"
QUEUE_FULL = "The batch scheduling queue to which this task was submitted is full"


def column(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32).reshape(-1, 1)


def answer(*values: float) -> np.ndarray:
    """What the fake answers for these ``x`` rows."""
    return column(*values) * FACTOR + VERSION


class Gated(FakeServable):
    """A FakeServable that records the ``x`` values and the thread of each call as it starts, may hold its calls
    at a gate (open until :meth:`hold`), and may raise any exception, not only a ServingError."""

    def __init__(self, *, batchable: bool = True, delay: float = 0.0) -> None:
        super().__init__("m", VERSION, factor=FACTOR, batchable=batchable, delay=delay)
        other = Signature("other", PREDICT_METHOD, {"x": X}, {"y": Y}, batchable=batchable)
        self.signatures = {**self.signatures, "other": other}
        self.calls: list[list[float]] = []
        self.started_on: list[str] = []  # the thread of each call, as it starts
        self.gate = threading.Event()
        self.gate.set()
        self.raising: BaseException | None = None
        self.held_only: set[float] | None = None  # while held, only calls with one of these x wait (None: every call)
        self._calls_lock = threading.Lock()

    def hold(self) -> None:
        """Calls that start from now on wait until :attr:`gate` is set again."""
        self.gate.clear()

    def run(
        self, signature: Signature, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        values = np.asarray(inputs["x"]).ravel().tolist()
        with self._calls_lock:
            self.calls.append(values)
            self.started_on.append(threading.current_thread().name)
        waits = self.held_only is None or not self.held_only.isdisjoint(values)
        if waits and not self.gate.wait(WAIT):
            raise ServingError(Code.DEADLINE_EXCEEDED, "the test never opened the gate")
        if self.raising is not None:
            raise self.raising
        return super().run(signature, inputs, outputs)


class Bench:
    """A BatchScheduler on its own thread pool, in front of one :class:`Gated` servable, recording its batches."""

    def __init__(self, servable: Gated, params: BatchingParameters | None, inline_cheap_calls: bool) -> None:
        self.servable = servable
        self.records: list[BatchRecord] = []
        self.executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix=THREAD_PREFIX)
        self.scheduler = BatchScheduler(
            self.executor, lambda _: params, listener=self.records.append, inline_cheap_calls=inline_cheap_calls
        )

    async def ask(
        self,
        *values: float,
        signature: str = "serving_default",
        outputs: Sequence[str] = ("y",),
        interest: Interest | None = None,
        one_client: bool = False,
    ) -> np.ndarray:
        result = await self.scheduler.run(
            self.servable, self.servable.signatures[signature], {"x": column(*values)}, list(outputs), interest,
            one_client,
        )  # fmt: skip
        assert set(result) == {"y"}
        return result["y"]

    def shapes(self) -> list[tuple[int, int, int]]:
        """(size, padded_size, tasks) of every batch recorded so far."""
        return [(r.size, r.padded_size, r.tasks) for r in self.records]

    def queued_rows(self) -> int | None:
        """Rows waiting in the servable's queues; None when it has no live queue."""
        depths = self.scheduler.queue_depths()
        return sum(rows for _, _, rows in depths) if depths else None


@pytest.fixture
def bench() -> Iterator[Callable[..., Bench]]:
    made: list[Bench] = []

    def make(
        params: BatchingParameters | None,
        servable: Gated | None = None,
        inline_cheap_calls: bool = False,
    ) -> Bench:
        made.append(Bench(servable or Gated(), params, inline_cheap_calls))
        return made[-1]

    yield make
    for b in made:
        b.servable.gate.set()
        b.executor.shutdown(wait=True)


async def until(predicate: Callable[[], object], what: str) -> None:
    """Poll ``predicate`` on the running loop (never blocking it) until truthy, or fail after :data:`WAIT`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {WAIT}s waiting for {what}")
        await asyncio.sleep(0.001)


def params(**fields: int | bool | tuple[int, ...]) -> BatchingParameters:
    """Parameters with one batch thread and no batch timeout unless told otherwise, validated as a file's are."""
    fields = {"num_batch_threads": 1, "batch_timeout_micros": 0, **fields}
    return BatchingParameters(**fields).validate("the test")  # type: ignore[arg-type]


def serving_error(future: asyncio.Future[np.ndarray]) -> ServingError:
    error = future.exception()
    assert isinstance(error, ServingError), error
    return error


# ====================================================================================== pure functions
@pytest.mark.parametrize(
    ("sizes", "allowed"),
    [([1], ()), ([3], (4, 8)), ([1, 2, 3], ()), ([2, 3], (4, 8)), ([4, 4], (8,)), ([5, 1, 2], (2, 4))],
)
def test_merge_then_split_gives_each_feed_exactly_the_answer_it_would_get_alone(
    sizes: list[int], allowed: tuple[int, ...]
) -> None:
    model = FakeServable(factor=FACTOR, version=VERSION)
    signature = model.signatures["serving_default"]
    starts = np.cumsum([0, *sizes])
    feeds = [{"x": column(*range(start, start + size))} for start, size in zip(starts, sizes, strict=False)]
    target = padded_size(sum(sizes), allowed)
    assert target >= sum(sizes) and (target in allowed or target == sum(sizes))

    merged = merge(feeds, pad_variable_length=False, padded_rows=target)
    assert merged["x"].shape == (target, 1)
    parts = split(model.run(signature, merged, ["y"]), sizes, padded_rows=target)

    assert len(parts) == len(feeds)
    for feed, part in zip(feeds, parts, strict=True):
        np.testing.assert_array_equal(part["y"], model.run(signature, feed, ["y"])["y"])


def test_execution_batch_size_and_queue_capacity_follow_large_batch_splitting() -> None:
    plain = BatchingParameters(max_batch_size=8, max_enqueued_batches=3)
    assert (plain.execution_batch_size, plain.max_enqueued_rows) == (8, 24)
    splitting = BatchingParameters(
        max_batch_size=64, max_enqueued_batches=3, enable_large_batch_splitting=True, max_execution_batch_size=16
    )
    assert (splitting.execution_batch_size, splitting.max_enqueued_rows) == (16, 48)
    unset = BatchingParameters(max_batch_size=64, enable_large_batch_splitting=True)  # no execution size given
    assert unset.execution_batch_size == 64
    assert splitting.validate("x") is splitting


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"max_enqueued_batches": 0}, "max_enqueued_batches must be positive, got 0"),
        ({"max_execution_batch_size": -1}, "max_execution_batch_size must not be negative"),
        (
            {"max_batch_size": 64, "enable_large_batch_splitting": True, "max_execution_batch_size": 16,
             "allowed_batch_sizes": (8, 64)},
            "the last entry of allowed_batch_sizes (64) must equal max_execution_batch_size (16)",
        ),
        (
            {"max_batch_size": 8, "allowed_batch_sizes": (0, 8)},
            "allowed_batch_sizes must be positive and increasing, got [0, 8]",
        ),
    ],
)  # fmt: skip
def test_validate_names_the_wrong_field_and_where_it_came_from(
    fields: dict[str, int | bool | tuple[int, ...]], fragment: str
) -> None:
    with pytest.raises(ServingError) as info:
        BatchingParameters(**fields).validate("m/batching_parameters.txt")  # type: ignore[arg-type]
    assert info.value.code == Code.INVALID_ARGUMENT
    assert info.value.message == f"Invalid batching parameters in m/batching_parameters.txt: {fragment}"


# =========================================================================== merging, splitting, padding
def test_queued_requests_merge_into_calls_of_at_most_max_batch_size_in_arrival_order(bench: Callable[..., Bench]):
    b = bench(params(max_batch_size=4))
    b.servable.hold()
    asked = [(0.0,), (1.0,), (2.0, 3.0), (4.0, 5.0, 6.0), (7.0,), (8.0, 9.0)]

    async def main() -> list[np.ndarray]:
        first = asyncio.ensure_future(b.ask(*asked[0]))
        await until(lambda: b.servable.calls, "the first call at the gate")
        queued = [asyncio.ensure_future(b.ask(*values)) for values in asked[1:]]
        await until(lambda: b.queued_rows() == 9, "9 rows queued behind the gate")
        b.servable.gate.set()
        return await asyncio.wait_for(asyncio.gather(first, *queued), WAIT)

    answers = asyncio.run(main())
    for values, got in zip(asked, answers, strict=True):
        np.testing.assert_array_equal(got, answer(*values))
    # Oldest first, and a request that does not fit ends the batch (nothing jumps the queue to fill it).
    assert b.servable.calls == [[0], [1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert b.shapes() == [(1, 1, 1), (3, 3, 2), (4, 4, 2), (2, 2, 1)]
    assert b.scheduler.queue_depths() == []


def test_large_batch_splitting_runs_execution_size_pieces_and_reassembles_the_answer_in_order(
    bench: Callable[..., Bench],
):
    b = bench(params(max_batch_size=16, enable_large_batch_splitting=True, max_execution_batch_size=4))
    b.servable.hold()
    big = [float(v) for v in range(10)]

    async def main() -> tuple[np.ndarray, np.ndarray]:
        first = asyncio.ensure_future(b.ask(100))
        await until(lambda: b.servable.calls, "the first call at the gate")
        whole = asyncio.ensure_future(b.ask(*big))
        small = asyncio.ensure_future(b.ask(50))
        await until(lambda: b.queued_rows() == 11, "the 3 pieces and the small request queued")
        b.servable.gate.set()
        await asyncio.wait_for(first, WAIT)
        return await asyncio.wait_for(whole, WAIT), await asyncio.wait_for(small, WAIT)

    whole, small = asyncio.run(main())
    np.testing.assert_array_equal(whole, answer(*big))
    np.testing.assert_array_equal(small, answer(50))
    # The last piece shares its call with the request queued after it.
    assert b.servable.calls == [[100], [0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 50]]
    assert b.shapes() == [(1, 1, 1), (4, 4, 1), (4, 4, 1), (3, 3, 2)]


def test_a_request_larger_than_max_batch_size_is_refused_before_it_reaches_the_model(bench: Callable[..., Bench]):
    b = bench(params(max_batch_size=16, enable_large_batch_splitting=True, max_execution_batch_size=4))
    with pytest.raises(ServingError) as info:
        asyncio.run(b.ask(*range(17)))
    assert info.value.code == Code.INVALID_ARGUMENT
    assert info.value.message == "Task size 17 is larger than maximum input batch size 16"
    assert b.servable.calls == [] and b.records == []


def test_allowed_batch_sizes_pad_each_call_and_no_padding_row_reaches_an_answer(bench: Callable[..., Bench]):
    b = bench(params(max_batch_size=8, allowed_batch_sizes=(4, 8)))
    b.servable.hold()

    async def main() -> list[np.ndarray]:
        alone = asyncio.ensure_future(b.ask(1, 2, 3))  # a batch of one is padded too
        await until(lambda: b.servable.calls, "the first call at the gate")
        two, three = asyncio.ensure_future(b.ask(4, 5)), asyncio.ensure_future(b.ask(6, 7, 8))
        await until(lambda: b.queued_rows() == 5, "5 rows queued behind the gate")
        b.servable.gate.set()
        answers = list(await asyncio.wait_for(asyncio.gather(alone, two, three), WAIT))
        return [*answers, await asyncio.wait_for(b.ask(9, 10, 11, 12), WAIT)]  # an allowed size: not padded

    alone, two, three, exact = asyncio.run(main())
    np.testing.assert_array_equal(alone, answer(1, 2, 3))
    np.testing.assert_array_equal(two, answer(4, 5))
    np.testing.assert_array_equal(three, answer(6, 7, 8))
    np.testing.assert_array_equal(exact, answer(9, 10, 11, 12))
    # The padding repeats the last real row; its answers are cut off again.
    assert b.servable.calls == [[1, 2, 3, 3], [4, 5, 6, 7, 8, 8, 8, 8], [9, 10, 11, 12]]
    assert b.servable.batches == [4, 8, 4]
    assert b.shapes() == [(3, 4, 1), (5, 8, 2), (4, 4, 1)]


# ==================================================================================== the batch timeout
def test_requests_wait_for_the_batch_timeout_and_share_the_batch_that_starts_then(bench: Callable[..., Bench]):
    timeout = 0.02
    b = bench(params(max_batch_size=8, batch_timeout_micros=int(timeout * 1e6)))

    async def main() -> tuple[float, np.ndarray, list[np.ndarray]]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        lone = await asyncio.wait_for(b.ask(1), WAIT)
        waited = loop.time() - start
        pair = await asyncio.wait_for(asyncio.gather(b.ask(2), b.ask(3, 4)), WAIT)
        return waited, lone, list(pair)

    waited, lone, (two, three) = asyncio.run(main())
    np.testing.assert_array_equal(lone, answer(1))
    np.testing.assert_array_equal(two, answer(2))
    np.testing.assert_array_equal(three, answer(3, 4))
    assert waited >= timeout, "a lone request ran before the batch timeout"
    assert b.servable.calls == [[1], [2, 3, 4]]
    assert b.shapes() == [(1, 1, 1), (3, 3, 2)]
    assert b.records[0].queue_seconds[0] >= timeout
    assert min(b.records[1].queue_seconds) >= timeout


def test_a_full_batch_runs_at_once_without_waiting_for_the_batch_timeout(bench: Callable[..., Bench]):
    b = bench(params(max_batch_size=4, batch_timeout_micros=LONG))

    async def main() -> list[np.ndarray]:
        # A wait for the 30 s timeout would fail this wait_for.
        return list(await asyncio.wait_for(asyncio.gather(b.ask(1, 2), b.ask(3), b.ask(4)), WAIT))

    pair, three, four = asyncio.run(main())
    np.testing.assert_array_equal(pair, answer(1, 2))
    np.testing.assert_array_equal(three, answer(3))
    np.testing.assert_array_equal(four, answer(4))
    assert b.servable.calls == [[1, 2, 3, 4]]
    assert b.shapes() == [(4, 4, 3)]
    assert max(b.records[0].queue_seconds) < WAIT
    assert b.scheduler.queue_depths() == []


# ============================================================================================ deadlines
def test_a_request_whose_deadline_passed_while_queued_is_dropped_unrun_when_its_batch_forms(
    bench: Callable[..., Bench],
):
    b = bench(params(max_batch_size=8))
    b.servable.hold()

    async def main() -> tuple[asyncio.Future[np.ndarray], list[np.ndarray]]:
        loop = asyncio.get_running_loop()
        first = asyncio.ensure_future(b.ask(1))
        await until(lambda: b.servable.calls, "the first call at the gate")
        expiring = Interest(timeout=0.01)
        expired = asyncio.ensure_future(b.ask(2, interest=expiring))
        kept = [asyncio.ensure_future(b.ask(3, interest=Interest(timeout=600))), asyncio.ensure_future(b.ask(4))]
        await until(lambda: b.queued_rows() == 3, "3 rows queued behind the gate")
        deadline = expiring.deadline
        assert deadline is not None
        await until(lambda: loop.time() >= deadline, "the deadline")
        assert not expired.done(), "nothing gave up on it: it leaves when its batch forms"
        b.servable.gate.set()
        answers = await asyncio.wait_for(asyncio.gather(first, *kept), WAIT)
        await asyncio.wait([expired], timeout=WAIT)
        return expired, list(answers)

    expired, (first, three, four) = asyncio.run(main())
    error = serving_error(expired)
    assert (error.code, error.message) == (Code.DEADLINE_EXCEEDED, "Deadline Exceeded")
    np.testing.assert_array_equal(first, answer(1))
    np.testing.assert_array_equal(three, answer(3))
    np.testing.assert_array_equal(four, answer(4))
    assert b.servable.calls == [[1], [3, 4]], "the expired request reached the model"
    assert b.shapes() == [(1, 1, 1), (2, 2, 2)]
    assert b.scheduler.queue_depths() == []


def test_an_expired_request_alone_in_its_queue_never_reaches_the_model(bench: Callable[..., Bench]):
    timeout = 0.02
    b = bench(params(max_batch_size=8, batch_timeout_micros=int(timeout * 1e6)))

    async def main() -> tuple[float, BaseException | None]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        try:
            await asyncio.wait_for(b.ask(7, interest=Interest(timeout=0.001)), WAIT)
        except ServingError as exc:
            return loop.time() - start, exc
        return loop.time() - start, None

    waited, error = asyncio.run(main())
    assert isinstance(error, ServingError) and error.code == Code.DEADLINE_EXCEEDED
    # With nothing but its Interest, the request is answered when the batch timer fires, not at its deadline.
    assert waited >= timeout
    assert b.servable.calls == [] and b.records == []
    assert b.scheduler.queue_depths() == []


def test_answering_early_at_the_deadline_takes_the_request_out_of_the_queue_and_frees_its_rows(
    bench: Callable[..., Bench],
):
    # What the dataplane does for a request with a deadline: an Interest, and a timer that answers it early.
    b = bench(params(max_batch_size=2, max_enqueued_batches=1))
    b.servable.hold()

    async def main() -> tuple[asyncio.Future[np.ndarray], np.ndarray, np.ndarray]:
        loop = asyncio.get_running_loop()
        first = asyncio.ensure_future(b.ask(1))
        await until(lambda: b.servable.calls, "the first call at the gate")
        interest = Interest(0.01, loop)
        loop.call_later(0.01, interest.answer_early, deadline_exceeded())
        expiring = asyncio.ensure_future(b.ask(2, 3, interest=interest))  # the queue is full now
        done, _ = await asyncio.wait([expiring], timeout=WAIT)
        assert done, "the deadline did not answer the queued request"
        assert not b.servable.gate.is_set() and b.servable.calls == [[1]]
        assert b.scheduler.queue_depths() == [("m", VERSION, 0)]
        later = asyncio.ensure_future(b.ask(4, 5))  # fits only because the expired rows left the queue
        await until(lambda: b.queued_rows() == 2, "the later request queued")
        b.servable.gate.set()
        return expiring, await asyncio.wait_for(first, WAIT), await asyncio.wait_for(later, WAIT)

    expiring, first, later = asyncio.run(main())
    assert serving_error(expiring).code == Code.DEADLINE_EXCEEDED
    np.testing.assert_array_equal(first, answer(1))
    np.testing.assert_array_equal(later, answer(4, 5))
    assert b.servable.calls == [[1], [4, 5]]


# ============================================================================== failures and a full queue
@pytest.mark.parametrize(
    ("raised", "code", "message"),
    [
        (ServingError(Code.FAILED_PRECONDITION, "the model says no"), Code.FAILED_PRECONDITION, "the model says no"),
        (ValueError("bad rows"), Code.INTERNAL, "ValueError: bad rows"),
    ],
    ids=["serving-error", "python-error"],
)
def test_a_failing_call_fails_every_request_of_its_batch_with_the_models_error_and_the_next_batch_runs(
    bench: Callable[..., Bench], raised: BaseException, code: Code, message: str
):
    b = bench(params(max_batch_size=8))
    b.servable.hold()
    b.servable.raising = raised

    async def main() -> tuple[list[BaseException | np.ndarray], np.ndarray]:
        first = asyncio.ensure_future(b.ask(1))
        await until(lambda: b.servable.calls, "the first call at the gate")
        queued = [asyncio.ensure_future(b.ask(2)), asyncio.ensure_future(b.ask(3, 4))]
        await until(lambda: b.queued_rows() == 3, "3 rows queued behind the gate")
        b.servable.gate.set()
        failed = await asyncio.wait_for(asyncio.gather(first, *queued, return_exceptions=True), WAIT)
        b.servable.raising = None
        return list(failed), await asyncio.wait_for(b.ask(5, 6), WAIT)

    failed, recovered = asyncio.run(main())
    for outcome in failed:
        assert isinstance(outcome, ServingError), outcome
        assert (outcome.code, outcome.message) == (code, message)
    np.testing.assert_array_equal(recovered, answer(5, 6))
    assert b.servable.calls == [[1], [2, 3, 4], [5, 6]]
    assert b.shapes() == [(2, 2, 1)], "only the batch that ran to the end is recorded"
    assert b.scheduler.queue_depths() == []


def test_a_full_queue_refuses_with_unavailable_at_once_and_the_refused_rows_never_reach_the_model(
    bench: Callable[..., Bench],
):
    b = bench(params(max_batch_size=2, max_enqueued_batches=1))  # room for 2 queued rows
    b.servable.hold()

    async def main() -> tuple[ServingError, list[np.ndarray]]:
        running = asyncio.ensure_future(b.ask(1, 2))  # rows a thread runs no longer count
        await until(lambda: b.servable.calls, "the first call at the gate")
        queued = [asyncio.ensure_future(b.ask(3)), asyncio.ensure_future(b.ask(4))]
        await until(lambda: b.queued_rows() == 2, "2 rows queued behind the gate")
        with pytest.raises(ServingError) as info:
            await asyncio.wait_for(b.ask(5), WAIT)  # refused while the gate is still shut: no wait for room
        assert not b.servable.gate.is_set()
        b.servable.gate.set()
        return info.value, list(await asyncio.wait_for(asyncio.gather(running, *queued), WAIT))

    error, (pair, three, four) = asyncio.run(main())
    assert (error.code, error.message) == (Code.UNAVAILABLE, QUEUE_FULL)
    np.testing.assert_array_equal(pair, answer(1, 2))
    np.testing.assert_array_equal(three, answer(3))
    np.testing.assert_array_equal(four, answer(4))
    assert b.servable.calls == [[1, 2], [3, 4]]


# ========================================================================== threads, queues, signatures
def test_num_batch_threads_bounds_the_calls_running_at_once(bench: Callable[..., Bench]):
    b = bench(params(max_batch_size=8, num_batch_threads=2))
    b.servable.hold()

    async def main() -> list[np.ndarray]:
        asked = [asyncio.ensure_future(b.ask(1))]
        await until(lambda: len(b.servable.calls) == 1, "the first call at the gate")
        asked.append(asyncio.ensure_future(b.ask(2)))  # a second thread is free: it starts at once
        await until(lambda: len(b.servable.calls) == 2, "the second call at the gate")
        asked.append(asyncio.ensure_future(b.ask(3)))
        await until(lambda: b.queued_rows() == 1, "the third request queued")
        assert len(b.servable.calls) == 2, "a third call started with both batch threads busy"
        b.servable.gate.set()
        return list(await asyncio.wait_for(asyncio.gather(*asked), WAIT))

    answers = asyncio.run(main())
    for value, got in zip((1, 2, 3), answers, strict=True):
        np.testing.assert_array_equal(got, answer(value))
    assert b.servable.calls == [[1], [2], [3]]
    assert b.servable.started_on[0] != b.servable.started_on[1], "the first two calls did not run side by side"


@pytest.mark.parametrize("why", ["signature-not-batchable", "batching-off"])
def test_unbatched_requests_run_one_call_each_whatever_their_size(bench: Callable[..., Bench], why: str):
    if why == "batching-off":
        b = bench(None)
    else:  # batching parameters given, but the signature cannot be concatenated along dimension 0
        b = bench(params(max_batch_size=2, batch_timeout_micros=LONG), Gated(batchable=False))

    async def main() -> list[np.ndarray]:
        # Neither batch timeout nor max_batch_size applies: 5 rows are not refused, nobody waits 30 s.
        return list(await asyncio.wait_for(asyncio.gather(b.ask(1), b.ask(2, 3), b.ask(4, 5, 6, 7, 8)), WAIT))

    one, two, five = asyncio.run(main())
    np.testing.assert_array_equal(one, answer(1))
    np.testing.assert_array_equal(two, answer(2, 3))
    np.testing.assert_array_equal(five, answer(4, 5, 6, 7, 8))
    assert sorted(b.servable.calls) == [[1], [2, 3], [4, 5, 6, 7, 8]]
    assert sorted(b.shapes()) == [(1, 1, 1), (2, 2, 1), (5, 5, 1)]
    # An unbatched call's queue time is its wait for a thread (and for its turn): one figure, never negative.
    assert all(len(r.queue_seconds) == 1 and 0.0 <= r.queue_seconds[0] < WAIT for r in b.records)
    assert b.scheduler.queue_depths() == []


def test_different_signatures_and_output_sets_never_share_a_batch(bench: Callable[..., Bench]):
    b = bench(params(max_batch_size=2, batch_timeout_micros=LONG))
    # Interleaved: each of the three queues fills (2 rows) and runs; nothing waits for the long timeout.
    asked = [(1.0, "serving_default", ("y",)), (10.0, "other", ("y",)), (100.0, "serving_default", ())]
    asked = asked + [(v * 2, signature, outputs) for v, signature, outputs in asked]

    async def main() -> list[np.ndarray]:
        return list(
            await asyncio.wait_for(
                asyncio.gather(*(b.ask(v, signature=s, outputs=outputs) for v, s, outputs in asked)), WAIT
            )
        )

    answers = asyncio.run(main())
    for (value, _, _), got in zip(asked, answers, strict=True):
        np.testing.assert_array_equal(got, answer(value))
    assert sorted(b.servable.calls) == [[1, 2], [10, 20], [100, 200]]
    assert sorted(r.signature for r in b.records) == ["other", "serving_default", "serving_default"]
    assert b.shapes() == [(2, 2, 2)] * 3


def test_batch_records_report_rows_padding_tasks_and_each_tasks_queue_wait(bench: Callable[..., Bench]):
    held = 0.005
    delay = 0.002
    b = bench(params(max_batch_size=4, allowed_batch_sizes=(2, 4)), Gated(delay=delay))
    b.servable.hold()

    async def main() -> None:
        first = asyncio.ensure_future(b.ask(1))
        await until(lambda: b.servable.calls, "the first call at the gate")
        queued = [asyncio.ensure_future(b.ask(2, 3))]
        await asyncio.sleep(0)  # the second request queues a loop turn before the third
        queued.append(asyncio.ensure_future(b.ask(4)))
        await until(lambda: b.queued_rows() == 3, "3 rows queued behind the gate")
        shut = time.perf_counter()
        await until(lambda: time.perf_counter() - shut >= held, "the gate held a little")
        b.servable.gate.set()
        await asyncio.wait_for(asyncio.gather(first, *queued), WAIT)

    asyncio.run(main())
    alone, merged = b.records
    assert (alone.model, alone.version, alone.signature) == ("m", VERSION, "serving_default")
    assert (alone.size, alone.padded_size, alone.tasks) == (1, 2, 1)
    assert len(alone.queue_seconds) == 1 and alone.run_seconds >= held + delay  # its call waited at the gate
    assert (merged.size, merged.padded_size, merged.tasks) == (3, 4, 2)
    assert len(merged.queue_seconds) == 2
    assert merged.queue_seconds[0] >= merged.queue_seconds[1] >= held, "per task, oldest first"
    assert delay <= merged.run_seconds < WAIT
    assert b.servable.batches == [2, 4]


@pytest.mark.parametrize(("platform", "may_inline"), [("fake", False), ("tensorflow", True)])
def test_only_a_cheap_call_of_an_inline_platform_moves_onto_the_event_loop(
    bench: Callable[..., Bench], monkeypatch: pytest.MonkeyPatch, platform: str, may_inline: bool
):
    monkeypatch.setattr(RunCost, "INLINE_BUDGET_SECONDS", 0.5)  # a busy test machine's hiccups stay in budget
    servable = Gated()
    servable.platform = platform
    b = bench(params(max_batch_size=8), servable, inline_cheap_calls=True)
    count = RunCost.SETTLE_RUNS + 3

    async def main() -> list[np.ndarray]:
        return [await asyncio.wait_for(b.ask(v), WAIT) for v in range(count)]

    answers = asyncio.run(main())
    for value, got in enumerate(answers):
        np.testing.assert_array_equal(got, answer(value))
    loop_thread = threading.current_thread().name  # asyncio.run's loop runs on this thread
    on_loop = [name == loop_thread for name in servable.threads]
    settle = RunCost.SETTLE_RUNS
    assert on_loop == [False] * settle + [may_inline] * (count - settle), servable.threads
    assert all(name.startswith(THREAD_PREFIX) for name, here in zip(servable.threads, on_loop, strict=True) if not here)
    assert b.shapes() == [(1, 1, 1)] * count, "a call on the loop is recorded as one on a thread is"


@pytest.mark.parametrize("why", ["no batching", "a signature that cannot batch"])
def test_run_now_answers_a_cheap_unbatched_call_at_once_and_records_it_as_run_does(
    bench: Callable[..., Bench], monkeypatch: pytest.MonkeyPatch, why: str
):
    monkeypatch.setattr(RunCost, "INLINE_BUDGET_SECONDS", 0.5)  # a busy test machine's hiccups stay in budget
    servable = Gated(batchable=why == "no batching")
    servable.platform = "tensorflow"
    b = bench(None if why == "no batching" else params(max_batch_size=8), servable, inline_cheap_calls=True)
    signature = servable.signatures["serving_default"]

    def now(value: float) -> dict[str, np.ndarray] | None:
        return b.scheduler.run_now(servable, signature, {"x": column(value)}, ["y"])

    async def main() -> None:
        assert now(-1.0) is None, "a signature not yet proven cheap is awaited through run(), on a thread"
        for value in range(RunCost.SETTLE_RUNS):
            await asyncio.wait_for(b.ask(value), WAIT)
        calls, records = len(servable.calls), len(b.records)
        answered = now(7.0)
        assert answered is not None and set(answered) == {"y"}
        np.testing.assert_array_equal(answered["y"], answer(7.0))
        assert servable.threads[-1] == threading.current_thread().name, "run on the loop's own thread"
        assert len(servable.calls) == calls + 1
        assert b.records[records:] and b.shapes()[-1] == (1, 1, 1), "recorded as a batch of one, as run() records it"

    asyncio.run(main())


def test_run_now_leaves_a_batched_call_to_the_queue(bench: Callable[..., Bench], monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(RunCost, "INLINE_BUDGET_SECONDS", 0.5)
    servable = Gated()
    servable.platform = "tensorflow"
    b = bench(params(max_batch_size=8), servable, inline_cheap_calls=True)

    async def main() -> None:
        for value in range(RunCost.SETTLE_RUNS + 2):  # proven cheap: its batches run on the loop, through the queue
            await asyncio.wait_for(b.ask(value), WAIT)
        calls = len(servable.calls)
        assert b.scheduler.run_now(servable, servable.signatures["serving_default"], {"x": column(1.0)}, ["y"]) is None
        assert len(servable.calls) == calls, "nothing ran: batched requests share batches through the queue"

    asyncio.run(main())


@pytest.mark.parametrize("batching", [True, False], ids=["batching", "no batching"])
def test_with_one_client_a_call_over_the_inline_budget_runs_on_the_loop_once_its_cost_is_known(
    bench: Callable[..., Bench], monkeypatch: pytest.MonkeyPatch, batching: bool
):
    """A call too slow to run on the loop under load (over the inline budget) runs there for the server's one client,
    once a few calls told its cost; every other request's call still goes to a thread, and the calls made for the one
    client never put the model's calls on the loop for everyone."""
    # No call, nor its thread CPU (a sleep uses next to none), is ever under this: no probe on the loop either.
    monkeypatch.setattr(RunCost, "INLINE_BUDGET_SECONDS", 1e-9)
    monkeypatch.setattr(RunCost, "ONE_CLIENT_BUDGET_SECONDS", 0.5)  # and always does for one client, machine busy
    servable = Gated(delay=0.002)
    servable.platform = "tensorflow"
    b = bench(params(max_batch_size=8) if batching else None, servable, inline_cheap_calls=True)
    settle = RunCost.SETTLE_RUNS

    async def main() -> None:
        for value in range(settle + 3):
            np.testing.assert_array_equal(await asyncio.wait_for(b.ask(value, one_client=True), WAIT), answer(value))
        for value in range(100, 103):
            np.testing.assert_array_equal(await asyncio.wait_for(b.ask(value), WAIT), answer(value))

    asyncio.run(main())
    loop_thread = threading.current_thread().name  # asyncio.run's loop runs on this thread
    on_loop = [name == loop_thread for name in servable.threads]
    assert on_loop == [False] * settle + [True] * 3 + [False] * 3, servable.threads
    assert len(b.records) == settle + 6, "a call run for one client is recorded as any other"
    assert b.scheduler.queue_depths() == []


def test_run_now_answers_the_one_clients_unbatched_call_once_its_cost_is_known(
    bench: Callable[..., Bench], monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(RunCost, "INLINE_BUDGET_SECONDS", 1e-9)  # no call proves cheap, nor makes a probe
    monkeypatch.setattr(RunCost, "ONE_CLIENT_BUDGET_SECONDS", 0.5)
    servable = Gated(delay=0.002)
    servable.platform = "tensorflow"
    b = bench(None, servable, inline_cheap_calls=True)
    signature = servable.signatures["serving_default"]

    def now(value: float, one_client: bool) -> dict[str, np.ndarray] | None:
        return b.scheduler.run_now(servable, signature, {"x": column(value)}, ["y"], one_client)

    async def main() -> None:
        assert now(-1.0, True) is None, "its cost is not known yet"
        for value in range(RunCost.SETTLE_RUNS):
            await asyncio.wait_for(b.ask(value), WAIT)
        assert now(-2.0, False) is None, "over the inline budget: a thread's, but for one client"
        answered = now(7.0, True)
        assert answered is not None
        np.testing.assert_array_equal(answered["y"], answer(7.0))
        assert servable.threads[-1] == threading.current_thread().name, "run on the loop's own thread"

    asyncio.run(main())


@pytest.mark.parametrize("platform", ["fake", "python"])
def test_a_platform_that_may_not_run_on_the_loop_never_does_for_one_client(
    bench: Callable[..., Bench], monkeypatch: pytest.MonkeyPatch, platform: str
):
    monkeypatch.setattr(RunCost, "ONE_CLIENT_BUDGET_SECONDS", 0.5)
    servable = Gated()
    servable.platform = platform  # a Python model's call may wait on I/O: never on the loop
    b = bench(None, servable, inline_cheap_calls=True)

    async def main() -> None:
        for value in range(RunCost.SETTLE_RUNS + 3):
            await asyncio.wait_for(b.ask(value, one_client=True), WAIT)

    asyncio.run(main())
    assert all(name.startswith(THREAD_PREFIX) for name in servable.threads), servable.threads


def test_a_call_for_one_client_is_known_by_its_typical_wall_time_and_leaves_the_inline_rule_alone():
    cost = RunCost()
    budget = RunCost.ONE_CLIENT_BUDGET_SECONDS
    for _ in range(RunCost.SETTLE_RUNS - 1):
        cost.record(budget / 4, on_loop=False, cpu_seconds=budget / 4)
    assert not cost.runs_for_one_client(), "not before SETTLE_RUNS calls"
    cost.record(budget / 4, on_loop=False, cpu_seconds=budget / 4)
    assert cost.runs_for_one_client()
    for _ in range(50):
        cost.record_for_one_client(budget / 2)
    assert cost.runs_for_one_client() and not cost.runs_on_loop() and not cost.inline
    for _ in range(50):  # the model grew slow (a bigger batch, a busy machine): back to the threads
        cost.record(budget * 3, on_loop=False)
    assert not cost.runs_for_one_client()
    assert not RunCost(allowed=False).runs_for_one_client()


class FakeClock:
    """time.monotonic as the test sets it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(run_cost, "time", fake)
    return fake


def test_a_call_cheap_in_cpu_but_slowed_by_the_gil_makes_the_next_call_a_probe_on_the_loop(clock: FakeClock):
    # Under load from the first request, a thread's wall time is mostly its wait for the GIL: never under budget.
    budget = RunCost.INLINE_BUDGET_SECONDS
    cost = RunCost()
    cost.record(budget * 10, on_loop=False)  # no CPU time measured: nothing to go on
    assert not cost.runs_on_loop()
    cost.record(budget * 10, on_loop=False, cpu_seconds=budget / 4)
    assert cost.runs_on_loop() and not cost.inline, "a probe, not yet the calls"
    cost.record(budget / 2, on_loop=True)  # the probe, timed on the loop: cheap
    assert cost.inline and cost.runs_on_loop()


def test_a_probe_over_budget_sends_the_calls_back_and_the_next_probe_waits_twice_as_long_each_time(clock: FakeClock):
    budget, first = RunCost.INLINE_BUDGET_SECONDS, RunCost.FIRST_PROBE_WAIT_SECONDS
    cost = RunCost()
    waits = []
    for _ in range(8):
        cost.record(budget * 10, on_loop=False, cpu_seconds=budget / 4)  # its work ran on the framework's threads
        assert cost.runs_on_loop()
        cost.record(budget * 5, on_loop=True)  # the probe shows the whole call: over budget
        assert not cost.inline
        cost.record(budget * 10, on_loop=False, cpu_seconds=budget / 4)
        started = clock.now
        while not cost.runs_on_loop():
            clock.now += first / 4
        waits.append(clock.now - started)
    assert waits[:4] == [first, 2 * first, 4 * first, 8 * first]
    assert waits[-1] == RunCost.LAST_PROBE_WAIT_SECONDS
    cost.record(budget / 2, on_loop=True)  # cheap at last (a smaller batch, a quieter machine): back on the loop
    assert cost.inline
    cost.record(RunCost.HICCUP_SECONDS * 2, on_loop=True)  # settled there, one call far over budget: the model
    assert not cost.inline
    cost.record(budget * 10, on_loop=False, cpu_seconds=budget / 4)
    clock.now += first
    assert cost.runs_on_loop(), "a cheap probe started the waits over"


def test_one_call_a_little_over_budget_on_the_loop_is_a_hiccup_and_two_in_a_row_are_the_model(clock: FakeClock):
    budget = RunCost.INLINE_BUDGET_SECONDS
    cost = RunCost()
    cost.record(budget * 10, on_loop=False, cpu_seconds=budget / 4)
    cost.record(budget / 2, on_loop=True)
    assert cost.inline
    for _ in range(3):  # the loop's thread preempted now and then, between cheap calls
        cost.record(budget * 3, on_loop=True)
        assert cost.inline
        cost.record(budget / 2, on_loop=True)
    cost.record(budget * 3, on_loop=True)
    cost.record(budget * 3, on_loop=True)
    assert not cost.inline, "two in a row over budget"


def test_calls_on_the_loop_that_another_process_preempted_stay_there_while_their_own_cpu_is_cheap(clock: FakeClock):
    budget = RunCost.INLINE_BUDGET_SECONDS
    cost = RunCost()
    cost.record(budget * 10, on_loop=False, cpu_seconds=budget / 4)
    cost.record(budget / 2, on_loop=True)
    assert cost.inline
    for _ in range(5):  # a busy machine: the loop's core taken during call after call, far past the hiccup bound
        cost.record(RunCost.HICCUP_SECONDS * 3, on_loop=True, cpu_seconds=budget / 4, preempted=True)
        assert cost.inline
    # Preempted, but its own CPU time over budget: the model is slow (two in a row, as without preemption)
    cost.record(budget * 3, on_loop=True, cpu_seconds=budget * 2, preempted=True)
    cost.record(budget * 3, on_loop=True, cpu_seconds=budget * 2, preempted=True)
    assert not cost.inline
    waiting = RunCost()  # not preempted: it waited on its own (the framework's threads, I/O): its wall time counts
    waiting.record(budget * 10, on_loop=False, cpu_seconds=budget / 4)
    waiting.record(budget / 2, on_loop=True)
    waiting.record(RunCost.HICCUP_SECONDS * 3, on_loop=True, cpu_seconds=budget / 4, preempted=False)
    assert not waiting.inline


def test_a_threads_marks_say_its_cpu_time_and_whether_it_was_preempted():
    mark = run_cost.thread_mark()
    deadline = time.thread_time() + 0.02
    while time.thread_time() < deadline:  # 20 ms of this thread's own CPU
        pass
    cpu, _ = run_cost.since(mark)
    assert 0.015 <= cpu < 5.0
    quiet = run_cost.thread_mark()
    time.sleep(0.01)  # a wait of its own accord: no CPU, and never taken for a preemption, whatever the OS did
    cpu, preempted = run_cost.since(quiet)
    assert cpu < 0.005 and not preempted


def test_no_probe_for_a_call_that_waited_long_or_used_its_cpu_or_whose_platform_may_wait_on_io(clock: FakeClock):
    budget = RunCost.INLINE_BUDGET_SECONDS
    waited = RunCost()  # little CPU, a long wall time: a wait on I/O rather than for the GIL
    waited.record(RunCost.PROBE_WALL_LIMIT_SECONDS * 2, on_loop=False, cpu_seconds=budget / 10)
    busy = RunCost()
    busy.record(budget * 10, on_loop=False, cpu_seconds=budget * 2)
    user_code = RunCost(allowed=False)
    user_code.record(budget * 10, on_loop=False, cpu_seconds=budget / 10)
    for _ in range(RunCost.SETTLE_RUNS):
        user_code.record(budget / 10, on_loop=False, cpu_seconds=budget / 10)
    assert not any(cost.runs_on_loop() for cost in (waited, busy, user_code))


# ====================================================================================== the cost curve
def test_the_cost_curve_fits_fixed_and_per_row_costs_once_batch_sizes_vary():
    curve = CostCurve()
    for _ in range(CostCurve.MIN_BATCHES):
        curve.record(4, 0.010)
    assert curve.line() is None, "batches of one size cannot separate the fixed cost from the rows'"
    for rows in (1, 2, 8, 16, 32, 3, 5, 7):
        curve.record(rows, 0.004 + 0.0001 * rows)
    for rows in (1, 2, 8, 16, 32, 3, 5, 7):
        curve.record(rows, 0.004 + 0.0001 * rows)
    line = curve.line()
    assert line is not None
    fixed, per_row = line
    assert fixed == pytest.approx(0.004 + 0.006 * 0.5, rel=0.5)  # the equal-size batches pull it up a little
    assert 0 <= per_row < 0.0005


def test_a_curve_of_rows_alone_never_holds_a_batch_back():
    curve = CostCurve()
    for rows in [1, 2, 4, 8, 16, 32, 64, 3, 5, 9] * 2:
        curve.record(rows, 0.00005 * rows)
        curve.record(rows, 0.0002 * rows, beside=True)
    line = curve.line()
    assert line is not None and line[0] == pytest.approx(0, abs=1e-6)
    assert not curve.fills_first(1)


def fixed_cost_curve(beside_factor: float | None) -> CostCurve:
    """Calls of 4 ms whatever their rows alone; beside another batch, ``beside_factor`` times that (None: never)."""
    curve = CostCurve()
    for rows in [1, 2, 8, 16, 32, 3, 5, 7] * 2:
        curve.record(rows, 0.004 + 0.00001 * rows)
        if beside_factor is not None:
            curve.record(rows, beside_factor * 0.004 + 0.00001 * rows, beside=True)
    return curve


def test_a_fixed_cost_holds_a_small_batch_back_only_where_overlapping_calls_slow_each_other_down():
    assert fixed_cost_curve(2.0).fills_first(8)  # a GIL-bound model on shared cores
    assert not fixed_cost_curve(2.0).fills_first(4096)  # a batch that large pays for its own call
    assert not fixed_cost_curve(1.05).fills_first(8)  # a GPU's kernels or waits: overlapping is free
    assert not fixed_cost_curve(None).fills_first(8)  # not learnt yet: batches still overlap, and it is learnt


class Contended(Gated):
    """Calls that cost 20 ms of one shared resource (a lock, as the GIL and the cores are): two at once take turns."""

    def __init__(self) -> None:
        super().__init__()
        self._resource = threading.Lock()
        self.entered = 0  # calls begun, before they wait for the resource
        self.spin = False

    def run(
        self, signature: Signature, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        self.entered += 1
        with self._resource:
            if self.spin:  # 20 ms of the thread's own CPU, as a model that holds the GIL or a core spends
                started = time.thread_time()
                while time.thread_time() - started < 0.02:
                    pass
            else:  # 20 ms to the dot: the tests that time calls alone against side by side
                time.sleep(0.02)
        return super().run(signature, inputs, outputs)


def test_a_model_whose_calls_cost_mostly_their_fixed_part_and_compete_fills_a_batch_instead_of_starting_a_second(
    bench: Callable[..., Bench], monkeypatch: pytest.MonkeyPatch
):
    """Two batch threads. The curve learns from the batches run that a call costs 20 ms whatever its rows, and more
    beside another; then requests that arrive one by one while a batch runs wait for it and run together, instead of
    a second call for each."""
    monkeypatch.setattr(CostCurve, "MIN_BATCHES", 4)
    # Pairs take turns: 20 and 40 ms, 1.5 times a call alone, on a quiet machine. A busy one adds its wake-up delay
    # to every call alike, which shrinks the ratio (a whole-suite run with both cores burning never saw 1.2 in 200
    # rounds); a model whose calls overlap freely stays at 1.0.
    monkeypatch.setattr(CostCurve, "CONTENDED", 1.1)
    model = Contended()
    b = bench(params(max_batch_size=16, num_batch_threads=2), model)

    async def pair(size: int) -> None:  # two of the same size side by side, on the two threads
        entered = model.entered
        first = asyncio.ensure_future(b.ask(*range(size)))
        await until(lambda: model.entered > entered, "the first of the pair running")
        await asyncio.wait_for(asyncio.gather(first, b.ask(*range(size))), WAIT)

    async def main() -> None:
        for size in (1, 2, 3, 4, 5):  # alone, of several sizes
            await asyncio.wait_for(b.ask(*range(size)), WAIT)
        for size in (1, 2, 3, 4, 5):
            await pair(size)
        # Learnt from wall times: on a busy machine a batch alone can be preempted into looking as slow as a pair.
        # More of both, until the curve has seen the calls compete (a bounded number of rounds).
        known = next(iter(b.scheduler._known[id(model)].values()))  # what it learnt
        for round_ in range(200):
            if known.curve.fills_first(1):
                break
            size = 1 + round_ % 5
            await asyncio.wait_for(b.ask(*range(size)), WAIT)
            await pair(size)
        b.servable.calls.clear()
        b.servable.hold()
        first = asyncio.ensure_future(b.ask(100))
        await until(lambda: len(b.servable.calls) == 1, "the first call at the gate")
        later = []
        # One a loop turn: each could start a batch of its own on the free thread. (Not a timed sleep between them: on
        # a busy machine 2 ms became longer than the call's cost, and a request that waited that long rightly ran.)
        for value in range(6):
            later.append(asyncio.ensure_future(b.ask(value)))
            await asyncio.sleep(0)
        await until(lambda: b.queued_rows() == 6, "6 rows waiting")
        assert len(b.servable.calls) == 1, "a small second batch started beside the running one"
        b.servable.gate.set()
        answers = await asyncio.wait_for(asyncio.gather(first, *later), WAIT)
        for value, got in zip((100, *range(6)), answers, strict=True):
            np.testing.assert_array_equal(got, answer(value))

    asyncio.run(main())
    assert b.servable.calls == [[100], [0, 1, 2, 3, 4, 5]]


def fixed_cost_bench(
    bench: Callable[..., Bench], monkeypatch: pytest.MonkeyPatch, quiet_share: float, longest_share: float
) -> Bench:
    """One batch thread on :class:`Contended` (20 ms a call whatever its rows), the cost curve learning from 4
    batches, its gathering waits ``quiet_share`` and ``longest_share`` of that cost."""
    monkeypatch.setattr(CostCurve, "MIN_BATCHES", 4)
    monkeypatch.setattr(CostCurve, "GATHER_QUIET_SHARE", quiet_share)
    monkeypatch.setattr(CostCurve, "GATHER_LONGEST_SHARE", longest_share)
    return bench(params(max_batch_size=8), Contended())


async def teach_the_fixed_cost(b: Bench) -> None:
    """Single requests of 1 to 5 rows: the curve learns 20 ms whatever the rows (and no batch of several ran)."""
    for size in (1, 2, 3, 4, 5):
        await asyncio.wait_for(b.ask(*range(size)), WAIT)


def test_the_next_batch_of_a_fixed_cost_model_takes_in_the_requests_its_answers_bring_back_before_it_starts(
    bench: Callable[..., Bench], monkeypatch: pytest.MonkeyPatch
):
    """Four clients in a closed loop on a model whose call costs 20 ms whatever its rows, one batch thread. An
    answered client's next request reaches the queue a loop turn or two after the batch ended (as a server's
    sockets are read once its thread lets go of the GIL): the next batch waits those turns and takes it in, so
    batches settle at every client's row, where they used to alternate between those left waiting and the rest."""
    # Waits of 10 and 20 ms rather than 2 and 5: a busy test machine's loop turns stay well inside them.
    b = fixed_cost_bench(bench, monkeypatch, 0.5, 1.0)

    async def client(values: range) -> None:
        for value in values:
            await asyncio.sleep(0)  # a turn to send it: it reaches the queue after the batch that answered it ended
            np.testing.assert_array_equal(await asyncio.wait_for(b.ask(value), WAIT), answer(value))

    async def main() -> None:
        await teach_the_fixed_cost(b)
        b.records.clear()
        await asyncio.gather(*(client(range(k * 10, k * 10 + 6)) for k in range(4)))

    asyncio.run(main())
    sizes = [record.size for record in b.records]
    # The first batch is the first client's row alone; after it every batch holds each client's next row (the last
    # lacks the first client's, done one batch earlier). Without the gathering: 1, 3, 1, 3...
    assert sizes[1:-1] == [4] * (len(sizes) - 2), f"the batches did not fill with every client's row: {sizes}"


def test_the_answered_callers_of_a_fixed_cost_model_are_awaited_together_when_they_come_back_over_several_turns(
    bench: Callable[..., Bench], monkeypatch: pytest.MonkeyPatch
):
    """As above, but each client sends its next request a different trip after its answer (1 to 4 ms: over a real
    network's sockets they arrive over several loop turns, not in one). The first back waits for the others: every
    batch after the first holds every client's row, where the first back used to start a batch of its own and the
    rest ran as the next one (1, 3, 1, 3...). The wait ends as soon as every answered caller is back."""
    # A quiet spell of 50 ms and 100 ms in all: far beyond the clients' trips, even on a busy machine; the batch
    # starts once all four are back, so the test does not wait them out.
    b = fixed_cost_bench(bench, monkeypatch, 2.5, 5.0)

    async def client(index: int, values: range) -> None:
        for value in values:
            await asyncio.sleep(0.001 * (index + 1))  # its trip: each client's next request a different turn
            np.testing.assert_array_equal(await asyncio.wait_for(b.ask(value), WAIT), answer(value))

    async def main() -> None:
        await teach_the_fixed_cost(b)
        b.records.clear()
        await asyncio.gather(*(client(k, range(k * 10, k * 10 + 6)) for k in range(4)))

    asyncio.run(main())
    sizes = [record.size for record in b.records]
    # The first batch is the first client's row alone (then no batch had ended full); the answers of every later
    # batch come back together, but the last, which lacks the clients done a batch earlier.
    assert sizes[1:-1] == [4] * (len(sizes) - 2), f"the answered callers did not come back as one batch: {sizes}"


def test_a_caller_back_alone_runs_once_the_others_stay_away_for_the_quiet_spell(
    bench: Callable[..., Bench], monkeypatch: pytest.MonkeyPatch
):
    """Callers answered together (the first of four on the idle model at once, the other three as one batch), and
    only one of them comes back: it waits the quiet spell for the others, then runs alone; a request after it (the
    last batch was of one) runs at once."""
    # A quiet spell of half a second: the loop turns below stay well inside it, even on a busy machine.
    b = fixed_cost_bench(bench, monkeypatch, 25.0, 50.0)

    async def main() -> None:
        await teach_the_fixed_cost(b)
        b.records.clear()
        together = await asyncio.wait_for(asyncio.gather(*(b.ask(v) for v in range(4))), WAIT)
        for value, got in enumerate(together):
            np.testing.assert_array_equal(got, answer(value))
        calls = len(b.servable.calls)
        back = asyncio.ensure_future(b.ask(7))
        for _ in range(5):  # loop turns in which a request that did not wait would have been dispatched
            await asyncio.sleep(0)
        assert b.queued_rows() == 1 and len(b.servable.calls) == calls, "the caller back did not wait for the others"
        np.testing.assert_array_equal(await asyncio.wait_for(back, WAIT), answer(7))
        np.testing.assert_array_equal(await asyncio.wait_for(b.ask(8), WAIT), answer(8))

    asyncio.run(main())
    assert [record.size for record in b.records] == [1, 3, 1, 1]


def test_the_requests_waiting_when_a_batch_ends_wait_for_its_answered_callers_however_long_the_silence_first(
    bench: Callable[..., Bench], monkeypatch: pytest.MonkeyPatch
):
    """A batch of one runs while three requests queue behind it. When it ends, the three wait for its caller's next
    request as well, and start with it the moment it arrives: one batch of four, not three then one. The quiet
    spell (1 ms here) counts from the first arrival after the batch ended, not from its end: the loop writes a
    batch's answers before it reads a socket again, and over gRPC that silence outlasts a quiet spell."""
    # A quiet spell of 1 ms, 5 s in all: the silence below lasts 20 times the quiet spell, and the test ends when
    # the caller comes back, long before the 5 s.
    b = fixed_cost_bench(bench, monkeypatch, 0.05, 250.0)

    async def main() -> None:
        await teach_the_fixed_cost(b)
        b.records.clear()
        first = asyncio.ensure_future(b.ask(0))  # the model is idle: it runs at once
        await until(lambda: b.servable.entered > 5, "the first request's call running")
        waiting = [asyncio.ensure_future(b.ask(value)) for value in (1, 2, 3)]
        np.testing.assert_array_equal(await asyncio.wait_for(first, WAIT), answer(0))
        await asyncio.sleep(0.02)  # the answered caller's trip back
        assert b.queued_rows() == 3 and b.servable.entered == 6, "the three waiting ran without their answered caller"
        back = asyncio.ensure_future(b.ask(4))
        answers = await asyncio.wait_for(asyncio.gather(*waiting, back), WAIT)
        for value, got in zip((1, 2, 3, 4), answers, strict=True):
            np.testing.assert_array_equal(got, answer(value))

    asyncio.run(main())
    assert [record.size for record in b.records] == [1, 4]


def test_the_requests_waiting_when_a_batch_ends_run_without_an_answered_caller_that_never_comes_back(
    bench: Callable[..., Bench], monkeypatch: pytest.MonkeyPatch
):
    """As above, but the answered caller sends nothing more: the three waiting start together once the gather's
    longest (50 ms here) has passed, with no arrival to start a quiet spell."""
    b = fixed_cost_bench(bench, monkeypatch, 0.05, 2.5)

    async def main() -> None:
        await teach_the_fixed_cost(b)
        b.records.clear()
        first = asyncio.ensure_future(b.ask(0))
        await until(lambda: b.servable.entered > 5, "the first request's call running")
        waiting = [asyncio.ensure_future(b.ask(value)) for value in (1, 2, 3)]
        answers = await asyncio.wait_for(asyncio.gather(first, *waiting), WAIT)
        for value, got in enumerate(answers):
            np.testing.assert_array_equal(got, answer(value))

    asyncio.run(main())
    assert [record.size for record in b.records] == [1, 3]


def test_a_lone_callers_request_is_not_held_for_others_after_its_answer(
    bench: Callable[..., Bench], monkeypatch: pytest.MonkeyPatch
):
    """One client on the same fixed-cost model: a batch of one answered expects nobody back, so its next request
    runs at once (as with the waits 100 s long, it would otherwise wait a quiet spell first)."""
    b = fixed_cost_bench(bench, monkeypatch, 5000.0, 5000.0)

    async def main() -> None:
        await teach_the_fixed_cost(b)
        for value in range(4):
            await asyncio.sleep(0.001)
            np.testing.assert_array_equal(await asyncio.wait_for(b.ask(value), WAIT), answer(value))

    asyncio.run(main())


def test_a_model_whose_overlapping_calls_cost_what_they_cost_alone_keeps_overlapping(
    bench: Callable[..., Bench], monkeypatch: pytest.MonkeyPatch
):
    """The same fixed cost, but calls that wait without competing (a GPU's kernels, I/O): the free thread starts the
    next batch at once, as without a cost curve."""
    monkeypatch.setattr(CostCurve, "MIN_BATCHES", 4)
    b = bench(params(max_batch_size=16, num_batch_threads=2), Gated(delay=0.02))

    async def main() -> None:
        for size in (1, 2, 3, 4, 5):
            await asyncio.wait_for(b.ask(*range(size)), WAIT)
        for size in (1, 2, 3, 4, 5):
            calls = len(b.servable.calls)
            first = asyncio.ensure_future(b.ask(*range(size)))
            await until(lambda: len(b.servable.calls) > calls, "the first of the pair running")  # noqa: B023
            await asyncio.wait_for(asyncio.gather(first, b.ask(*range(size))), WAIT)
        b.servable.calls.clear()
        b.servable.hold()
        first = asyncio.ensure_future(b.ask(100))
        await until(lambda: len(b.servable.calls) == 1, "the first call at the gate")
        second = asyncio.ensure_future(b.ask(7))
        await until(lambda: len(b.servable.calls) == 2, "the second call started beside the first")
        b.servable.gate.set()
        await asyncio.wait_for(asyncio.gather(first, second), WAIT)

    asyncio.run(main())
    assert b.servable.calls == [[100], [7]]


# ====================================================================================== unbatched calls that compete
def test_unbatched_calls_contend_only_when_overlapping_makes_them_slower_and_they_are_not_cheap():
    def contention(alone: float, beside: float, calls: int = Contention.MIN_CALLS) -> Contention:
        seen = Contention()
        for _ in range(calls):
            seen.record(alone, beside=False)
            seen.record(beside, beside=True)
        return seen

    assert contention(0.004, 0.012).contended()  # three times slower side by side: a GIL-bound model
    assert not contention(0.004, 0.0044).contended()  # they overlap freely
    assert not contention(0.0002, 0.002).contended()  # cheap calls: a turn's hand-off costs more than the overlap
    assert not contention(0.004, 0.012, calls=Contention.MIN_CALLS - 1).contended()  # not seen enough yet
    under_load_from_the_start = Contention()
    for _ in range(Contention.MIN_CALLS):
        under_load_from_the_start.record(0.012, beside=True)
    assert under_load_from_the_start.takes_turns() and not under_load_from_the_start.contended()
    cheap_side_by_side = Contention()  # calls of microseconds: nothing to learn, they never take turns
    for _ in range(Contention.MIN_CALLS * 2):
        cheap_side_by_side.record(0.0002, beside=True)
    assert not cheap_side_by_side.takes_turns()
    for _ in range(Contention.MIN_CALLS):
        under_load_from_the_start.record(0.004, beside=False)  # the calls that took turns ran alone
    assert under_load_from_the_start.contended()


class Concurrency(Contended):
    """:class:`Contended`, counting how many of its calls are inside at once (the most, ever)."""

    def __init__(self, contended: bool = True) -> None:
        super().__init__()
        self.contended = contended
        self.inside = 0
        self.most = 0
        self.entries: list[int] = []  # how many were inside as each call entered, itself included
        self._count = threading.Lock()

    def run(
        self, signature: Signature, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        with self._count:
            self.inside += 1
            self.most = max(self.most, self.inside)
            self.entries.append(self.inside)
        try:
            if self.contended:
                return super().run(signature, inputs, outputs)
            self.entered += 1
            time.sleep(0.02)  # waits, taking nothing from the others
            return Gated.run(self, signature, inputs, outputs)
        finally:
            with self._count:
                self.inside -= 1


async def teach(b: Bench, model: Concurrency) -> None:
    """Unbatched calls alone, then in pairs side by side, until the contention is known. A contending model's is
    learnt from wall times: on a busy machine a call alone can be preempted into looking as slow as a pair, so the
    calls go on, one alone and a pair, until the scheduler has seen its calls contend (a bounded number of rounds)."""

    async def pair(value: int) -> None:
        entered = model.entered
        first = asyncio.ensure_future(b.ask(value))
        await until(lambda: model.entered > entered, "the first of the pair running")
        await asyncio.wait_for(asyncio.gather(first, b.ask(value)), WAIT)

    for value in range(Contention.MIN_CALLS):
        await asyncio.wait_for(b.ask(value), WAIT)
    for value in range(Contention.MIN_CALLS + 1):
        await pair(value)
    for value in range(200 if model.contended else 0):
        known = next(iter(b.scheduler._known[id(model)].values()))  # what it learnt
        if known.contention.contended():
            break
        await asyncio.wait_for(b.ask(value), WAIT)
        await pair(value)
    model.most = 0


def test_unbatched_calls_that_slow_each_other_down_take_turns_and_every_request_is_answered(
    bench: Callable[..., Bench], monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(Contention, "MIN_CALLS", 3)
    monkeypatch.setattr(Contention, "CONTENDED", 1.2)  # pairs take turns: 20 and 40 ms, 1.5 times a call alone
    model = Concurrency()
    b = bench(None, model)

    async def main() -> list[np.ndarray]:
        await teach(b, model)
        return list(await asyncio.wait_for(asyncio.gather(*(b.ask(v) for v in range(5))), WAIT))

    answers = asyncio.run(main())
    for value, got in enumerate(answers):
        np.testing.assert_array_equal(got, answer(value))
    assert model.most == 1, "contending calls ran side by side"


def test_calls_already_side_by_side_when_turns_begin_finish_and_then_one_runs_at_a_time(
    bench: Callable[..., Bench], monkeypatch: pytest.MonkeyPatch
):
    """A model under load from its first request: four requests always in flight. Once the calls are seen side by
    side, an ending call must not hand its place to a waiter while others still run: the concurrency falls to one
    (it used to stay at four, so the calls were never seen alone and never stopped contending)."""
    monkeypatch.setattr(Contention, "MIN_CALLS", 3)
    monkeypatch.setattr(Contention, "CONTENDED", 1.2)
    model = Concurrency()
    model.spin = True  # calls that use their thread's CPU: only those are made to take turns to be seen alone
    b = bench(None, model)

    async def client(values: range) -> None:
        for value in values:
            np.testing.assert_array_equal(await asyncio.wait_for(b.ask(value), WAIT), answer(value))

    async def main() -> None:
        await asyncio.gather(*(client(range(k * 10, k * 10 + 6)) for k in range(4)))
        # Learnt from wall times: on a busy machine a call alone can be preempted into looking as slow as those side
        # by side. More of the same load, until the calls were seen to contend (a bounded number of rounds).
        known = next(iter(b.scheduler._known[id(model)].values()))  # what it learnt
        for _ in range(50):
            if known.contention.contended():
                break
            await asyncio.gather(*(client(range(k * 10, k * 10 + 6)) for k in range(4)))
        await asyncio.gather(*(client(range(k * 10, k * 10 + 6)) for k in range(4)))

    asyncio.run(main())
    assert max(model.entries[:4]) > 1, "the first calls ran side by side"
    assert model.entries[-10:] == [1] * 10, f"calls still started beside others: {model.entries}"
    known = next(iter(b.scheduler._known[id(model)].values()))  # what it learnt
    assert known.contention.contended(), "the calls that took turns were seen alone"


def test_unbatched_calls_that_overlap_freely_keep_running_side_by_side(
    bench: Callable[..., Bench], monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(Contention, "MIN_CALLS", 3)
    model = Concurrency(contended=False)
    b = bench(None, model)

    async def main() -> None:
        await teach(b, model)
        await asyncio.wait_for(asyncio.gather(*(b.ask(v) for v in range(4))), WAIT)

    asyncio.run(main())
    assert model.most >= 2


def test_a_request_waiting_its_turn_whose_caller_gives_up_leaves_without_running(
    bench: Callable[..., Bench], monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(Contention, "MIN_CALLS", 3)
    monkeypatch.setattr(Contention, "CONTENDED", 1.2)  # pairs take turns: 20 and 40 ms, 1.5 times a call alone
    model = Concurrency()
    b = bench(None, model)

    async def main() -> None:
        await teach(b, model)
        model.calls.clear()
        model.hold()
        running = asyncio.ensure_future(b.ask(1))
        await until(lambda: model.calls == [[1]], "the first call at the gate")
        interest = Interest()
        given_up = asyncio.ensure_future(b.ask(2, interest=interest))
        third = asyncio.ensure_future(b.ask(3))
        known = next(iter(b.scheduler._known[id(model)].values()))  # its turns queue
        await until(lambda: len(known.turns) == 2, "both waiting their turn")
        assert model.calls == [[1]], "a call started beside a contending one"
        interest.give_up(ServingError(Code.CANCELLED, "Cancelled"))
        with pytest.raises(ServingError, match="Cancelled"):
            await asyncio.wait_for(given_up, WAIT)
        model.gate.set()
        await asyncio.wait_for(asyncio.gather(running, third), WAIT)

    asyncio.run(main())
    assert model.calls == [[1], [3]], "the request given up ran, or the next did not get its turn"


def test_turns_do_not_stall_behind_a_call_that_waits_instead_of_computing(
    bench: Callable[..., Bench], monkeypatch: pytest.MonkeyPatch
):
    """A contending model's call that hangs (on a lock, a file, a remote service) holds the turn: once no call has
    ended for the calls' patience, the waiters run beside it and are answered while it waits (they used to wait for
    it however long it took)."""
    monkeypatch.setattr(Contention, "MIN_CALLS", 3)
    monkeypatch.setattr(Contention, "CONTENDED", 1.2)
    monkeypatch.setattr(Contention, "STALL_FACTOR", 1.0)
    monkeypatch.setattr(Contention, "MIN_STALL_SECONDS", 0.05)
    model = Concurrency()
    b = bench(None, model)

    async def main() -> None:
        await teach(b, model)
        known = next(iter(b.scheduler._known[id(model)].values()))  # what it learnt
        assert known.contention.contended()
        model.calls.clear()
        model.hold()
        hung = asyncio.ensure_future(b.ask(1))
        await until(lambda: model.calls == [[1]], "the first call at the gate")
        model.held_only = {1.0}  # the calls after it compute and return
        waiting = [asyncio.ensure_future(b.ask(v)) for v in (2, 3, 4)]
        for value, got in zip((2, 3, 4), await asyncio.wait_for(asyncio.gather(*waiting), WAIT), strict=True):
            np.testing.assert_array_equal(got, answer(value))
        assert not hung.done(), "the hung call returned: nothing was proved"
        model.gate.set()
        np.testing.assert_array_equal(await asyncio.wait_for(hung, WAIT), answer(1))

    asyncio.run(main())


# ============================================================================ the next batch, staged for its thread
class PerRow(Gated):
    """A Gated servable whose calls cost ``per_row`` seconds a row and nothing fixed (a forward pass a row), and that
    knows which ``x`` values its calls compute right now."""

    def __init__(self, per_row: float = 0.002) -> None:
        super().__init__()
        self.per_row = per_row
        self.computing: set[float] = set()

    def run(
        self, signature: Signature, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        values = set(np.asarray(inputs["x"]).ravel().tolist())
        with self._calls_lock:
            self.computing |= values
        try:
            answered = super().run(signature, inputs, outputs)
            time.sleep(self.per_row * len(values))
            return answered
        finally:
            with self._calls_lock:
                self.computing -= values


async def teach_the_cost(b: Bench, rows_dominate: bool) -> None:
    """Single requests of 1 to 8 rows: the curve learns what a call costs by its rows (then the calls are
    forgotten), until it judges as the model is made (``rows_dominate``: whether 2 rows cost more than the call's
    fixed part). On a busy machine a sleeping call wakes late, which reads as a fixed part: more rounds of the same
    requests, a bounded number, until the curve has seen past it."""
    for _ in range(30):
        for size in range(1, 9):
            await asyncio.wait_for(b.ask(*range(100, 100 + size)), WAIT)
        known = next(iter(b.scheduler._known[id(b.servable)].values()))
        if known.curve.rows_dominate(2) == rows_dominate:
            break
    b.servable.calls.clear()
    b.servable.started_on.clear()
    b.records.clear()


def calls_started(model: Gated, count: int) -> bool:
    """Block this thread (the event loop's, in the tests below) until ``count`` calls started, or :data:`WAIT`."""
    deadline = time.monotonic() + WAIT
    while len(model.calls) < count:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


def test_the_batch_queued_behind_a_running_one_starts_as_it_ends_while_the_event_loop_is_busy(
    bench: Callable[..., Bench],
):
    """For a model whose calls cost their rows, requests that arrive while the only batch thread runs are formed into
    the next batch at once, and the thread starts it the moment its batch ends, on its own: with the event loop
    held up (as by a turn full of other requests' sockets) the second call still starts. It used to wait for the
    loop to form it."""
    b = bench(params(max_batch_size=8), PerRow())

    async def main() -> tuple[bool, list[np.ndarray]]:
        await teach_the_cost(b, rows_dominate=True)
        b.servable.hold()
        first = asyncio.ensure_future(b.ask(1))
        await until(lambda: b.servable.calls, "the first call at the gate")
        rest = [asyncio.ensure_future(b.ask(2)), asyncio.ensure_future(b.ask(3, 4))]
        await until(lambda: b.queued_rows() == 3, "3 rows queued behind the gate")
        b.servable.gate.set()
        started_while_busy = calls_started(b.servable, 2)  # the loop blocked here until the second call starts
        return started_while_busy, list(await asyncio.wait_for(asyncio.gather(first, *rest), WAIT))

    started_while_busy, (one, two, three_four) = asyncio.run(main())
    assert started_while_busy, "the next batch waited for the event loop"
    np.testing.assert_array_equal(one, answer(1))
    np.testing.assert_array_equal(two, answer(2))
    np.testing.assert_array_equal(three_four, answer(3, 4))
    assert b.servable.calls == [[1], [2, 3, 4]]
    assert b.servable.started_on[0] == b.servable.started_on[1], "the next batch did not run on the same thread"
    assert b.shapes() == [(1, 1, 1), (3, 3, 2)]
    assert all(seconds >= 0 for record in b.records for seconds in record.queue_seconds)
    assert b.scheduler.queue_depths() == []


@pytest.mark.parametrize("cost", ["fixed", "unknown"])
def test_the_next_batch_of_a_model_whose_calls_cost_mostly_a_fixed_part_or_are_unknown_is_left_to_the_loop(
    bench: Callable[..., Bench], cost: str
):
    """Where a call is known to cost mostly its fixed part, or its cost is not known yet, the next batch is formed
    by the loop when the running one ends (and grows meanwhile), never taken by the thread on its own: with the
    loop held up, the second call cannot start."""
    b = bench(params(max_batch_size=8), Gated(delay=0.002))

    async def main() -> tuple[bool, list[np.ndarray]]:
        if cost == "fixed":
            await teach_the_cost(b, rows_dominate=False)  # 2 ms a call whatever its rows
        b.servable.hold()
        first = asyncio.ensure_future(b.ask(1))
        await until(lambda: b.servable.calls, "the first call at the gate")
        rest = [asyncio.ensure_future(b.ask(2)), asyncio.ensure_future(b.ask(3))]
        await until(lambda: b.queued_rows() == 2, "2 rows queued behind the gate")
        b.servable.gate.set()
        time.sleep(0.3)  # the loop held up while the first call ends (2 ms): only a thread could start the next
        left = len(b.servable.calls) == 1
        return left, list(await asyncio.wait_for(asyncio.gather(first, *rest), WAIT))

    left_to_the_loop, answers = asyncio.run(main())
    assert left_to_the_loop, "the thread took the next batch on its own"
    for value, got in zip((1, 2, 3), answers, strict=True):
        np.testing.assert_array_equal(got, answer(value))
    assert b.servable.calls == [[1], [2, 3]]


def test_a_staged_request_given_up_never_runs_frees_its_rows_and_lets_go_of_its_model_at_once(
    bench: Callable[..., Bench],
):
    """A request formed into the next batch holds its model as a running one does (a thread may take it any
    moment); given up before the thread takes it, it leaves unrun, its rows free the queue, and its model is let go
    without waiting for the batch that runs."""
    b = bench(params(max_batch_size=8, max_enqueued_batches=1), PerRow())

    async def main() -> None:
        await teach_the_cost(b, rows_dominate=True)
        b.servable.hold()
        first = asyncio.ensure_future(b.ask(1))
        await until(lambda: b.servable.calls, "the first call at the gate")
        interest = Interest()
        given_up = asyncio.ensure_future(b.ask(2, 3, 4, 5, 6, 7, 8, 9, interest=interest))
        await until(lambda: b.queued_rows() == 8, "the request queued behind the gate")
        assert interest.running == 1, "the staged request does not hold its model"
        full = await asyncio.gather(b.ask(99), return_exceptions=True)
        assert isinstance(full[0], ServingError) and full[0].code == Code.UNAVAILABLE, "staged rows left the queue"
        let_go: list[bool] = []
        interest.answer_early(ServingError(Code.CANCELLED, "Cancelled"))
        interest.when_idle(lambda: let_go.append(True))
        assert let_go == [True], "the model stays held for a request that will never run"
        with pytest.raises(ServingError, match="Cancelled"):
            await asyncio.wait_for(given_up, WAIT)
        assert b.queued_rows() == 0
        later = asyncio.ensure_future(b.ask(10, 11))  # fits only because the given-up rows left the queue
        await until(lambda: b.queued_rows() == 2, "the later request queued")
        b.servable.gate.set()
        np.testing.assert_array_equal(await asyncio.wait_for(first, WAIT), answer(1))
        np.testing.assert_array_equal(await asyncio.wait_for(later, WAIT), answer(10, 11))

    asyncio.run(main())
    assert b.servable.calls == [[1], [10, 11]], "the given-up request reached the model"
    assert b.scheduler.queue_depths() == []


def test_a_staged_request_whose_awaiter_is_cancelled_never_runs(bench: Callable[..., Bench]):
    b = bench(params(max_batch_size=8), PerRow())

    async def main() -> None:
        await teach_the_cost(b, rows_dominate=True)
        b.servable.hold()
        first = asyncio.ensure_future(b.ask(1))
        await until(lambda: b.servable.calls, "the first call at the gate")
        cancelled = asyncio.ensure_future(b.ask(2))
        kept = asyncio.ensure_future(b.ask(3))
        await until(lambda: b.queued_rows() == 2, "2 rows queued behind the gate")
        cancelled.cancel()
        await asyncio.wait([cancelled], timeout=WAIT)
        assert b.queued_rows() == 1
        b.servable.gate.set()
        np.testing.assert_array_equal(await asyncio.wait_for(kept, WAIT), answer(3))
        await asyncio.wait_for(first, WAIT)

    asyncio.run(main())
    assert b.servable.calls == [[1], [3]]


def test_a_staged_batch_still_runs_when_the_threads_shut_down_and_every_caller_is_answered(
    bench: Callable[..., Bench],
):
    b = bench(params(max_batch_size=8), PerRow())

    async def main() -> list[np.ndarray]:
        await teach_the_cost(b, rows_dominate=True)
        b.servable.hold()
        first = asyncio.ensure_future(b.ask(1))
        await until(lambda: b.servable.calls, "the first call at the gate")
        rest = [asyncio.ensure_future(b.ask(v)) for v in (2, 3)]
        await until(lambda: b.queued_rows() == 2, "2 rows queued behind the gate")
        b.executor.shutdown(wait=False, cancel_futures=True)
        b.servable.gate.set()
        return list(await asyncio.wait_for(asyncio.gather(first, *rest), WAIT))

    for value, got in zip((1, 2, 3), asyncio.run(main()), strict=True):
        np.testing.assert_array_equal(got, answer(value))


def test_under_deadlines_and_cancellations_a_model_is_let_go_only_once_no_thread_computes_for_its_request(
    bench: Callable[..., Bench], monkeypatch: pytest.MonkeyPatch
):
    """Many clients, one batch thread, each request given a deadline that is as likely to pass before its batch
    forms, while it is staged, or while it runs (the data plane's early answer), or cancelled: every request is
    answered exactly (its rows, DEADLINE_EXCEEDED or its cancellation), and when a request lets go of its model
    (``Interest.when_idle``), no thread computes any of its rows. Nothing is left queued or held."""
    model = PerRow(per_row=0.0003)
    b = bench(params(max_batch_size=8), model)
    taken_on_threads: list[int] = []
    take = NextBatch.take

    def counted_take(staged: NextBatch, now: float) -> tuple[list[BatchTask], list[BatchTask]]:
        run, back = take(staged, now)
        if run and threading.current_thread() is not threading.main_thread():
            taken_on_threads.append(len(run))
        return run, back

    monkeypatch.setattr(NextBatch, "take", counted_take)
    violations: list[float] = []
    interests: list[Interest] = []
    rng = np.random.default_rng(7)

    async def one(value: float) -> None:
        loop = asyncio.get_running_loop()
        timeout = float(rng.choice([0.0002, 0.001, 0.003, 60.0]))
        interest = Interest(timeout, loop)
        interests.append(interest)
        timer = loop.call_later(timeout, interest.expire)
        asked = asyncio.ensure_future(b.ask(value, interest=interest))
        if rng.random() < 0.1:
            loop.call_later(float(rng.random()) * 0.003, asked.cancel)
        try:
            got = await asked
        except ServingError as error:
            assert error.code == Code.DEADLINE_EXCEEDED, error
        except asyncio.CancelledError:
            pass
        else:
            np.testing.assert_array_equal(got, answer(value))
        finally:
            timer.cancel()

        def let_go() -> None:
            with model._calls_lock:
                if value in model.computing:
                    violations.append(value)

        interest.when_idle(let_go)

    client_runs = itertools.count()

    async def client() -> None:
        first = 1000 * next(client_runs)  # every request's value its own, round after round
        for k in range(25):
            await one(float(first + k))

    async def main() -> None:
        await teach_the_cost(b, rows_dominate=True)
        # A thread takes a staged batch only when the loop staged one while it ran: on a loaded machine a round can
        # go without (the loop preempted while the thread ran), so rounds go on until one did, a few at most.
        for _ in range(ROUNDS_UNTIL_STAGED):
            await asyncio.wait_for(asyncio.gather(*(client() for _ in range(16))), 60)
            if taken_on_threads:
                break
        await until(lambda: all(interest.running == 0 for interest in interests), "every run returned")

    asyncio.run(main())
    assert violations == [], f"requests let go of their model while a thread computed their rows: {violations}"
    assert taken_on_threads, "no thread took a staged batch: nothing here was proved of them"
    assert b.scheduler.queue_depths() == []
    assert len(b.servable.calls) > 1
