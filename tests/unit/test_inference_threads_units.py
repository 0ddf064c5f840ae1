"""The inference threads never leave a call queued behind a running one while a thread could still start.

A thread waiting for work is claimed by the call that finds it: a burst of calls sent while one thread idles starts
threads for the others, as ThreadPoolExecutor does, instead of queueing them all for that one thread (where a slow or
blocked call would hold every call behind it).
"""

from __future__ import annotations

import threading

from workbench.batching.threads import InferenceThreads

WAIT_S = 10.0


def _one_idle_thread(threads: InferenceThreads) -> None:
    done = threading.Event()
    threads.call(done.set)
    assert done.wait(WAIT_S)


def test_a_burst_of_calls_starts_threads_instead_of_queueing_behind_a_held_call() -> None:
    threads = InferenceThreads(3, "unit-burst")
    release = threading.Event()
    try:
        _one_idle_thread(threads)
        held = [threading.Event(), threading.Event()]
        ran = threading.Event()

        def hold(started: threading.Event) -> None:
            started.set()
            release.wait(WAIT_S)

        # Sent back to back, before the idle thread can wake: each call must find a thread of its own.
        threads.call(hold, held[0])
        threads.call(hold, held[1])
        threads.call(ran.set)
        assert held[0].wait(WAIT_S) and held[1].wait(WAIT_S), "a call waited behind a held one"
        assert ran.wait(WAIT_S), "a call waited behind the held ones although a third thread could start"
    finally:
        release.set()
        threads.shutdown()


def test_at_the_limit_calls_wait_for_a_thread_to_finish() -> None:
    threads = InferenceThreads(1, "unit-limit")
    release = threading.Event()
    try:
        started, ran = threading.Event(), threading.Event()
        threads.call(lambda: (started.set(), release.wait(WAIT_S)))
        threads.call(ran.set)
        assert started.wait(WAIT_S)
        assert not ran.wait(0.2)  # one thread, and it is busy
        release.set()
        assert ran.wait(WAIT_S)
    finally:
        release.set()
        threads.shutdown()


def test_threads_are_reused_when_calls_come_one_at_a_time() -> None:
    threads = InferenceThreads(4, "unit-reuse")
    try:
        for _ in range(20):
            _one_idle_thread(threads)
        assert len(threads._threads) == 1  # how many started is the point
    finally:
        threads.shutdown()
