"""The long-lived heap `workbench serve` freezes (:mod:`workbench.runtime.heap`): cycles are still collected at each
settle, frozen ones too, and a burst of version changes settles once."""

from __future__ import annotations

import gc
import threading
import weakref

from workbench.runtime.heap import LongLivedHeap


class Cycle:
    def __init__(self) -> None:
        self.me = self


def test_settling_collects_cycles_and_freezes_what_is_left():
    heap = LongLivedHeap()
    try:
        gc.collect()
        freed = threading.Event()
        cycle = Cycle()
        weakref.finalize(cycle, freed.set)
        del cycle
        gc.freeze()  # garbage frozen by an earlier settle: the next one collects it all the same
        assert not freed.is_set()
        heap.settle()
        assert freed.is_set()
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def test_settle_soon_settles_once_for_a_burst_and_not_after_stop(monkeypatch):
    settled = threading.Event()
    count: list[int] = []
    heap = LongLivedHeap(delay=0.05)
    monkeypatch.setattr(heap, "settle", lambda: (count.append(1), settled.set()))
    for _ in range(5):
        heap.settle_soon()
    assert settled.wait(5)
    assert count == [1]
    heap.stop()
    heap.settle_soon()
    assert heap._timer is None
