"""The Open Inference Protocol's (v2) REST inference bodies ↔ numpy, with Triton's binary tensor extension.

A request is JSON: ``inputs`` (each a ``name``, ``shape``, ``datatype`` and ``data``, nested or flat, row-major),
optional ``outputs`` to return, an ``id`` echoed back and ``parameters``. With the binary tensor extension (how
``tritonclient`` sends tensors by default) the body is that JSON header followed by raw tensors: the
``Inference-Header-Content-Length`` header says where the JSON ends, an input with ``parameters.binary_data_size``
takes that many bytes of what follows, in input order. Raw tensors are little-endian and row-major; a raw BYTES
element is a 4-byte little-endian length followed by its bytes.

Responses mirror it: outputs as JSON ``data`` (flat, row-major), or raw after the JSON when the request asked for
binary outputs (``parameters.binary_data_output``, or ``binary_data`` per requested output), with the header
length in the same header. Raw tensors are read with ``np.frombuffer`` (no copy) and JSON is written by orjson.

With Triton's shared-memory extension an input's raw bytes come from a registered region instead, and a requested
output's go there (:mod:`workbench.protocol.shared_memory_parameters`); such an output is answered without data.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import orjson

from workbench.core.classification import requested_count
from workbench.core.errors import ServingError, invalid_argument
from workbench.core.signatures import TensorSpec
from workbench.protocol import shared_memory_parameters
from workbench.protocol.bytes_codec import TruncatedElement, TruncatedLength, from_b64, is_b64, unpack_bytes
from workbench.protocol.json_tensor import parse_body
from workbench.protocol.shared_memory_parameters import SharedMemory, SharedTensor
from workbench.protocol.v2_types import BYTES, impossible_shape, raw_contents, to_datatype, to_numpy_dtype

HEADER_LENGTH = "Inference-Header-Content-Length"
BINARY_DATA_SIZE = "binary_data_size"
BINARY_DATA = "binary_data"
BINARY_DATA_OUTPUT = "binary_data_output"
CLASSIFICATION = "classification"  # an output's parameter: Triton's classification extension
CONTENT_TYPE = (
    "content_type"  # an input's or output's parameter: MLServer's codec for it (np, pd, str, base64, datetime)
)

_MAX_BYTES = (1 << 63) - 1  # numpy's limit on an array's bytes (impossible_shape's)
_REGION, _BYTE_SIZE, _OFFSET = (
    shared_memory_parameters.REGION,
    shared_memory_parameters.BYTE_SIZE,
    shared_memory_parameters.OFFSET,
)

# JSON arrays orjson writes straight from numpy (OPT_SERIALIZE_NUMPY); others go through tolist().
_ORJSON_NUMPY_KINDS = frozenset("biuf")


@dataclasses.dataclass(frozen=True)
class RequestedOutput:
    name: str
    binary: bool | None = None  # None: as the request's binary_data_output says
    shared: SharedTensor | None = None  # where in shared memory to write it (then the answer carries no data)
    classification: int = 0  # Triton's classification extension: answer the top N classes (0: the values)
    content_type: str = ""  # parameters.content_type: how MLServer's runtimes encode it (protocol.v2_dialects)


@dataclasses.dataclass(frozen=True)
class InferRequest:
    """A decoded inference request: tensors by name, in the order sent."""

    inputs: dict[str, np.ndarray]
    datatypes: dict[str, str]  # the v2 datatype each input was sent as, for messages
    outputs: tuple[RequestedOutput, ...] = ()
    id: str | None = None
    parameters: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # Each input's parameters.content_type where it has one (MLServer's codecs: workbench.protocol.v2_dialects).
    content_types: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @property
    def timeout_seconds(self) -> float | None:
        """Triton's ``parameters.timeout``: how long the request may take, in microseconds (None: not given)."""
        value = self.parameters.get("timeout")
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise invalid_argument(f"parameters.timeout must be a positive number of microseconds, got {_short(value)}")
        return value / 1e6

    @property
    def binary_outputs(self) -> bool:
        """Whether outputs not requested by name (or without ``binary_data``) come back raw."""
        return self.parameters.get(BINARY_DATA_OUTPUT) is True


# ------------------------------------------------------------------------------------------- requests
ASYNC = "async"  # workbench's extension: a request with parameters.async true is queued and answered 202


def asks_async(body: bytes, header_length_value: str | None) -> bool:
    """Whether the request's ``parameters.async`` is true. Only a body that holds the word is parsed here (every
    other request is decoded once, as before); a body that does not parse is left for the decoding to refuse."""
    try:
        length = header_length(header_length_value, len(body))
    except ServingError:
        return False
    header = body if length is None else body[:length]
    if b'"async"' not in header:
        return False
    try:
        doc = orjson.loads(header)
    except orjson.JSONDecodeError:
        return False
    parameters = doc.get("parameters") if isinstance(doc, dict) else None
    return isinstance(parameters, dict) and parameters.get(ASYNC) is True


def header_length(value: str | None, body_size: int) -> int | None:
    """The JSON header's length from the ``Inference-Header-Content-Length`` header (None: all JSON)."""
    if value is None:
        return None
    text = value.strip()
    if not text.isdigit() or int(text) > body_size:
        raise invalid_argument(
            f"{HEADER_LENGTH} must be the length of the JSON header, a number from 0 to the body's {body_size} "
            f"bytes; got {value!r}"
        )
    return int(text)


def decode_infer_request(
    body: bytes, json_length: int | None = None, shared_memory: SharedMemory | None = None
) -> InferRequest:
    """Decode a v2 inference request body; ``json_length``: where its JSON ends and raw tensors begin.

    Inputs in shared memory are copied out of ``shared_memory`` here, and outputs to be written there are checked
    against it (before the model runs); without it, a request naming shared memory is UNIMPLEMENTED."""
    header = body if json_length is None else body[:json_length]
    doc = parse_body(header)
    request_id = doc.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise invalid_argument(f'"id" must be a string, got {_short(request_id)}')
    parameters = _object(doc.get("parameters"), '"parameters"')
    entries = doc.get("inputs")
    if not isinstance(entries, list) or not entries:
        raise invalid_argument('An inference request needs "inputs": a list of tensors with name, shape, datatype')
    raw = memoryview(body)[json_length:] if json_length is not None else memoryview(b"")
    offset = 0
    inputs: dict[str, np.ndarray] = {}
    datatypes: dict[str, str] = {}
    content_types: dict[str, str] = {}
    for entry in entries:
        name, shape, datatype = _tensor_header(entry)
        if name in inputs:
            raise invalid_argument(f'Input "{name}" is sent twice')
        given = entry.get("parameters")
        tensor_parameters = {} if given is None else _object(given, f'parameters of input "{name}"')
        size = tensor_parameters.get(BINARY_DATA_SIZE)
        shared = _shared_tensor(tensor_parameters, name, "Input")
        content_type = tensor_parameters.get(CONTENT_TYPE)
        if content_type is not None:
            if not isinstance(content_type, str):
                raise invalid_argument(f'parameters.{CONTENT_TYPE} of input "{name}" must be a string')
            content_types[name] = content_type
        if shared is not None:
            if size is not None or "data" in entry:  # Triton's rule: data, binary data or shared memory, one of them
                raise invalid_argument(
                    f'Input "{name}" has {shared_memory_parameters.REGION} and '
                    f"{BINARY_DATA_SIZE if size is not None else 'data'}: send one"
                )
            raw_shared = shared_memory_parameters.read_input(shared_memory, shared, name, shape, datatype)
            inputs[name] = _from_raw(name, memoryview(raw_shared), shape, datatype)
        elif size is not None:
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise invalid_argument(f'{BINARY_DATA_SIZE} of input "{name}" must be a non-negative integer')
            if "data" in entry:
                raise invalid_argument(f'Input "{name}" has both "data" and {BINARY_DATA_SIZE}: send one')
            if offset + size > len(raw):
                raise invalid_argument(
                    f'Input "{name}" says {BINARY_DATA_SIZE} {size}, but only {len(raw) - offset} bytes of binary '
                    f"data are left after the JSON header (is {HEADER_LENGTH} right?)"
                )
            inputs[name] = _from_raw(name, raw[offset : offset + size], shape, datatype)
            offset += size
        elif "data" in entry:
            inputs[name] = _from_json(name, entry["data"], shape, datatype)
        else:
            raise invalid_argument(f'Input "{name}" has neither "data" nor parameters.{BINARY_DATA_SIZE}')
        datatypes[name] = datatype
    if offset != len(raw):
        raise invalid_argument(
            f"The body has {len(raw) - offset} bytes of binary data that no input's {BINARY_DATA_SIZE} accounts for"
        )
    outputs = _requested_outputs(doc.get("outputs"))
    for output in outputs:
        if output.shared is not None:
            shared_memory_parameters.check_output(shared_memory, output.shared, output.name)
    return InferRequest(inputs, datatypes, outputs, request_id, parameters, content_types)


def _short(value: Any) -> str:
    text = orjson.dumps(value, default=str).decode()
    return text if len(text) <= 80 else text[:77] + "..."


def _object(value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise invalid_argument(f"{what} must be a JSON object, got {_short(value)}")
    return value


def _tensor_header(entry: Any) -> tuple[str, tuple[int, ...], str]:
    if not isinstance(entry, dict):
        raise invalid_argument(f"Each input must be an object with name, shape, datatype; got {_short(entry)}")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise invalid_argument(f'Each input needs a "name" string; got {_short(entry.get("name"))}')
    shape = entry.get("shape")
    if not isinstance(shape, list) or not _dimensions(shape):
        raise invalid_argument(f'Input "{name}" needs a "shape": a list of non-negative integers; got {_short(shape)}')
    datatype = entry.get("datatype")
    if not isinstance(datatype, str):
        raise invalid_argument(f'Input "{name}" needs a "datatype" string such as "FP32"; got {_short(datatype)}')
    dtype = to_numpy_dtype(datatype)  # an unknown datatype is refused here, listing the known ones
    # impossible_shape's question, asked of the whole product first: it differs only with a 0 among the dimensions
    elements = math.prod(shape)
    if (elements == 0 or elements * dtype.itemsize > _MAX_BYTES) and impossible_shape(shape, dtype.itemsize):
        raise invalid_argument(f'Input "{name}": shape {shape} is larger than any tensor can be')
    return name, tuple(shape), datatype


def _dimensions(shape: list[Any]) -> bool:
    """Whether every dimension is a non-negative integer (booleans are not)."""
    for dim in shape:  # noqa: SIM110 - a loop, not all() of a generator: half the time on every request
        if type(dim) is not int or dim < 0:
            return False
    return True


def _shared_tensor(parameters: Mapping[str, Any], name: str, kind: str) -> SharedTensor | None:
    """:func:`~workbench.protocol.shared_memory_parameters.shared_tensor` of an input's or output's parameters,
    asked only of those that name one of its keys (every other tensor names no region)."""
    if not parameters or (_REGION not in parameters and _BYTE_SIZE not in parameters and _OFFSET not in parameters):
        return None
    return shared_memory_parameters.shared_tensor(parameters, f'{kind} "{name}"')


def _requested_outputs(entries: Any) -> tuple[RequestedOutput, ...]:
    if entries is None:
        return ()
    if not isinstance(entries, list):
        raise invalid_argument(f'"outputs" must be a list of {{"name": ...}} objects, got {_short(entries)}')
    requested = []
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise invalid_argument(f'Each requested output needs a "name" string; got {_short(entry)}')
        given = entry.get("parameters")
        parameters = {} if given is None else _object(given, f'parameters of output "{entry["name"]}"')
        binary = parameters.get(BINARY_DATA)
        if binary is not None and not isinstance(binary, bool):
            raise invalid_argument(f'{BINARY_DATA} of output "{entry["name"]}" must be true or false')
        shared = _shared_tensor(parameters, entry["name"], "Output")
        if shared is not None and binary:
            raise invalid_argument(
                f'Output "{entry["name"]}" asks for both {shared_memory_parameters.REGION} and {BINARY_DATA}: give one'
            )
        classes = parameters.get(CLASSIFICATION)
        count = requested_count(classes, entry["name"]) if classes is not None else 0
        content_type = parameters.get(CONTENT_TYPE, "")
        if not isinstance(content_type, str):
            raise invalid_argument(f'parameters.{CONTENT_TYPE} of output "{entry["name"]}" must be a string')
        requested.append(RequestedOutput(entry["name"], binary, shared, count, content_type))
    return tuple(requested)


def _elements(shape: Sequence[int]) -> int:
    return math.prod(shape)


def _shape_error(name: str, shape: Sequence[int], detail: str) -> Exception:
    return invalid_argument(f'Input "{name}" says shape {list(shape)} ({_elements(shape)} elements) but {detail}')


def _from_raw(name: str, raw: memoryview, shape: tuple[int, ...], datatype: str) -> np.ndarray:
    count = _elements(shape)
    if datatype == BYTES:
        return _bytes_from_raw(name, raw, shape, count)
    dtype = _little_endian(datatype)
    if len(raw) != count * dtype.itemsize:
        raise _shape_error(
            name, shape, f"its {len(raw)} bytes of binary data hold {len(raw) / dtype.itemsize:g} {datatype} elements"
        )
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


@functools.lru_cache(maxsize=64)  # a dozen datatypes: each one's raw dtype made once, not once per tensor
def _little_endian(datatype: str) -> np.dtype[Any]:
    """The numpy type of a raw tensor of ``datatype`` (raw tensors are little-endian)."""
    return to_numpy_dtype(datatype).newbyteorder("<")


def _bytes_from_raw(name: str, raw: memoryview, shape: tuple[int, ...], count: int) -> np.ndarray:
    try:
        values = unpack_bytes(raw)
    except TruncatedLength:
        raise invalid_argument(f'Input "{name}": binary BYTES data ends inside an element\'s 4-byte length') from None
    except TruncatedElement as exc:
        raise invalid_argument(
            f'Input "{name}": a BYTES element of {exc.length} bytes runs past its binary data'
        ) from None
    if len(values) != count:
        raise _shape_error(name, shape, f"its binary data holds {len(values)} BYTES elements")
    return values.reshape(shape)


def _from_json(name: str, data: Any, shape: tuple[int, ...], datatype: str) -> np.ndarray:
    if not isinstance(data, list):
        data = [data]  # a lone value: Triton's clients send a scalar tensor so
    if datatype == BYTES:
        return _bytes_from_json(name, data, shape)
    dtype = to_numpy_dtype(datatype)
    try:
        array = np.asarray(data)
    except (ValueError, OverflowError) as exc:  # ragged nesting; integers beyond 64 bits
        raise invalid_argument(f'Input "{name}": "data" is not a regular array of numbers ({exc})') from None
    _check_kind(name, array, datatype)
    if array.shape != shape:
        if array.ndim > 1:
            raise _shape_error(name, shape, f'its nested "data" has shape {list(array.shape)}')
        if array.size != _elements(shape):
            raise _shape_error(name, shape, f'"data" holds {array.size} elements')
        array = array.reshape(shape)
    if dtype.kind in "iu" and array.size and array.dtype.kind in "iu":
        info = np.iinfo(dtype)
        if array.min() < info.min or array.max() > info.max:
            raise invalid_argument(f'Input "{name}": a value is out of the range of {datatype}')
    return array.astype(dtype, copy=False)


def _check_kind(name: str, array: np.ndarray, datatype: str) -> None:
    """Refuse JSON values of another kind than the datatype says (Triton does too: no silent casts)."""
    if array.size == 0:
        return
    kind = array.dtype.kind
    if datatype == "BOOL":
        ok, wanted = kind == "b", "true or false"
    elif datatype.startswith(("INT", "UINT")):
        ok, wanted = kind in "iu", "integers"
    else:
        ok, wanted = kind in "iuf", "numbers"
    if not ok:
        raise invalid_argument(f'Input "{name}" is {datatype}: its "data" must be {wanted}')


def _bytes_from_json(name: str, data: list[Any], shape: tuple[int, ...]) -> np.ndarray:
    values: list[bytes] = []
    found = _flatten_bytes(name, data, values)
    if found != shape and (len(found) > 1 or len(values) != _elements(shape)):
        raise _shape_error(name, shape, f'its "data" has shape {list(found)} ({len(values)} elements)')
    array = np.empty(len(values), dtype=object)
    array[:] = values
    return array.reshape(shape)


def _flatten_bytes(name: str, data: list[Any], into: list[bytes]) -> tuple[int, ...]:
    """Append ``data``'s strings to ``into`` row-major and return its shape (ragged nesting is refused)."""
    if data and all(isinstance(item, list) for item in data):
        shapes = {_flatten_bytes(name, item, into) for item in data}
        if len(shapes) != 1:
            raise invalid_argument(f'Input "{name}": "data" is ragged (rows of different lengths)')
        return (len(data), *shapes.pop())
    for item in data:
        if isinstance(item, str):
            into.append(item.encode())
        elif is_b64(item):
            try:
                into.append(from_b64(item))
            except ValueError:
                raise invalid_argument(f'Input "{name}": {_short(item)} is not valid base64') from None
        else:
            raise invalid_argument(f'Input "{name}" is BYTES: its "data" must be strings; got {_short(item)}')
    return (len(data),)


def check_datatypes(request: InferRequest, specs: Mapping[str, TensorSpec]) -> None:
    """Refuse an input sent as another datatype than the model's signature takes, in v2's words."""
    for name, value in request.inputs.items():
        spec = specs.get(name)
        if spec is None or (spec.dtype.kind in "OSU" and value.dtype.kind in "OSU") or spec.dtype == value.dtype:
            continue
        raise invalid_argument(
            f'Input "{name}" is {to_datatype(spec.dtype)} but the request sends {request.datatypes[name]}'
        )


# ------------------------------------------------------------------------------------------ responses
@dataclasses.dataclass(frozen=True)
class EncodedResponse:
    body: bytes
    json_length: int | None  # set when raw tensors follow the JSON (the Inference-Header-Content-Length)


def encode_infer_response(
    model_name: str,
    model_version: int | str | None,
    request: InferRequest,
    outputs: Mapping[str, np.ndarray],
    shared_memory: SharedMemory | None = None,
    parameters: Mapping[str, Any] | None = None,
    output_parameters: Mapping[str, Mapping[str, Any]] | None = None,
) -> EncodedResponse:
    """The response body: each output as JSON data, or raw after the JSON when the request asked for it so; an output
    requested in shared memory is written into ``shared_memory`` and answered with its parameters but no data.
    ``parameters``: the response's own (an explanation's), if any; ``output_parameters``: parameters outputs carry
    (the content type MLServer's runtimes put on each)."""
    requested = {o.name: o for o in request.outputs}
    entries: list[dict[str, Any]] = []
    raw: list[bytes] = []
    for name, value in outputs.items():
        asked = requested.get(name)
        binary = asked.binary if asked is not None else None
        if binary is None:
            binary = request.binary_outputs
        datatype = to_datatype(value.dtype)
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(value.shape)}
        own = output_parameters.get(name) if output_parameters else None
        if own:
            entry["parameters"] = dict(own)
        if asked is not None and asked.shared is not None:
            shared_memory_parameters.write_output(shared_memory, asked.shared, name, raw_contents(value, datatype))
            entry["parameters"] = {**entry.get("parameters", {}), **asked.shared.parameters()}
        elif binary:
            data = raw_contents(value, datatype)
            entry["parameters"] = {**entry.get("parameters", {}), BINARY_DATA_SIZE: len(data)}
            raw.append(data)
        else:
            entry["data"] = _json_data(name, value, datatype)
        entries.append(entry)
    doc: dict[str, Any] = {"model_name": model_name, "outputs": entries}
    if model_version is not None:  # None: a model its own server names no version (MLServer omits the field)
        doc["model_version"] = str(model_version)
    if request.id is not None:
        doc["id"] = request.id
    if parameters:
        doc["parameters"] = dict(parameters)
    header = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    if not raw:
        return EncodedResponse(header, None)
    return EncodedResponse(b"".join((header, *raw)), len(header))


def _json_data(name: str, value: np.ndarray, datatype: str) -> Any:
    flat = value.reshape(-1)
    if datatype == BYTES:
        try:
            return [item.decode() if isinstance(item, bytes) else str(item) for item in flat]
        except UnicodeDecodeError:
            raise invalid_argument(
                f'Output "{name}" holds bytes that are not UTF-8 text, which JSON cannot carry: request it with '
                f'"parameters": {{"{BINARY_DATA}": true}}'
            ) from None
    if flat.dtype.kind in _ORJSON_NUMPY_KINDS and flat.dtype.isnative:
        return np.ascontiguousarray(flat)  # orjson writes it without a Python list
    return flat.astype(np.float32).tolist() if flat.dtype.kind == "V" else flat.tolist()  # BF16 (ml_dtypes)
