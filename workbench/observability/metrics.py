"""Prometheus metrics: TF Serving's names as the baseline, Triton's
(:mod:`workbench.observability.triton_metrics`), plus
per-version series of our own.

Exposition is ``prometheus_client``'s. TF Serving's ``:tensorflow:serving:request_count`` keeps its exact
sample name (clients' PromQL uses it); prometheus_client would append ``_total`` to a counter, so that one
family is exported untyped. Our own series carry the model *version* too, which TF Serving lacks.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from workbench.batching.scheduler import BatchRecord
from workbench.observability.generation_metrics import GenerationMetrics
from workbench.observability.pending_observations import FoldFirst, PendingObservations, fold_histogram
from workbench.observability.triton_metrics import TritonMetrics

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# TF Serving's request_latency buckets: 10 µs growing by 1.8x, 33 of them (up to about 2 hours).
_TF_LATENCY_BUCKETS_US = tuple(10 * 1.8**i for i in range(33))
_LATENCY_BUCKETS_S = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


# How far a shadow's float outputs are from the primary's: from rounding noise to another answer altogether.
_SHADOW_DIFF_BUCKETS = (1e-9, 1e-7, 1e-5, 1e-4, 1e-3, 1e-2, 0.05, 0.1, 0.5, 1.0, 10.0)


class OutputDiffLike(Protocol):
    """One output of one request compared with the shadow's (workbench.planes.shadowing.OutputDiff)."""

    @property
    def rows(self) -> int: ...

    @property
    def agreeing(self) -> int | None: ...

    @property
    def max_abs(self) -> float | None: ...


class _TFServingRequestCount:
    """``:tensorflow:serving:request_count{model_name, status}`` exactly as TF Serving names it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str], int] = defaultdict(int)

    def add(self, counts: Mapping[tuple[str, str], int]) -> None:
        """Requests counted by (model name, status)."""
        with self._lock:
            for key, count in counts.items():
                self._counts[key] += count

    def collect(self) -> Iterator[Metric]:
        metric = Metric(":tensorflow:serving:request_count", "The total number of requests.", "unknown")
        with self._lock:
            items = sorted(self._counts.items())
        for (model_name, status), count in items:
            metric.add_sample(":tensorflow:serving:request_count", {"model_name": model_name, "status": status}, count)
        yield metric


class _ScrapeTimeGauge:
    """A per-(model, version) gauge read from the engine when Prometheus scrapes, not kept up to date."""

    def __init__(self, name: str, documentation: str, read: Callable[[], Iterable[tuple[str, int, float]]]) -> None:
        self._name, self._documentation, self._read = name, documentation, read

    def collect(self) -> Iterator[Metric]:
        metric = GaugeMetricFamily(self._name, self._documentation, labels=["model", "version"])
        for model, version, value in self._read():
            metric.add_metric([model, str(version)], value)
        yield metric


class _AsyncQueueGauges:
    """The asynchronous queue's depth and the age of its oldest request, read when Prometheus scrapes: what an
    autoscaler (KEDA, an HPA on an external metric) scales consumers on."""

    def __init__(self, read: Callable[[], tuple[int, float] | None]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        waiting = self._read()
        if waiting is None:
            return
        count, oldest = waiting
        yield GaugeMetricFamily(
            "workbench_async_requests_waiting", "Asynchronous requests queued or running, not answered yet.", count
        )
        yield GaugeMetricFamily(
            "workbench_async_oldest_waiting_seconds", "Age of the oldest asynchronous request not answered yet.", oldest
        )


class ServingMetrics:
    """The server's metrics; every frontend records through :meth:`observe_request`."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        # A statistics answer reads the batch series under this lock and a batch is recorded under it, so a
        # snapshot counts a batch's rows and its run together (prometheus_client adds a histogram's sum before its
        # bucket): perf_analyzer's mean batch between two snapshots is exact.
        self._statistics_lock = threading.Lock()
        # Requests and batches are observed by one append each and folded into the series below in bulk; first in
        # the registry, so that every read of it folds what is pending before reading a series.
        self._pending: PendingObservations[tuple[Any, ...]] = PendingObservations(self._fold, self._statistics_lock)
        self.registry.register(FoldFirst(self._pending))
        self._tf_request_count = _TFServingRequestCount()
        self.registry.register(self._tf_request_count)
        self.triton = TritonMetrics()
        self.registry.register(self.triton)
        self._tf_request_latency = Histogram(
            ":tensorflow:serving:request_latency",
            "Distribution of wall time (in microseconds) for Tensorflow Serving request.",
            ["model_name", "API", "entrypoint"],
            buckets=_TF_LATENCY_BUCKETS_US,
            registry=self.registry,
        )
        self.requests = Counter(
            "workbench_requests",
            "Requests by model, version, API, protocol and canonical status code.",
            ["model", "version", "api", "protocol", "code"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "workbench_request_latency_seconds",
            "Request latency from decoded request to encoded answer, per model version.",
            ["model", "version", "api", "protocol"],
            buckets=_LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.batch_size = Histogram(
            "workbench_batch_size",
            "Rows of real requests in each TensorFlow call (1 per request when batching is off).",
            ["model", "version"],
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048),
            registry=self.registry,
        )
        self.queue_seconds = Histogram(
            "workbench_queue_seconds",
            "Time a request waited in its batch queue before its batch started.",
            ["model", "version"],
            buckets=_LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.inference_seconds = Histogram(
            "workbench_inference_seconds",
            "Time of each TensorFlow call (a whole batch), merging and splitting included.",
            ["model", "version"],
            buckets=_LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self._request_children: dict[tuple[object, ...], tuple[Any, Any, Any]] = {}
        self._batch_children: dict[tuple[str, int], tuple[Any, Any, Any]] = {}
        self._queue_depths: Callable[[], Iterable[tuple[str, int, int]]] = lambda: ()
        self._traffic_shares: Callable[[], Iterable[tuple[str, int, float]]] = lambda: ()
        self._async_waiting: Callable[[], tuple[int, float] | None] = lambda: None
        self.registry.register(_AsyncQueueGauges(lambda: self._async_waiting()))
        self.registry.register(
            _ScrapeTimeGauge(
                "workbench_queue_depth",
                "Rows waiting in batch queues, per model version.",
                lambda: self._queue_depths(),
            )
        )
        self.registry.register(
            _ScrapeTimeGauge(
                "workbench_traffic_share",
                "Share of a model's default traffic (requests naming no version) each version receives.",
                lambda: self._traffic_shares(),
            )
        )
        self.batch_rows = Counter(
            "workbench_batch_rows",
            "Rows of batch prediction jobs run in this server, by model and outcome (scored, failed).",
            ["model", "outcome"],
            registry=self.registry,
        )
        self.batch_jobs_running = Gauge(
            "workbench_batch_jobs_running", "Batch prediction jobs running in this server.", registry=self.registry
        )
        self.shadow_requests = Counter(
            "workbench_shadow_requests",
            "Copies of default requests to a model's shadow version, by outcome (compared, failed, dropped).",
            ["model", "version", "outcome"],
            registry=self.registry,
        )
        self.shadow_rows = Counter(
            "workbench_shadow_rows",
            "Rows of a classification output (classes, or the argmax of scores) compared with the shadow's; "
            "agreeing: the rows whose class was the same (the agreement rate is their ratio).",
            ["model", "version", "output", "agreeing"],
            registry=self.registry,
        )
        self.shadow_abs_diff = Histogram(
            "workbench_shadow_abs_diff",
            "Largest absolute difference between a float output and the shadow's, per compared request.",
            ["model", "version", "output"],
            buckets=_SHADOW_DIFF_BUCKETS,
            registry=self.registry,
        )
        self.version_available = Gauge(
            "workbench_model_version_available",
            "1 while a model version is AVAILABLE, else 0.",
            ["model", "version"],
            registry=self.registry,
        )
        self.trace_context_invalid = Counter(
            "workbench_trace_context_invalid",
            "Traced requests whose traceparent was malformed: ignored (a new trace started, as W3C Trace Context "
            "requires), by protocol.",
            ["protocol"],
            registry=self.registry,
        )
        # Text generation's series (time to first token, per output token, tokens in and out).
        self.generation = GenerationMetrics(self.registry)

    def observe_request(
        self, model: str, version: int | None, api: str, protocol: str, code: str, seconds: float
    ) -> None:
        key = (model, version, api, protocol, code)
        children = self._request_children.get(key)
        if children is None:  # labels() costs a lock and tuple work: resolve each label set once
            version_label = "" if version is None else str(version)
            children = self._request_children[key] = (
                self._tf_request_latency.labels(model, api, protocol.upper()),
                self.requests.labels(model, version_label, api, protocol, code),
                self.latency.labels(model, version_label, api, protocol) if code == "OK" else None,
            )
        self._pending.add((children, model, version, code, seconds))

    def observe_batch(self, record: BatchRecord) -> None:
        key = (record.model, record.version)
        children = self._batch_children.get(key)
        if children is None:
            version = str(record.version)
            children = self._batch_children[key] = (
                self.batch_size.labels(record.model, version),
                self.inference_seconds.labels(record.model, version),
                self.queue_seconds.labels(record.model, version),
            )
        self._pending.add((children, record))

    def _fold(self, items: list[tuple[Any, ...]]) -> None:
        """What :meth:`observe_request` and :meth:`observe_batch` recorded, added to the series in bulk (under the
        statistics lock: a batch's rows and its run land together). Grouped first by label set (the children's
        tuple), so that each value costs one append here and each series one update."""
        requests: dict[int, tuple[tuple[Any, ...], list[float]]] = {}  # by label set: its first item, its seconds
        batches: dict[int, tuple[tuple[Any, Any, Any], list[BatchRecord]]] = {}
        for item in items:
            children = item[0]
            if len(item) == 2:
                found = batches.get(id(children))
                if found is None:
                    batches[id(children)] = (children, [item[1]])
                else:
                    found[1].append(item[1])
            else:
                group = requests.get(id(children))
                if group is None:
                    requests[id(children)] = (item, [item[4]])
                else:
                    group[1].append(item[4])
        tf_counts: dict[tuple[str, str], int] = {}
        triton_requests: list[tuple[str, int, str, int, float]] = []
        for ((tf_latency, counter, latency), model, version, code, _), seconds in requests.values():
            tf_counts[(model, code)] = tf_counts.get((model, code), 0) + len(seconds)
            if version is not None:  # Triton counts the requests that reached a model version
                triton_requests.append((model, version, code, len(seconds), sum(seconds)))
            fold_histogram(tf_latency, [s * 1e6 for s in seconds])
            counter.inc(len(seconds))
            if latency is not None:
                fold_histogram(latency, seconds)
        self._tf_request_count.add(tf_counts)
        self.triton.requests(triton_requests)
        for (batch_size, inference_seconds, queue_seconds), records in batches.values():
            fold_histogram(batch_size, [r.size for r in records])
            fold_histogram(inference_seconds, [r.run_seconds for r in records])
            fold_histogram(queue_seconds, [waited for r in records for waited in r.queue_seconds])
            self.triton.batches(records)

    def observe_cache_lookup(self, model: str, version: int, hit: bool, seconds: float) -> None:
        self.triton.cache_lookup(model, version, hit, seconds)

    def observe_cache_insert(self, model: str, version: int, seconds: float) -> None:
        self.triton.cache_insert(model, version, seconds)

    def report_queue_depths(self, depths: Callable[[], Iterable[tuple[str, int, int]]]) -> None:
        """Where the queue-depth gauge reads (model, version, rows waiting) at scrape time."""
        self._queue_depths = depths

    def report_traffic_shares(self, shares: Callable[[], Iterable[tuple[str, int, float]]]) -> None:
        self._traffic_shares = shares

    def observe_shadow(
        self, model: str, version: int, outcome: str, diffs: Mapping[str, OutputDiffLike] | None = None
    ) -> None:
        """A copy to ``model``'s shadow ``version``: compared (with each output's differences), failed or dropped."""
        self.shadow_requests.labels(model, str(version), outcome).inc()
        for output, diff in (diffs or {}).items():
            if diff.agreeing is not None:
                self.shadow_rows.labels(model, str(version), output, "true").inc(diff.agreeing)
                self.shadow_rows.labels(model, str(version), output, "false").inc(diff.rows - diff.agreeing)
            if diff.max_abs is not None:
                self.shadow_abs_diff.labels(model, str(version), output).observe(diff.max_abs)

    def count_batch_rows(self, model: str, scored: int, failed: int) -> None:
        if scored:
            self.batch_rows.labels(model, "scored").inc(scored)
        if failed:
            self.batch_rows.labels(model, "failed").inc(failed)

    def report_async_queue(self, waiting: Callable[[], tuple[int, float] | None]) -> None:
        """Where the asynchronous queue's gauges read (requests waiting, oldest age; None: no queue) at scrape time."""
        self._async_waiting = waiting

    def count_invalid_trace_context(self, protocol: str) -> None:
        """A request's traceparent was malformed (tracing on): it was served in a new trace."""
        self.trace_context_invalid.labels(protocol).inc()

    def set_version_state(self, model: str, version: int, available: bool) -> None:
        self.version_available.labels(model, str(version)).set(1 if available else 0)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def statistics_families(self) -> list[Metric]:
        """What Triton's statistics extension is read from: requests, latencies, queueing, runs, batch sizes."""
        families = (self.requests, self.latency, self.queue_seconds, self.inference_seconds, self.batch_size)
        with self._statistics_lock:
            self._pending.fold_locked()
            return [metric for family in (*families, self.triton) for metric in family.collect()]
