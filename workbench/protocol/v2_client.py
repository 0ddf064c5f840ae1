"""The client's half of the Open Inference Protocol (KServe v2, Triton): numpy in, requests out, answers back to numpy.

One request shape for both wires: REST's JSON body, with Triton's binary tensor extension for the tensors where raw
bytes beat JSON numbers (a JSON header, then the raw tensors; ``Inference-Header-Content-Length`` says where the
header ends), and gRPC's ``ModelInferRequest`` with ``raw_input_contents``, the form tritonclient sends. Answers are
read back from JSON ``data``, from raw bytes after a JSON header, or from a ``ModelInferResponse``'s raw or typed
contents, whichever the server chose. BYTES tensors travel as Triton does (each element a 4-byte little-endian
length and its bytes: :mod:`workbench.protocol.bytes_codec`).

Pure translation: no sockets here (the :class:`~workbench.client.Client` and :mod:`workbench.client.bench` send
what this builds), and no TensorFlow.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import orjson

from workbench.core.errors import Code, ServingError
from workbench.core.signatures import DEFAULT_SIGNATURE, PREDICT_METHOD, Signature, TensorSpec
from workbench.protocol.bytes_codec import MalformedBytes, unpack_bytes
from workbench.protocol.v2_types import BYTES, CONTENTS_FIELD, raw_contents, to_datatype, to_numpy_dtype

HEADER_LENGTH = "Inference-Header-Content-Length"  # Triton's binary extension: the JSON header's length in bytes
INFER_METHOD = "/inference.GRPCInferenceService/ModelInfer"

# A tensor goes as raw bytes from this size on. Below it JSON costs no more (measured against workbench, 16 clients:
# a 4-byte tensor ~5,200 requests/s as JSON, ~4,800 raw; about even at 1 KiB), stays readable, and every v2 server
# reads it (the binary extension is Triton's); above it, JSON numbers cost a conversion per element on both sides
# where raw bytes are one copy (a 784-float image: ~2,800 requests/s as JSON, ~4,100 raw).
BINARY_FROM_BYTES = 1024


def version_path(model: str, version: int | None, label: str | None) -> str:
    """``/v2/models/m``, ``…/versions/2`` or ``…/versions/canary`` (a label where v2 puts a version: workbench's)."""
    if version is not None and label is not None:
        raise ValueError("give a version or a label, not both")
    path = f"/v2/models/{model}"
    chosen = version_string(version, label)
    return f"{path}/versions/{chosen}" if chosen else path


def version_string(version: int | None, label: str | None) -> str:
    """The ``model_version`` of a request: digits select a version, any other string a label, empty the default."""
    if version is not None:
        return str(int(version))
    if label is not None:
        if not label or label.isdigit():
            raise ValueError(f"the v2 protocol reads {label!r} as a version number, not a label")
        return label
    return ""


def answered_version(model_version: str) -> int | None:
    """The version that answered, from a response's ``model_version`` (absent or empty: unknown)."""
    return int(model_version) if model_version.isdigit() else None


# ------------------------------------------------------------------------------------------- raw tensors
def to_raw(array: np.ndarray) -> bytes:
    """A tensor's raw form: row-major little-endian elements, or BYTES' length-prefixed elements."""
    return raw_contents(array, to_datatype(array.dtype))


def from_raw(buffer: bytes | memoryview, datatype: str, shape: Sequence[int]) -> np.ndarray:
    """The array a raw tensor holds; a size that does not fit the shape is DATA_LOSS (the answer is damaged)."""
    if datatype == BYTES:
        try:
            flat = unpack_bytes(buffer)
        except MalformedBytes as exc:
            raise ServingError(Code.DATA_LOSS, f"a BYTES tensor's raw data is malformed: {exc}") from None
    else:
        dtype = to_numpy_dtype(datatype).newbyteorder("<")
        if len(buffer) % dtype.itemsize:
            raise ServingError(Code.DATA_LOSS, f"{len(buffer)} bytes is no whole number of {datatype} elements")
        flat = np.frombuffer(buffer, dtype=dtype)
    expected = int(np.prod(shape, dtype=np.int64))
    if flat.size != expected:
        raise ServingError(Code.DATA_LOSS, f"{flat.size} {datatype} elements do not fill the shape {list(shape)}")
    return flat.reshape(shape)


def _json_bytes(array: np.ndarray) -> list[str] | None:
    """BYTES elements as JSON strings, or None where one is not UTF-8 text (only raw bytes can carry it)."""
    texts = []
    for value in array.reshape(-1).tolist():
        if isinstance(value, bytes):
            try:
                value = value.decode("utf-8")
            except UnicodeDecodeError:
                return None
        texts.append(str(value))
    return texts


# --------------------------------------------------------------------------------------------------- REST
@dataclasses.dataclass(frozen=True)
class RestRequest:
    """An infer request's body and the headers it needs."""

    body: bytes
    headers: dict[str, str]


def rest_infer_request(
    inputs: Mapping[str, np.ndarray],
    outputs: Sequence[str] = (),
    *,
    binary_data: bool | None = None,
    request_id: str = "",
    parameters: Mapping[str, bool | int | str] | None = None,
) -> RestRequest:
    """``POST …/infer``'s body: JSON ``data`` for small tensors, raw bytes for large ones (``binary_data=None``).

    ``binary_data=True`` sends every tensor raw and asks for raw outputs, as tritonclient does; ``False`` keeps to
    the JSON that every v2 server reads. Outputs come back raw when any input went raw: that server speaks the
    extension, and answers decode without a JSON parse of their numbers.
    """
    described: list[dict[str, Any]] = []
    raws: list[bytes] = []
    for name, array in inputs.items():
        datatype = to_datatype(array.dtype)
        tensor: dict[str, Any] = {"name": name, "shape": list(array.shape), "datatype": datatype}
        texts = _json_bytes(array) if datatype == BYTES else None
        raw = binary_data
        if raw is None:
            raw = (datatype == BYTES and texts is None) or (datatype != BYTES and array.nbytes >= BINARY_FROM_BYTES)
        if raw:
            data = to_raw(array)
            tensor["parameters"] = {"binary_data_size": len(data)}
            raws.append(data)
        elif datatype == BYTES:
            if texts is None:
                raise ValueError(f"input {name!r} holds bytes that are not UTF-8: they need binary_data")
            tensor["data"] = texts
        elif datatype == "BF16":
            raise ValueError(f"input {name!r} is BF16, which JSON cannot carry: it needs binary_data")
        else:
            tensor["data"] = np.ascontiguousarray(array).reshape(-1)
        described.append(tensor)
    doc: dict[str, Any] = {"inputs": described}
    if request_id:
        doc["id"] = request_id
    binary_outputs = bool(raws) if binary_data is None else binary_data
    request_parameters: dict[str, Any] = dict(parameters or {})
    if outputs:
        doc["outputs"] = [{"name": n, "parameters": {"binary_data": binary_outputs}} for n in outputs]
    elif binary_outputs:
        request_parameters["binary_data_output"] = True
    if request_parameters:
        doc["parameters"] = request_parameters
    header = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    if not raws:
        return RestRequest(header, {"Content-Type": "application/json"})
    headers = {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(len(header))}
    return RestRequest(b"".join([header, *raws]), headers)


@dataclasses.dataclass(frozen=True)
class InferAnswer:
    """What an infer response says: the outputs by name, the version that answered and the echoed id."""

    outputs: dict[str, np.ndarray]
    model_version: int | None
    request_id: str


def rest_infer_answer(body: bytes, header_length: str | None) -> InferAnswer:
    """Read an infer response: all JSON, or (with ``Inference-Header-Content-Length``) a JSON header and raw data."""
    size = int(header_length) if header_length else len(body)
    try:
        doc = orjson.loads(body[:size])
    except orjson.JSONDecodeError as exc:
        raise ServingError(Code.DATA_LOSS, f"the infer response is not JSON: {exc}") from None
    raw = memoryview(body)[size:]
    outputs = {}
    for tensor in doc.get("outputs", []):
        name, datatype, shape = tensor["name"], tensor["datatype"], tensor["shape"]
        raw_size = tensor.get("parameters", {}).get("binary_data_size")
        if raw_size is not None:
            outputs[name] = from_raw(raw[:raw_size], datatype, shape)
            raw = raw[raw_size:]
        elif datatype == BYTES:
            outputs[name] = _bytes_array(tensor["data"], shape)
        else:
            outputs[name] = np.asarray(tensor["data"], dtype=to_numpy_dtype(datatype)).reshape(shape)
    return InferAnswer(outputs, answered_version(str(doc.get("model_version", ""))), str(doc.get("id", "")))


def _bytes_array(data: Any, shape: Sequence[int]) -> np.ndarray:
    flat = np.asarray(data, dtype=object).reshape(-1)
    encoded = [v.encode("utf-8") if isinstance(v, str) else v for v in flat.tolist()]
    array = np.empty(len(encoded), dtype=object)
    array[:] = encoded  # element by element: numpy would otherwise make bytes of equal length a 2-d array
    return array.reshape(shape)


# --------------------------------------------------------------------------------------------------- gRPC
def grpc_infer_request(
    model: str,
    inputs: Mapping[str, np.ndarray],
    outputs: Sequence[str] = (),
    *,
    version: str = "",
    request_id: str = "",
    parameters: Mapping[str, bool | int | str] | None = None,
) -> Any:
    """A ``ModelInferRequest`` with every tensor in ``raw_input_contents``, as tritonclient builds them."""
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=model, model_version=version, id=request_id)
    for key, value in (parameters or {}).items():  # bool before int: a bool is an int to Python
        field = "bool_param" if isinstance(value, bool) else "int64_param" if isinstance(value, int) else "string_param"
        setattr(request.parameters[key], field, value)
    for name, array in inputs.items():
        request.inputs.add(name=name, datatype=to_datatype(array.dtype), shape=array.shape)
        request.raw_input_contents.append(to_raw(array))
    for name in outputs:
        request.outputs.add(name=name)
    return request


def grpc_infer_answer(response: Any) -> InferAnswer:
    """Read a ``ModelInferResponse``: ``raw_output_contents`` in the order of ``outputs``, else typed contents."""
    outputs = {}
    for index, tensor in enumerate(response.outputs):
        shape = list(tensor.shape)
        if response.raw_output_contents:
            outputs[tensor.name] = from_raw(response.raw_output_contents[index], tensor.datatype, shape)
            continue
        field = CONTENTS_FIELD.get(tensor.datatype)
        if field is None:
            raise ServingError(Code.DATA_LOSS, f"output {tensor.name!r} ({tensor.datatype}) came without raw data")
        values = getattr(tensor.contents, field)
        if tensor.datatype == BYTES:
            outputs[tensor.name] = _bytes_array(list(values), shape)
        else:
            outputs[tensor.name] = np.asarray(values, dtype=to_numpy_dtype(tensor.datatype)).reshape(shape)
    return InferAnswer(outputs, answered_version(response.model_version), response.id)


# ----------------------------------------------------------------------------------------------- metadata
def signature_from_metadata(doc: Mapping[str, Any]) -> Signature:
    """A model's v2 metadata (``inputs``/``outputs`` with datatypes and -1 for any size) as its serving signature."""

    def specs(tensors: Sequence[Mapping[str, Any]]) -> dict[str, TensorSpec]:
        return {
            t["name"]: TensorSpec(
                alias=t["name"],
                name=t["name"],
                dtype=to_numpy_dtype(t["datatype"]),
                shape=tuple(int(d) for d in t["shape"]),
            )
            for t in tensors
        }

    return Signature(
        name=DEFAULT_SIGNATURE,
        method_name=PREDICT_METHOD,
        inputs=specs(doc.get("inputs", [])),
        outputs=specs(doc.get("outputs", [])),
    )
