"""TF Serving's REST JSON ↔ numpy: predict requests (row and columnar), responses, and float printing.

Pure translation, no sockets and no model: the REST frontend hands in the body (:class:`PredictBody`), and the data
plane hands it the signatures of the servable it resolved; the rules and messages are those of TF Serving's
``json_tensor.cc``. Numbers take a numpy fast path;
anything numpy refuses (ragged lists, wrong JSON types) is re-walked element by element to say exactly where
the request is wrong.

One module of ~460 lines on purpose: it is the counterpart of that one C++ file (requests and responses share its
``Format``, ``dumps`` and float rules), and the REST front end and the tests reach it as ``json_tensor.*``. Bytes as
``{"b64": ...}`` are :mod:`workbench.protocol.bytes_codec`'s.
"""

from __future__ import annotations

import binascii
import enum
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import orjson

from workbench.core.errors import Code, ServingError, invalid_argument
from workbench.core.inference import signature_name_or_default
from workbench.core.signatures import Signature, TensorSpec, describe_inputs, input_error
from workbench.protocol import json_numbers
from workbench.protocol.bytes_codec import from_b64, is_b64, to_b64

BYTES_SUFFIX = "_bytes"


class Format(enum.Enum):
    ROW = "instances"
    COLUMNAR = "inputs"


# ------------------------------------------------------------------------------------------ parsing
def parse_body(body: bytes) -> dict[str, Any]:
    """Parse a request body that must be a JSON object (NaN and ±Infinity tokens accepted)."""
    if not body.strip():
        raise invalid_argument("JSON Parse error: The document is empty")
    try:
        doc = orjson.loads(body)  # about 10x faster than json on numeric payloads...
    except orjson.JSONDecodeError:
        doc = _parse_body_slowly(body)  # ...but it refuses NaN/Infinity tokens, which TF Serving accepts
    if not isinstance(doc, dict):
        raise invalid_argument(f"JSON Value: {dumps_value(doc)} Is not object")
    return doc


def _parse_body_slowly(body: bytes) -> Any:
    try:
        return json.loads(body)
    except UnicodeDecodeError:
        raise invalid_argument("JSON Parse error: Invalid encoding in string.") from None
    except json.JSONDecodeError as exc:
        raise invalid_argument(f"JSON Parse error: {exc.msg} at offset: {exc.pos}") from None
    except RecursionError:
        raise invalid_argument("JSON Parse error: The document is nested too deeply") from None


def signature_name_of(doc: Mapping[str, Any]) -> str:
    name = doc.get("signature_name", "")
    if not isinstance(name, str):
        raise invalid_argument(
            f"JSON Value: {dumps_value(doc)} not formatted correctly. 'signature_name' key must be a string value."
        )
    return name


def _json_type(value: Any) -> str:
    if value is None:
        return "Null"
    if value is True:
        return "True"
    if value is False:
        return "False"
    if isinstance(value, dict):
        return "Object"
    if isinstance(value, list):
        return "Array"
    if isinstance(value, str):
        return "String"
    return "Number"


def dumps_value(value: Any) -> str:
    """A JSON value as TF Serving quotes it in error messages (truncated: messages stay readable)."""
    text = json.dumps(value, separators=(",", ":"), allow_nan=True)
    return text if len(text) <= 200 else text[:200] + "..."


def decode_predict_request(
    body: bytes, input_specs: Callable[[str, tuple[str, ...]], Mapping[str, TensorSpec]]
) -> tuple[str, dict[str, np.ndarray], Format]:
    """Decode a ``:predict`` body; ``input_specs(signature_name, names)`` gives the inputs a request sending those
    names addresses (a model that takes its features by name takes either them or its matrix)."""
    doc = parse_body(body)
    signature_name = signature_name_of(doc)
    specs = input_specs(signature_name, _sent_names(doc))
    # numpy turns [1, true] into [1, 1]; TF Serving refuses the bool. Bodies with a boolean token anywhere
    # (rare in numeric inputs) take the exact, element-by-element path.
    fast = b"true" not in body and b"false" not in body
    if not specs:
        raise invalid_argument(f"Failed to get input map for signature: {signature_name or 'DEFAULT'}")
    has_instances, has_inputs = "instances" in doc, "inputs" in doc
    if has_instances and has_inputs:
        raise invalid_argument(
            f"JSON Value: {dumps_value(doc)} Not formatted correctly expecting only one of 'inputs' or "
            "'instances' keys to exist "
        )
    if has_instances:
        return signature_name, _decode_instances(doc, specs, fast), Format.ROW
    if has_inputs:
        return signature_name, _decode_inputs(doc["inputs"], specs, fast), Format.COLUMNAR
    raise invalid_argument("Missing 'inputs' or 'instances' key")


def input_specs(
    signatures: Mapping[str, Signature], signature_name: str, sent: tuple[str, ...] = ()
) -> Mapping[str, TensorSpec]:
    """The inputs of the signature a REST request names, for decoding its JSON (TF Serving's REST layer words an
    unknown signature its own way, not as gRPC's predict does)."""
    key = signature_name_or_default(signature_name)
    signature = signatures.get(key)
    if signature is None:
        raise ServingError(Code.INVALID_ARGUMENT, f'Serving signature name: "{key}" not found in signature def')
    return signature.request_inputs(sent)


class PredictBody:
    """A ``:predict`` body on its way through the data plane's one call (:meth:`Dataplane.infer
    <workbench.planes.dataplane.Dataplane.infer>`): decoded once the servable it names is resolved (its signature's
    dtypes decide how the JSON reads), its outputs encoded in the format it was sent in."""

    __slots__ = ("body", "format", "_decoded")
    stacks = True  # its answer is encoded from its rows of the outputs alone, whatever ran beside them

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.format = Format.ROW  # what decode() found: row ("instances") or columnar ("inputs")
        self._decoded: tuple[str, dict[str, np.ndarray]] | None = None  # what decode_together found for it

    def decode(self, signatures: Mapping[str, Signature]) -> tuple[str, dict[str, np.ndarray]]:
        """The signature name the body names and its inputs, against the resolved servable's ``signatures``."""
        decoded, self._decoded = self._decoded, None
        if decoded is not None:
            return decoded
        signature_name, inputs, self.format = decode_predict_request(
            self.body, lambda name, sent: input_specs(signatures, name, sent)
        )
        return signature_name, inputs

    def encode(self, outputs: Mapping[str, np.ndarray]) -> bytes:
        return encode_predict_response(outputs, self.format)

    @staticmethod
    def decode_together(requests: Sequence[PredictBody], signatures: Mapping[str, Signature]) -> None:
        """Decode the bodies of a group at once, when all of them are the common case (see :func:`decode_rows`):
        each one's :meth:`decode` then returns its own rows, as decoding it alone would. Otherwise nothing is done,
        and each decodes alone."""
        decoded = decode_rows([request.body for request in requests], signatures)
        if decoded is None:
            return
        signature_name, name, arrays = decoded
        for request, array in zip(requests, arrays, strict=True):
            request.format = Format.ROW
            request._decoded = (signature_name, {name: array})  # noqa: SLF001 - its own class's


def decode_rows(
    bodies: Sequence[bytes], signatures: Mapping[str, Signature]
) -> tuple[str, str, list[np.ndarray]] | None:
    """Many ``:predict`` bodies decoded in one pass, for the common case only: each an object of a non-empty
    ``instances`` list of numbers or lists of them (and perhaps a ``signature_name``, the same in all), for a
    signature of one floating-point input, every value exactly representable in it. Returns the signature name,
    the input's name and each body's rows (views of one array), each equal to what :func:`decode_predict_request`
    makes of that body alone; None when any body is anything else (the bodies then decode one by one, which says
    what is wrong with which).

    One JSON parse, one numpy conversion and one range check for the whole group, where each body alone costs
    three of each (numpy's calls cost more than a small body's numbers)."""
    joined = b"[" + b",".join(bodies) + b"]"
    if b"true" in joined or b"false" in joined:  # numpy reads a boolean among numbers as one: the exact path
        return None
    try:
        docs = orjson.loads(joined)
    except orjson.JSONDecodeError:
        return None
    signature_name: str | None = None
    rows: list[Any] = []
    ends: list[int] = []
    for doc in docs:
        if type(doc) is not dict:
            return None
        instances = doc.get("instances")
        name = doc.get("signature_name", "")
        if type(instances) is not list or not instances or type(instances[0]) is dict or type(name) is not str:
            return None
        if len(doc) != 1 + ("signature_name" in doc) or (signature_name is not None and name != signature_name):
            return None
        signature_name = name
        rows.extend(instances)
        ends.append(len(rows))
    if signature_name is None:
        return None
    try:
        specs = input_specs(signatures, signature_name)
    except ServingError:
        return None
    if len(specs) != 1:
        return None
    ((input_name, spec),) = specs.items()
    dtype = spec.dtype
    if dtype.kind != "f":
        return None
    try:
        raw = np.asarray(rows)
    except (ValueError, TypeError, OverflowError):
        return None
    limit = _MAX_EXACT_INT.get(dtype, 1 << 11)
    # Every value within the exact range (a NaN fails it): then each body alone converts to the same values.
    if raw.dtype.kind not in "fiu" or not raw.size or not (raw.max() <= limit and raw.min() >= -limit):
        return None
    array = raw.astype(dtype, copy=False)
    starts = [0, *ends[:-1]]
    return signature_name, input_name, [array[start:end] for start, end in zip(starts, ends, strict=True)]


def _sent_names(doc: Mapping[str, Any]) -> tuple[str, ...]:
    """The names a request's object sends (columnar ``inputs``, or its first instance), else none."""
    value = doc.get("inputs") if "inputs" in doc else None
    if value is None and isinstance(doc.get("instances"), list) and doc["instances"]:
        value = doc["instances"][0]
    return tuple(value) if isinstance(value, dict) and not is_b64(value) else ()


def _decode_instances(doc: Mapping[str, Any], specs: Mapping[str, TensorSpec], fast: bool) -> dict[str, np.ndarray]:
    instances = doc["instances"]
    if not isinstance(instances, list):
        raise invalid_argument(f"JSON Value: {dumps_value(doc)} Excepting 'instances' to be an list/array")
    if not instances:
        raise invalid_argument(f"JSON Value: {dumps_value(doc)} No values in 'instances' array")
    first = instances[0]
    objects = isinstance(first, dict) and not is_b64(first)
    if not objects:
        if len(specs) > 1:
            raise invalid_argument(
                "instances is a plain list, but expecting list of objects as multiple input tensors required "
                f"as per tensorinfo_map. Signature inputs: {describe_inputs(specs)}."
            )
        ((name, spec),) = specs.items()
        for i, item in enumerate(instances):
            if isinstance(item, dict) and not is_b64(item):
                raise input_error(
                    spec, f"an object at item {i}", f"Expecting value/list but got object at item {i} of input list"
                )
        return {name: _decode_batch(instances, spec, name=None, fast=fast)}

    names = sorted(specs)
    columns: dict[str, list[Any]] = {name: [] for name in names}
    for i, item in enumerate(instances):
        if not isinstance(item, dict) or is_b64(item):
            raise invalid_argument(
                f"Expecting object but got list at item {i} of input list. Signature inputs: {describe_inputs(specs)}."
            )
        for key in item:
            if key not in specs:
                raise invalid_argument(
                    f"Failed to process element: {i} key: {key} of 'instances' list. Error: INVALID_ARGUMENT: "
                    f"JSON object: does not have named input: {key}. Signature inputs: {describe_inputs(specs)}."
                )
        if sorted(item) != names:
            missing = ",".join(n for n in names if n not in item)
            raise invalid_argument(
                f"Failed to process element: {i} of 'instances' list. JSON object: {dumps_value(item)} "
                f"keys must be equal to: {','.join(names)}. Missing: {missing}. "
                f"Signature inputs: {describe_inputs(specs)}."
            )
        for name in names:
            columns[name].append(item[name])
    return {name: _decode_batch(columns[name], specs[name], name=name, fast=fast) for name in names}


def _decode_inputs(value: Any, specs: Mapping[str, TensorSpec], fast: bool) -> dict[str, np.ndarray]:
    if not isinstance(value, dict) or is_b64(value):
        if len(specs) > 1:
            raise invalid_argument(
                "inputs is a plain value/list, but expecting an object as multiple input tensors required as "
                f"per tensorinfo_map. Signature inputs: {describe_inputs(specs)}."
            )
        ((name, spec),) = specs.items()
        return {name: decode_tensor(value, spec, fast)}
    tensors = {}
    for name, spec in sorted(specs.items()):
        if name not in value:
            raise invalid_argument(
                f"Missing named input: {name} in 'inputs' object. Signature inputs: {describe_inputs(specs)}."
            )
        tensors[name] = decode_tensor(value[name], spec, fast)
    return tensors


def _decode_batch(items: list[Any], spec: TensorSpec, name: str | None, fast: bool) -> np.ndarray:
    """The row format: each instance is one example; all must have the same shape."""
    try:
        return _to_array(items, spec, fast)
    except _Unfit as batch_error:
        # Find the instance at fault, for a message that says which one and why.
        shape0 = None
        for i, item in enumerate(items):
            where = f"Failed to process element: {i}" + (f" key: {name}" if name else "")
            try:
                shape = _to_array(item, spec).shape
            except _Unfit as unfit:
                raise input_error(
                    spec,
                    f"{unfit.received} in instance {i}",
                    f"{where} of 'instances' list. Error: INVALID_ARGUMENT: {unfit.detail}",
                ) from None
            if shape0 is None:
                shape0 = shape
            elif shape != shape0:
                size0, size = int(np.prod(shape0)), int(np.prod(shape))
                detail = (
                    f"Expecting tensor size: {size0} but got: {size}"
                    if size0 != size
                    else f"Expecting shape {_shape_str(shape0)} but got: {_shape_str(shape)}"
                )
                raise input_error(
                    spec,
                    f"instances of different shapes ({_shape_str(shape0)} in instance 0, "
                    f"{_shape_str(shape)} in instance {i})",
                    f"{where} of 'instances' list. Error: INVALID_ARGUMENT: {detail}",
                ) from None
        raise input_error(spec, batch_error.received, batch_error.detail) from None


def _shape_str(shape: tuple[int, ...]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


# --------------------------------------------------------------------------------- value → tensor
_MAX_EXACT_INT = {np.dtype(np.float32): (1 << 24) - 1, np.dtype(np.float64): (1 << 53) - 1}


class _Unfit(Exception):
    """A JSON value that does not fit its input: what was received, and TF Serving's message about it.

    Raised where the value is walked; the callers, which know whether it is a whole tensor or one instance of
    the row format, turn it into the one input error format (:func:`input_error`).
    """

    def __init__(self, received: str, detail: str) -> None:
        super().__init__(detail)
        self.received, self.detail = received, detail


def decode_tensor(value: Any, spec: TensorSpec, fast: bool = False) -> np.ndarray:
    """A JSON value (scalar or nested lists) as an array of the signature's dtype, or an error naming the input.

    ``fast`` lets numpy convert numbers in C. It cannot see a boolean hidden among numbers (it makes
    ``[1, true]`` into ``[1, 1]``), so callers pass it only when the JSON has no boolean token at all.
    """
    try:
        return _to_array(value, spec, fast)
    except _Unfit as unfit:
        raise input_error(spec, unfit.received, unfit.detail) from None


def _to_array(value: Any, spec: TensorSpec, fast: bool = False) -> np.ndarray:
    dtype = spec.dtype
    if dtype.kind != "O" and fast:
        converted = _numeric_fast_path(value, dtype)
        if converted is not None:
            return converted
    return _walk(value, spec)


def _numeric_fast_path(value: Any, dtype: np.dtype) -> np.ndarray | None:
    """numpy's C conversion when the JSON holds only the right kind of numbers; None means walk it."""
    try:
        raw = np.asarray(value)
    except (ValueError, TypeError, OverflowError):
        return None
    kind = raw.dtype.kind
    if dtype.kind == "f":
        if kind not in "fiu":
            return None
        if raw.size == 0:
            return raw.astype(dtype)
        # Past the largest exact integer an int token among floats may be lossy: check token by token. The common
        # case is settled without a temporary (a NaN fails it: then look past the non-finite values), a few values
        # in Python, which compares them faster than numpy starts a reduction.
        limit = _MAX_EXACT_INT.get(dtype, 1 << 11)
        if raw.size <= 16:
            within = all(-limit <= v <= limit for v in raw.ravel().tolist())
        else:
            within = bool(raw.max() <= limit and raw.min() >= -limit)
        if within:
            return raw.astype(dtype, copy=False)
        if kind == "f":
            finite = raw[np.isfinite(raw)]
            if finite.size and np.abs(finite).max() > limit:
                return None
            return raw.astype(dtype)
        return None
    if dtype.kind in "iu":
        if kind not in "iu":
            return None if raw.size else raw.astype(dtype)
        info = np.iinfo(dtype)
        if raw.size and (raw.min() < info.min or raw.max() > info.max):
            return None
        return raw.astype(dtype)
    if dtype.kind == "b":
        return raw if kind == "b" else (None if raw.size else raw.astype(dtype))
    return None


def _leaf_shape(value: Any) -> list[int]:
    shape = []
    while isinstance(value, list):
        shape.append(len(value))
        if not value:
            break
        value = value[0]
    return shape


def _walk(value: Any, spec: TensorSpec) -> np.ndarray:
    """TF Serving's FillTensorProto: shape from the first elements, every leaf at the same depth."""
    shape = _leaf_shape(value)
    rank = len(shape)
    flat: list[Any] = []

    def visit(v: Any, level: int) -> None:
        if not isinstance(v, list):
            if level != rank:
                raise _Unfit(
                    f"a ragged list (a value at depth {level} where the first values are at depth {rank})",
                    f"JSON Value: {dumps_value(v)} found at incorrect level: {level + 1} in the JSON DOM. "
                    f"Expected at level: {rank}",
                )
            flat.append(_leaf(v, spec))
            return
        if level >= rank:
            raise _Unfit(
                f"a ragged list (a list at depth {level} where the first values are at depth {rank})",
                f"Encountered list at unexpected level: {level} expected < {rank}",
            )
        if len(v) != shape[level]:
            raise _Unfit(
                f"a ragged list (lists of {shape[level]} and of {len(v)} at depth {level})",
                f"Encountered list at unexpected size: {len(v)} at level: {level} expected size: {shape[level]}",
            )
        for item in v:
            visit(item, level + 1)

    visit(value, 0)
    out = np.empty(len(flat), dtype=spec.dtype)
    if flat:
        out[:] = flat
    return out.reshape(shape)


def _type_error(v: Any, spec: TensorSpec, received: str = "") -> _Unfit:
    return _Unfit(
        received or f"a JSON {_json_type(v)}",
        f"JSON Value: {dumps_value(v)} Type: {_json_type(v)} is not of expected type: {spec.dtype_name}",
    )


def _lossy(v: float, spec: TensorSpec) -> _Unfit:
    return _Unfit(
        f"{v}, which {spec.dtype_name} cannot hold exactly",
        f"Cannot convert JSON value: {v} to {spec.dtype_name} without loss of precision.",
    )


def _leaf(v: Any, spec: TensorSpec) -> Any:
    kind = spec.dtype.kind
    if kind == "O":
        if isinstance(v, str):
            return v.encode("utf-8")
        if isinstance(v, dict):
            if not is_b64(v):
                raise _Unfit(
                    'an object other than {"b64": "..."}',
                    f"JSON Value: {dumps_value(v)} not formatted correctly for base64 data",
                )
            try:
                return from_b64(v)
            except (binascii.Error, ValueError):
                raise _Unfit("invalid base64", "Unable to base64 decode") from None
        raise _type_error(v, spec)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        if kind == "b" and isinstance(v, bool):
            return v
        raise _type_error(v, spec)
    if kind == "b":
        raise _type_error(v, spec)
    if kind == "f":
        if isinstance(v, int):
            if abs(v) > _MAX_EXACT_INT.get(spec.dtype, 1 << 11):
                raise _lossy(v, spec)
        elif math.isfinite(v) and abs(v) > float(np.finfo(spec.dtype).max):
            raise _lossy(v, spec)
        return v
    if isinstance(v, float):
        raise _type_error(v, spec, f"the JSON float {v}")
    info = np.iinfo(spec.dtype)
    if not info.min <= v <= info.max:
        raise _type_error(v, spec, f"{v}, out of {spec.dtype_name}'s range")
    return v


# ------------------------------------------------------------------------------------ responses
def to_json_value(array: np.ndarray, as_b64: bool = False) -> Any:
    """An output tensor as nested JSON-ready lists (floats in shortest form, bytes as text or b64)."""
    kind = array.dtype.kind
    if kind == "f":
        if array.dtype.itemsize < 8:
            # float32 → the shortest decimal that round-trips in float32 ("0.1", not 0.10000000149011612),
            # carried in a float64 whose repr is that same decimal.
            array = array.astype(str).astype(np.float64)
        return array.tolist()
    if kind in "OSU":
        return _strings(array.tolist(), as_b64)
    if kind == "c":
        raise invalid_argument(f"Failed to write JSON value for tensor type: {array.dtype}")
    return array.tolist()


def _strings(value: Any, as_b64: bool) -> Any:
    if isinstance(value, list):
        return [_strings(v, as_b64) for v in value]
    if isinstance(value, str):
        value = value.encode("utf-8")
    if not as_b64:
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            pass  # not text: send it losslessly rather than as invalid JSON
    return to_b64(value)


def dumps(obj: Any) -> bytes:
    """Compact JSON with TF Serving's NaN / Infinity / -Infinity tokens."""
    return json.dumps(obj, separators=(",", ":"), allow_nan=True, ensure_ascii=False).encode("utf-8")


def encode_predict_response(outputs: Mapping[str, np.ndarray], fmt: Format) -> bytes:
    if not outputs:
        raise invalid_argument("Cannot convert empty tensor map to JSON")
    names = sorted(outputs)
    if all(json_numbers.fits(outputs[n]) for n in names):
        fast = _encode_numbers(outputs, names, fmt)
        if fast is not None:
            return fast
    values = {n: to_json_value(outputs[n], n.endswith(BYTES_SUFFIX)) for n in names}
    if fmt is Format.COLUMNAR:
        return dumps({"outputs": values[names[0]] if len(names) == 1 else values})
    batch = _row_batch(outputs, names)
    if len(names) == 1:
        return dumps({"predictions": values[names[0]]})
    return dumps({"predictions": [{n: values[n][i] for n in names} for i in range(batch)]})


def _row_batch(outputs: Mapping[str, np.ndarray], names: list[str]) -> int:
    """The batch size every output of a row-format answer shares (TF Serving's checks, in its order)."""
    batch = None
    for name in names:
        if outputs[name].ndim == 0:
            raise invalid_argument(f"Tensor name: {name} has no shape information ")
        size = outputs[name].shape[0]
        if batch is not None and size != batch:
            raise invalid_argument(f"Tensor name: {name} has inconsistent batch size: {size} expecting: {batch}")
        batch = size
    assert batch is not None
    return batch


def _encode_numbers(outputs: Mapping[str, np.ndarray], names: list[str], fmt: Format) -> bytes | None:
    """The response written by orjson, for outputs that all :func:`json_numbers.fits`: the bytes :func:`dumps`
    would write (see :mod:`workbench.protocol.json_numbers`); None where a key needs escaping."""
    if fmt is Format.COLUMNAR:
        if len(names) == 1:
            return json_numbers.dumps({"outputs": outputs[names[0]]})
        return (
            json_numbers.dumps({"outputs": {n: outputs[n] for n in names}}) if json_numbers.plain_keys(names) else None
        )
    batch = _row_batch(outputs, names)
    if len(names) == 1:
        return json_numbers.dumps({"predictions": outputs[names[0]]})
    if not json_numbers.plain_keys(names):
        return None
    return json_numbers.dumps({"predictions": [{n: outputs[n][i] for n in names} for i in range(batch)]})


def _score(value: float) -> float:
    return float(np.float32(value).astype(str)) if math.isfinite(value) else value


def encode_classify_response(results: list[list[tuple[str, float]]]) -> bytes:
    return dumps({"results": [[[label, _score(score)] for label, score in row] for row in results]})


def encode_regress_response(values: list[float]) -> bytes:
    return dumps({"results": [_score(v) for v in values]})


def encode_error(message: str) -> bytes:
    return dumps({"error": message})
