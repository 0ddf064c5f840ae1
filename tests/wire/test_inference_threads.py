"""The inference threads: calls run in order on named threads; shutting down drops what waits, and says so."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from workbench.batching.threads import InferenceThreads, caller


def occupy(call: Callable[..., object]) -> threading.Event:
    """Keep an executor's only thread busy until the returned event is set: calls made meanwhile wait queued."""
    running, release = threading.Event(), threading.Event()

    def hold() -> None:
        running.set()
        release.wait(10)

    call(hold)
    assert running.wait(10)
    return release


def test_calls_run_on_the_named_threads_and_hand_their_outcome_back() -> None:
    threads = InferenceThreads(2, "test-infer")
    seen: list[tuple[int, str]] = []
    done = threading.Semaphore(0)

    def record(value: int) -> None:
        seen.append((value, threading.current_thread().name))
        done.release()

    try:
        for value in range(20):
            threads.call(record, value)
        for _ in range(20):
            assert done.acquire(timeout=10)
    finally:
        threads.shutdown()
    assert sorted(value for value, _ in seen) == list(range(20))
    assert {name for _, name in seen} <= {"test-infer_0", "test-infer_1"}


def test_submit_keeps_the_executor_interface() -> None:
    with InferenceThreads(1, "test-submit") as threads:
        assert threads.submit(pow, 2, 10).result(timeout=10) == 1024
        with pytest.raises(ZeroDivisionError):
            threads.submit(divmod, 1, 0).result(timeout=10)


def test_shutting_down_drops_what_waits_and_tells_each_dropped_call() -> None:
    threads = InferenceThreads(1, "test-drop")
    dropped: list[int] = []
    ran: list[int] = []
    release = occupy(threads.call)  # the only thread is busy: what comes next waits in the queue
    for value in range(3):
        threads.call(ran.append, value, dropped=lambda value=value: dropped.append(value))
    waiting = threads.submit(ran.append, 99)
    threads.shutdown(wait=False, cancel_futures=True)
    release.set()
    threads.shutdown(wait=True)
    assert dropped == [0, 1, 2]
    assert waiting.cancelled()
    assert ran == []
    with pytest.raises(RuntimeError, match="after shutdown"):
        threads.call(ran.append, 4)


def test_a_failing_call_is_logged_and_the_thread_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    threads = InferenceThreads(1, "test-fail")
    after = threading.Event()
    try:
        with caplog.at_level(logging.ERROR, logger="workbench.batching.threads"):
            threads.call(divmod, 1, 0)
            threads.call(after.set)
            assert after.wait(10)
    finally:
        threads.shutdown()
    assert any("ZeroDivisionError" in (r.exc_text or "") for r in caplog.records)


def test_any_executor_runs_a_call_and_reports_a_cancelled_one() -> None:
    """The batcher takes any Executor (tests pass their own): ``caller`` gives it the same call form."""
    pool = ThreadPoolExecutor(max_workers=1)
    call = caller(pool)
    ran: list[int] = []
    dropped: list[int] = []
    release = occupy(call)
    call(ran.append, 1, dropped=lambda: dropped.append(1))
    pool.shutdown(wait=False, cancel_futures=True)
    release.set()
    pool.shutdown(wait=True)
    assert (ran, dropped) == ([], [1])
