"""The request log's Parquet collector: rows buffered per partition, written as whole files (never seen half-written).

Files go under the collector's folder (a local path, or an fsspec URL such as ``s3://bucket/logs``) in Hive-style
partitions, ``model=<name>/version=<n>/hour=<YYYY-MM-DDTHH>/part-<writer>-<n>.parquet`` (the hour is UTC), so
``pandas.read_parquet(folder)`` and ``pyarrow.dataset.dataset(folder, partitioning="hive")`` read every model's
requests with ``model``, ``version`` and ``hour`` as columns, and a query on one model or hour opens only its files.

Rows wait in memory until a partition holds ``rows_per_file`` rows, its oldest row is ``flush_seconds`` old, or the
server stops; then each partition's rows become one file (row groups of at most ``ROW_GROUP_ROWS``). A local file is
written under a hidden name (``.part-….parquet.tmp``, which readers skip) and renamed into place; an object store's
upload is one PUT, which the store makes visible whole.

Runs on the request log's writer thread only (no locks).
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

ROWS_PER_FILE = 10_000
FLUSH_SECONDS = 10.0
ROW_GROUP_ROWS = 4096
# The fixed columns' Arrow types; tensor columns take their type from their values.
_FIXED = {
    "request_id": "string",
    "time": "timestamp",
    "signature": "string",
    "method": "string",
    "protocol": "string",
    "latency_seconds": "float64",
    "status": "string",
    "shapes": "string",
}

# (model, version) of rows written, or of rows given up on: told back to the request log's counts.
Written = Callable[[str, int, bool], None]


@dataclasses.dataclass
class _Partition:
    model: str
    version: int
    hour: str
    rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    since: float = 0.0  # monotonic time of its oldest waiting row


def hour_of(timestamp: float) -> str:
    return datetime.datetime.fromtimestamp(timestamp, datetime.timezone.utc).strftime("%Y-%m-%dT%H")


class ParquetSink:
    """One collector folder's buffered partitions."""

    def __init__(
        self,
        folder: str,
        writer: str,
        counted: Written,
        rows_per_file: int = ROWS_PER_FILE,
        flush_seconds: float = FLUSH_SECONDS,
    ) -> None:
        self.folder = folder.rstrip("/")
        self._writer = writer
        self._counted = counted
        self.rows_per_file = rows_per_file
        self.flush_seconds = flush_seconds
        self._partitions: dict[tuple[str, int, str], _Partition] = {}
        self._number = 0
        self._failing = False
        self._remote = "://" in folder and not folder.startswith("file://")
        if folder.startswith("file://"):
            self.folder = folder[len("file://") :].rstrip("/")

    @property
    def waiting(self) -> int:
        return sum(len(p.rows) for p in self._partitions.values())

    def add(self, model: str, version: int, timestamp: float, values: dict[str, Any]) -> None:
        key = (model, version, hour_of(timestamp))
        partition = self._partitions.get(key)
        if partition is None:
            partition = self._partitions[key] = _Partition(model, version, key[2], since=time.monotonic())
        partition.rows.append(values)
        if len(partition.rows) >= self.rows_per_file:
            self._flush(key)

    def next_due(self) -> float | None:
        """Seconds until the oldest waiting partition is due (None: nothing waits)."""
        if not self._partitions:
            return None
        oldest = min(p.since for p in self._partitions.values())
        return max(0.0, oldest + self.flush_seconds - time.monotonic())

    def flush_due(self) -> None:
        now = time.monotonic()
        for key in [k for k, p in self._partitions.items() if now - p.since >= self.flush_seconds]:
            self._flush(key)

    def close(self) -> None:
        for key in list(self._partitions):
            self._flush(key)

    # ------------------------------------------------------------------------------------------- writing
    def _flush(self, key: tuple[str, int, str]) -> None:
        partition = self._partitions.pop(key)
        if not partition.rows:
            return
        folder = f"{self.folder}/model={partition.model}/version={partition.version}/hour={partition.hour}"
        name = f"part-{self._writer}-{self._number:05d}.parquet"
        self._number += 1
        try:
            table = to_table(partition.rows)
            self._write(table, folder, name)
        except Exception as exc:  # noqa: BLE001 - a full disk or a lost bucket must not end the writer
            if not self._failing:  # said once until a write succeeds again
                log.error("Could not write request log file %s/%s: %s", folder, name, exc)
            self._failing = True
            for _ in partition.rows:
                self._counted(partition.model, partition.version, False)
            return
        if self._failing:
            log.info("Writing request log files under %s again", self.folder)
        self._failing = False
        for _ in partition.rows:
            self._counted(partition.model, partition.version, True)

    def _write(self, table: Any, folder: str, name: str) -> None:
        import pyarrow.parquet as pq

        if self._remote:
            import fsspec

            fs, path = fsspec.core.url_to_fs(f"{folder}/{name}")
            with fs.open(path, "wb") as out:  # one upload, visible once complete
                pq.write_table(table, out, row_group_size=ROW_GROUP_ROWS)
            return
        os.makedirs(folder, exist_ok=True)
        hidden = os.path.join(folder, f".{name}.tmp")  # readers skip names starting with "." or "_"
        try:
            pq.write_table(table, hidden, row_group_size=ROW_GROUP_ROWS)
            os.replace(hidden, os.path.join(folder, name))
        except BaseException:
            if os.path.exists(hidden):
                os.unlink(hidden)
            raise


def to_table(rows: list[dict[str, Any]]) -> Any:
    """Rows (from :func:`workbench.observability.log_records.row`) as one Arrow table; absent columns are null."""
    import pyarrow as pa

    names: dict[str, None] = {}
    for values in rows:
        names.update(dict.fromkeys(values))
    columns: dict[str, Any] = {}
    for name in names:
        cells = [values.get(name) for values in rows]
        kind = _FIXED.get(name)
        if kind == "timestamp":
            micros = np.array([round(float(c or 0.0) * 1e6) for c in cells], np.int64)
            columns[name] = pa.array(micros, pa.timestamp("us", tz="UTC"))
        elif kind is not None:
            columns[name] = pa.array(cells, pa.string() if kind == "string" else pa.float64())
        else:
            columns[name] = _tensor_column(cells)
    return pa.table(columns)


def _tensor_column(cells: list[Any]) -> Any:
    """A list column of one numeric type (the values' common one), of binary, or a string (JSON) column."""
    import pyarrow as pa

    present = [c for c in cells if c is not None]
    if all(isinstance(c, str) for c in present):
        return pa.array(cells, pa.string())
    if all(isinstance(c, list) for c in present):
        return pa.array(cells, pa.list_(pa.binary()))
    arrays = [c for c in present if isinstance(c, np.ndarray)]
    dtype = np.result_type(*(a.dtype for a in arrays)) if arrays else np.dtype(np.float64)
    if dtype.kind not in "biuf":
        dtype = np.dtype(np.float64)
    return pa.array(
        [c.astype(dtype, copy=False) if isinstance(c, np.ndarray) else None for c in cells],
        pa.list_(pa.from_numpy_dtype(dtype)),
    )
