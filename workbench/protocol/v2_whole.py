"""v2 requests and responses as :mod:`workbench.core.whole_requests` carries them (REST JSON and gRPC messages).

For servables that answer requests whole (MLServer's runtimes). Unlike :mod:`workbench.protocol.v2_json`, which
checks each tensor against its shape for a model's signature, a tensor here keeps what was sent: its elements flat
and its shape as given (MLServer's clients send one BYTES element of shape ``[11]``, eleven bytes of text), every
parameter (``content_type`` first), and responses carry the outputs' and the response's parameters as the model gave
them. Every element must still be of its datatype: anything else is INVALID_ARGUMENT, naming the input.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2

from workbench.core.errors import Code, ServingError
from workbench.core.whole_requests import RequestedOutput, Tensor, WholeRequest, WholeResponse
from workbench.protocol.bytes_codec import MalformedBytes, from_b64, is_b64, to_b64, unpack_bytes
from workbench.protocol.v2_grpc_messages import parameter_values
from workbench.protocol.v2_types import BYTES, CONTENTS_FIELD, raw_contents, to_numpy_dtype


def _invalid(message: str) -> ServingError:
    return ServingError(Code.INVALID_ARGUMENT, message)


def _object(value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _invalid(f"{what} must be a JSON object")
    return value


def _shape(value: Any, name: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in value):
        raise _invalid(f'Input "{name}" needs a "shape": a list of sizes, e.g. [1, 4]')
    return tuple(value)


def _flat(data: Any) -> list[Any]:
    if not isinstance(data, list):
        return [data]
    flat: list[Any] = []
    for item in data:
        flat.extend(_flat(item) if isinstance(item, list) else [item])
    return flat


def _elements(name: str, datatype: str, data: Any) -> np.ndarray:
    """The JSON ``data`` of an input, flat, as numpy. BYTES elements stay the text they were sent as (``str``, as
    MLServer's REST API hands runtimes JSON text), ``{"b64": ...}`` ones become ``bytes``."""
    flat = _flat(data)
    if datatype == BYTES:
        array = np.empty(len(flat), dtype=object)
        try:
            array[:] = [
                item if isinstance(item, str) else from_b64(item) if is_b64(item) else _not_text(item) for item in flat
            ]
        except (TypeError, ValueError) as exc:
            raise _invalid(f'Input "{name}" is BYTES: {exc}') from None
        return array
    dtype = to_numpy_dtype(datatype)
    if any(isinstance(item, (str, dict, type(None))) for item in flat) or (
        datatype != "BOOL" and any(isinstance(item, bool) for item in flat)
    ):
        raise _invalid(f'Input "{name}" is {datatype}: its "data" must hold numbers')
    try:
        return np.asarray(flat, dtype=dtype)
    except (TypeError, ValueError, OverflowError) as exc:
        raise _invalid(f'Input "{name}" is {datatype}: {exc}') from None


def _not_text(item: Any) -> bytes:
    raise TypeError(f'its "data" must hold strings, got {item!r}')


def rest_request(doc: Any) -> WholeRequest:
    """A v2 REST request body (parsed JSON) as a whole request."""
    if not isinstance(doc, dict):
        raise _invalid("An inference request is a JSON object")
    entries = doc.get("inputs")
    if not isinstance(entries, list) or not entries:
        raise _invalid('An inference request needs "inputs": a list of tensors with name, shape, datatype and data')
    inputs = []
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise _invalid("Each input must be an object with name, shape, datatype and data")
        name = entry["name"]
        datatype = entry.get("datatype")
        if not isinstance(datatype, str):
            raise _invalid(f'Input "{name}" needs a "datatype" string such as "FP32"')
        to_numpy_dtype(datatype)  # an unknown datatype is refused here, listing the known ones
        if "data" not in entry:
            raise _invalid(f'Input "{name}" has no "data" (this model takes its tensors as JSON)')
        parameters = _object(entry.get("parameters"), f'parameters of input "{name}"')
        shape = _shape(entry.get("shape"), name)
        inputs.append(Tensor(name, datatype, shape, _elements(name, datatype, entry["data"]), parameters))
    outputs = []
    for entry in doc.get("outputs") or ():
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise _invalid('Each of "outputs" must be an object with a name')
        outputs.append(RequestedOutput(entry["name"], _object(entry.get("parameters"), "parameters of an output")))
    request_id = doc.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise _invalid('"id" must be a string')
    return WholeRequest(tuple(inputs), tuple(outputs), request_id, _object(doc.get("parameters"), '"parameters"'))


def _json_data(tensor: Tensor) -> list[Any]:
    if tensor.datatype == BYTES:
        return [_text(item) for item in tensor.data.tolist()]
    values: list[Any] = tensor.data.tolist()
    if tensor.data.dtype.kind == "f":  # JSON has no NaN: null, as MLServer sends it
        values = [None if value != value else value for value in values]
    return values


def _text(item: Any) -> Any:
    try:
        return item.decode() if isinstance(item, bytes) else str(item)
    except UnicodeDecodeError:
        return to_b64(item)


def rest_response(model: str, version: int, response: WholeResponse) -> dict[str, Any]:
    """The JSON of a whole response: every output with its parameters, and the response's own."""
    # The runtime's own model_version, as MLServer answers it (none when the runtime sets none).
    doc: dict[str, Any] = {"model_name": model}
    if response.model_version is not None:
        doc["model_version"] = str(response.model_version)
    if response.id is not None:
        doc["id"] = response.id
    if response.parameters:
        doc["parameters"] = dict(response.parameters)
    outputs = []
    for tensor in response.outputs:
        entry: dict[str, Any] = {"name": tensor.name, "shape": list(tensor.shape), "datatype": tensor.datatype}
        if tensor.parameters:
            entry["parameters"] = dict(tensor.parameters)
        entry["data"] = _json_data(tensor)
        outputs.append(entry)
    doc["outputs"] = outputs
    return doc


def grpc_request(request: Any) -> WholeRequest:
    """A ``ModelInferRequest`` as a whole request: typed contents or raw contents, each input's parameters kept."""
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise _invalid(f"raw_input_contents holds {len(raw)} tensors for {len(request.inputs)} inputs")
    inputs = []
    for index, tensor in enumerate(request.inputs):
        name, datatype = tensor.name, tensor.datatype
        dtype = to_numpy_dtype(datatype)
        if raw:
            if datatype == BYTES:
                try:
                    data = unpack_bytes(raw[index])
                except MalformedBytes as exc:
                    raise _invalid(f'Input "{name}": {exc}') from None
            elif len(raw[index]) % dtype.itemsize:
                raise _invalid(f'Input "{name}": {len(raw[index])} bytes are no whole number of {datatype}')
            else:
                data = np.frombuffer(raw[index], dtype=dtype.newbyteorder("<")).astype(dtype)
        else:
            field = CONTENTS_FIELD.get(datatype)
            if field is None:
                raise _invalid(f'Input "{name}": {datatype} tensors have no typed contents; send them raw')
            values = list(getattr(tensor.contents, field))
            if datatype == BYTES:
                data = np.empty(len(values), dtype=object)
                data[:] = values
            else:
                data = np.asarray(values).astype(dtype)
        parameters = parameter_values(tensor.parameters)
        inputs.append(Tensor(name, datatype, tuple(int(d) for d in tensor.shape), data, parameters))
    outputs = tuple(RequestedOutput(o.name, parameter_values(o.parameters)) for o in request.outputs)
    return WholeRequest(tuple(inputs), outputs, request.id or None, parameter_values(request.parameters))


def _set_parameters(target: Any, values: Mapping[str, Any]) -> None:
    for key, value in values.items():
        if isinstance(value, bool):
            target[key].bool_param = value
        elif isinstance(value, int):
            target[key].int64_param = value
        elif isinstance(value, float):
            target[key].double_param = value
        elif isinstance(value, str):
            target[key].string_param = value
        # other values (a runtime's nested headers) have no InferParameter form: REST carries them, gRPC cannot


def grpc_response(model: str, version: int, response: WholeResponse, request_id: str = "") -> Any:
    """A ``ModelInferResponse`` of a whole response, each output in its typed contents field (MLServer's form); where
    one has none (FP16), every output travels raw, as a response cannot mix the two."""
    answer = service_pb2.ModelInferResponse(
        model_name=model, model_version=response.model_version or "", id=response.id or request_id
    )
    _set_parameters(answer.parameters, response.parameters)
    raw = any(t.datatype not in CONTENTS_FIELD for t in response.outputs)
    for tensor in response.outputs:
        output = answer.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=list(tensor.shape))
        _set_parameters(output.parameters, tensor.parameters)
        if raw:
            answer.raw_output_contents.append(raw_contents(tensor.data, tensor.datatype))
        else:
            getattr(output.contents, CONTENTS_FIELD[tensor.datatype]).extend(tensor.data.tolist())
    return answer
