"""Rolling statistics per model version, for the live charts: rates and percentiles over a short window.

Recording is an append to a deque, with no lock (a deque's appends and pops are atomic, and the request path
runs it for every request); a snapshot trims what fell out of the window, under the lock that snapshots share,
and computes requests/s, p50/p95/p99 latency, errors, mean batch size and queue depth; for a version that has
generated text, its time to first token (p50, p95) and the tokens it generated per second
(:mod:`workbench.planes.generation_watch` records them, for every generation whichever frontend it came through).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

Key = tuple[str, int | None]


class _Series:
    def __init__(self) -> None:
        self.requests: collections.deque[tuple[float, float, bool]] = collections.deque()  # (t, seconds, ok)
        self.batches: collections.deque[tuple[float, int, int]] = collections.deque()  # (t, rows, tasks)
        # Requests trimmed out of the window so far: the totals are these plus what the window holds.
        self.trimmed_requests = 0
        self.trimmed_errors = 0
        # Response cache lookups since the start (counters: a plain += under the GIL from the loop thread).
        self.cache_hits = 0
        self.cache_misses = 0
        # Text generation: each first token's time from the request's arrival, and the tokens as they came.
        self.first_tokens: collections.deque[tuple[float, float]] = collections.deque()  # (t, seconds)
        self.tokens: collections.deque[tuple[float, int]] = collections.deque()  # (t, tokens)
        self.generated = False  # once true, the version's entry has the generation fields


# Tokens that come within this long of a bucket's start are added to it: a generator at GPU rates answers thousands
# of responses a second, and the window keeps (and each snapshot copies) one entry a bucket instead of one each.
TOKEN_BUCKET_SECONDS = 0.1


class RollingStats:
    def __init__(self, window_seconds: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.window = window_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._series: dict[Key, _Series] = {}
        self.started = clock()

    def _series_of(self, key: Key) -> _Series:
        series = self._series.get(key)
        if series is None:  # a version's first record: the one that takes the lock
            with self._lock:
                series = self._series.setdefault(key, _Series())
        return series

    def record_request(self, model: str, version: int | None, seconds: float, ok: bool) -> None:
        self._series_of((model, version)).requests.append((self._clock(), seconds, ok))

    def record_batch(self, model: str, version: int, rows: int, tasks: int) -> None:
        self._series_of((model, version)).batches.append((self._clock(), rows, tasks))

    def record_cache(self, model: str, version: int, hit: bool) -> None:
        series = self._series_of((model, version))
        if hit:
            series.cache_hits += 1
        else:
            series.cache_misses += 1

    def record_first_token(self, model: str, version: int, seconds: float) -> None:
        """A generation's first token came, ``seconds`` after its request arrived."""
        series = self._series_of((model, version))
        series.generated = True
        series.first_tokens.append((self._clock(), seconds))

    def record_tokens(self, model: str, version: int, tokens: int) -> None:
        """``tokens`` more tokens generated, now (a response's worth, as it came)."""
        series = self._series_of((model, version))
        series.generated = True
        now, counted = self._clock(), series.tokens
        # Only the loop's thread records; a snapshot trims buckets older than the window, never the newest one.
        if counted and now - counted[-1][0] < TOKEN_BUCKET_SECONDS:
            started, so_far = counted[-1]
            counted[-1] = (started, so_far + tokens)
        else:
            counted.append((now, tokens))

    def snapshot(self, queue_depths: Mapping[tuple[str, int], int] | None = None) -> dict[str, Any]:
        """``{"time", "window_seconds", "models": {name: {version: {...}}}}``, JSON-ready.

        ``queue_depths`` gives the rows waiting per (model, version); a version with rows waiting is listed
        even before its first request has finished. A version that has generated text has three more fields:
        ``time_to_first_token_p50_ms`` and ``_p95_ms`` (None when no first token came in the window) and
        ``tokens_per_second``; one that never did has none of them.
        """
        queue_depths = queue_depths or {}
        now = self._clock()
        horizon = now - self.window
        span = min(self.window, max(now - self.started, 1e-9))
        models: dict[str, dict[str, Any]] = {}
        with self._lock:
            for key in queue_depths:
                self._series.setdefault(key, _Series())
            items = list(self._series.items())
            for _, series in items:
                while series.requests and series.requests[0][0] < horizon:
                    series.trimmed_errors += not series.requests.popleft()[2]
                    series.trimmed_requests += 1
                while series.batches and series.batches[0][0] < horizon:
                    series.batches.popleft()
                while series.first_tokens and series.first_tokens[0][0] < horizon:
                    series.first_tokens.popleft()
                while series.tokens and series.tokens[0][0] < horizon:
                    series.tokens.popleft()
            # Copies (each taken at once): requests recorded meanwhile count in the next snapshot.
            rows = [
                (
                    key,
                    list(series.requests),
                    list(series.batches),
                    series.trimmed_requests,
                    series.trimmed_errors,
                    (series.cache_hits, series.cache_misses),
                    (list(series.first_tokens), list(series.tokens)) if series.generated else None,
                )
                for key, series in items
            ]
        for (model, version), requests, batches, trimmed, trimmed_errors, (hits, misses), generation in rows:
            latencies = np.array([r[1] for r in requests if r[2]], dtype=np.float64) * 1000
            errors = sum(1 for r in requests if not r[2])
            total, total_errors = trimmed + len(requests), trimmed_errors + errors
            p50, p95, p99 = np.percentile(latencies, [50, 95, 99]).tolist() if latencies.size else (None, None, None)
            batch_rows = sum(b[1] for b in batches)
            entry = {
                "requests_per_second": round(len(requests) / span, 3),
                "errors_per_second": round(errors / span, 3),
                "p50_ms": _round(p50),
                "p95_ms": _round(p95),
                "p99_ms": _round(p99),
                "mean_batch_size": round(batch_rows / len(batches), 3) if batches else None,
                "batches_per_second": round(len(batches) / span, 3),
                "queue_depth": queue_depths.get((model, version), 0) if version is not None else 0,
                "total_requests": total,
                "total_errors": total_errors,
            }
            if hits or misses:  # a model with the response cache on
                entry.update(cache_hits=hits, cache_misses=misses, cache_hit_rate=round(hits / (hits + misses), 4))
            if generation is not None:  # a version that has generated text
                entry.update(_generation_fields(*generation, span))
            models.setdefault(model, {})["" if version is None else str(version)] = entry
        return {"time": time.time(), "window_seconds": self.window, "models": models}


def _generation_fields(
    first_tokens: list[tuple[float, float]], tokens: list[tuple[float, int]], span: float
) -> dict[str, float | None]:
    seconds = np.array([f[1] for f in first_tokens], dtype=np.float64) * 1000
    p50, p95 = np.percentile(seconds, [50, 95]).tolist() if seconds.size else (None, None)
    return {
        "time_to_first_token_p50_ms": _round(p50),
        "time_to_first_token_p95_ms": _round(p95),
        "tokens_per_second": round(sum(t[1] for t in tokens) / span, 3),
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
