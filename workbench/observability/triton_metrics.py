"""Triton's Prometheus series (``nv_inference_*``, ``nv_cache_*``), exported beside TF Serving's and workbench's own.

Dashboards and alerts written for Triton query these names, so they are kept exactly, labelled ``model`` and
``version`` as Triton labels them. Triton's series are cumulative counts without prometheus_client's ``_total``
suffix, so they are exported untyped (as TF Serving's ``request_count`` is); PromQL's ``rate()`` reads them the same.

What each counts, in workbench's terms:

- ``nv_inference_request_success`` / ``_failure``: requests answered for a model version, one per request whatever
  its batch (failures carry Triton's ``reason``: REJECTED when the server turned the request away, CANCELED when the
  client or its deadline ended it, BACKEND when the model failed, OTHER for bad input); requests that never reached
  a version (an unknown model) are counted by neither, as in Triton.
- ``nv_inference_count`` / ``nv_inference_exec_count``: rows inferred and model runs (a merged batch is one run);
  cached answers count in neither.
- ``nv_inference_request_duration_us``: the time of successful requests, cached ones included;
  ``nv_inference_queue_duration_us``: the time requests waited for their batch;
  ``nv_inference_compute_infer_duration_us``: each request's share of compute is its whole batch's run, as Triton
  adds a batch's compute time to every request in it. workbench times a run as a whole, merging and splitting
  included, so ``compute_input`` and ``compute_output`` stay 0 (exported, so that sums over the three still work).
- ``nv_cache_num_hits_per_model`` / ``_misses_per_model`` and their durations in microseconds: a hit's lookup; a
  miss's lookup and its insertion of the answer.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterable, Iterator

from prometheus_client.metrics_core import Metric

from workbench.batching.scheduler import BatchRecord

# (name, help) of every family, in the order Triton's endpoint lists them.
_FAMILIES = (
    ("nv_inference_request_success", "Number of successful inference requests, all batch sizes"),
    ("nv_inference_request_failure", "Number of failed inference requests, all batch sizes"),
    ("nv_inference_count", "Number of inferences performed (does not include cached requests)"),
    ("nv_inference_exec_count", "Number of model executions performed (does not include cached requests)"),
    ("nv_inference_request_duration_us", "Cumulative inference request duration in microseconds"),
    ("nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds"),
    ("nv_inference_compute_input_duration_us", "Cumulative compute input duration in microseconds"),
    ("nv_inference_compute_infer_duration_us", "Cumulative compute inference duration in microseconds"),
    ("nv_inference_compute_output_duration_us", "Cumulative inference compute output duration in microseconds"),
    ("nv_cache_num_hits_per_model", "Number of cache hits per model"),
    ("nv_cache_num_misses_per_model", "Number of cache misses per model"),
    ("nv_cache_hit_duration_per_model", "Total cache hit duration per model, in microseconds"),
    ("nv_cache_miss_duration_per_model", "Total cache miss (lookup and insertion) duration per model, in microseconds"),
)
# Families every version that has served shows, zero or not (Triton lists them once a model is loaded).
_ALWAYS = frozenset(name for name, _ in _FAMILIES if not name.startswith(("nv_cache", "nv_inference_request_failure")))

# Canonical status code → Triton's failure reason.
_REASONS = {
    "RESOURCE_EXHAUSTED": "REJECTED",
    "UNAVAILABLE": "REJECTED",
    "CANCELLED": "CANCELED",
    "DEADLINE_EXCEEDED": "CANCELED",
    "INTERNAL": "BACKEND",
    "UNKNOWN": "BACKEND",
}

_Labels = tuple[tuple[str, str], ...]


def failure_reason(code: str) -> str:
    """Triton's ``reason`` label for a request that ended with canonical status ``code``."""
    return _REASONS.get(code, "OTHER")


class TritonMetrics:
    """A collector of Triton's series, fed by :class:`~workbench.observability.metrics.ServingMetrics`.

    Plain sums under one lock: each observation is a few dictionary additions, and a scrape copies them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, dict[_Labels, float]] = {name: defaultdict(float) for name, _ in _FAMILIES}

    def _add(self, family: str, labels: _Labels, value: float) -> None:
        self._values[family][labels] += value

    @staticmethod
    def _labels(model: str, version: int) -> _Labels:
        return (("model", model), ("version", str(version)))

    def requests(self, requests: Iterable[tuple[str, int, str, int, float]]) -> None:
        """Requests answered by model versions: (model, version, canonical status code, how many, their seconds
        in all) each."""
        with self._lock:
            for model, version, code, count, seconds in requests:
                labels = self._labels(model, version)
                if code == "OK":
                    self._add("nv_inference_request_success", labels, count)
                    self._add("nv_inference_request_duration_us", labels, seconds * 1e6)
                else:
                    self._add("nv_inference_request_failure", (*labels, ("reason", failure_reason(code))), count)

    def batches(self, records: Iterable[BatchRecord]) -> None:
        with self._lock:
            for record in records:
                labels = self._labels(record.model, record.version)
                self._add("nv_inference_count", labels, record.size)
                self._add("nv_inference_exec_count", labels, 1)
                self._add("nv_inference_queue_duration_us", labels, sum(record.queue_seconds) * 1e6)
                self._add("nv_inference_compute_infer_duration_us", labels, record.run_seconds * 1e6 * record.tasks)

    def cache_lookup(self, model: str, version: int, hit: bool, seconds: float) -> None:
        labels = self._labels(model, version)
        with self._lock:
            if hit:
                self._add("nv_cache_num_hits_per_model", labels, 1)
                self._add("nv_cache_hit_duration_per_model", labels, seconds * 1e6)
            else:
                self._add("nv_cache_num_misses_per_model", labels, 1)
                self._add("nv_cache_miss_duration_per_model", labels, seconds * 1e6)

    def cache_insert(self, model: str, version: int, seconds: float) -> None:
        """A miss's answer went into the cache: Triton counts the insertion in the miss's duration."""
        with self._lock:
            self._add("nv_cache_miss_duration_per_model", self._labels(model, version), seconds * 1e6)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            values = {name: dict(samples) for name, samples in self._values.items()}
        # Every version seen anywhere gets the families Triton always lists, at 0 where nothing happened yet.
        versions = {labels[:2] for samples in values.values() for labels in samples}
        for name, documentation in _FAMILIES:
            samples = values[name]
            if name in _ALWAYS:
                samples = {labels: samples.get(labels, 0.0) for labels in versions} | samples
            metric = Metric(name, documentation, "unknown")
            for labels, value in sorted(samples.items()):
                metric.add_sample(name, dict(labels), round(value))  # Triton exports whole counts and µs
            yield metric
