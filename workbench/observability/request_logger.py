"""Request logging (TF Serving's ``logging_config``): sampled requests and responses as TFRecord files.

Each model with a :class:`~workbench.config.request_logging.RequestLogConfig` has every successful
request logged independently with probability ``sampling_rate``, as one ``tensorflow.serving.PredictionLog``
record (the format of warmup files, so logged traffic replays as warmup). Failed requests are not logged.

Files are ``<filename_prefix>-<writer>-<n>.tfrecord`` (see :mod:`workbench.protocol.request_log_files`); a
file rolls over to the next once it holds ``max_file_bytes``; models may share a prefix (each record names
its model). Records are flushed after each batch the writer takes, so a reader sees whole records, and at
most a part of the one being written at the end of the newest file.

Nothing here blocks the event loop: the loop only samples and queues an entry (references to arrays it
already has); a background thread builds the protos and writes. The queue is bounded in records and in
bytes; when the disk falls behind, entries are dropped and counted (``describe()``, the health endpoint),
never waited for.

A model's collector may instead be ``"parquet"`` (:mod:`workbench.observability.parquet_sink`: Parquet files
partitioned by model, version and hour) or ``"cloudevents"`` (:mod:`workbench.observability.cloudevents_sink`:
KServe's logger's events over HTTP). The same sampling, queue and counts apply; ``logged`` counts rows in a
written file, or requests whose events were delivered.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import enum
import logging
import os
import queue
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from workbench.config.options import ModelConfig
from workbench.config.request_logging import (
    CLOUDEVENTS,
    PARQUET,
    TFRECORD,
    RequestLogConfig,
    logging_file,
    read_model_request_log_config,
)
from workbench.core.errors import ServingError
from workbench.observability import log_records
from workbench.observability.cloudevents_sink import MAX_QUEUED as CLOUDEVENTS_MAX_QUEUED
from workbench.observability.cloudevents_sink import CloudEventsSink
from workbench.observability.log_records import LoggedCall
from workbench.observability.parquet_sink import FLUSH_SECONDS, ROWS_PER_FILE, ParquetSink
from workbench.observability.prediction_logs import LogEntry
from workbench.protocol.request_log_files import FILE_SUFFIX, log_file_name, writer_id

log = logging.getLogger(__name__)

MAX_FILE_BYTES = 64 * 1024 * 1024
MAX_PENDING_RECORDS = 4096
MAX_PENDING_BYTES = 64 * 1024 * 1024
_BATCH = 256  # records written between flushes, at most


class _Signal(enum.Enum):
    RECONFIGURED = "reconfigured"  # close the files of prefixes no model uses any more
    STOP = "stop"  # write what came before, close every file, end the thread


@dataclasses.dataclass(frozen=True)
class _Pending:
    config: RequestLogConfig
    entry: LogEntry
    timestamp: float
    size: int
    call: LoggedCall | None = None


@dataclasses.dataclass
class _Counts:
    sampled: int = 0  # answered requests chosen for the log
    logged: int = 0  # records written and flushed
    dropped: int = 0  # sampled, but the queue was full or the write failed
    send_failures: int = 0  # CloudEvents POSTs that failed (each retry counts; a record may still be logged)


@dataclasses.dataclass
class _OpenFile:
    path: str
    writer: Any  # tf.io.TFRecordWriter
    bytes: int = 0


class _ModelFileCache:
    """``<model>/logging_config.txt`` per model, re-read only when the file changes; errors said once."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[tuple[int, int] | None, RequestLogConfig | None]] = {}

    def get(self, base_path: str) -> RequestLogConfig | None:
        path = logging_file(base_path)
        try:
            st = os.stat(path)
            stamp: tuple[int, int] | None = (st.st_mtime_ns, st.st_size)
        except OSError:
            stamp = None
        previous = self._seen.get(base_path)
        if previous is not None and previous[0] == stamp:
            return previous[1]
        config = None
        if stamp is not None:
            try:
                config = read_model_request_log_config(base_path)
            except ServingError as exc:
                # Keep what was working: a half-written or broken edit must not silence (or start) logging.
                log.error("%s (request logging for this model is unchanged)", exc.message)
                config = previous[1] if previous is not None else None
        self._seen[base_path] = (stamp, config)
        return config


class RequestLogger:
    """Samples answered requests per model and writes them on a background thread."""

    def __init__(
        self,
        *,
        max_file_bytes: int = MAX_FILE_BYTES,
        max_pending_records: int = MAX_PENDING_RECORDS,
        max_pending_bytes: int = MAX_PENDING_BYTES,
        parquet_rows_per_file: int = ROWS_PER_FILE,
        parquet_flush_seconds: float = FLUSH_SECONDS,
        cloudevents_max_queued: int = CLOUDEVENTS_MAX_QUEUED,
    ) -> None:
        self.max_file_bytes = max_file_bytes
        self.parquet_rows_per_file = parquet_rows_per_file
        self.parquet_flush_seconds = parquet_flush_seconds
        self.cloudevents_max_queued = cloudevents_max_queued
        self.max_pending_bytes = max_pending_bytes
        self.writer = writer_id()
        self._configs: dict[str, RequestLogConfig] = {}  # replaced whole, never mutated: read without a lock
        self._files_beside = _ModelFileCache()
        self._configure_lock = threading.Lock()  # config reloads and repository scans take turns
        self._queue: queue.Queue[_Pending | _Signal] = queue.Queue(max_pending_records)
        self._pending_bytes = 0
        self._lock = threading.Lock()  # counts, pending bytes, the writer thread's start
        self._counts: dict[str, _Counts] = collections.defaultdict(_Counts)
        self._random = random.Random()
        self._thread: threading.Thread | None = None
        self._closed = False
        # The writer thread's own state.
        self._open: dict[str, _OpenFile] = {}
        self._numbers: dict[str, int] = collections.defaultdict(int)
        self._failing: set[str] = set()
        self._parquet: dict[str, ParquetSink] = {}  # by folder
        self._events: dict[str, CloudEventsSink] = {}  # by URL

    # ------------------------------------------------------------------------------------- configuration
    def configure(self, models: Iterable[ModelConfig]) -> None:
        """Log exactly these models' requests: a config file's ``logging_config``, or the file beside the model.

        Called on every config (re)load and repository scan; cheap when nothing changed.
        """
        with self._configure_lock:
            configs: dict[str, RequestLogConfig] = {}
            for model in models:
                config = model.logging if model.logging is not None else self._files_beside.get(model.base_path)
                if config is not None:
                    configs[model.name] = config
            if configs != self._configs:
                self._reconfigure(configs)

    def _reconfigure(self, configs: dict[str, RequestLogConfig]) -> None:
        for name, config in sorted(configs.items()):
            if self._configs.get(name) != config:
                where = {
                    TFRECORD: f"{config.filename_prefix}-*{FILE_SUFFIX}",
                    PARQUET: f"Parquet files under {config.filename_prefix}",
                    CLOUDEVENTS: f"CloudEvents POSTed to {config.filename_prefix}",
                }[config.sink]
                log.info("Logging requests of model %s (sampling rate %g) to %s", name, config.sampling_rate, where)
        for name in sorted(set(self._configs) - set(configs)):
            log.info("Request logging of model %s is off", name)
        self._configs = configs
        if configs:
            self._start_writer()
        self._signal(_Signal.RECONFIGURED)

    def describe(self) -> dict[str, dict[str, Any]]:
        """Per logging model: where its files go, its sampling rate, and requests sampled, logged and dropped."""
        with self._lock:
            counts = {name: dataclasses.replace(c) for name, c in self._counts.items()}
        return {
            name: {
                "sink": config.sink,
                "filename_prefix": config.filename_prefix,
                "sampling_rate": config.sampling_rate,
                **dataclasses.asdict(counts.get(name, _Counts())),
            }
            for name, config in sorted(self._configs.items())
        }

    def configured(self, model: str) -> bool:
        """Whether ``model``'s requests may be logged (it has a logging config)."""
        return model in self._configs

    # ---------------------------------------------------------------------------------- the serving path
    def log(self, model: str, entry: Callable[[], LogEntry], protocol: str = "", latency_seconds: float = 0.0) -> None:
        """Maybe log one answered request of ``model``: sampled here, written later; never blocks.

        ``entry`` is only called for a sampled request, so an unsampled one costs a lookup and a random draw.
        ``protocol`` and ``latency_seconds`` (the frontend's label, the time to answer) go into Parquet rows and
        CloudEvents; a sampled request gets its request id here.
        """
        config = self._configs.get(model)
        if config is None or self._random.random() >= config.sampling_rate:
            return
        record = entry()
        now = time.time()
        call = LoggedCall(uuid.uuid4().hex, now, protocol, latency_seconds) if config.sink != TFRECORD else None
        pending = _Pending(config, record, now, record.nbytes, call)
        with self._lock:
            counts = self._counts[model]
            counts.sampled += 1
            if self._closed or self._pending_bytes + pending.size > self.max_pending_bytes:
                counts.dropped += 1
                return
            try:
                self._queue.put_nowait(pending)
            except queue.Full:
                counts.dropped += 1
                return
            self._pending_bytes += pending.size

    # ------------------------------------------------------------------------------------- the writer
    def _start_writer(self) -> None:
        with self._lock:
            if self._thread is not None or self._closed:
                return
            self._thread = threading.Thread(target=self._run, name="workbench-request-log", daemon=True)
            self._thread.start()

    def _signal(self, signal: _Signal) -> None:
        # A full queue: the writer is busy, and looks at the configuration after that batch anyway.
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(signal)

    def _run(self) -> None:
        while True:
            batch = self._next_batch()
            entries = [item for item in batch if isinstance(item, _Pending)]
            others = [item for item in entries if item.config.sink != TFRECORD]
            if others:
                self._hand_over(others)
            if len(others) < len(entries):
                self._write([item for item in entries if item.config.sink == TFRECORD])
            for sink in self._parquet.values():
                sink.flush_due()
            self._close_unused()
            if _Signal.STOP in batch:
                break
        for prefix in list(self._open):
            self._close(prefix)
        for folder in list(self._parquet):
            self._parquet.pop(folder).close()
        for url in list(self._events):
            self._events.pop(url).close()

    def _next_batch(self) -> list[_Pending | _Signal]:
        """Wait for something to do (or for Parquet rows to come due), then take what else is queued, up to one
        batch."""
        dues = [due for due in (sink.next_due() for sink in self._parquet.values()) if due is not None]
        try:
            batch: list[_Pending | _Signal] = [self._queue.get(timeout=min(dues) if dues else None)]
        except queue.Empty:
            return []
        while len(batch) < _BATCH and batch[-1] is not _Signal.STOP:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return batch

    def _write(self, entries: list[_Pending]) -> None:
        written: collections.Counter[str] = collections.Counter()
        failed: collections.Counter[str] = collections.Counter()
        touched: set[str] = set()
        broken: set[str] = set()  # failed in this batch: not retried (a new file per record) until the next
        for pending in entries:
            prefix, model = pending.config.filename_prefix, pending.entry.model
            if prefix in broken:
                failed[model] += 1
                continue
            try:
                data = pending.entry.prediction_log(pending.config, pending.timestamp).SerializeToString()
                target = self._file(prefix)
                target.writer.write(data)
                target.bytes += len(data) + 16  # TFRecord framing: length, its CRC, data, its CRC
                touched.add(prefix)
                written[model] += 1
                if target.bytes >= self.max_file_bytes:
                    self._close(prefix)  # full: closing flushes it, and the next record starts the next file
            except Exception as exc:  # noqa: BLE001 - a full disk or a bad path must not end the writer
                self._failed(prefix, exc)
                broken.add(prefix)
                failed[model] += 1
        for prefix in touched:
            opened = self._open.get(prefix)
            if opened is None:  # closed since (full, or failed): nothing left to flush
                continue
            try:
                opened.writer.flush()
                self._failing.discard(prefix)
            except Exception as exc:  # noqa: BLE001
                self._failed(prefix, exc)
        with self._lock:
            self._pending_bytes -= sum(pending.size for pending in entries)
            for model, n in written.items():
                self._counts[model].logged += n
            for model, n in failed.items():
                self._counts[model].dropped += n

    def _hand_over(self, entries: list[_Pending]) -> None:
        """Parquet rows into their folder's buffers, CloudEvents into their URL's queue."""
        for pending in entries:
            config, entry, call = pending.config, pending.entry, pending.call
            assert call is not None
            try:
                if config.sink == PARQUET:
                    self._parquet_sink(config.filename_prefix).add(
                        entry.model, entry.version, pending.timestamp, log_records.row(entry, call)
                    )
                else:
                    self._events_sink(config.filename_prefix).offer(entry, call)
            except Exception as exc:  # noqa: BLE001 - one record that cannot become a row is lost, not the writer
                log.error("Could not log request %s of %s: %s", call.request_id, entry.model, exc)
                self._count(entry.model, entry.version, False)
        with self._lock:
            self._pending_bytes -= sum(pending.size for pending in entries)

    def _parquet_sink(self, folder: str) -> ParquetSink:
        sink = self._parquet.get(folder)
        if sink is None:
            sink = self._parquet[folder] = ParquetSink(
                folder, self.writer, self._count, self.parquet_rows_per_file, self.parquet_flush_seconds
            )
        return sink

    def _events_sink(self, url: str) -> CloudEventsSink:
        sink = self._events.get(url)
        if sink is None:
            sink = self._events[url] = CloudEventsSink(
                url, self._count, self._send_failed, max_queued=self.cloudevents_max_queued
            )
        return sink

    def _count(self, model: str, version: int, logged: bool) -> None:
        """A record's fate, from a sink (the writer thread, or a CloudEvents sender)."""
        with self._lock:
            counts = self._counts[model]
            if logged:
                counts.logged += 1
            else:
                counts.dropped += 1

    def _send_failed(self, model: str) -> None:
        with self._lock:
            self._counts[model].send_failures += 1

    def _file(self, prefix: str) -> _OpenFile:
        target = self._open.get(prefix)
        if target is not None:
            return target
        import tensorflow as tf

        path = log_file_name(prefix, self.writer, self._numbers[prefix])
        self._numbers[prefix] += 1
        folder = os.path.dirname(path)
        if folder:
            tf.io.gfile.makedirs(folder)
        target = self._open[prefix] = _OpenFile(path, tf.io.TFRecordWriter(path))
        log.info("Writing request log %s", path)
        return target

    def _failed(self, prefix: str, exc: Exception) -> None:
        if prefix not in self._failing:  # said once until a write succeeds again, not once per record
            self._failing.add(prefix)
            log.error("Could not write request log records under %s: %s", prefix, exc)
        target = self._open.pop(prefix, None)
        if target is not None:
            with contextlib.suppress(Exception):  # already failing: the error above says why
                target.writer.close()

    def _close(self, prefix: str) -> None:
        target = self._open.pop(prefix, None)
        if target is None:
            return
        try:
            target.writer.close()
        except Exception as exc:  # noqa: BLE001
            self._failed(prefix, exc)

    def _close_unused(self) -> None:
        """Close the files of prefixes no model logs to any more, so they are complete for readers (and write the
        Parquet rows, send the events, of collectors no model uses any more)."""
        used = {config.filename_prefix for config in self._configs.values() if config.sink == TFRECORD}
        for prefix in [p for p in self._open if p not in used]:
            self._close(prefix)
        used = {config.filename_prefix for config in self._configs.values() if config.sink == PARQUET}
        for folder in [f for f in self._parquet if f not in used]:
            self._parquet.pop(folder).close()
        used = {config.filename_prefix for config in self._configs.values() if config.sink == CLOUDEVENTS}
        for url in [u for u in self._events if u not in used]:
            self._events.pop(url).close()

    def close(self, timeout: float = 30.0) -> None:
        """Write what is queued, close the files, and stop the writer (blocks: call it off the event loop)."""
        with self._lock:
            self._closed = True
            thread = self._thread
        if thread is None:
            return
        try:
            self._queue.put(_Signal.STOP, timeout=timeout)  # after every entry already queued
        except queue.Full:
            log.error("The request log writer did not keep up: records still queued at shutdown are lost")
            return
        thread.join(timeout)
