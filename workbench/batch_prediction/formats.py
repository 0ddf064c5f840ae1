"""The tabular files a batch prediction job scores and writes: CSV, Parquet, JSON Lines, .npy, .npz and TFRecord.

A job counts the rows of each input file, reads it a range of rows at a time (so a file larger than memory is
scored in chunks, and a resumed job starts where it stopped) and writes each chunk's predictions as one file. This
module is that I/O, the same for local paths and fsspec URLs (``s3://``, ``gs://``, ``memory://``, ``file://``):

- Reading returns columns as numpy arrays, in the file's column order: what a model's inputs are made of. A
  :class:`RowReader` keeps a file open where its last range ended, so a job reading its shards in order reads each
  file once: CSV, JSON Lines and TFRecord cannot seek to a row, and a Parquet row group is decoded whole. Parquet
  starts at the row group holding a range's first row; .npy and .npz read the rows' bytes after the header.
- Writing is atomic: a file is written under a temporary name and renamed (locally), or uploaded whole in one put
  (object stores), so a reader (or a job resuming after a crash) never sees a partial output file.
- Bad data raises :class:`BatchDataError` naming the file and why; a store that fails raises
  :class:`~workbench.runtime.storage.StorageError`.

pandas, pyarrow and fsspec are imported when a file needs them, never when this module is imported: the batch job's
command line starts without them.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import glob
import itertools
import os
import tempfile
import uuid
import zipfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import IO, TYPE_CHECKING, Any, Protocol

import numpy as np
import orjson

from workbench.protocol.tfrecord import CorruptRecord, encode_record, read_records, records_in
from workbench.runtime.storage import StorageError, _filesystem, is_remote, redact, storage_error, translated

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

__all__ = [
    "FORMATS",
    "RECORD_COLUMN",
    "BatchDataError",
    "child",
    "count_rows",
    "exists",
    "format_of",
    "list_inputs",
    "list_names",
    "RowReader",
    "read_rows",
    "read_text",
    "remove",
    "write_table",
    "write_text",
]

FORMATS = ("csv", "parquet", "jsonl", "npy", "npz", "tfrecord")

# The column of a TFRecord file's raw records: a TensorFlow model whose signature parses tf.Examples is fed these.
RECORD_COLUMN = "serialized_example"

_EXTENSIONS = {
    ".csv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".npy": "npy",
    ".npz": "npz",
    ".tfrecord": "tfrecord",
    ".tfrecords": "tfrecord",
    ".tfr": "tfrecord",
}
_GLOB_CHARACTERS = ("*", "?", "[")
_CSV_CHUNK_ROWS = 1 << 18  # rows pandas holds at once while counting a CSV file's rows
_PARQUET_BATCH_ROWS = 1 << 16  # rows pyarrow decodes at a time while reading a Parquet file

Columns = dict[str, np.ndarray]
Writer = Callable[[IO[bytes]], None]


class BatchDataError(ValueError):
    """A file that cannot be read or written as asked (unknown format, unreadable, a column that does not fit the
    format); its message names the (redacted) file and why."""


def _fail(path: str, why: str) -> BatchDataError:
    return BatchDataError(f"{redact(path)}: {why}")


# ------------------------------------------------------------------------------------------- formats, inputs
def format_of(path: str, explicit: str | None = None) -> str:
    """The format of ``path``: ``explicit`` (any case) when given, else the one its extension names."""
    if explicit:
        named = explicit.lower()
        if named not in FORMATS:
            raise _fail(path, f"unknown format {explicit!r}; the formats are {', '.join(FORMATS)}")
        return named
    fmt = _format_by_extension(path)
    if fmt is None:
        known = ", ".join(_EXTENSIONS)
        raise _fail(path, f"unknown file type; the known extensions are {known} (or name the format)")
    return fmt


def _format_by_extension(path: str) -> str | None:
    name = path.rstrip("/").rsplit("/", 1)[-1]
    return _EXTENSIONS.get(os.path.splitext(name)[1].lower())


def list_inputs(uri: str) -> list[str]:
    """The files ``uri`` names: itself, the data files directly in it (a folder), or its matches (a glob).

    A folder's files are those whose extension names a format, skipping hidden ones (``.name``, and ``_name`` as
    Spark's ``_SUCCESS``); a glob's matches skip hidden ones too but keep any extension (the format may be named).
    Local paths come back as paths, remote ones as URLs in ``uri``'s own form.
    """
    found = _list_remote(uri) if is_remote(uri) else _list_local(uri)
    if not found:
        raise _fail(uri, "no input files found there")
    return found


def _is_glob(path: str) -> bool:
    return any(character in path for character in _GLOB_CHARACTERS)


def _is_hidden(name: str) -> bool:
    return name.startswith((".", "_"))


def _data_files(names: Iterable[str]) -> list[str]:
    return sorted(name for name in names if not _is_hidden(name) and _format_by_extension(name))


def _list_local(uri: str) -> list[str]:
    if _is_glob(uri):
        matches = (path for path in glob.glob(uri) if os.path.isfile(path))
        return sorted(path for path in matches if not _is_hidden(os.path.basename(path)))
    if os.path.isdir(uri):
        names = (name for name in os.listdir(uri) if os.path.isfile(os.path.join(uri, name)))
        return [os.path.join(uri, name) for name in _data_files(names)]
    return [uri] if os.path.isfile(uri) else []


def _list_remote(uri: str) -> list[str]:
    fs, path = _filesystem(uri)
    with translated(uri):
        fs.invalidate_cache()  # fsspec caches listings: a job must see the files there now
        if _is_glob(path):
            matches = fs.glob(path, detail=True)
            files = sorted(name for name, info in matches.items() if info.get("type") != "directory")
            return [_url_of(uri, path, name, fs) for name in files if not _is_hidden(name.rsplit("/", 1)[-1])]
        if fs.isdir(path):
            entries = fs.ls(path, detail=True)
            names = (entry["name"].rstrip("/").rsplit("/", 1)[-1] for entry in entries if entry["type"] != "directory")
            return [child(uri, name) for name in _data_files(names)]
        return [uri] if fs.isfile(path) else []


def _url_of(uri: str, pattern: str, match: str, fs: Any) -> str:
    """A glob's match as a URL in the form ``uri`` was given in (its scheme and bucket spelled the same)."""
    fixed_uri, fixed_path = _fixed_part(uri), _fixed_part(pattern)
    if "://" in fixed_uri and fixed_path and match.startswith(fixed_path + "/"):
        return fixed_uri + match[len(fixed_path) :]
    return str(fs.unstrip_protocol(match))


def _fixed_part(pattern: str) -> str:
    """The folder a glob's first wildcard is in (``s3://b/p`` of ``s3://b/p/part-*.csv``)."""
    first = min((index for c in _GLOB_CHARACTERS if (index := pattern.find(c)) >= 0), default=len(pattern))
    return pattern[: max(pattern.rfind("/", 0, first), 0)]


# ---------------------------------------------------------------------------------------------------- reading
def count_rows(path: str, fmt: str) -> int:
    """The number of rows (records, for TFRecord) of the file, read from metadata or headers where the format has
    them. A blank line of a CSV file is a row (of missing values), one of a JSON Lines file is not."""
    counter = _handler(_COUNTERS, fmt, path)
    with _reading(path):
        return counter(path)


def read_rows(path: str, fmt: str, start: int, stop: int) -> Columns:
    """Rows ``[start, stop)`` of the file as columns: one range, by a :class:`RowReader` of its own."""
    with RowReader() as reader:
        return reader.read(path, fmt, start, stop)


class RowReader:
    """Reads ranges of rows of files, keeping the file it last read open where its last range ended.

    A job reads its shards in order, each starting where the one before ended. Read from the file's start each
    time, a CSV, JSON Lines or TFRecord file of n shards would be parsed n(n+1)/2 shards' worth (none can seek to a
    row), and a Parquet row group decoded once for every shard in it. Any other range is read right too: a later
    one reads past the rows between, an earlier one reopens the file. One file is open at a time, and one thread at
    a time reads.
    """

    def __init__(self) -> None:
        self._open: tuple[str, str, _Cursor] | None = None

    def read(self, path: str, fmt: str, start: int, stop: int) -> Columns:
        """Rows ``[start, stop)`` of the file as columns (fewer rows where the file ends first).

        csv, jsonl, parquet: numeric and bool columns keep their numpy dtype (per range read: an int column with a
        missing value in this range reads as float64), text is an object array of str (a missing text value is
        ``""`` in CSV, which cannot tell them apart, else None), and a column of equal-length lists is a 2-D array.
        A blank line of a CSV file is a row of missing values (as in :func:`count_rows`). npy: ``{"": rows}``; npz:
        each array by its name. tfrecord: each record's tf.Example features by name (sorted: an Example's features
        have no order), 1-D where every record has one value and 2-D where all have k, and the raw records as
        :data:`RECORD_COLUMN`.
        """
        if start < 0:
            raise _fail(path, f"cannot read rows from {start}")
        opener = _handler(_CURSORS, fmt, path)
        try:
            with _reading(path):
                cursor = self._cursor(path, fmt, start, opener)
                if cursor.row < start:
                    cursor.skip(start - cursor.row)
                return cursor.take(max(start, stop) - start)
        except BaseException:
            self.close()  # where a failed read left the file is unknown: the next read opens it again
            raise

    def _cursor(self, path: str, fmt: str, start: int, opener: Callable[[str, int], _Cursor]) -> _Cursor:
        if self._open is not None:
            open_path, open_fmt, cursor = self._open
            if (open_path, open_fmt) == (path, fmt) and cursor.row <= start:
                return cursor
            self.close()
        cursor = opener(path, start)
        self._open = (path, fmt, cursor)
        return cursor

    def close(self) -> None:
        if self._open is not None:
            _, _, cursor = self._open
            self._open = None
            cursor.close()

    def __enter__(self) -> RowReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class _Cursor(Protocol):
    """A file open for reading in order. Opened for a range's first row, it may start before it (``row``)."""

    row: int  # the row take() reads first

    def take(self, rows: int) -> Columns:
        """The next ``rows`` rows (fewer at the file's end)."""
        ...

    def skip(self, rows: int) -> None:
        """Past the next ``rows`` rows."""
        ...

    def close(self) -> None: ...


class _Reading:
    """What a cursor that cannot seek does to skip rows: it reads them."""

    def take(self, rows: int) -> Columns:
        raise NotImplementedError

    def skip(self, rows: int) -> None:
        self.take(rows)


class _OpenFile:
    """A cursor's file, opened (locally, or through fsspec) when the cursor is, closed with it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._files = contextlib.ExitStack()
        self.file = self._files.enter_context(_open_binary(path))

    def close(self) -> None:
        self._files.close()


def _handler(table: Mapping[str, Any], fmt: str, path: str) -> Any:
    if fmt not in table:
        raise _fail(path, f"unknown format {fmt!r}; the formats are {', '.join(FORMATS)}")
    return table[fmt]


@contextlib.contextmanager
def _reading(path: str) -> Iterator[None]:
    """Bad data (or a missing local file) becomes a BatchDataError naming the file; a failing store a StorageError."""
    try:
        yield
    except (BatchDataError, StorageError):
        raise
    except (ValueError, EOFError, zipfile.BadZipFile) as exc:  # pandas', pyarrow's and numpy's errors of bad data
        raise _fail(path, _reason(exc)) from exc
    except Exception as exc:  # each store's client raises its own types while a file is read
        if is_remote(path):
            raise storage_error(path, exc) from None
        raise _fail(path, _reason(exc)) from exc


def _reason(exc: BaseException) -> str:
    if isinstance(exc, CorruptRecord):  # its message names the file already
        return exc.reason
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


@contextlib.contextmanager
def _open_binary(path: str) -> Iterator[IO[bytes]]:
    """The file opened for reading: a local one directly, a remote one through fsspec (read as it is consumed)."""
    if not is_remote(path):
        with open(path, "rb") as local:
            yield local
        return
    fs, remote_path = _filesystem(path)
    with translated(path):
        remote = fs.open(remote_path, "rb")
    with remote:
        yield remote


# --- CSV and JSON Lines (through pandas)
def _count_csv(path: str) -> int:
    import pandas as pd

    with _open_binary(path) as f:
        try:
            # One column parsed, in chunks: the tokenizer still sees every field, so quoted newlines count right.
            with pd.read_csv(f, usecols=[0], chunksize=_CSV_CHUNK_ROWS, skip_blank_lines=False) as chunks:
                return sum(len(chunk) for chunk in chunks)
        except pd.errors.EmptyDataError:  # not even a header
            return 0


class _CsvCursor(_Reading):
    """pandas' reader, parsing the next rows when asked (so dtypes are inferred range by range)."""

    def __init__(self, path: str, start: int) -> None:
        import pandas as pd

        self.row = 0
        self._file = _OpenFile(path)
        self._chunks: Any = None
        try:
            f = self._file.file
            try:
                self._names = list(pd.read_csv(f, nrows=0).columns)
            except pd.errors.EmptyDataError:  # not even a header: no columns, no rows
                self._names = []
                return
            f.seek(0)
            # Blank lines are rows (of missing values) here and in _count_csv alike.
            self._chunks = pd.read_csv(
                f, header=None, names=self._names, skiprows=1, index_col=False, skip_blank_lines=False, iterator=True
            )
        except BaseException:
            self._file.close()
            raise

    def take(self, rows: int) -> Columns:
        import pandas as pd

        if self._chunks is None:
            return {}
        frame = pd.DataFrame(columns=self._names)
        if rows > 0:
            with contextlib.suppress(StopIteration):  # the file has ended
                frame = self._chunks.get_chunk(rows)
        self.row += len(frame)
        return _frame_columns(frame, self._file.path, missing_text="")

    def close(self) -> None:
        if self._chunks is not None:
            self._chunks.close()
        self._file.close()


def _count_jsonl(path: str) -> int:
    with _open_binary(path) as f:
        return sum(1 for line in f if line.strip())


class _JsonLinesCursor(_Reading):
    """The file's non-blank lines, read in order; pandas builds each range's columns."""

    def __init__(self, path: str, start: int) -> None:
        self.row = 0
        self._file = _OpenFile(path)
        self._lines = (line for line in self._file.file if line.strip())

    def take(self, rows: int) -> Columns:
        import pandas as pd

        lines = list(itertools.islice(self._lines, rows))
        records = [_json_object(line, self.row + offset, self._file.path) for offset, line in enumerate(lines)]
        self.row += len(lines)
        # Keys in first-seen order, a missing key a missing value, dtypes inferred as pandas does.
        return _frame_columns(pd.DataFrame(records), self._file.path, missing_text=None)

    def skip(self, rows: int) -> None:
        self.row += sum(1 for _ in itertools.islice(self._lines, rows))  # lines skipped are not parsed

    def close(self) -> None:
        self._file.close()


def _json_object(line: bytes, row: int, path: str) -> dict[str, Any]:
    try:
        value = orjson.loads(line)
    except ValueError as exc:
        raise _fail(path, f"row {row} is not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise _fail(path, f"row {row} is not a JSON object (JSON Lines holds one object per line)")
    return value


def _frame_columns(frame: pd.DataFrame, path: str, missing_text: str | None) -> Columns:
    return {str(name): _series_column(frame[name], str(name), path, missing_text) for name in frame.columns}


def _series_column(series: pd.Series, name: str, path: str, missing_text: str | None) -> np.ndarray:
    if isinstance(series.dtype, np.dtype) and series.dtype.kind != "O":
        return series.to_numpy()
    values = series.to_numpy(dtype=object, na_value=missing_text)
    if any(isinstance(value, list) for value in values):
        return _stacked(values, name, path)
    return values


def _stacked(values: np.ndarray, name: str, path: str) -> np.ndarray:
    """A column of lists as one 2-D array, rows x length: a model input has one shape."""
    lengths = {len(value) if isinstance(value, list) else -1 for value in values}
    if len(lengths) > 1 or -1 in lengths:
        raise _fail(path, f"column {name!r} holds lists of different lengths (or rows without one)")
    return np.array(values.tolist())


# --- Parquet (through pyarrow)
def _count_parquet(path: str) -> int:
    import pyarrow.parquet as pq

    with _open_binary(path) as f:
        return int(pq.ParquetFile(f).metadata.num_rows)


class _ParquetCursor:
    """pyarrow's batches from the row group holding a row on, a batch's rows past a range held for the next. Rows
    skipped in row groups of their own are not decoded."""

    def __init__(self, path: str, start: int) -> None:
        import pyarrow.parquet as pq

        self._file = _OpenFile(path)
        try:
            self._parquet = pq.ParquetFile(self._file.file)
            self._columns = _parquet_data_columns(self._parquet.schema_arrow)
            self._empty = self._parquet.schema_arrow.empty_table().select(self._columns)
            self._start_at(start)
        except BaseException:
            self._file.close()
            raise

    def _start_at(self, row: int) -> None:
        metadata = self._parquet.metadata
        first_group, self.row = _row_group_of(metadata, row)
        groups = list(range(first_group, metadata.num_row_groups))
        self._batches: Iterator[pa.RecordBatch] = iter(())
        if groups:  # (none: the file ends before the row)
            self._batches = self._parquet.iter_batches(
                batch_size=_PARQUET_BATCH_ROWS, row_groups=groups, columns=self._columns, use_pandas_metadata=False
            )
        self._held: pa.Table = self._empty  # decoded, not yet taken

    def take(self, rows: int) -> Columns:
        taken = self._next(rows)
        return {name: _arrow_column(taken.column(name), name, self._file.path) for name in taken.column_names}

    def skip(self, rows: int) -> None:
        target = self.row + rows
        _, group_start = _row_group_of(self._parquet.metadata, target)
        if group_start > self.row + self._held.num_rows:  # a row group not decoded yet: start there
            self._start_at(target)
        self._next(target - self.row)

    def _next(self, rows: int) -> pa.Table:
        import pyarrow as pa

        batches = self._held.to_batches()
        held = self._held.num_rows
        while held < rows and (batch := next(self._batches, None)) is not None:
            batches.append(batch)
            held += batch.num_rows
        table = pa.Table.from_batches(batches, schema=self._empty.schema)
        taken, self._held = table.slice(0, rows), table.slice(rows)
        self.row += taken.num_rows
        return taken

    def close(self) -> None:
        self._file.close()


def _row_group_of(metadata: Any, row: int) -> tuple[int, int]:
    """The row group holding ``row`` (the count of groups where the file ends first), and its first row."""
    first = 0
    for index in range(metadata.num_row_groups):
        rows = metadata.row_group(index).num_rows
        if row < first + rows:
            return index, first
        first += rows
    return metadata.num_row_groups, first


def _parquet_data_columns(schema: pa.Schema) -> list[str]:
    """The columns, without the index pandas stores as columns (``__index_level_0__``) when it wrote the file."""
    index = (schema.pandas_metadata or {}).get("index_columns", [])
    return [name for name in schema.names if name not in {column for column in index if isinstance(column, str)}]


def _arrow_column(column: pa.ChunkedArray, name: str, path: str) -> np.ndarray:
    import pyarrow as pa

    kind = column.type
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return _arrow_lists(column.combine_chunks(), name, path)
    # Numbers and bools keep their dtype (ints with nulls become float64 NaN), text and bytes are object arrays.
    return column.to_numpy()


def _arrow_lists(array: pa.Array, name: str, path: str) -> np.ndarray:
    import pyarrow.compute as pc

    lengths = pc.unique(pc.list_value_length(array))
    if array.null_count or len(lengths) > 1:
        raise _fail(path, f"column {name!r} holds lists of different lengths (or rows without one)")
    width = lengths[0].as_py() if len(lengths) else 0
    return pc.list_flatten(array).to_numpy(zero_copy_only=False).reshape(len(array), width)


# --- .npy and .npz (through numpy's format module)
class _SeekingCursor:
    """A format whose ranges are read where they are (each range reopens the file: the header says where)."""

    def __init__(self, read: Callable[[str, int, int], Columns], path: str, start: int) -> None:
        self._read, self._path, self.row = read, path, start

    def take(self, rows: int) -> Columns:
        columns = self._read(self._path, self.row, self.row + rows)
        self.row += len(next(iter(columns.values()), ()))
        return columns

    def skip(self, rows: int) -> None:
        self.row += rows

    def close(self) -> None:
        pass


def _count_npy(path: str) -> int:
    with _open_binary(path) as f:
        shape, _, _ = _npy_header(f)
    return _rows_of(shape, path)


def _read_npy(path: str, start: int, stop: int) -> Columns:
    with _open_binary(path) as f:
        return {"": _npy_rows(f, start, stop, path)}


def _count_npz(path: str) -> int:
    with _open_binary(path) as f, zipfile.ZipFile(f) as archive:
        counts = {}
        for member in _npz_members(archive):
            with archive.open(member) as array:
                counts[_array_name(member)] = _rows_of(_npy_header(array)[0], path)
    if len(set(counts.values())) > 1:
        raise _fail(path, f"its arrays have different numbers of rows: {counts}")
    return next(iter(counts.values()), 0)


def _read_npz(path: str, start: int, stop: int) -> Columns:
    # np.load's NpzFile would read each whole array; a member's rows are read after its header instead.
    columns = {}
    with _open_binary(path) as f, zipfile.ZipFile(f) as archive:
        for member in _npz_members(archive):
            with archive.open(member) as array:
                columns[_array_name(member)] = _npy_rows(array, start, stop, path)
    return columns


def _npz_members(archive: zipfile.ZipFile) -> list[str]:
    return [name for name in archive.namelist() if not name.endswith("/")]


def _array_name(member: str) -> str:
    return member[: -len(".npy")] if member.endswith(".npy") else member  # as np.load names them


def _npy_header(f: IO[bytes]) -> tuple[tuple[int, ...], bool, np.dtype]:
    """(shape, Fortran order, dtype) from the header of the .npy data at ``f``'s position; leaves ``f`` after it."""
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(f)  # type: ignore[no-any-return]
    return np.lib.format.read_array_header_2_0(f)  # type: ignore[no-any-return]


def _npy_rows(f: IO[bytes], start: int, stop: int, path: str) -> np.ndarray:
    """Rows [start, stop) of the .npy data at ``f``'s position, reading only their bytes (C order)."""
    shape, fortran_order, dtype = _npy_header(f)
    rows = _rows_of(shape, path)
    if dtype.hasobject:
        raise _fail(path, "an array of Python objects (a pickle) is not read")
    start, stop = min(start, rows), min(stop, rows)
    if fortran_order:  # its rows are not contiguous: read it whole
        return np.array(np.lib.format.read_array(_rewound(f), allow_pickle=False)[start:stop])
    row_shape = shape[1:]
    row_bytes = dtype.itemsize * int(np.prod(row_shape))
    f.seek(start * row_bytes, os.SEEK_CUR)
    # Read straight into the array (one copy, the GIL released while the file is read), not through a bytes object
    # or a memory map (a page fault a page: several times slower for a shard of hundreds of megabytes).
    rows_read = np.empty((stop - start, *row_shape), dtype=dtype)
    buffer = rows_read.data.cast("B")
    filled = 0
    while filled < len(buffer):
        got = f.readinto(buffer[filled:])  # type: ignore[attr-defined]
        if not got:
            raise _fail(path, "the array's data ends before its header says")
        filled += got
    return rows_read


def _rewound(f: IO[bytes]) -> IO[bytes]:
    f.seek(0)
    return f


def _rows_of(shape: tuple[int, ...], path: str) -> int:
    if not shape:
        raise _fail(path, "holds a single value, not rows (an array of at least one dimension is)")
    return shape[0]


# --- TFRecord files of tf.Examples
def _records(path: str) -> Iterator[bytes]:
    if not is_remote(path):
        return read_records(path)
    fs, remote_path = _filesystem(path)
    with translated(path):
        data = fs.cat_file(remote_path)
    return records_in(data, path)


def _count_tfrecord(path: str) -> int:
    return sum(1 for _ in _records(path))


class _TfRecordCursor(_Reading):
    """The file's records in order (a remote file downloaded once), each range's parsed as tf.Examples."""

    def __init__(self, path: str, start: int) -> None:
        self.row = 0
        self._path = path
        self._records = _records(path)

    def take(self, rows: int) -> Columns:
        records = list(itertools.islice(self._records, rows))
        columns = _example_columns(records, self.row, self._path)
        columns[RECORD_COLUMN] = _objects(records)
        self.row += len(records)
        return columns

    def skip(self, rows: int) -> None:
        self.row += sum(1 for _ in itertools.islice(self._records, rows))  # records skipped are not parsed

    def close(self) -> None:
        self._records = iter(())


def _example_proto() -> Any:
    """TensorFlow's ``example_pb2``, without importing TensorFlow (seconds): see runtime/tensorflow_protos.py."""
    import workbench.runtime.tensorflow_protos  # noqa: F401  # isort: skip  (no tensorflow/__init__)
    from tensorflow.core.example import example_pb2

    return example_pb2


def _example_columns(records: list[bytes], first: int, path: str) -> Columns:
    example_pb2 = _example_proto()
    parsed = [_example_features(example_pb2, data, first + offset, path) for offset, data in enumerate(records)]
    names = sorted({name for features in parsed for name in features})
    return {name: _feature_column([features.get(name) for features in parsed], name, path) for name in names}


def _example_features(example_pb2: Any, data: bytes, row: int, path: str) -> dict[str, tuple[str, list[Any]]]:
    """A record's features by name, as (``int64_list``, ``float_list`` or ``bytes_list``, values)."""
    from google.protobuf.message import DecodeError

    example = example_pb2.Example()
    try:
        example.ParseFromString(data)
    except DecodeError:
        raise _fail(path, f"record {row} is not a tf.Example") from None
    features = {}
    for name, feature in example.features.feature.items():
        kind = feature.WhichOneof("kind")
        if kind is not None:
            features[name] = (kind, list(getattr(feature, kind).value))
    return features


_FEATURE_DTYPES: dict[str, Any] = {"int64_list": np.int64, "float_list": np.float32, "bytes_list": object}


def _feature_column(rows: list[tuple[str, list[Any]] | None], name: str, path: str) -> np.ndarray:
    """One feature in every record read, as a column: 1-D for one value a record, 2-D for k."""
    present = [row for row in rows if row is not None and row[1]]
    if len(present) < len(rows):
        raise _fail(path, f"feature {name!r} is missing from some of the records")
    kinds = {kind for kind, _ in present}
    if len(kinds) > 1:
        raise _fail(path, f"feature {name!r} has different types in different records ({', '.join(sorted(kinds))})")
    widths = {len(values) for _, values in present}
    if len(widths) > 1:
        raise _fail(path, f"feature {name!r} has different numbers of values in different records")
    array = np.array([values for _, values in present], dtype=_FEATURE_DTYPES[kinds.pop()])
    return array.reshape(len(rows)) if widths.pop() == 1 else array


def _objects(values: list[Any]) -> np.ndarray:
    return np.fromiter(values, dtype=object, count=len(values))


# ---------------------------------------------------------------------------------------------------- writing
def write_table(columns: Mapping[str, np.ndarray], path: str, fmt: str) -> None:
    """Write the columns (of one length; 1-D or 2-D) as one file, atomically.

    csv: a 2-D column becomes columns ``name_0``, ``name_1``, ...; jsonl: one object per row, a 2-D column's row a
    list, NaN null. CSV and JSON have no bytes: a bytes column is written as its text where every value is UTF-8,
    else every value base64-encoded. parquet: a 2-D column is a fixed-size list column. npy: exactly one column.
    npy, npz: text and bytes as numpy's fixed-width types (str and bytes without trailing NULs). tfrecord: one
    tf.Example a row, a feature a column (ints and bools int64_list, floats float_list, str and bytes bytes_list).
    """
    writer = _handler(_WRITERS, fmt, path)
    table = _checked(columns, path)
    _write_atomically(path, lambda f: writer(table, f, path))


def _checked(columns: Mapping[str, np.ndarray], path: str) -> Columns:
    table = {str(name): np.asarray(values) for name, values in columns.items()}
    for name, values in table.items():
        if values.ndim not in (1, 2):
            raise _fail(path, f"column {name!r} has {values.ndim} dimensions; a table's columns have 1 or 2")
    lengths = {name: len(values) for name, values in table.items()}
    if len(set(lengths.values())) > 1:
        raise _fail(path, f"the columns have different numbers of rows: {lengths}")
    return table


def _write_atomically(path: str, write: Writer) -> None:
    if is_remote(path):
        fs, remote_path = _filesystem(path)
        if not getattr(fs, "local_file", False):
            _put(fs, remote_path, path, write)
            return
        path = remote_path  # file://: a local file, renamed into place like any other
    _replace(path, write)


def _replace(path: str, write: Writer) -> None:
    """Write a temporary file next to ``path`` and rename it over ``path``: the file is whole, or the old one."""
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    temporary = os.path.join(folder, f".tmp-{uuid.uuid4().hex}")
    try:
        with open(temporary, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())  # the data is on disk before the rename makes it the file
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temporary)
        raise


def _put(fs: Any, remote_path: str, url: str, write: Writer) -> None:
    """Write a local temporary file and upload it: an object store's put makes the object whole or not at all."""
    descriptor, temporary = tempfile.mkstemp(prefix=".tmp-")
    try:
        with os.fdopen(descriptor, "wb") as f:
            write(f)
        with translated(url):
            fs.put_file(temporary, remote_path)
    finally:
        os.remove(temporary)


# --- CSV and JSON Lines
def _write_csv(columns: Columns, f: IO[bytes], path: str) -> None:
    import pandas as pd

    flat: dict[str, np.ndarray] = {}
    for name, values in columns.items():
        text = _text_of_bytes(values)
        if text.ndim == 1:
            flat[name] = text
        else:
            flat.update((f"{name}_{index}", text[:, index]) for index in range(text.shape[1]))
    pd.DataFrame(flat).to_csv(f, index=False, mode="wb")


def _write_jsonl(columns: Columns, f: IO[bytes], path: str) -> None:
    names = list(columns)
    # tolist() turns numpy values into Python's (a 2-D column's row into a list); orjson writes NaN as null.
    rows = zip(*(_text_of_bytes(values).tolist() for values in columns.values()), strict=True)
    options = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE
    for index, row in enumerate(rows):
        try:
            f.write(orjson.dumps(dict(zip(names, row, strict=True)), option=options))
        except orjson.JSONEncodeError as exc:
            raise _fail(path, f"row {index} cannot be written as JSON: {exc}") from None


def _text_of_bytes(values: np.ndarray) -> np.ndarray:
    """A bytes column as text, for formats without bytes: UTF-8 where every value decodes, else base64."""
    if values.dtype.kind not in "SO":
        return values
    items = values.ravel().tolist()
    if not any(isinstance(item, bytes) for item in items):
        return values
    try:
        text = [item.decode() if isinstance(item, bytes) else item for item in items]
    except UnicodeDecodeError:  # one encoding for the whole column: a reader decodes all of it or none
        text = [base64.b64encode(item).decode("ascii") if isinstance(item, bytes) else item for item in items]
    return _objects(text).reshape(values.shape)


# --- Parquet
def _write_parquet(columns: Columns, f: IO[bytes], path: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({name: _arrow_array(values, name, path) for name, values in columns.items()}), f)


def _arrow_array(values: np.ndarray, name: str, path: str) -> pa.Array:
    import pyarrow as pa

    try:
        if values.ndim == 2:
            return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), values.shape[1])
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        raise _fail(path, f"column {name!r} cannot be written as Parquet: {exc}") from None


# --- .npy and .npz
def _write_npy(columns: Columns, f: IO[bytes], path: str) -> None:
    if len(columns) != 1:
        names = ", ".join(map(repr, columns))
        raise _fail(path, f"an .npy file holds one array, not {len(columns)} columns ({names}): write npz")
    ((name, values),) = columns.items()
    np.save(f, _storable(values, name, path), allow_pickle=False)


def _write_npz(columns: Columns, f: IO[bytes], path: str) -> None:
    # What np.savez does, which would take a column named "file" or "allow_pickle" for its own argument.
    with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, values in columns.items():
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, _storable(values, name, path), allow_pickle=False)


def _storable(values: np.ndarray, name: str, path: str) -> np.ndarray:
    """An object column as numpy's fixed-width str or bytes: anything else would be stored as a pickle."""
    if values.dtype != object:
        return values
    items = values.ravel().tolist()
    if all(isinstance(item, str) for item in items):
        return values.astype(str)
    # numpy's bytes type drops trailing NULs: a value ending in one would not read back the same
    if all(isinstance(item, bytes) and not item.endswith(b"\0") for item in items):
        return values.astype(bytes)
    raise _fail(path, f"column {name!r} holds values other than str or bytes, which .npy stores only as pickles")


# --- TFRecord
def _write_tfrecord(columns: Columns, f: IO[bytes], path: str) -> None:
    example_pb2 = _example_proto()
    features = [(name, _feature_kind(values, name, path), _feature_rows(values)) for name, values in columns.items()]
    rows = len(next(iter(columns.values()))) if columns else 0
    for row in range(rows):
        example = example_pb2.Example()
        for name, kind, values in features:
            try:
                getattr(example.features.feature[name], kind).value.extend(values[row])
            except (TypeError, ValueError) as exc:  # an int out of int64's range
                raise _fail(path, f"column {name!r}, row {row}: {exc}") from None
        f.write(encode_record(example.SerializeToString()))


def _feature_kind(values: np.ndarray, name: str, path: str) -> str:
    if values.dtype.kind in "biu":
        return "int64_list"
    if values.dtype.kind == "f":
        return "float_list"
    if values.dtype.kind in "US" or all(isinstance(item, (str, bytes)) for item in values.ravel().tolist()):
        return "bytes_list"
    raise _fail(
        path, f"column {name!r} ({values.dtype}) cannot be a tf.Example feature: ints, floats, str and bytes can"
    )


def _feature_rows(values: np.ndarray) -> list[list[Any]]:
    """Each row's values as a list, in the Python types a feature's list takes (str encoded as UTF-8)."""
    if values.dtype.kind == "b":
        values = values.astype(np.int64)
    items = values.tolist()
    if values.dtype.kind in "UO":
        items = [_encoded(item) for item in items]
    return items if values.ndim == 2 else [[item] for item in items]


def _encoded(item: Any) -> Any:
    if isinstance(item, list):
        return [_encoded(value) for value in item]
    return item.encode() if isinstance(item, str) else item


# ---------------------------------------------------------------------------------------------- plain files
def exists(path: str) -> bool:
    """Whether the file (or folder) is there, locally or in a store."""
    if not is_remote(path):
        return os.path.exists(path)
    fs, remote_path = _filesystem(path)
    with translated(path):
        fs.invalidate_cache(remote_path)  # fsspec caches listings; a resumed job asks what is there now
        return bool(fs.exists(remote_path))


def read_text(path: str) -> str:
    """The whole file as UTF-8 text."""
    if not is_remote(path):
        with open(path, encoding="utf-8") as f:
            return f.read()
    fs, remote_path = _filesystem(path)
    with translated(path):
        data = fs.cat_file(remote_path)
    return bytes(data).decode("utf-8")


def write_text(path: str, text: str) -> None:
    """Write ``text`` (UTF-8) as the file, atomically as :func:`write_table` does."""
    data = text.encode("utf-8")

    def write(f: IO[bytes]) -> None:
        f.write(data)

    _write_atomically(path, write)


def remove(path: str) -> None:
    """Remove the file; one that is not there is fine."""
    if not is_remote(path):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
        return
    fs, remote_path = _filesystem(path)
    with translated(path), contextlib.suppress(FileNotFoundError):
        fs.rm_file(remote_path)


def list_names(folder: str) -> list[str]:
    """The names of the files directly in ``folder``, sorted; none if it is not there."""
    if not is_remote(folder):
        if not os.path.isdir(folder):
            return []
        return sorted(name for name in os.listdir(folder) if os.path.isfile(os.path.join(folder, name)))
    fs, remote_path = _filesystem(folder)
    with translated(folder):
        fs.invalidate_cache(remote_path)
        try:
            entries = fs.ls(remote_path, detail=True)
        except FileNotFoundError:
            return []
    return sorted(entry["name"].rstrip("/").rsplit("/", 1)[-1] for entry in entries if entry["type"] != "directory")


def child(folder: str, name: str) -> str:
    """``folder``'s file ``name``: joined with the local separator, or with "/" in a URL."""
    return f"{folder.rstrip('/')}/{name}" if is_remote(folder) else os.path.join(folder, name)


_COUNTERS: dict[str, Callable[[str], int]] = {
    "csv": _count_csv,
    "parquet": _count_parquet,
    "jsonl": _count_jsonl,
    "npy": _count_npy,
    "npz": _count_npz,
    "tfrecord": _count_tfrecord,
}
_CURSORS: dict[str, Callable[[str, int], _Cursor]] = {
    "csv": _CsvCursor,
    "parquet": _ParquetCursor,
    "jsonl": _JsonLinesCursor,
    "npy": functools.partial(_SeekingCursor, _read_npy),
    "npz": functools.partial(_SeekingCursor, _read_npz),
    "tfrecord": _TfRecordCursor,
}
_WRITERS: dict[str, Callable[[Columns, IO[bytes], str], None]] = {
    "csv": _write_csv,
    "parquet": _write_parquet,
    "jsonl": _write_jsonl,
    "npy": _write_npy,
    "npz": _write_npz,
    "tfrecord": _write_tfrecord,
}
