"""One worker of ``workbench serve --num_workers N`` answering for the whole server.

Workers share nothing but the ports, so a request for ``/workbench/v1/stats``, the stats stream, the Prometheus
metrics or the health lands on one worker, which must describe all of them. Each worker answers its own figures on
a Unix socket in the supervisor's run folder (``worker-<index>.sock``), from a thread of its own; the worker that
got the request asks its siblings there and adds their figures to its own. Why this way: it asks at the moment of
the request (counts add up exactly, nothing is stale), needs no shared files or metric library modes (every metric
and stat family works as it is, custom collectors included), and because siblings answer from a thread, never from
their event loop, two workers gathering from each other at once cannot wait on each other.

A sibling that does not answer (being restarted) is left out of that answer, and said so (``"workers"``).
"""

from __future__ import annotations

import abc
import json
import logging
import os
import socket
import socketserver
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from workbench.observability.metrics import ServingMetrics

log = logging.getLogger(__name__)

ASK_TIMEOUT_S = 5.0  # a sibling busy with requests still answers from its own thread within this
VIEWS = ("stats", "metrics", "health")


def socket_path(run_dir: str | os.PathLike[str], index: int) -> Path:
    return Path(run_dir) / f"worker-{index}.sock"


@dataclass(frozen=True)
class LocalViews:
    """What this worker alone says: its stats snapshot, its Prometheus exposition, its health."""

    stats: Callable[[], dict[str, Any]]
    metrics: Callable[[], bytes]
    health: Callable[[], dict[str, Any]]

    def answer(self, view: str) -> bytes:
        if view == "metrics":
            return self.metrics()
        if view == "stats":
            return json.dumps(self.stats(), default=str).encode()
        if view == "health":
            return json.dumps(self.health(), default=str).encode()
        raise ValueError(f"unknown view {view!r}")


class _Server(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True
    views: LocalViews


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        view = self.rfile.readline(64).decode(errors="replace").strip()
        try:
            self.wfile.write(self.server.views.answer(view))
        except Exception:  # the asking sibling leaves this worker out; the reason is logged here
            log.exception("Could not answer a sibling's %r", view)


PeerId = int | str  # a worker's index; a Ray Serve replica's id


def _in_order(peer: PeerId) -> tuple[int, str]:
    return (len(str(peer)), str(peer))  # indexes in numeric order (2 before 10); ids of one length alphabetically


class Peers(abc.ABC):
    """Processes that serve as one server, each with its own engine: how one answers for all of them.

    A subclass says how this process's :class:`LocalViews` reach the others (:meth:`start`, :meth:`stop`) and how it
    reads theirs (:meth:`gather`); the whole-server views are merged here.
    """

    def __init__(self, index: PeerId, views: LocalViews) -> None:
        self.index, self.views = index, views

    @abc.abstractmethod
    def start(self) -> None: ...

    @abc.abstractmethod
    def stop(self) -> None: ...

    @abc.abstractmethod
    def gather(self, view: str) -> list[tuple[PeerId, bytes | None]]:
        """Every peer's answer (None: it did not answer), this one's first."""

    def stats(self) -> dict[str, Any]:
        answers = [(index, json.loads(body) if body is not None else None) for index, body in self.gather("stats")]
        merged = merge_stats([snapshot for _, snapshot in answers if snapshot is not None])
        merged["workers"] = [_worker_row(index, snapshot) for index, snapshot in sorted(answers, key=_first_in_order)]
        return merged

    def exposition(self) -> bytes:
        return merge_expositions([body.decode() for _, body in self.gather("metrics") if body is not None])

    def workers(self) -> list[dict[str, Any]]:
        """Each peer: its index, pid and readiness (``"answered": false`` while one is being restarted)."""
        rows = []
        for index, body in self.gather("health"):
            if body is None:
                rows.append({"index": index, "answered": False})
                continue
            health = json.loads(body)
            rows.append({"index": index, "answered": True, "pid": health["pid"], "readiness": health["readiness"]})
        return sorted(rows, key=lambda row: _in_order(row["index"]))


def _first_in_order(answer: tuple[PeerId, Any]) -> tuple[int, str]:
    return _in_order(answer[0])


class WorkerPeers(Peers):
    """This worker's place among ``count`` workers in ``run_dir``: answers its siblings, gathers theirs."""

    def __init__(self, run_dir: str, index: int, count: int, views: LocalViews) -> None:
        super().__init__(index, views)
        self.run_dir, self.count = run_dir, count
        self._path = socket_path(run_dir, index)
        self._server: _Server | None = None

    def start(self) -> None:
        path = self._path
        path.unlink(missing_ok=True)  # left by this worker's previous life (it was killed)
        server = _Server(str(path), _Handler)
        server.views = self.views
        threading.Thread(target=server.serve_forever, name="workbench-peers", daemon=True).start()
        self._server = server

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._path.unlink(missing_ok=True)
            self._server = None

    def gather(self, view: str) -> list[tuple[PeerId, bytes | None]]:
        answers: list[tuple[PeerId, bytes | None]] = [(self.index, self.views.answer(view))]
        for index in range(self.count):
            if index != self.index:
                answers.append((index, _ask(socket_path(self.run_dir, index), view)))
        return answers


def _ask(path: Path, view: str) -> bytes | None:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(ASK_TIMEOUT_S)
            sock.connect(str(path))
            sock.sendall(view.encode() + b"\n")
            chunks = []
            while chunk := sock.recv(1 << 16):
                chunks.append(chunk)
    except OSError:  # not there (restarting), refused, or too slow: left out of this answer
        return None
    return b"".join(chunks) or None


def _worker_row(index: PeerId, snapshot: dict[str, Any] | None) -> dict[str, Any]:
    """One worker's line of the whole server's stats: whether it answered, and the requests it has served (how
    evenly the kernel spreads connections)."""
    if snapshot is None:
        return {"index": index, "answered": False}
    served = sum(entry["total_requests"] for versions in snapshot["models"].values() for entry in versions.values())
    return {"index": index, "answered": True, "total_requests": served}


class WholeServerMetrics(ServingMetrics):
    """A worker's metrics whose exposition is the whole server's: every worker's samples added up."""

    peers: Peers | None = None

    def own_exposition(self) -> bytes:
        return super().exposition()

    def exposition(self) -> bytes:
        return self.peers.exposition() if self.peers is not None else super().exposition()

    def statistics_families(self) -> list[Metric]:
        """The same families, every worker's samples added up (read back from the merged exposition)."""
        own = super().statistics_families()
        if self.peers is None:
            return own
        names = {family.name for family in own}
        merged = text_string_to_metric_families(self.peers.exposition().decode())
        return [family for family in merged if family.name in names]


# ------------------------------------------------------------------------------------------- merging
_SUMMED_STATS = (
    "requests_per_second",
    "errors_per_second",
    "batches_per_second",
    "queue_depth",
    "total_requests",
    "total_errors",
    "cache_hits",  # the response cache's lookups: each worker has its own cache and counts its own
    "cache_misses",
    "tokens_per_second",  # a generator's: each worker counts the tokens it generated
)
_PERCENTILES = ("p50_ms", "p95_ms", "p99_ms")
_FIRST_TOKEN_PERCENTILES = ("time_to_first_token_p50_ms", "time_to_first_token_p95_ms")


def merge_stats(snapshots: list[dict[str, Any]]) -> dict[str, Any]:
    """Several workers' :meth:`RollingStats.snapshot` as one server's.

    Rates, counts and queue depths add up. Percentiles cannot be merged exactly from percentiles: each is the
    workers' percentiles weighted by their request rates (exact when the workers see alike latencies, as the
    kernel spreads connections evenly). The mean batch size is weighted by batch rates. Response cache hits and
    misses add up and the hit rate is theirs; an entry has them only when a worker's has. So have a generator's
    fields: tokens per second add up, the time to first token's percentiles are weighted by request rates (one
    request is one generation).
    """
    if not snapshots:
        return {"models": {}}
    entries: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for snapshot in snapshots:
        for model, versions in snapshot["models"].items():
            for version, entry in versions.items():
                entries.setdefault(model, {}).setdefault(version, []).append(entry)
    models = {
        model: {version: _merge_entry(rows) for version, rows in versions.items()}
        for model, versions in entries.items()
    }
    merged = {**snapshots[0], "time": max(s["time"] for s in snapshots), "models": models}
    shadows = [snapshot["shadow"] for snapshot in snapshots if snapshot.get("shadow")]
    if shadows:
        merged["shadow"] = merge_shadows(shadows)
    return merged


_SHADOW_COUNTS = ("mirrored", "compared", "failed", "dropped")
_SHADOW_WEIGHTED = ("agreement", "primary_p50_ms", "primary_p99_ms", "p50_ms", "p99_ms")
_SHADOW_SLOWEST, _SHADOW_RECENT = 5, 200  # as many as one worker's record lists (workbench.planes.shadowing)


def merge_shadows(records: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Several workers' shadow records (each mirrors the requests it answered) as one server's: counts add up; the
    agreement, mean differences and latency percentiles are weighted by the copies each compared; the largest
    difference is the largest; the slowest inputs are the slowest of all."""
    by_model: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        for model, summary in record.items():
            by_model.setdefault(model, []).append(summary)
    merged = {}
    for model, rows in by_model.items():
        row = dict(rows[0])
        for key in _SHADOW_COUNTS:
            row[key] = sum(r.get(key) or 0 for r in rows)
        for key in _SHADOW_WEIGHTED:
            row[key] = _weighted(rows, key, "compared")
        outputs: dict[str, list[tuple[dict[str, Any], int]]] = {}
        for r in rows:
            for name, output in (r.get("outputs") or {}).items():
                outputs.setdefault(name, []).append((output, r.get("compared") or 0))
        row["outputs"] = {name: _merge_output(found) for name, found in outputs.items()}
        slowest = sorted((s for r in rows for s in r.get("slowest") or []), key=lambda s: s["ms"], reverse=True)
        row["slowest"] = slowest[:_SHADOW_SLOWEST]
        row["recent_abs_diffs"] = [d for r in rows for d in r.get("recent_abs_diffs") or []][-_SHADOW_RECENT:]
        merged[model] = row
    return merged


def _merge_output(found: list[tuple[dict[str, Any], int]]) -> dict[str, Any]:
    def weighted(key: str) -> float | None:
        pairs = [(output[key], weight) for output, weight in found if output.get(key) is not None]
        total = sum(weight for _, weight in pairs)
        return round(sum(value * weight for value, weight in pairs) / total, 9) if pairs and total else None

    maxima = [output["max_abs_diff"] for output, _ in found if output.get("max_abs_diff") is not None]
    return {
        "agreement": weighted("agreement"),
        "mean_abs_diff": weighted("mean_abs_diff"),
        "max_abs_diff": max(maxima) if maxima else None,
        "mean_rel_diff": weighted("mean_rel_diff"),
    }


def _merge_entry(rows: list[dict[str, Any]]) -> dict[str, Any]:
    merged = dict(rows[0])  # a field this merge does not know keeps the first worker's value
    for key in _SUMMED_STATS:
        values = [row[key] for row in rows if row.get(key) is not None]
        if values:
            merged[key] = round(sum(values), 3) if any(isinstance(v, float) for v in values) else sum(values)
    for key in _PERCENTILES:
        merged[key] = _weighted(rows, key, "requests_per_second")
    for key in _FIRST_TOKEN_PERCENTILES:
        if any(key in row for row in rows):
            merged[key] = _weighted(rows, key, "requests_per_second")
    merged["mean_batch_size"] = _weighted(rows, "mean_batch_size", "batches_per_second")
    # The server's hit rate: all its workers' hits over all their lookups (rates cannot be added or averaged).
    lookups = merged.get("cache_hits", 0) + merged.get("cache_misses", 0)
    if lookups:
        merged["cache_hit_rate"] = round(merged.get("cache_hits", 0) / lookups, 4)
    return merged


def _weighted(rows: list[dict[str, Any]], key: str, weight_key: str) -> float | None:
    pairs = [(row[key], row.get(weight_key) or 0.0) for row in rows if row.get(key) is not None]
    if not pairs:
        return None
    total = sum(weight for _, weight in pairs)
    if total <= 0:
        return round(sum(value for value, _ in pairs) / len(pairs), 3)
    return round(sum(value * weight for value, weight in pairs) / total, 3)


# Gauges that are one worker's share of the server's (added up); other gauges say the same on every worker.
_SUMMED_GAUGES = frozenset({"workbench_queue_depth"})


def merge_expositions(texts: list[str]) -> bytes:
    """Several workers' Prometheus text expositions as one: counters, histograms and untyped counts add up,
    ``*_created`` takes the earliest, per-worker gauges (queue depth) add up, other gauges take the highest."""
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            if family.name not in families:
                families[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
                values[family.name] = {}
            combine = _combiner(family.name, family.type)
            samples = values[family.name]
            for sample in family.samples:
                key = (sample.name, tuple(sample.labels.items()))
                samples[key] = sample.value if key not in samples else combine(samples[key], sample.value)
    for name, family in families.items():
        for (sample_name, labels), value in values[name].items():
            family.add_sample(sample_name, dict(labels), value)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(list(families.values())))
    return generate_latest(registry)


def _combiner(name: str, kind: str) -> Callable[[float, float], float]:
    if kind == "gauge":
        if name.endswith("_created"):
            return min
        return (lambda a, b: a + b) if name in _SUMMED_GAUGES else max
    return lambda a, b: a + b


class _Fixed:
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> list[Metric]:
        return self._families
