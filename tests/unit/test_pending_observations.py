"""Observations folded in bulk read the same as prometheus_client's own, one by one."""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Histogram

from workbench.observability.metrics import ServingMetrics
from workbench.observability.pending_observations import PendingObservations, fold_histogram


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in registry.collect()
        for s in family.samples
        if not s.name.endswith("_created")
    }


def test_fold_histogram_counts_as_observe_does() -> None:
    # Values on bucket bounds, between them, below the first and past the last finite bound.
    values = [0.0, 0.1, 0.25, 0.2500001, 1.0, 2.5, 7.0, 1e9, -1.0, 0.1]
    one_by_one, folded = CollectorRegistry(), CollectorRegistry()
    a = Histogram("h", "h", ["m"], buckets=(0.1, 0.25, 1.0, 5.0), registry=one_by_one)
    b = Histogram("h", "h", ["m"], buckets=(0.1, 0.25, 1.0, 5.0), registry=folded)
    for value in values:
        a.labels("x").observe(value)
    fold_histogram(b.labels("x"), values)
    assert _samples(one_by_one) == _samples(folded)


def test_pending_folds_once_enough_wait_and_in_order() -> None:
    folded: list[list[int]] = []
    pending: PendingObservations[int] = PendingObservations(folded.append, threading.Lock(), every=3)
    for item in range(7):
        pending.add(item)
    assert folded == [[0, 1, 2], [3, 4, 5]]
    pending.fold()
    assert folded == [[0, 1, 2], [3, 4, 5], [6]]
    pending.fold()  # nothing pending: no empty fold
    assert len(folded) == 3


def test_every_read_of_the_registry_sees_every_request_before_it() -> None:
    metrics = ServingMetrics()
    labels = {"model": "m", "version": "1", "api": "predict", "protocol": "rest", "code": "OK"}
    for count in range(1, 4):  # far fewer than a fold's worth: read with nothing folded yet
        metrics.observe_request("m", 1, "predict", "rest", "OK", 0.002)
        assert metrics.registry.get_sample_value("workbench_requests_total", labels) == count
    text = metrics.exposition().decode()
    assert ':tensorflow:serving:request_count{model_name="m",status="OK"} 3.0' in text
    assert 'nv_inference_request_success{model="m",version="1"} 3.0' in text


def test_concurrent_observations_are_all_counted() -> None:
    metrics = ServingMetrics()

    def observe() -> None:
        for _ in range(2000):
            metrics.observe_request("m", 1, "predict", "grpc", "OK", 0.001)

    threads = [threading.Thread(target=observe) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    labels = {"model": "m", "version": "1", "api": "predict", "protocol": "grpc"}
    assert metrics.registry.get_sample_value("workbench_request_latency_seconds_count", labels) == 8000
