"""TF Serving's REST API (``/v1/models/...``): metadata, status, predict, classify and regress, over JSON.

Metadata is read from its JSON directly, so a client that only talks REST never imports TensorFlow's protos
(except to hand :meth:`~workbench.client.Client.metadata` its proto). Strings that are not UTF-8 travel as
``{"b64": ...}`` (:mod:`workbench.protocol.bytes_codec`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from workbench.client.http import HttpConnection
from workbench.client.transport import Answer, Transport
from workbench.core.signatures import Signature
from workbench.core.sticky import STICKY_HEADER
from workbench.protocol.bytes_codec import B64, from_b64, to_b64
from workbench.protocol.signature_defs import signatures_from_json


def model_path(model: str, version: int | None, label: str | None) -> str:
    """``/v1/models/m``, ``…/versions/2`` or ``…/labels/stable``."""
    if version is not None and label is not None:
        raise ValueError("give a version or a label, not both")
    path = f"/v1/models/{model}"
    if version is not None:
        path += f"/versions/{int(version)}"
    elif label is not None:
        path += f"/labels/{label}"
    return path


def predict_body(feeds: Mapping[str, np.ndarray], signature_name: str) -> dict[str, Any]:
    """A ``:predict`` (or ``:predictAsync``) request's JSON: columnar, every input by name."""
    body: dict[str, Any] = {"inputs": {k: _to_json(v) for k, v in feeds.items()}}
    if signature_name:
        body["signature_name"] = signature_name
    return body


def predict_outputs(doc: Mapping[str, Any], signature: Signature, output_filter: Sequence[str]) -> dict[str, Any]:
    """The outputs of a columnar ``:predict`` answer, as numpy arrays of the signature's dtypes."""
    names = list(signature.outputs)
    # Columnar answers hold the one output's value directly, or an object of several.
    raw = {names[0]: doc["outputs"]} if len(names) == 1 else doc["outputs"]
    return {  # REST has no output_filter: filter here, so both protocols answer alike
        k: _from_json(v, signature.outputs[k].dtype) for k, v in raw.items() if not output_filter or k in output_filter
    }


class TfsRestTransport(Transport):
    name = "rest"

    def __init__(self, http: HttpConnection) -> None:
        self._http = http

    def signatures(self, model: str, version: int | None, label: str | None) -> dict[str, Signature]:
        doc = self._http.json("GET", model_path(model, version, label) + "/metadata")
        return signatures_from_json(doc["metadata"]["signature_def"])

    def metadata(self, model: str, version: int | None, label: str | None) -> Any:
        from google.protobuf import json_format

        import workbench.runtime.tensorflow_protos  # noqa: F401  # isort: skip  (no tensorflow/__init__)
        from tensorflow_serving.apis import get_model_metadata_pb2

        doc = self._http.json("GET", model_path(model, version, label) + "/metadata")
        return json_format.ParseDict(doc["metadata"]["signature_def"], get_model_metadata_pb2.SignatureDefMap())

    def status(self, model: str, version: int | None, label: str | None) -> list[dict[str, Any]]:
        doc = self._http.json("GET", model_path(model, version, label))
        return [
            {
                "version": int(s["version"]),
                "state": s["state"],
                "error_code": s["status"]["error_code"],
                "error_message": s["status"]["error_message"],
            }
            for s in doc["model_version_status"]
        ]

    def predict(
        self,
        model: str,
        signature: Signature,
        feeds: Mapping[str, np.ndarray],
        *,
        signature_name: str,
        output_filter: Sequence[str],
        version: int | None,
        label: str | None,
        parameters: Mapping[str, bool | int | str] | None,
        key: str | None = None,
    ) -> Answer:
        started = time.perf_counter()
        body = predict_body(feeds, signature_name)
        sticky = {STICKY_HEADER: key} if key is not None else None
        doc, headers = self._http.json_answer(
            "POST", model_path(model, version, label) + ":predict", body, headers=sticky
        )
        latency = (time.perf_counter() - started) * 1000
        outputs = predict_outputs(doc, signature, output_filter)
        # workbench says which version answered (after labels and canaries); TF Serving does not.
        answered = headers.get("X-Model-Version", "")
        return Answer(outputs, int(answered) if answered.isdigit() else version, latency)

    def examples(
        self,
        kind: str,
        model: str,
        examples: Sequence[Mapping[str, Any]],
        version: int | None,
        label: str | None,
        signature_name: str,
    ) -> tuple[Any, float]:
        started = time.perf_counter()
        body: dict[str, Any] = {"examples": [_example_json(e) for e in examples]}
        if signature_name:
            body["signature_name"] = signature_name
        doc = self._http.json("POST", model_path(model, version, label) + f":{kind}", body)
        return doc["results"], (time.perf_counter() - started) * 1000


def _to_json(array: np.ndarray) -> Any:
    if array.dtype.kind == "O":
        return _bytes_to_json(array.tolist())
    return array.tolist()


def _bytes_to_json(value: Any) -> Any:
    if isinstance(value, list):
        return [_bytes_to_json(v) for v in value]
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return to_b64(value)
    return value


def _from_json(value: Any, dtype: np.dtype[Any]) -> np.ndarray:
    if dtype.kind == "O":  # DT_STRING: text or {"b64": ...}
        return np.array(_json_to_bytes(value), dtype=object)
    return np.asarray(value, dtype=dtype)


def _json_to_bytes(value: Any) -> Any:
    if isinstance(value, list):
        return [_json_to_bytes(v) for v in value]
    if isinstance(value, dict) and B64 in value:
        return from_b64(value, validate=False)
    return value.encode("utf-8") if isinstance(value, str) else value


def _example_json(example: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for name, value in example.items():
        values = np.asarray(value).reshape(-1).tolist() if not isinstance(value, (str, bytes)) else [value]
        out[name] = [_bytes_to_json(v) if isinstance(v, bytes) else v for v in values]
    return out
