"""``mlserver.codecs.numpy``, ``.string``, ``.base64`` and ``.datetime``: the input codecs of one tensor each.

- ``np`` (:class:`NumpyCodec`): a numpy array of the tensor's datatype and shape; a 1-D array answers ``[N, 1]``.
- ``str`` (:class:`StringCodec`): a list of strings (BYTES, UTF-8), one per element; answers shape ``[N, 1]``.
- ``base64`` (:class:`Base64Codec`): a list of ``bytes``, each sent base64-encoded.
- ``datetime`` (:class:`DatetimeCodec`): a list of ``datetime``, each sent as ISO 8601 text.
The matching request codecs (``NumpyRequestCodec``, ``StringRequestCodec``) decode a request of one input.
"""

from __future__ import annotations

import base64
import binascii
import datetime
from typing import Any

import numpy as np

from workbench.mlserver_api.codecs.codec_base import InputCodec, register_input_codec, register_request_codec
from workbench.mlserver_api.codecs.codec_errors import CodecError
from workbench.mlserver_api.codecs.content_types import InputOrOutput, SingleInputRequestCodec, inject_batch_dimension
from workbench.mlserver_api.dataplane_types import Datatype, Parameters, RequestInput, ResponseOutput, TensorData

_NUMPY_OF: dict[str, str] = {
    "BOOL": "bool",
    "UINT8": "uint8",
    "UINT16": "uint16",
    "UINT32": "uint32",
    "UINT64": "uint64",
    "INT8": "int8",
    "INT16": "int16",
    "INT32": "int32",
    "INT64": "int64",
    "FP16": "float16",
    "FP32": "float32",
    "FP64": "float64",
}
_DATATYPE_OF = {numpy: datatype for datatype, numpy in _NUMPY_OF.items()}
ENCODING = "utf-8"


def flat_list(data: Any) -> list[Any]:
    """A tensor's elements as one flat list: nested lists flattened, one ``bytes``/``str``/number as a list of it."""
    root = getattr(data, "root", data)
    if isinstance(root, np.ndarray):
        return list(root.reshape(-1).tolist())
    if not isinstance(root, (list, tuple)):
        return [root]
    flat: list[Any] = []
    stack = [iter(root)]
    while stack:
        item = next(stack[-1], _END)
        if item is _END:
            stack.pop()
        elif isinstance(item, (list, tuple)):
            stack.append(iter(item))
        else:
            flat.append(item)
    return flat


_END = object()


def to_datatype(dtype: np.dtype[Any]) -> Datatype:
    if dtype.kind in "OSU":
        return Datatype.BYTES
    name = _DATATYPE_OF.get(dtype.name)
    if name is None:
        raise CodecError(f"numpy {dtype} has no v2 datatype")
    return Datatype(name)


def to_dtype(input_or_output: InputOrOutput) -> np.dtype[Any]:
    datatype = str(input_or_output.datatype)
    if datatype == "BYTES":
        return np.dtype(object)
    return np.dtype(_NUMPY_OF[datatype])


def encode_str(elem: str) -> bytes:
    return elem.encode(ENCODING)


def decode_str(encoded: Any, str_codec: str = ENCODING) -> Any:
    if encoded is None or isinstance(encoded, str):
        return encoded
    if isinstance(encoded, bytes):
        return encoded.decode(str_codec)
    return ""


def is_list_of(payload: Any, kind: type | tuple[type, ...]) -> bool:
    return isinstance(payload, list) and all(isinstance(element, kind) for element in payload)


def _ndarray(input_or_output: InputOrOutput) -> np.ndarray:
    elements = flat_list(input_or_output.data)
    shape = list(input_or_output.shape)
    if str(input_or_output.datatype) == "BYTES":
        array = np.array(elements)  # bytes as numpy's fixed-width bytes, text as its fixed-width str
        return array.reshape(shape) if array.size == int(np.prod(shape)) else array
    dtype = to_dtype(input_or_output)
    values = [np.nan if value is None else value for value in elements]
    try:
        return np.asarray(values, dtype=dtype).reshape(shape)
    except (TypeError, ValueError) as exc:
        raise CodecError(
            f"'{input_or_output.name}' is not {input_or_output.datatype} of shape {shape}: {exc}"
        ) from None


def _encode_data(array: np.ndarray, datatype: Datatype) -> list[Any]:
    if datatype is Datatype.BYTES:
        return [encode_str(v) if isinstance(v, str) else v for v in array.reshape(-1).tolist()]
    values = array.reshape(-1).tolist()
    if array.dtype.kind == "f" and np.isnan(array).any():  # JSON has no NaN: sent as null
        values = [None if value != value else value for value in values]
    return list(values)


@register_input_codec
class NumpyCodec(InputCodec):
    ContentType = "np"
    TypeHint = np.ndarray

    @classmethod
    def can_encode(cls, payload: Any) -> bool:
        return isinstance(payload, np.ndarray)

    @classmethod
    def encode_output(cls, name: str, payload: np.ndarray, **kwargs: Any) -> ResponseOutput:
        datatype = to_datatype(payload.dtype)
        return ResponseOutput(
            name=name,
            datatype=datatype,
            shape=inject_batch_dimension(list(payload.shape)),
            data=TensorData(_encode_data(payload, datatype)),
            parameters=Parameters(content_type=cls.ContentType),
        )

    @classmethod
    def decode_output(cls, response_output: ResponseOutput) -> np.ndarray:
        return _ndarray(response_output)

    @classmethod
    def encode_input(cls, name: str, payload: np.ndarray, **kwargs: Any) -> RequestInput:
        output = cls.encode_output(name, payload)
        return RequestInput(
            name=name, datatype=output.datatype, shape=output.shape, data=output.data, parameters=output.parameters
        )

    @classmethod
    def decode_input(cls, request_input: RequestInput) -> np.ndarray:
        return _ndarray(request_input)


@register_request_codec
class NumpyRequestCodec(SingleInputRequestCodec):
    InputCodec = NumpyCodec
    ContentType = NumpyCodec.ContentType


class _ListCodec(InputCodec):
    """A list of Python values sent as BYTES, one element each (shape ``[N, 1]``)."""

    @classmethod
    def _to_element(cls, value: Any) -> Any:
        raise NotImplementedError()

    @classmethod
    def _from_element(cls, element: Any) -> Any:
        raise NotImplementedError()

    @classmethod
    def encode_output(cls, name: str, payload: list[Any], use_bytes: bool = True, **kwargs: Any) -> ResponseOutput:
        packed = [cls._to_element(value) for value in payload]
        if not use_bytes:
            packed = [decode_str(value) for value in packed]
        return ResponseOutput(
            name=name,
            datatype=Datatype.BYTES,
            shape=[len(payload), 1],
            data=TensorData(packed),
            parameters=Parameters(content_type=cls.ContentType),
        )

    @classmethod
    def decode_output(cls, response_output: ResponseOutput) -> list[Any]:
        return [cls._from_element(element) for element in flat_list(response_output.data)]

    @classmethod
    def encode_input(cls, name: str, payload: list[Any], use_bytes: bool = True, **kwargs: Any) -> RequestInput:
        output = cls.encode_output(name, payload, use_bytes)
        return RequestInput(
            name=name, datatype=output.datatype, shape=output.shape, data=output.data, parameters=output.parameters
        )

    @classmethod
    def decode_input(cls, request_input: RequestInput) -> list[Any]:
        return [cls._from_element(element) for element in flat_list(request_input.data)]


@register_input_codec
class StringCodec(_ListCodec):
    ContentType = "str"
    TypeHint = list[str]

    @classmethod
    def can_encode(cls, payload: Any) -> bool:
        return is_list_of(payload, str)

    @classmethod
    def _to_element(cls, value: Any) -> Any:
        return encode_str(value) if isinstance(value, str) else value

    @classmethod
    def _from_element(cls, element: Any) -> Any:
        return decode_str(element)


@register_request_codec
class StringRequestCodec(SingleInputRequestCodec):
    InputCodec = StringCodec
    ContentType = StringCodec.ContentType


@register_input_codec
class Base64Codec(_ListCodec):
    ContentType = "base64"
    TypeHint = list[bytes]

    @classmethod
    def can_encode(cls, payload: Any) -> bool:
        return is_list_of(payload, bytes)

    @classmethod
    def _to_element(cls, value: Any) -> Any:
        return base64.b64encode(value if isinstance(value, bytes) else encode_str(value))

    @classmethod
    def _from_element(cls, element: Any) -> Any:
        try:
            return base64.b64decode(element if isinstance(element, bytes) else encode_str(element), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise CodecError(f"not base64: {exc}") from None


@register_input_codec
class DatetimeCodec(_ListCodec):
    ContentType = "datetime"
    TypeHint = list[datetime.datetime]

    @classmethod
    def can_encode(cls, payload: Any) -> bool:
        return is_list_of(payload, datetime.datetime)

    @classmethod
    def _to_element(cls, value: Any) -> Any:
        return encode_str(value.isoformat() if isinstance(value, datetime.datetime) else str(value))

    @classmethod
    def _from_element(cls, element: Any) -> Any:
        try:
            return datetime.datetime.fromisoformat(decode_str(element))
        except (TypeError, ValueError) as exc:
            raise CodecError(f"not an ISO 8601 date and time: {exc}") from None
