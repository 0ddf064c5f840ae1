"""The response cache's counts, kept where the server keeps its others."""

from __future__ import annotations

from workbench.observability.metrics import ServingMetrics
from workbench.observability.stats import RollingStats


class CacheCounts:
    """The response cache's lookups, counted in the server's live stats and its metrics (Triton's ``nv_cache_*``)."""

    def __init__(self, stats: RollingStats, metrics: ServingMetrics) -> None:
        self._stats, self._metrics = stats, metrics

    def cache_lookup(self, model: str, version: int, hit: bool, seconds: float) -> None:
        self._stats.record_cache(model, version, hit)
        self._metrics.observe_cache_lookup(model, version, hit, seconds)

    def cache_insert(self, model: str, version: int, seconds: float) -> None:
        self._metrics.observe_cache_insert(model, version, seconds)
