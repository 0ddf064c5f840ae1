"""The request log's counts as Prometheus counters, read from :meth:`RequestLogger.describe` when Prometheus scrapes.

``workbench_request_log_records_total{model, sink, outcome}``: sampled requests by what became of them (``logged``:
written to a file or delivered; ``dropped``: the queue was full, the write failed, or the receiver never took it);
``workbench_request_log_send_failures_total{model, sink}``: failed CloudEvents POSTs, retries included.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from prometheus_client.metrics_core import CounterMetricFamily, Metric


class Describes(Protocol):
    def describe(self) -> dict[str, dict[str, object]]: ...


class RequestLogCollector:
    def __init__(self, request_log: Describes) -> None:
        self._request_log = request_log

    def collect(self) -> Iterator[Metric]:
        records = CounterMetricFamily(
            "workbench_request_log_records",
            "Requests sampled for the request log, by outcome: logged (written or delivered) or dropped.",
            labels=["model", "sink", "outcome"],
        )
        failures = CounterMetricFamily(
            "workbench_request_log_send_failures",
            "Failed CloudEvents POSTs of the request log (each retry counts).",
            labels=["model", "sink"],
        )
        for model, info in self._request_log.describe().items():
            sink = str(info.get("sink", ""))
            for outcome in ("logged", "dropped"):
                records.add_metric([model, sink, outcome], float(info.get(outcome, 0)))  # type: ignore[arg-type]
            failures.add_metric([model, sink], float(info.get("send_failures", 0)))  # type: ignore[arg-type]
        yield records
        yield failures
