"""Drift monitoring: each model version's served inputs, over a rolling window, against a reference.

A version is monitored when it has a reference:

- given at export (``workbench.export(model, "m", reference=X_train)``): ``assets.extra/drift_reference.npz`` in
  the version folder, one array per input alias (``"*"``: the signature's only input), rows first; or
- with ``--drift_reference_rows=N``, the first N rows the version serves.

The serving path only offers an answered predict (a dict lookup, and for a monitored version a put into a bounded
queue; a full queue drops the rows and counts them). A background thread turns inputs into features
(:func:`workbench.observability.drift.features`), keeps the last ``--drift_window`` rows per version, and tests the
window against the reference at most every ``EVALUATE_SECONDS`` once it holds ``min_rows``. A feature's alert is
logged once when it starts to drift and once when it stops; the results are what ``GET
/workbench/v1/models/{model}/drift`` answers and what the ``workbench_drift_*`` gauges read.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from workbench.core.errors import Code, ServingError
from workbench.core.servable import Servable
from workbench.observability.drift import (
    FeatureDrift,
    Thresholds,
    compare,
    features,
    kind_of,
)
from workbench.observability.prediction_logs import LogEntry, PredictEntry

log = logging.getLogger(__name__)

REFERENCE_FILE = os.path.join("assets.extra", "drift_reference.npz")
ONLY_INPUT = "*"  # a reference array for the signature's only input, whatever its alias
MAX_QUEUED = 10_000  # requests waiting for the drift thread
MAX_REFERENCE_ROWS = 100_000  # a larger reference is subsampled (evenly, the same rows every time)
EVALUATE_SECONDS = 0.5
_Key = tuple[str, int]


def read_reference(version_path: str) -> dict[str, np.ndarray] | None:
    """A version folder's exported reference (alias → rows), or None when it has none."""
    path = os.path.join(version_path, REFERENCE_FILE)
    if not version_path or not os.path.isfile(path):
        return None
    with np.load(path, allow_pickle=False) as data:
        return {name: data[name] for name in data.files}


@dataclasses.dataclass
class _Version:
    """One monitored version's reference, window and last results (the drift thread's; read under the lock)."""

    source: str  # "export" or "requests"
    reference: dict[str, np.ndarray]  # feature → values (filled from requests until reference_rows)
    reference_rows: int = 0
    kinds: dict[str, str] = dataclasses.field(default_factory=dict)
    window: dict[str, collections.deque[np.ndarray]] = dataclasses.field(default_factory=dict)
    window_rows: int = 0
    new_rows: int = 0
    rows_seen: int = 0  # served rows taken into the window, ever
    rows_tested: int = 0  # rows_seen when the results were computed
    evaluated: float = 0.0
    results: dict[str, FeatureDrift] = dataclasses.field(default_factory=dict)
    skipped: set[str] = dataclasses.field(default_factory=set)  # inputs whose rank or width is not tested


class DriftMonitor:
    """Per model version: a reference, a rolling window of served rows, and their drift."""

    def __init__(
        self,
        window_rows: int = 1000,
        reference_rows: int = 0,
        thresholds: Thresholds | None = None,
        min_rows: int | None = None,
        max_queued: int = MAX_QUEUED,
    ) -> None:
        if window_rows < 1:
            raise ServingError(Code.INVALID_ARGUMENT, f"--drift_window must be at least 1 row, got {window_rows}")
        if reference_rows < 0:
            raise ServingError(Code.INVALID_ARGUMENT, f"--drift_reference_rows must be 0 or more, got {reference_rows}")
        self.window_rows = window_rows
        self.reference_rows = reference_rows
        self.thresholds = thresholds or Thresholds()
        self.min_rows = min(window_rows, 100) if min_rows is None else min_rows
        self._monitored: dict[_Key, bool] = {}  # False: looked, no reference (the serving path skips it)
        self._queue: queue.Queue[tuple[_Key, str, dict[str, np.ndarray]] | None] = queue.Queue(max_queued)
        self._lock = threading.Lock()  # _versions' results, for readers
        self._versions: dict[_Key, _Version] = {}
        self.dropped = 0
        self._thread: threading.Thread | None = None
        self._closed = False

    # ---------------------------------------------------------------------------------- the serving path
    def offer(self, servable: Servable, entry: Callable[[], LogEntry]) -> None:
        """An answered request of ``servable``: its inputs queued for the drift thread when it is monitored."""
        key = (servable.name, servable.version)
        if self._monitored.get(key) is False or self._closed:
            return
        record = entry()
        if not isinstance(record, PredictEntry):
            return
        if self._thread is None:
            self._start()
        try:
            self._queue.put_nowait((key, getattr(servable, "path", ""), dict(record.inputs)))
        except queue.Full:
            self.dropped += 1

    def forget(self, model: str, version: int) -> None:
        """``version`` of ``model`` unloaded: its window and results go (a new load starts over)."""
        with self._lock:
            self._versions.pop((model, version), None)
        self._monitored.pop((model, version), None)

    # --------------------------------------------------------------------------------------- reading
    def report(self, model: str) -> list[dict[str, Any]]:
        """Every monitored version of ``model``: its reference, window and each feature's drift (JSON-ready)."""
        with self._lock:
            versions = sorted((k[1], v) for k, v in self._versions.items() if k[0] == model)
            return [
                {
                    "version": version,
                    "reference": {"source": state.source, "rows": state.reference_rows},
                    "window_rows": state.window_rows,
                    "window_size": self.window_rows,
                    "rows_seen": state.rows_seen,
                    "rows_tested": state.rows_tested,
                    "evaluated": state.window_rows >= self.min_rows and bool(state.results),
                    "alert": any(r.drifted for r in state.results.values()),
                    "drifted_features": sorted(r.name for r in state.results.values() if r.drifted),
                    "features": [state.results[name].as_dict() for name in sorted(state.results)],
                    "skipped_inputs": sorted(state.skipped),
                }
                for version, state in versions
            ]

    def summaries(self) -> dict[str, dict[str, Any]]:
        """The stats snapshot's ``"drift"``: per monitored model and version, the alert and each feature's figures."""
        with self._lock:
            out: dict[str, dict[str, Any]] = {}
            for (model, version), state in sorted(self._versions.items()):
                out.setdefault(model, {})[str(version)] = {
                    "alert": any(r.drifted for r in state.results.values()),
                    "window_rows": state.window_rows,
                    "reference": state.source,
                    "features": {
                        name: {"psi": round(r.psi, 4), "test": r.test, "p_value": r.p_value, "drifted": r.drifted}
                        for name, r in sorted(state.results.items())
                    },
                }
            return out

    def snapshot(self) -> list[tuple[str, int, FeatureDrift]]:
        with self._lock:
            return [(k[0], k[1], r) for k, state in sorted(self._versions.items()) for r in state.results.values()]

    def close(self, timeout: float = 5.0) -> None:
        self._closed = True
        thread = self._thread
        if thread is not None:
            try:
                self._queue.put(None, timeout=timeout)
            except queue.Full:
                return
            thread.join(timeout)

    # ------------------------------------------------------------------------------------ the thread
    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="workbench-drift", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=EVALUATE_SECONDS)
            except queue.Empty:
                self._evaluate_due()
                continue
            if item is None:
                return
            key, path, inputs = item
            try:
                self._take(key, path, inputs)
            except Exception:  # one odd request must not end drift monitoring
                log.exception("Drift monitoring of %s version %d could not take a request", *key)
            self._evaluate_due()

    def _state(self, key: _Key, path: str) -> _Version | None:
        state = self._versions.get(key)
        if state is not None:
            return state
        if self._monitored.get(key) is False:
            return None
        try:
            exported = read_reference(path)
        except Exception as exc:  # noqa: BLE001 - a broken file is said, and the version is not monitored
            log.error("The drift reference of %s version %d cannot be read: %s", key[0], key[1], exc)
            exported = None
        if (exported is not None or self.reference_rows > 0) and not _have_scipy():
            log.error(
                "Drift of %s version %d is not monitored: the tests need scipy (pip install scipy)", key[0], key[1]
            )
            exported = None
            self._monitored[key] = False
            return None
        if exported is not None:
            state = _Version("export", {})
            columns = features(exported)
            state.skipped = {alias for alias in exported if not _gives(alias, columns)}
            state.reference = {name: _subsample(values) for name, values in columns.items()}
            state.reference_rows = max((len(v) for v in state.reference.values()), default=0)
            state.kinds = {name: kind_of(values) for name, values in state.reference.items()}
            log.info("Monitoring drift of %s version %d against its exported reference", *key)
        elif self.reference_rows > 0:
            state = _Version("requests", {})
            log.info("Monitoring drift of %s version %d against its first %d rows", key[0], key[1], self.reference_rows)
        else:
            self._monitored[key] = False
            return None
        self._monitored[key] = True
        with self._lock:
            self._versions[key] = state
        return state

    def _take(self, key: _Key, path: str, inputs: dict[str, np.ndarray]) -> None:
        state = self._state(key, path)
        if state is None:
            return
        with self._lock:
            if state.source == "requests" and state.reference_rows < self.reference_rows:
                self._fill_reference(state, inputs)
                return
            columns = self._columns(state, inputs)
            rows = max((len(v) for v in columns.values()), default=0)
            for name, values in columns.items():
                state.window.setdefault(name, collections.deque()).append(values)
            state.window_rows += rows
            state.new_rows += rows
            state.rows_seen += rows
            self._trim(state)

    def _fill_reference(self, state: _Version, inputs: dict[str, np.ndarray]) -> None:
        columns = self._columns(state, inputs)
        room = self.reference_rows - state.reference_rows
        chunks: dict[str, list[np.ndarray]] = {}
        for name, values in columns.items():
            chunks.setdefault(name, []).append(values[:room])
        joined = {n: np.concatenate([state.reference[n], *c]) if n in state.reference else np.concatenate(c)
                  for n, c in chunks.items()}  # fmt: skip
        state.reference.update(joined)
        state.reference_rows = max((len(v) for v in state.reference.values()), default=0)
        if state.reference_rows >= self.reference_rows:
            state.kinds = {name: kind_of(values) for name, values in state.reference.items()}

    def _columns(self, state: _Version, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Feature columns of one request; inputs that give none are remembered as skipped."""
        columns = features(inputs)
        state.skipped.update(alias for alias in inputs if not _gives(alias, columns))
        if state.source == "export" and len(inputs) == 1:
            _name_only_input(state, next(iter(inputs)))
        return columns

    def _trim(self, state: _Version) -> None:
        for chunks in state.window.values():
            total = sum(len(c) for c in chunks)
            while chunks and total - len(chunks[0]) >= self.window_rows:
                total -= len(chunks.popleft())
        state.window_rows = max((sum(len(c) for c in chunks) for chunks in state.window.values()), default=0)

    def _evaluate_due(self) -> None:
        now = time.monotonic()
        for key, state in list(self._versions.items()):
            if state.new_rows == 0 or now - state.evaluated < EVALUATE_SECONDS or state.window_rows < self.min_rows:
                continue
            if not state.kinds:  # the reference is still filling
                continue
            self._evaluate(key, state)
            state.evaluated = now

    def _evaluate(self, key: _Key, state: _Version) -> None:
        results: dict[str, FeatureDrift] = {}
        for name, chunks in state.window.items():
            reference = state.reference.get(name)
            if reference is None or not len(reference):
                continue
            window = np.concatenate(list(chunks))[-self.window_rows :]
            kind = state.kinds.get(name) or kind_of(reference)
            try:
                results[name] = compare(name, kind, reference, window, self.thresholds)
            except Exception as exc:  # noqa: BLE001 - a feature that cannot be tested is left out, and said
                log.warning("Drift of %s version %d feature %s cannot be tested: %s", key[0], key[1], name, exc)
        with self._lock:
            before = state.results
        # Said before the report shows it: whoever reads a report that drifted finds its line in the log already.
        self._say_crossings(key, before, results)
        with self._lock:
            state.results = results
            state.new_rows = 0
            state.rows_tested = state.rows_seen

    @staticmethod
    def _say_crossings(key: _Key, before: dict[str, FeatureDrift], results: dict[str, FeatureDrift]) -> None:
        """Log the features that crossed their thresholds since the last evaluation, either way."""
        for name, result in sorted(results.items()):
            was = before.get(name)
            if result.drifted and (was is None or not was.drifted):
                log.warning(
                    "Drift: model %s version %d feature %s (%s) drifted from its reference: PSI %.3f, %s p-value %.2g",
                    key[0], key[1], name, result.kind, result.psi, result.test, result.p_value,
                )  # fmt: skip
            elif not result.drifted and was is not None and was.drifted:
                log.info("Drift: model %s version %d feature %s is back within its thresholds", key[0], key[1], name)


def _have_scipy() -> bool:
    import importlib.util

    return importlib.util.find_spec("scipy") is not None


def _gives(alias: str, columns: dict[str, np.ndarray]) -> bool:
    """Whether input ``alias`` gave feature columns (else its rank or width is not tested)."""
    return any(name == alias or name.startswith(f"{alias}[") for name in columns)


def _subsample(values: np.ndarray) -> np.ndarray:
    if len(values) <= MAX_REFERENCE_ROWS:
        return values
    return values[np.linspace(0, len(values) - 1, MAX_REFERENCE_ROWS).astype(np.int64)]


def _name_only_input(state: _Version, alias: str) -> None:
    """An exported ``"*"`` reference stands for the only input: named as it, once its name is known."""
    star = [name for name in state.reference if name == ONLY_INPUT or name.startswith(f"{ONLY_INPUT}[")]
    for name in star:
        renamed = alias + name[len(ONLY_INPUT) :]
        state.reference[renamed] = state.reference.pop(name)
        state.kinds[renamed] = state.kinds.pop(name)


class DriftCollector:
    """The ``workbench_drift_*`` gauges, read from the monitor when Prometheus scrapes."""

    def __init__(self, monitor: DriftMonitor) -> None:
        self._monitor = monitor

    def collect(self) -> Iterator[Metric]:
        psi = GaugeMetricFamily(
            "workbench_drift_psi",
            "Population stability index of a feature's served values against its reference.",
            labels=["model", "version", "feature"],
        )
        p_value = GaugeMetricFamily(
            "workbench_drift_p_value",
            "p-value of a feature's drift test (ks: Kolmogorov-Smirnov, chi2: chi-squared); low means drift.",
            labels=["model", "version", "feature", "test"],
        )
        alert = GaugeMetricFamily(
            "workbench_drift_alert",
            "1 while a feature's drift crosses --drift_thresholds, else 0.",
            labels=["model", "version", "feature"],
        )
        for model, version, result in self._monitor.snapshot():
            psi.add_metric([model, str(version), result.name], result.psi)
            p_value.add_metric([model, str(version), result.name, result.test], result.p_value)
            alert.add_metric([model, str(version), result.name], 1.0 if result.drifted else 0.0)
        yield psi
        yield p_value
        yield alert
        yield CounterMetricFamily(
            "workbench_drift_dropped_requests",
            "Requests not taken into drift windows because the drift thread's queue was full.",
            value=self._monitor.dropped,
        )
