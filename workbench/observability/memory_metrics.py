"""Prometheus series of the memory budget, read from the manager's ledger when Prometheus scrapes.

- ``workbench_memory_budget_bytes{memory}`` and ``workbench_memory_charged_bytes{memory}``: the budget and what the
  loaded versions are counted for, ``memory`` being ``host`` or ``gpu``;
- ``workbench_model_version_memory_bytes{model, version, memory}``: what each version is counted for (its measured
  size while it holds memory, 0 once evicted);
- ``workbench_model_version_resident{model, version}``: 1 while a version is loaded and serving, 0 once evicted;
- ``workbench_model_version_loads_total{model, version}`` and
  ``workbench_model_version_evictions_total{model, version, reason}`` (``budget``: to make room; ``idle``:
  ``--unload_after_idle``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

Summary = Callable[[], Mapping[str, Any] | None]


class MemoryMetrics:
    """A collector: registered with the server's registry, it reads ``summary()`` at each scrape."""

    def __init__(self, summary: Summary) -> None:
        self._summary = summary

    def collect(self) -> Iterator[Metric]:
        summary = self._summary()
        if summary is None:
            return
        budget = GaugeMetricFamily(
            "workbench_memory_budget_bytes",
            "The memory budget (--memory_budget), per kind of memory.",
            labels=["memory"],
        )
        for kind, key in (("host", "budget_bytes"), ("gpu", "budget_gpu_bytes")):
            if summary.get(key) is not None:
                budget.add_metric([kind], summary[key])
        yield budget
        charged = GaugeMetricFamily(
            "workbench_memory_charged_bytes",
            "Memory the loaded (and loading) versions are counted for against the budget, per kind of memory.",
            labels=["memory"],
        )
        charged.add_metric(["host"], summary["charged_bytes"])
        charged.add_metric(["gpu"], summary["charged_gpu_bytes"])
        yield charged
        sizes = GaugeMetricFamily(
            "workbench_model_version_memory_bytes",
            "Memory a model version is counted for (measured at its load; 0 while it is not loaded).",
            labels=["model", "version", "memory"],
        )
        resident = GaugeMetricFamily(
            "workbench_model_version_resident",
            "1 while a model version is loaded and serving, 0 once evicted (it loads again when asked for).",
            labels=["model", "version"],
        )
        loads = CounterMetricFamily(
            "workbench_model_version_loads", "Loads of a model version that succeeded.", labels=["model", "version"]
        )
        evictions = CounterMetricFamily(
            "workbench_model_version_evictions",
            "Evictions of a model version: budget (to make room for another) or idle (--unload_after_idle).",
            labels=["model", "version", "reason"],
        )
        for model, versions in summary["versions"].items():
            for version, figures in versions.items():
                sizes.add_metric([model, version, "host"], figures["bytes"])
                sizes.add_metric([model, version, "gpu"], figures["gpu_bytes"])
                resident.add_metric([model, version], 1 if figures["resident"] else 0)
                loads.add_metric([model, version], figures["loads"])
                for reason in ("budget", "idle"):
                    evictions.add_metric([model, version, reason], figures["evictions"].get(reason, 0))
        yield from (sizes, resident, loads, evictions)
