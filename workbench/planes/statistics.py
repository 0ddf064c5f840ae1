"""Triton's model statistics, read from the server's Prometheus series, so they agree with ``/metrics``."""

from __future__ import annotations

import collections
from collections.abc import Iterable

from prometheus_client.metrics_core import Metric

from workbench.protocol.v2_models import Duration, ModelStatistics


class MetricTotals:
    """The server's Prometheus series summed per (model, version), read once for a statistics answer."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._samples: dict[tuple[str, str, str], float] = collections.defaultdict(float)
        self._buckets: dict[tuple[str, str], list[tuple[float, float]]] = collections.defaultdict(list)
        for metric in families:
            for sample in metric.samples:
                key = (sample.labels.get("model", ""), sample.labels.get("version", ""))
                if sample.name == "workbench_batch_size_bucket":
                    self._buckets[key].append((float(sample.labels["le"]), sample.value))
                elif sample.name.startswith("workbench_requests") and not sample.name.endswith("_created"):
                    code = "ok" if sample.labels["code"] == "OK" else "fail"
                    self._samples[(*key, f"requests_{code}")] += sample.value
                else:
                    self._samples[(*key, sample.name)] += sample.value

    def _duration(self, key: tuple[str, str], family: str) -> Duration:
        return Duration(int(self._samples[(*key, f"{family}_count")]), self._samples[(*key, f"{family}_sum")])

    def _cache(self, key: tuple[str, str], outcome: str, plural: str) -> Duration:
        """Response cache hits or misses, read from Triton's ``nv_cache_*`` series (durations in µs)."""
        count = int(self._samples[(*key, f"nv_cache_num_{plural}_per_model")])
        return Duration(count, self._samples[(*key, f"nv_cache_{outcome}_duration_per_model")] / 1e6)

    def statistics(self, model: str, version: int) -> ModelStatistics:
        key = (model, str(version))
        # Batch sizes as the batch-size histogram keeps them: a batch counts under the first bucket it fits
        # (1, 2, 4, 8, ...), so a batch of 3 rows is reported as size 4.
        batches, below = {}, 0.0
        for bound, cumulative in sorted(self._buckets[key]):
            if cumulative > below and bound != float("inf"):
                batches[int(bound)] = Duration(int(cumulative - below))
            below = cumulative
        return ModelStatistics(
            name=model,
            version=version,
            inference_count=int(self._samples[(*key, "workbench_batch_size_sum")]),
            execution_count=int(self._samples[(*key, "workbench_batch_size_count")]),
            success=self._duration(key, "workbench_request_latency_seconds"),
            # Failed requests are counted, not timed (the latency histogram keeps answered ones).
            fail=Duration(int(self._samples[(*key, "requests_fail")])),
            queue=self._duration(key, "workbench_queue_seconds"),
            compute_infer=self._duration(key, "workbench_inference_seconds"),
            cache_hit=self._cache(key, "hit", "hits"),
            cache_miss=self._cache(key, "miss", "misses"),
            batches=batches,
        )
