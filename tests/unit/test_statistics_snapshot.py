"""Triton's statistics answer is one consistent snapshot: a batch is counted whole or not at all.

perf_analyzer and the analyzer divide ``inference_count`` by ``execution_count`` between two snapshots; a snapshot
taken half-way through recording a batch (its rows counted, the run not yet) makes one-row batches look like 1.01.
"""

from __future__ import annotations

import sys
import threading

from workbench.batching.scheduler import BatchRecord
from workbench.observability.metrics import ServingMetrics
from workbench.planes.statistics import MetricTotals


def test_a_snapshot_never_counts_a_batchs_rows_without_its_run() -> None:
    metrics = ServingMetrics()
    record = BatchRecord("m", 1, "serving_default", 1, 1, 1, (0.001,), 0.002)
    stop = threading.Event()

    def record_batches() -> None:
        while not stop.is_set():
            metrics.observe_batch(record)

    writers = [threading.Thread(target=record_batches) for _ in range(2)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible, so a snapshot lands inside an observation
    try:
        for writer in writers:
            writer.start()
        torn = []
        for _ in range(300):
            stats = MetricTotals(metrics.statistics_families()).statistics("m", 1)
            if stats.inference_count != stats.execution_count:
                torn.append((stats.inference_count, stats.execution_count))
    finally:
        stop.set()
        for writer in writers:
            writer.join()
        sys.setswitchinterval(interval)
    final = MetricTotals(metrics.statistics_families()).statistics("m", 1)
    assert final.execution_count > 0 and final.inference_count == final.execution_count
    assert torn == [], f"{len(torn)} snapshots of 300 counted rows without their runs, e.g. {torn[:3]}"
