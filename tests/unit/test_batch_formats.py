"""workbench.batch_prediction.formats on real files: every format written, counted and read back, by range, locally and
through
fsspec's in-memory file system (the remote code paths)."""

from __future__ import annotations

import base64
import os
import uuid
from collections.abc import Iterator

import numpy as np
import pytest

from workbench.batch_prediction import formats
from workbench.batch_prediction.formats import RECORD_COLUMN, BatchDataError
from workbench.protocol.tfrecord import encode_record
from workbench.runtime.storage import StorageError

ROWS = 10
TABULAR = ("csv", "parquet", "jsonl", "npz", "tfrecord")


def table() -> dict[str, np.ndarray]:
    return {
        "f": np.arange(ROWS) * 0.25 - 1.0,
        "i": np.arange(ROWS, dtype=np.int64) * 7 - 20,
        "s": np.array([f'row {n}, "quoted"' for n in range(ROWS)], dtype=object),
        "m": np.arange(ROWS * 3, dtype=np.float64).reshape(ROWS, 3) / 8,
    }


def expected(fmt: str, columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What read_rows gives back for ``columns`` written as ``fmt``."""
    if fmt == "csv":  # a 2-D column is written as one column per value
        flat = {name: values for name, values in columns.items() if values.ndim == 1}
        flat.update((f"m_{k}", columns["m"][:, k]) for k in range(columns["m"].shape[1]))
        return {name: flat[name] for name in ["f", "i", "s", "m_0", "m_1", "m_2"]}
    if fmt == "tfrecord":  # float_list holds float32, bytes_list bytes; an Example's features come back sorted
        converted = {
            "f": columns["f"].astype(np.float32),
            "i": columns["i"],
            "m": columns["m"].astype(np.float32),
            "s": np.array([value.encode() for value in columns["s"]], dtype=object),
        }
        return dict(sorted(converted.items()))
    return columns


def assert_columns(actual: dict[str, np.ndarray], wanted: dict[str, np.ndarray]) -> None:
    assert list(actual) == list(wanted)
    for name, values in wanted.items():
        assert actual[name].shape == values.shape, name
        np.testing.assert_array_equal(actual[name], values, err_msg=name)


def sliced(columns: dict[str, np.ndarray], start: int, stop: int) -> dict[str, np.ndarray]:
    return {name: values[start:stop] for name, values in columns.items()}


def without_records(columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {name: values for name, values in columns.items() if name != RECORD_COLUMN}


# ------------------------------------------------------------------------------------------------ round trips
@pytest.mark.parametrize("fmt", TABULAR)
def test_round_trip(tmp_path, fmt):
    path = str(tmp_path / f"data.{fmt}")
    formats.write_table(table(), path, fmt)

    assert formats.count_rows(path, fmt) == ROWS
    columns = formats.read_rows(path, fmt, 0, ROWS)
    assert_columns(without_records(columns), expected(fmt, table()))
    if fmt in ("csv", "parquet", "jsonl"):
        assert columns["f"].dtype == np.float64
        assert columns["i"].dtype == np.int64
        assert columns["s"].dtype == object and isinstance(columns["s"][0], str)


@pytest.mark.parametrize("fmt", TABULAR)
def test_a_middle_range_and_one_past_the_end(tmp_path, fmt):
    path = str(tmp_path / f"data.{fmt}")
    formats.write_table(table(), path, fmt)
    wanted = expected(fmt, table())

    assert_columns(without_records(formats.read_rows(path, fmt, 3, 7)), sliced(wanted, 3, 7))
    assert_columns(without_records(formats.read_rows(path, fmt, ROWS - 2, ROWS + 5)), sliced(wanted, ROWS - 2, ROWS))


@pytest.mark.parametrize("fmt", (*TABULAR, "npy"))
def test_a_reader_reads_ranges_in_order_out_of_order_and_across_files(tmp_path, fmt):
    """A RowReader's ranges equal one-shot reads whatever their order: the next one, one further on (rows skipped),
    an earlier one (the file reopened), another file and back, and one past the end."""
    columns = {"m": table()["m"]} if fmt == "npy" else table()
    paths = [str(tmp_path / f"{name}.{fmt}") for name in ("a", "b")]
    for path in paths:
        formats.write_table(columns, path, fmt)
    wanted = {"": columns["m"]} if fmt == "npy" else expected(fmt, columns)
    a, b = paths
    ranges = [(a, 0, 3), (a, 3, 6), (a, 8, 9), (a, 1, 4), (b, 2, 5), (a, 4, 8), (a, 8, 14)]
    with formats.RowReader() as reader:
        for path, start, stop in ranges:
            got = without_records(reader.read(path, fmt, start, stop))
            assert_columns(got, sliced(wanted, start, stop))
            assert_columns(got, without_records(formats.read_rows(path, fmt, start, stop)))


def test_a_reader_reads_a_file_once_when_its_ranges_follow_each_other(tmp_path):
    """Shards read in order parse the file once: the bytes read from it are about its size, not n(n+1)/2 shards'
    (what reading each range from the file's start costs, as a CSV file cannot seek to a row)."""
    io = f"/proc/{os.getpid()}/io"
    if not os.path.exists(io):
        pytest.skip("the bytes a process reads are counted in /proc (Linux)")
    rows, shards = 20_000, 10
    path = str(tmp_path / "big.csv")
    values = np.arange(rows * 8, dtype=np.float64).reshape(rows, 8)
    formats.write_table({f"c{k}": values[:, k] for k in range(8)}, path, "csv")

    def bytes_read() -> int:
        with open(io) as counters:
            return int(next(line for line in counters if line.startswith("rchar:")).split()[1])

    before = bytes_read()
    with formats.RowReader() as reader:
        step = rows // shards
        parts = [reader.read(path, "csv", start, start + step) for start in range(0, rows, step)]
    read = bytes_read() - before
    np.testing.assert_array_equal(np.concatenate([part["c3"] for part in parts]), values[:, 3])
    assert read < 1.5 * os.path.getsize(path), (read, os.path.getsize(path))


def test_a_parquet_reader_starts_at_the_row_group_of_its_first_row(tmp_path):
    """A resumed job's first shard is far into a file, and a worker's next shard further on: the reader starts at
    the row group that holds the range's first row."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "groups.parquet"
    values = np.arange(40, dtype=np.int64)
    pq.write_table(pa.table({"v": values}), path, row_group_size=8)
    with formats.RowReader() as reader:
        assert_columns(reader.read(str(path), "parquet", 21, 30), {"v": values[21:30]})
        assert_columns(reader.read(str(path), "parquet", 30, 31), {"v": values[30:31]})
        assert_columns(reader.read(str(path), "parquet", 35, 37), {"v": values[35:37]})
        assert_columns(reader.read(str(path), "parquet", 37, 50), {"v": values[37:]})
        assert_columns(reader.read(str(path), "parquet", 45, 50), {"v": values[:0]})


def test_rows_skipped_are_not_parsed_and_a_failed_read_leaves_the_reader_able_to_read_again(tmp_path):
    path = tmp_path / "lines.jsonl"
    path.write_text('{"x": 1}\n{"x": 2}\nnot json\n{"x": 4}\n')
    with formats.RowReader() as reader:
        assert_columns(reader.read(str(path), "jsonl", 0, 2), {"x": np.array([1, 2])})
        assert_columns(reader.read(str(path), "jsonl", 3, 4), {"x": np.array([4])})
        with pytest.raises(BatchDataError, match="row 2 is not JSON"):
            reader.read(str(path), "jsonl", 2, 4)
        assert_columns(reader.read(str(path), "jsonl", 1, 2), {"x": np.array([2])})


def test_npy_holds_one_unnamed_array(tmp_path):
    path = str(tmp_path / "x.npy")
    matrix = np.arange(24, dtype=np.float32).reshape(8, 3)
    formats.write_table({"x": matrix}, path, "npy")

    assert formats.count_rows(path, "npy") == 8
    assert_columns(formats.read_rows(path, "npy", 0, 8), {"": matrix})
    assert_columns(formats.read_rows(path, "npy", 2, 5), {"": matrix[2:5]})


def test_npy_refuses_two_columns_and_names_npz(tmp_path):
    with pytest.raises(BatchDataError, match="npz"):
        formats.write_table({"a": np.zeros(3), "b": np.ones(3)}, str(tmp_path / "x.npy"), "npy")
    assert os.listdir(tmp_path) == []


def test_npz_arrays_must_agree_on_their_rows(tmp_path):
    path = tmp_path / "x.npz"
    np.savez(path, a=np.zeros(3), b=np.zeros(4))
    with pytest.raises(BatchDataError, match="different numbers of rows"):
        formats.count_rows(str(path), "npz")


def test_parquet_reads_a_range_across_row_groups(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "groups.parquet"
    values = np.arange(20, dtype=np.int64)
    pq.write_table(pa.table({"v": values, "w": values.astype(str)}), path, row_group_size=4)

    assert formats.count_rows(str(path), "parquet") == 20
    columns = formats.read_rows(str(path), "parquet", 5, 11)
    assert_columns(columns, {"v": values[5:11], "w": values[5:11].astype(str).astype(object)})


def test_parquet_ragged_lists_are_refused(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "ragged.parquet"
    pq.write_table(pa.table({"v": [[1, 2], [3]]}), path)
    with pytest.raises(BatchDataError, match="'v'"):
        formats.read_rows(str(path), "parquet", 0, 2)


# ------------------------------------------------------------------------------------------ CSV and JSON Lines
def test_csv_quoted_newlines_are_inside_rows(tmp_path):
    path = tmp_path / "quoted.csv"
    path.write_text('id,text\n1,"a\nb"\n2,c\n3,"d\n\ne"\n4,f\n')

    assert formats.count_rows(str(path), "csv") == 4
    columns = formats.read_rows(str(path), "csv", 1, 3)
    assert_columns(columns, {"id": np.array([2, 3]), "text": np.array(["c", "d\n\ne"], dtype=object)})
    assert_columns(formats.read_rows(str(path), "csv", 3, 9), {"id": np.array([4]), "text": np.array(["f"], object)})


def test_csv_bytes_are_text_or_base64(tmp_path):
    path = str(tmp_path / "bytes.csv")
    formats.write_table(
        {"utf8": np.array([b"caf\xc3\xa9", b"x"], object), "raw": np.array([b"\xff", b"y"], object)}, path, "csv"
    )

    columns = formats.read_rows(path, "csv", 0, 2)
    assert list(columns["utf8"]) == ["café", "x"]
    assert [base64.b64decode(value) for value in columns["raw"]] == [b"\xff", b"y"]


def test_jsonl_lists_are_matrices_and_ragged_ones_are_refused(tmp_path):
    path = tmp_path / "lists.jsonl"
    path.write_text('{"id": 1, "v": [1.0, 2.0]}\n\n{"id": 2, "v": [3.5, 4.0]}\n{"id": 3, "v": [5.0]}\n')

    assert formats.count_rows(str(path), "jsonl") == 3
    assert_columns(
        formats.read_rows(str(path), "jsonl", 0, 2), {"id": np.array([1, 2]), "v": np.array([[1.0, 2.0], [3.5, 4.0]])}
    )
    with pytest.raises(BatchDataError, match="'v'") as caught:
        formats.read_rows(str(path), "jsonl", 0, 3)
    assert str(path) in str(caught.value)


def test_jsonl_line_that_is_not_an_object(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"a": 1}\n[1, 2]\n')
    with pytest.raises(BatchDataError, match="row 1"):
        formats.read_rows(str(path), "jsonl", 0, 2)


# ---------------------------------------------------------------------------------------------------- TFRecord
def example_pb2():
    import workbench.runtime.tensorflow_protos  # noqa: F401  # isort: skip  (no tensorflow/__init__)
    from tensorflow.core.example import example_pb2

    return example_pb2


def test_tfrecord_records_are_tf_examples(tmp_path):
    path = str(tmp_path / "data.tfrecord")
    formats.write_table(table(), path, "tfrecord")

    columns = formats.read_rows(path, "tfrecord", 2, 4)
    assert len(columns[RECORD_COLUMN]) == 2
    example = example_pb2().Example.FromString(columns[RECORD_COLUMN][1])
    feature = example.features.feature
    assert list(feature["i"].int64_list.value) == [table()["i"][3]]
    assert list(feature["m"].float_list.value) == pytest.approx(list(table()["m"][3]))
    assert list(feature["s"].bytes_list.value) == [table()["s"][3].encode()]


def test_tfrecord_missing_and_ragged_features_are_refused(tmp_path):
    Example = example_pb2().Example  # noqa: N806 - the proto class

    def record(**features: list[int]) -> bytes:
        example = Example()
        for name, values in features.items():
            example.features.feature[name].int64_list.value.extend(values)
        return encode_record(example.SerializeToString())

    missing, ragged = tmp_path / "missing.tfrecord", tmp_path / "ragged.tfrecord"
    missing.write_bytes(record(a=[1], b=[2]) + record(a=[3]))
    ragged.write_bytes(record(a=[1, 2]) + record(a=[3]))

    assert formats.count_rows(str(missing), "tfrecord") == 2
    assert_columns(without_records(formats.read_rows(str(missing), "tfrecord", 1, 2)), {"a": np.array([3])})
    with pytest.raises(BatchDataError, match="feature 'b'"):
        formats.read_rows(str(missing), "tfrecord", 0, 2)
    with pytest.raises(BatchDataError, match="feature 'a'"):
        formats.read_rows(str(ragged), "tfrecord", 0, 2)


# -------------------------------------------------------------------------------------------- formats, inputs
@pytest.mark.parametrize(
    ("name", "fmt"),
    [
        ("a.csv", "csv"),
        ("a.CSV", "csv"),
        ("a.parquet", "parquet"),
        ("a.pq", "parquet"),
        ("a.jsonl", "jsonl"),
        ("a.ndjson", "jsonl"),
        ("a.json", "jsonl"),
        ("a.npy", "npy"),
        ("a.npz", "npz"),
        ("a.tfrecord", "tfrecord"),
        ("a.tfrecords", "tfrecord"),
        ("s3://b/p/a.tfr", "tfrecord"),
    ],
)
def test_format_of_by_extension(name, fmt):
    assert formats.format_of(name) == fmt


def test_format_of_explicit_and_unknown():
    assert formats.format_of("part-0000", "CSV") == "csv"
    assert formats.format_of("a.csv", "parquet") == "parquet"
    with pytest.raises(BatchDataError, match=r"data\.txt.*\.csv"):
        formats.format_of("data.txt")
    with pytest.raises(BatchDataError, match="xlsx"):
        formats.format_of("a.csv", "xlsx")


def test_list_inputs(tmp_path):
    for name in ["b.csv", "a.parquet", ".hidden.csv", "_SUCCESS", "notes.txt", "c.csv"]:
        (tmp_path / name).write_text("x\n")
    (tmp_path / "sub.csv").mkdir()

    assert formats.list_inputs(str(tmp_path)) == [str(tmp_path / n) for n in ["a.parquet", "b.csv", "c.csv"]]
    assert formats.list_inputs(str(tmp_path / "*.csv")) == [str(tmp_path / "b.csv"), str(tmp_path / "c.csv")]
    assert formats.list_inputs(str(tmp_path / "notes.txt")) == [str(tmp_path / "notes.txt")]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(BatchDataError, match="empty"):
        formats.list_inputs(str(empty))
    with pytest.raises(BatchDataError, match="nothing"):
        formats.list_inputs(str(tmp_path / "nothing"))


# ----------------------------------------------------------------------------------------------- atomic writes
def test_writes_are_atomic_and_replace(tmp_path):
    path = str(tmp_path / "out" / "part.parquet")  # its folder is created
    formats.write_table({"v": np.arange(5)}, path, "parquet")
    formats.write_table({"v": np.arange(3)}, path, "parquet")

    assert os.listdir(tmp_path / "out") == ["part.parquet"]
    assert_columns(formats.read_rows(path, "parquet", 0, 10), {"v": np.arange(3)})
    with pytest.raises(BatchDataError):  # a write that fails leaves the file as it was, and no temporary file
        formats.write_table({"v": np.array([{"a": 1}], dtype=object)}, path, "npy")
    assert os.listdir(tmp_path / "out") == ["part.parquet"]

    text = str(tmp_path / "out" / "summary.json")
    formats.write_text(text, "{}\n")
    formats.write_text(text, '{"rows": 3}\n')
    assert formats.read_text(text) == '{"rows": 3}\n'
    assert sorted(os.listdir(tmp_path / "out")) == ["part.parquet", "summary.json"]


def test_plain_files(tmp_path):
    folder = str(tmp_path / "f")
    assert formats.list_names(folder) == []
    assert not formats.exists(formats.child(folder, "a.txt"))
    formats.write_text(formats.child(folder, "a.txt"), "é")
    os.mkdir(os.path.join(folder, "sub"))
    assert formats.exists(formats.child(folder, "a.txt"))
    assert formats.list_names(folder) == ["a.txt"]
    formats.remove(formats.child(folder, "a.txt"))
    formats.remove(formats.child(folder, "a.txt"))  # already gone: fine
    assert formats.list_names(folder) == []
    url = "file://" + formats.child(folder, "b.txt")  # a file:// URL is written through the same rename
    formats.write_text(url, "b")
    assert formats.read_text(url) == "b" and formats.list_names(folder) == ["b.txt"]


# ------------------------------------------------------------------------------------------ remote (memory://)
@pytest.fixture
def bucket() -> Iterator[str]:
    from fsspec.implementations.memory import MemoryFileSystem

    name = f"bucket-{uuid.uuid4().hex[:8]}"
    yield f"memory://{name}"
    MemoryFileSystem().rm(f"/{name}", recursive=True)


@pytest.mark.parametrize("fmt", TABULAR)
def test_remote_round_trip(bucket, fmt):
    folder = f"{bucket}/in"
    for part in range(2):
        formats.write_table(table(), formats.child(folder, f"part-{part}.{fmt}"), fmt)
    formats.write_text(formats.child(folder, "_SUCCESS"), "")

    paths = [f"{folder}/part-0.{fmt}", f"{folder}/part-1.{fmt}"]
    assert formats.list_inputs(folder) == paths
    assert formats.list_inputs(f"{folder}/part-*") == paths
    assert formats.list_inputs(paths[1]) == [paths[1]]
    assert formats.count_rows(paths[1], fmt) == ROWS
    assert_columns(without_records(formats.read_rows(paths[1], fmt, 3, 7)), sliced(expected(fmt, table()), 3, 7))


def test_remote_npy(bucket):
    path = f"{bucket}/x.npy"
    matrix = np.arange(12, dtype=np.int32).reshape(6, 2)
    formats.write_table({"": matrix}, path, "npy")
    assert formats.count_rows(path, "npy") == 6
    assert_columns(formats.read_rows(path, "npy", 4, 9), {"": matrix[4:]})


def test_remote_plain_files(bucket):
    folder = f"{bucket}/out"
    assert formats.list_names(folder) == []
    with pytest.raises(BatchDataError, match=folder):
        formats.list_inputs(folder)
    path = formats.child(folder + "/", "plan.json")
    assert path == f"{folder}/plan.json"
    assert not formats.exists(path)

    formats.write_text(path, '{"shards": 2}')
    assert formats.exists(path)
    assert formats.read_text(path) == '{"shards": 2}'
    assert formats.list_names(folder) == ["plan.json"]
    formats.remove(path)
    formats.remove(path)
    assert formats.list_names(folder) == []
    with pytest.raises(StorageError, match="plan.json"):
        formats.read_text(path)
    with pytest.raises(StorageError, match="gone.csv"):
        formats.count_rows(f"{folder}/gone.csv", "csv")
