"""Read request logs back: the ``PredictionLog`` records a server wrote for a model's ``logging_config``.

``read_request_log("logs/digits")`` returns the records of every file of that prefix (or of one file, or of a
folder's log files), oldest first, as :class:`LoggedRequest`: the model, the version that answered, the
method, and request and response as numpy where they are tensors. In a notebook the list shows as a table.
``write_warmup_file(records, version_dir)`` turns logged traffic into a version's warmup requests.

Only local files are read, with the TFRecord framing checked in pure Python; TensorFlow is not imported.
"""

from __future__ import annotations

import dataclasses
import datetime
import html
import os
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from workbench.protocol.request_log_files import log_files
from workbench.protocol.tfrecord import encode_record, read_records

__all__ = ["LoggedRequest", "RequestLog", "read_request_log", "write_warmup_file"]

WARMUP_FILE = Path("assets.extra") / "tf_serving_warmup_requests"
MAX_WARMUP_RECORDS = 1000  # what a server replays at most (TF Serving's limit)
_METHODS = {
    "predict_log": "predict",
    "classify_log": "classify",
    "regress_log": "regress",
    "multi_inference_log": "multi_inference",
}


@dataclasses.dataclass(frozen=True)
class LoggedRequest:
    """One logged request and its answer.

    ``request``/``response`` by method — predict: ``{alias: ndarray}`` both; classify and regress: a list of
    examples (``{feature: ndarray}``) and, in return, ``[[(label, score), …], …]`` or an array of floats;
    multi_inference: the examples, and ``{signature: result}``. ``log`` is the record itself.
    """

    model: str
    version: int | None
    method: str
    signature_name: str
    time: datetime.datetime | None
    request: Any
    response: Any
    log: Any = dataclasses.field(repr=False, compare=False)
    file: str = dataclasses.field(default="", repr=False, compare=False)


class RequestLog(list[LoggedRequest]):
    """The records read, shown as a compact table in a notebook (the records stay a plain list)."""

    _COLUMNS = ("time (UTC)", "model", "version", "method", "signature", "request", "response")

    def _rows(self) -> list[tuple[str, ...]]:
        return [
            (
                r.time.strftime("%Y-%m-%d %H:%M:%S") if r.time is not None else "",
                r.model,
                "" if r.version is None else str(r.version),
                r.method,
                r.signature_name,
                _summary(r.request),
                _summary(r.response),
            )
            for r in self
        ]

    def __repr__(self) -> str:
        rows = [self._COLUMNS, *self._rows()]
        widths = [max(len(row[i]) for row in rows) for i in range(len(self._COLUMNS))]
        lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
        return "\n".join([f"{len(self)} logged request{'' if len(self) == 1 else 's'}", *lines])

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{html.escape(c)}</th>" for c in self._COLUMNS)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in self._rows()
        )
        caption = f"{len(self)} logged request{'' if len(self) == 1 else 's'}"
        return f"<table><caption>{caption}</caption><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _summary(value: Any) -> str:
    """``x: float32[2,1]`` for tensors, ``3 examples``/``3 results`` for lists: what fits a table cell."""
    if isinstance(value, dict):
        return ", ".join(
            f"{key}: {item.dtype}[{','.join(map(str, item.shape))}]"
            if isinstance(item, np.ndarray)
            else f"{key}: {_summary(item)}"
            for key, item in value.items()
        )
    if isinstance(value, np.ndarray):
        return f"{value.dtype}[{','.join(map(str, value.shape))}]"
    if isinstance(value, list):
        examples = bool(value) and isinstance(value[0], dict)
        return f"{len(value)} {'examples' if examples else 'results'}"
    return str(value)


def read_request_log(
    path_or_prefix: str | os.PathLike[str], *, model: str | None = None, last: int | None = None
) -> RequestLog:
    """The logged requests under a ``filename_prefix`` (or in one file, or a folder), oldest first.

    ``model`` keeps one model's records (models may share a prefix); ``last`` keeps the newest ``last``. A file
    still being written may end in part of a record: reading stops before it. A corrupted file raises
    ``ValueError`` naming the file and the byte.
    """
    from tensorflow_serving.apis import prediction_log_pb2

    if last is not None and last < 0:
        raise ValueError(f"last must not be negative, got {last}")
    files = log_files(path_or_prefix)
    if not files:
        raise FileNotFoundError(f"no request log files at {os.fspath(path_or_prefix)}")
    records: list[LoggedRequest] = []
    for path in files:
        for i, data in enumerate(read_records(path, partial_tail="stop")):
            log = prediction_log_pb2.PredictionLog()
            try:
                log.ParseFromString(data)
            except Exception:  # noqa: BLE001 - whatever protobuf raises, the record is refused
                raise ValueError(f"{path}: record {i} is not a tensorflow.serving.PredictionLog") from None
            if model is None or log.log_metadata.model_spec.name == model:
                records.append(_logged_request(log, str(path)))
    if last is not None:
        records = records[max(0, len(records) - last) :]
    return RequestLog(records)


def _logged_request(log: Any, file: str) -> LoggedRequest:
    kind = log.WhichOneof("log_type")
    method = _METHODS.get(kind or "", kind or "")
    spec = log.log_metadata.model_spec
    request: Any = None
    response: Any = None
    if kind == "predict_log":
        request = _tensors(log.predict_log.request.inputs)
        response = _tensors(log.predict_log.response.outputs)
    elif kind in ("classify_log", "regress_log", "multi_inference_log"):
        entry = getattr(log, kind)
        request = _examples(entry.request.input)
        if kind == "classify_log":
            response = _classifications(entry.response.result)
        elif kind == "regress_log":
            response = np.array([r.value for r in entry.response.result.regressions], np.float32)
        else:
            response = {
                result.model_spec.signature_name: _classifications(result.classification_result)
                if result.HasField("classification_result")
                else np.array([r.value for r in result.regression_result.regressions], np.float32)
                for result in entry.response.results
            }
    stamp = log.log_metadata.timestamp_secs
    return LoggedRequest(
        model=spec.name,
        version=spec.version.value if spec.HasField("version") else None,
        method=method,
        signature_name=spec.signature_name,
        time=datetime.datetime.fromtimestamp(stamp, datetime.timezone.utc) if stamp else None,
        request=request,
        response=response,
        log=log,
        file=file,
    )


def _tensors(protos: Any) -> dict[str, np.ndarray]:
    from workbench.protocol.tensor_proto import to_numpy

    return {alias: to_numpy(proto, alias) for alias, proto in protos.items()}


def _examples(request_input: Any) -> list[dict[str, np.ndarray]]:
    kind = request_input.WhichOneof("kind")
    if kind == "example_list_with_context":
        with_context = request_input.example_list_with_context
        examples, context = list(with_context.examples), with_context.context
    elif kind == "example_list":
        examples, context = list(request_input.example_list.examples), None
    else:
        return []
    rows = []
    for example in examples:
        features = {**(context.features.feature if context is not None else {}), **example.features.feature}
        rows.append({name: _feature_values(feature) for name, feature in features.items()})
    return rows


def _feature_values(feature: Any) -> np.ndarray:
    kind = feature.WhichOneof("kind")
    if kind == "float_list":
        return np.array(feature.float_list.value, np.float32)
    if kind == "int64_list":
        return np.array(feature.int64_list.value, np.int64)
    if kind == "bytes_list":
        values = np.empty(len(feature.bytes_list.value), dtype=object)
        values[:] = list(feature.bytes_list.value)
        return values
    return np.array([], np.float32)


def _classifications(result: Any) -> list[list[tuple[str, float]]]:
    return [[(c.label, c.score) for c in row.classes] for row in result.classifications]


def write_warmup_file(
    records: Iterable[LoggedRequest | Any] | str | os.PathLike[str],
    version_dir: str | os.PathLike[str],
    *,
    limit: int = MAX_WARMUP_RECORDS,
) -> Path:
    """Write logged requests as ``<version_dir>/assets.extra/tf_serving_warmup_requests``; returns its path.

    ``records``: what :func:`read_request_log` returned, ``PredictionLog`` protos, or a log's path or prefix.
    The newest ``limit`` records are kept (a server replays at most 1000). Write into a version folder before
    it is published (exported to a hidden folder, then renamed into place): a server that already sees the
    version may have loaded it without the file. The file is replaced atomically.
    """
    if not 0 < limit <= MAX_WARMUP_RECORDS:
        raise ValueError(f"limit must be from 1 to {MAX_WARMUP_RECORDS}, got {limit}")
    read = read_request_log(records) if isinstance(records, (str, os.PathLike)) else records
    logs: list[Any] = [r.log if isinstance(r, LoggedRequest) else r for r in read][-limit:]
    if not logs:
        raise ValueError("no records to write as warmup requests")
    target = Path(version_dir) / WARMUP_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(f".{target.name}.{uuid.uuid4().hex}")
    with open(staging, "wb") as f:
        for log in logs:
            f.write(encode_record(log.SerializeToString()))
    os.replace(staging, target)
    return target
