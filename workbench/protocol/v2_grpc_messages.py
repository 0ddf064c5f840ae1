"""The Open Inference Protocol's gRPC messages ↔ numpy: ModelInferRequest in, ModelInferResponse out; and a model's
metadata and config as messages, from the same description the REST frontend answers as JSON (:mod:`v2_models`).

The messages are Triton's own (``tritonclient.grpc.service_pb2``, generated from ``grpc_service.proto``), so any
v2 gRPC client speaks to workbench unchanged. A request's tensors come either in typed ``contents`` (one repeated
field per family of types; FP16 and BF16 have none) or, as ``tritonclient`` sends them, in
``raw_input_contents``: one little-endian buffer per input, in the order of ``inputs``, BYTES elements each a
4-byte little-endian length and the bytes. Answers use ``raw_output_contents``, which is what ``tritonclient``
reads and the cheapest to build. With Triton's shared-memory extension an input's raw bytes come from a registered
region instead (and ``raw_input_contents`` holds buffers only for the other inputs, as Triton reads it), and a
requested output's raw bytes go to one: it is answered with its datatype, shape and shared-memory parameters and an
empty buffer (:mod:`workbench.protocol.shared_memory_parameters`). Everything here is pure: no engine, no server.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2

from workbench.core.classification import requested_count
from workbench.core.errors import Code, ServingError, invalid_argument
from workbench.core.signatures import Signature, shape_text
from workbench.protocol import shared_memory_parameters, v2_models, v2_types
from workbench.protocol.bytes_codec import TruncatedElement, TruncatedLength, unpack_bytes
from workbench.protocol.shared_memory_parameters import SharedMemory, SharedTensor
from workbench.protocol.v2_json import CONTENT_TYPE, InferRequest, RequestedOutput

# The typed ``InferTensorContents`` field of each datatype, and the numpy type its values arrive in (protobuf
# widens the small integer types to 32 bits). FP16 and BF16 have no typed field: they travel raw only.
_ARRIVING_AS: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "INT8": np.dtype(np.int32),
    "INT16": np.dtype(np.int32),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "UINT8": np.dtype(np.uint32),
    "UINT16": np.dtype(np.uint32),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    v2_types.BYTES: np.dtype(object),
}
_CONTENTS = {datatype: (v2_types.CONTENTS_FIELD[datatype], dtype) for datatype, dtype in _ARRIVING_AS.items()}
_CONTENTS_FIELDS = tuple(dict.fromkeys(field for field, _ in _CONTENTS.values()))
# The datatype Triton names for values in a field meant for another datatype: a shared field's widest type.
_FIELD_TYPES = {
    "bool_contents": "BOOL",
    "int_contents": "INT32",
    "int64_contents": "INT64",
    "uint_contents": "UINT32",
    "uint64_contents": "UINT64",
    "fp32_contents": "FP32",
    "fp64_contents": "FP64",
    "bytes_contents": "BYTES",
}


def model_metadata_response(model: v2_models.ModelDescription) -> Any:
    """``ModelMetadataResponse`` of ``model``: :func:`v2_models.model_metadata` as the message."""
    described = v2_models.grpc_metadata(v2_models.model_metadata(model, _default_signature(model)))
    return json_format.ParseDict(described, service_pb2.ModelMetadataResponse())


def model_config_response(model: v2_models.ModelDescription) -> Any:
    """``ModelConfigResponse`` of ``model``: :func:`v2_models.model_config` as the message."""
    config = v2_models.model_config(model, _default_signature(model))
    return service_pb2.ModelConfigResponse(config=json_format.ParseDict(config, model_config_pb2.ModelConfig()))


def _default_signature(model: v2_models.ModelDescription) -> Signature:
    """``serving_default``; a model without one is refused in the words gRPC's descriptions have always used (the
    predict's, where REST's are :func:`v2_models.default_signature`'s)."""
    if model.signature is None:
        raise ServingError(Code.FAILED_PRECONDITION, 'Serving signature key "serving_default" not found.')
    return model.signature


def decode_inputs(request: Any, shared_memory: SharedMemory | None = None) -> dict[str, np.ndarray]:
    """The tensors of a ModelInferRequest by name; a malformed one is INVALID_ARGUMENT naming the input (in Triton's
    words where Triton refuses it too). Inputs in shared memory are copied out of ``shared_memory`` (without it they
    are UNIMPLEMENTED)."""
    model = request.model_name
    places = [_place(tensor.parameters, f'Input "{tensor.name}"') for tensor in request.inputs]
    raw = request.raw_input_contents
    # One pass in the order of the inputs, as Triton's InferGRPCToInput reads them, refusing the first that carries
    # contents beside raw buffers or shared memory (the message's presence counts, as protobuf's has_contents() tells
    # it, even with no values in it) or has no data at all.
    buffered = 0  # the inputs that take a raw buffer
    for tensor, place in zip(request.inputs, places, strict=True):
        typed = tensor.HasField("contents")
        if place is not None and typed:
            raise invalid_argument(
                f"unexpected 'content' provided when using shared memory for input tensor '{tensor.name}' for "
                f"model '{model}'"
            )
        if place is not None:
            continue
        if typed and raw:
            raise invalid_argument(
                f"contents field must not be specified when using raw_input_contents for '{tensor.name}' for "
                f"model '{model}'"
            )
        if typed:
            continue
        if buffered >= len(raw):
            raise invalid_argument(
                f"unable to find data for input tensor '{tensor.name}' for model '{model}' in request."
            )
        buffered += 1
    if len(raw) > buffered:
        raise invalid_argument(
            f"raw_input_contents holds {len(raw)} buffers for {buffered} inputs"
            f"{' not in shared memory' if any(place is not None for place in places) else ''}: "
            "send every input raw (in the order of inputs) or none"
        )
    buffers = iter(raw)
    tensors: dict[str, np.ndarray] = {}
    for tensor, place in zip(request.inputs, places, strict=True):
        if tensor.name in tensors:
            raise invalid_argument(f'Input "{tensor.name}" is sent more than once')
        if place is None:
            tensors[tensor.name] = _decode(tensor, next(buffers) if raw else None, model)
            continue
        _, shape = _header(tensor)
        data = shared_memory_parameters.read_input(shared_memory, place, tensor.name, shape, tensor.datatype)
        tensors[tensor.name] = _decode(tensor, data, model)
    return tensors


def names_shared_memory(request: Any) -> bool:
    """Whether any input or requested output of a ModelInferRequest names a shared-memory region (or its size or
    offset): only such a request needs the client's regions (:func:`decode_inputs`, :func:`infer_response`)."""
    keys = shared_memory_parameters.PARAMETERS
    for tensors in (request.inputs, request.outputs):
        for tensor in tensors:
            parameters = tensor.parameters
            if parameters and any(key in parameters for key in keys):
                return True
    return False


def parameter_values(parameters: Mapping[str, Any]) -> dict[str, Any]:
    """A map of ``InferParameter`` as plain values (bool, int, str, float, bytes): what v2 REST's JSON would hold."""
    values: dict[str, Any] = {}
    for key, parameter in parameters.items():
        which = parameter.WhichOneof("parameter_choice")
        if which is not None:
            values[key] = getattr(parameter, which)
    return values


def requested_outputs(request: Any, shared_memory: SharedMemory | None = None) -> list[str]:
    """The outputs a request asks for, in its order; empty means every output of the model. Those to be written to
    shared memory are checked against ``shared_memory`` now, before the model runs (without it: UNIMPLEMENTED)."""
    classification_counts(request)  # a bad classification parameter is refused before the model runs
    for output in request.outputs:
        place = _place(output.parameters, f'Output "{output.name}"')
        if place is not None:
            shared_memory_parameters.check_output(shared_memory, place, output.name)
    return [output.name for output in request.outputs]


def as_infer_request(request: Any, inputs: dict[str, np.ndarray]) -> InferRequest:
    """A ModelInferRequest as REST decodes one (its ``inputs`` decoded already): what a servable that reads v2
    requests its own way is handed (``workbench.protocol.v2_dialects``), with each tensor's content type."""

    def content_type(parameters: Mapping[str, Any]) -> str:
        value = parameter_values(parameters).get(CONTENT_TYPE, "") if CONTENT_TYPE in parameters else ""
        return value if isinstance(value, str) else ""

    datatypes = {tensor.name: tensor.datatype for tensor in request.inputs}
    content_types = {t.name: content_type(t.parameters) for t in request.inputs if content_type(t.parameters)}
    outputs = tuple(RequestedOutput(o.name, content_type=content_type(o.parameters)) for o in request.outputs)
    parameters = parameter_values(request.parameters) if request.parameters else {}
    return InferRequest(inputs, datatypes, outputs, request.id or None, parameters, content_types)


def classification_counts(request: Any) -> dict[str, int]:
    """The outputs a request asks to be answered as their top classes (Triton's classification extension)."""
    counts = {}
    for output in request.outputs:
        if "classification" in output.parameters:
            value = parameter_values({"c": output.parameters["classification"]}).get("c")
            counts[output.name] = requested_count(value, output.name)
    return counts


def output_regions(request: Any) -> dict[str, SharedTensor]:
    """The requested outputs to be written to shared memory, and where."""
    places = {output.name: _place(output.parameters, f'Output "{output.name}"') for output in request.outputs}
    return {name: place for name, place in places.items() if place is not None}


def infer_response(
    model_name: str,
    model_version: str,
    request_id: str,
    outputs: Mapping[str, np.ndarray],
    order: Sequence[str],
    shared: Mapping[str, SharedTensor] | None = None,
    shared_memory: SharedMemory | None = None,
    output_parameters: Mapping[str, Mapping[str, Any]] | None = None,
) -> Any:
    """A ModelInferResponse carrying ``outputs`` (in ``order``) as raw little-endian buffers; those in ``shared``
    are written to ``shared_memory`` instead and answered with their shared-memory parameters and an empty buffer."""
    response = service_pb2.ModelInferResponse(model_name=model_name, model_version=model_version, id=request_id)
    for name in order:
        value = outputs[name]
        datatype = v2_types.to_datatype(value.dtype)
        output = response.outputs.add(name=name, datatype=datatype, shape=value.shape)
        for key, parameter in (output_parameters or {}).get(name, {}).items():
            output.parameters[key].string_param = str(parameter)
        data = v2_types.raw_contents(value, datatype)
        place = shared.get(name) if shared else None
        if place is not None:
            shared_memory_parameters.write_output(shared_memory, place, name, data)
            for key, parameter in place.parameters().items():
                if isinstance(parameter, str):
                    output.parameters[key].string_param = parameter
                else:
                    output.parameters[key].int64_param = parameter
            data = b""  # as Triton answers: raw_output_contents keeps one buffer per output
        response.raw_output_contents.append(data)
    return response


def _bytes_input(buffer: bytes, shape: tuple[int, ...], name: str) -> np.ndarray:
    """A raw BYTES buffer of input ``name`` as a numpy ``object`` array of ``shape`` holding ``bytes``."""
    try:
        elements = unpack_bytes(buffer)
    except TruncatedLength:
        raise invalid_argument(f'Input "{name}": its raw BYTES data ends inside an element\'s 4-byte length') from None
    except TruncatedElement as exc:
        raise invalid_argument(
            f'Input "{name}": a raw BYTES element says it has {exc.length} bytes, but only {exc.remaining} remain'
        ) from None
    if len(elements) != math.prod(shape):
        raise _count_mismatch(name, shape, len(elements))
    return elements.reshape(shape)


def _place(parameters: Mapping[str, Any], what: str) -> SharedTensor | None:
    """Where in shared memory a tensor's ``InferParameter`` map puts it (None: nowhere)."""
    if not any(key in parameters for key in shared_memory_parameters.PARAMETERS):
        return None
    return shared_memory_parameters.shared_tensor(parameter_values(parameters), what)


def _header(tensor: Any) -> tuple[np.dtype[Any], tuple[int, ...]]:
    """An input's numpy type and shape, checked."""
    name = tensor.name
    dtype = _dtype(tensor.datatype, name)
    shape = tuple(tensor.shape)
    if any(d < 0 for d in shape):
        raise invalid_argument(f'Input "{name}": shape {shape_text(shape)} has a negative dimension')
    if v2_types.impossible_shape(shape, dtype.itemsize):
        raise invalid_argument(f'Input "{name}": shape {shape_text(shape)} is larger than any tensor can be')
    return dtype, shape


def _decode(tensor: Any, raw: bytes | None, model: str) -> np.ndarray:
    name, datatype = tensor.name, tensor.datatype
    dtype, shape = _header(tensor)
    count = math.prod(shape)
    if raw is not None:
        if datatype == v2_types.BYTES:
            return _bytes_input(raw, shape, name)
        if len(raw) != count * dtype.itemsize:
            raise invalid_argument(
                f'Input "{name}": shape {shape_text(shape)} of {datatype} takes {count * dtype.itemsize} bytes '
                f"but raw_input_contents holds {len(raw)}"
            )
        return np.frombuffer(raw, dtype=dtype.newbyteorder("<")).reshape(shape)
    return _from_contents(tensor, dtype, shape, count, model)


def _from_contents(tensor: Any, dtype: np.dtype[Any], shape: tuple[int, ...], count: int, model: str) -> np.ndarray:
    name, datatype = tensor.name, tensor.datatype
    sent = [field for field in _CONTENTS_FIELDS if len(getattr(tensor.contents, field))]
    typed = _CONTENTS.get(datatype)
    for other in sent:
        if typed is None or other != typed[0]:  # Triton's text: the type the field carries, the one expected
            raise invalid_argument(
                f"unexpected explicit tensor data for input tensor '{name}' for model '{model}' of type "
                f"'{_FIELD_TYPES[other]}', expected datatype '{datatype}'"
            )
    if typed is None:
        raise invalid_argument(f'Input "{name}": {datatype} tensors have no typed contents; send them raw')
    field, carrier = typed
    values = getattr(tensor.contents, field)
    if len(values) != count:
        raise _count_mismatch(name, shape, len(values))
    if datatype == v2_types.BYTES:
        array = np.empty(count, dtype=object)
        array[:] = list(values)
        return array.reshape(shape)
    carried = np.array(values, dtype=carrier)
    array = carried.astype(dtype)
    if dtype != carrier and not np.array_equal(array, carried):  # protobuf widened INT8..UINT16: check the range
        raise invalid_argument(f'Input "{name}": a value in {field} is out of the range of {datatype}')
    return array.reshape(shape)


def _count_mismatch(name: str, shape: tuple[int, ...], sent: int) -> ServingError:
    return invalid_argument(
        f'Input "{name}": shape {shape_text(shape)} holds {math.prod(shape)} elements but {sent} were sent'
    )


def _dtype(datatype: str, name: str) -> np.dtype[Any]:
    try:
        return v2_types.to_numpy_dtype(datatype)
    except ServingError as exc:
        raise ServingError(exc.code, f'Input "{name}": {exc.message}') from None
