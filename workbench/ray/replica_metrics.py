"""Workbench's per-version series from every Ray Serve replica, through Ray's metrics agent.

Each replica keeps workbench's own Prometheus registry (``/monitoring/prometheus/metrics`` through Ray's proxy
adds up every replica's, :mod:`workbench.ray.peers`) and records the same observations into ``ray.util.metrics``.
Ray's metrics agent on each node exports those for every replica on the node, with Ray's ``ray_`` prefix and the
replica's identity as tags, which is where a Prometheus scraping a Ray cluster already looks; Ray's Grafana
dashboards and ``sum by (model, version)`` give the whole deployment.
"""

from __future__ import annotations

from typing import Any

# Serve's subclasses of ray.util.metrics: each series also carries the deployment, replica and application tags
# (without them a node's agent also keeps exporting the series of replicas that have gone, indistinguishable).
from ray.serve import metrics as ray_metrics

from workbench.batching.scheduler import BatchRecord
from workbench.observability.whole_server import WholeServerMetrics

# The buckets of workbench's own histograms (Ray adds +Inf itself).
_LATENCY_BOUNDARIES_S = [1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]
_BATCH_BOUNDARIES = [float(2**i) for i in range(12)]


class RayServingMetrics(WholeServerMetrics):
    """A replica's metrics, its exposition answering for every replica, also recorded as Ray metrics."""

    def __init__(self) -> None:
        super().__init__()
        self._ray_requests = ray_metrics.Counter(
            "workbench_requests",
            "Requests by model, version, API, protocol and canonical status code.",
            tag_keys=("model", "version", "api", "protocol", "code"),  # type: ignore[arg-type]  # Ray types it Tuple[str]
        )
        self._ray_latency = ray_metrics.Histogram(
            "workbench_request_latency_seconds",
            "Request latency from decoded request to encoded answer, per model version.",
            boundaries=_LATENCY_BOUNDARIES_S,
            tag_keys=("model", "version", "api", "protocol"),  # type: ignore[arg-type]  # Ray types it Tuple[str]
        )
        self._ray_batch_size = ray_metrics.Histogram(
            "workbench_batch_size",
            "Rows of real requests in each model call (1 per request when batching is off).",
            boundaries=_BATCH_BOUNDARIES,
            tag_keys=("model", "version"),  # type: ignore[arg-type]  # Ray types it Tuple[str]
        )
        self._ray_available = ray_metrics.Gauge(
            "workbench_model_version_available",
            "1 while a model version is AVAILABLE, else 0.",
            tag_keys=("model", "version"),  # type: ignore[arg-type]  # Ray types it Tuple[str]
        )
        self._tags: dict[tuple[Any, ...], tuple[dict[str, str], dict[str, str]]] = {}

    def observe_request(
        self, model: str, version: int | None, api: str, protocol: str, code: str, seconds: float
    ) -> None:
        super().observe_request(model, version, api, protocol, code, seconds)
        key = (model, version, api, protocol, code)
        tags = self._tags.get(key)
        if tags is None:  # one dict per label set, as the Prometheus children are resolved once
            version_tag = "" if version is None else str(version)
            request = {"model": model, "version": version_tag, "api": api, "protocol": protocol}
            tags = self._tags[key] = ({**request, "code": code}, request)
        self._ray_requests.inc(1.0, tags=tags[0])
        if code == "OK":
            self._ray_latency.observe(seconds, tags=tags[1])

    def observe_batch(self, record: BatchRecord) -> None:
        super().observe_batch(record)
        self._ray_batch_size.observe(record.size, tags={"model": record.model, "version": str(record.version)})

    def set_version_state(self, model: str, version: int, available: bool) -> None:
        super().set_version_state(model, version, available)
        self._ray_available.set(1 if available else 0, tags={"model": model, "version": str(version)})
