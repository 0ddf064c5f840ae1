"""One logged request as the request log's sinks write it: a flat row (Parquet) and JSON bodies (CloudEvents).

The dataplane's :class:`~workbench.observability.prediction_logs.LogEntry` holds what ran (numpy inputs, serialized
examples, results); :class:`LoggedCall` adds what the serving path knew around it (a request id, when, the protocol,
how long it took). These functions run on the request log's background threads, never on the event loop.

A predict's tensors become columns ``input.<alias>`` / ``output.<alias>`` of flattened values (numbers keep their
type, strings are bytes), with every tensor's shape in the ``shapes`` column (JSON); its CloudEvents bodies are
the KServe v2 inference request and response (``{"id", "inputs": [{name, shape, datatype, data}]}``), the bodies
KServe's logger forwards for a v2 predictor. Classify, regress and multi-inference requests are the serialized
``tf.Example`` protos they carried (``input.examples``) and their results as JSON, with TF Serving's REST bodies
(``{"examples": [{"b64": …}]}``, ``{"results": …}``) as events.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from workbench.observability.prediction_logs import (
    ClassifyEntry,
    LogEntry,
    MultiInferenceEntry,
    PredictEntry,
    RegressEntry,
)

OK = "OK"  # only answered requests reach the request log (failed ones are counted in the metrics)


@dataclasses.dataclass(frozen=True)
class LoggedCall:
    """What the serving path knew of one sampled request besides its tensors."""

    request_id: str
    timestamp: float  # seconds since the epoch, when it was answered
    protocol: str  # the frontend's label: "rest", "grpc", "v2-rest", "v2-grpc"
    latency_seconds: float  # from admission to the answer
    status: str = OK


def signature_of(entry: LogEntry) -> str:
    return getattr(entry, "signature_name", "")


# --------------------------------------------------------------------------------------------- Parquet rows
def row(entry: LogEntry, call: LoggedCall) -> dict[str, Any]:
    """One Parquet row: the fixed columns, then a column per tensor (ndarray, list of bytes, or JSON text)."""
    values: dict[str, Any] = {
        "request_id": call.request_id,
        "time": call.timestamp,
        "signature": signature_of(entry),
        "method": entry.METHOD,
        "protocol": call.protocol,
        "latency_seconds": call.latency_seconds,
        "status": call.status,
    }
    shapes: dict[str, list[int]] = {}
    if isinstance(entry, PredictEntry):
        for side, tensors in (("input", entry.inputs), ("output", entry.outputs)):
            for alias, value in tensors.items():
                array = np.asarray(value)
                shapes[f"{side}.{alias}"] = list(array.shape)
                values[f"{side}.{alias}"] = _flat(array)
    elif isinstance(entry, (ClassifyEntry, RegressEntry, MultiInferenceEntry)):
        values["input.examples"] = list(entry.examples)
        shapes["input.examples"] = [len(entry.examples)]
        if isinstance(entry, ClassifyEntry):
            values["output.classifications"] = json.dumps(_classifications(entry.classifications))
        elif isinstance(entry, RegressEntry):
            values["output.regressions"] = np.asarray(entry.regressions, np.float64)
        else:
            values["output.results"] = json.dumps(_multi_results(entry))
    values["shapes"] = json.dumps(shapes)
    return values


def _flat(array: np.ndarray) -> np.ndarray | list[bytes]:
    if array.dtype.kind in "OSU":
        return [v if isinstance(v, bytes) else str(v).encode() for v in array.ravel().tolist()]
    return array.ravel()


def _classifications(rows: Any) -> list[list[list[Any]]]:
    return [[[label, float(score)] for label, score in row] for row in rows]


def _multi_results(entry: MultiInferenceEntry) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for task, (signature_name, result) in zip(entry.tasks, entry.results, strict=True):
        if task.method_name.endswith("classify"):
            out.append({"signature": signature_name, "classifications": _classifications(result)})
        else:
            out.append({"signature": signature_name, "regressions": [float(v) for v in result]})
    return out


# ---------------------------------------------------------------------------------------- CloudEvents bodies
def request_body(entry: LogEntry, call: LoggedCall) -> dict[str, Any]:
    if isinstance(entry, PredictEntry):
        body: dict[str, Any] = {"id": call.request_id, "inputs": _v2_tensors(entry.inputs)}
        if entry.signature_name:
            body["parameters"] = {"signature_name": entry.signature_name}
        if entry.output_filter:
            body["outputs"] = [{"name": name} for name in entry.output_filter]
        return body
    examples = getattr(entry, "examples", ())
    return {
        "signature_name": signature_of(entry),
        "examples": [{"b64": base64.b64encode(e).decode("ascii")} for e in examples],
    }


def response_body(entry: LogEntry, call: LoggedCall) -> dict[str, Any]:
    if isinstance(entry, PredictEntry):
        return {
            "model_name": entry.model,
            "model_version": str(entry.version),
            "id": call.request_id,
            "outputs": _v2_tensors(entry.outputs),
        }
    if isinstance(entry, ClassifyEntry):
        return {"results": _classifications(entry.classifications)}
    if isinstance(entry, RegressEntry):
        return {"results": [float(v) for v in entry.regressions]}
    assert isinstance(entry, MultiInferenceEntry)
    return {"results": _multi_results(entry)}


def _v2_tensors(tensors: Mapping[str, np.ndarray]) -> list[dict[str, Any]]:
    from workbench.protocol.v2_types import to_datatype

    out = []
    for name, value in tensors.items():
        array = np.asarray(value)
        if array.dtype.kind in "OSU":
            values = array.ravel().tolist()
            data: list[Any] = [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in values]
        else:
            data = array.ravel().tolist()
        out.append({"name": name, "shape": list(array.shape), "datatype": to_datatype(array.dtype), "data": data})
    return out
