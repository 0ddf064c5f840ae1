"""MLServer's content types (its codecs), between a decoded v2 request's tensors and what a model is given.

MLServer reads each input by its ``parameters.content_type`` (else the one its model's settings declare for it),
and the whole request by the request's (else the settings'): ``np`` (the default: the one input as an array),
``pd`` (every input a column of one DataFrame, named by the input), ``str`` (BYTES as text), ``base64`` (BYTES
holding base64, decoded) and ``datetime`` (ISO 8601 text). A content type it has no codec for is ignored, as
MLServer ignores it. Its errors read "There was an error encoding / decoding the payload: ..." and are the client's
(400); here they are INVALID_ARGUMENT, which is 400 on REST.
"""

from __future__ import annotations

import base64
import binascii
import datetime
from collections.abc import Mapping
from typing import Any

import numpy as np

from workbench.core.errors import ServingError, invalid_argument

NUMPY = "np"
PANDAS = "pd"
STRING = "str"
BASE64 = "base64"
DATETIME = "datetime"
INPUT_CODECS = (NUMPY, STRING, BASE64, DATETIME)
REQUEST_CODECS = (NUMPY, PANDAS, STRING)


def codec_error(detail: str) -> ServingError:
    """MLServer's ``CodecError``, in its words."""
    return invalid_argument(f"There was an error encoding / decoding the payload: {detail}")


def decode_input(name: str, value: np.ndarray, content_type: str) -> np.ndarray:
    """One input as its content type reads it: ``str`` → text, ``base64`` → the bytes it encodes, ``datetime`` →
    ``datetime64``; ``np`` and content types MLServer has no codec for leave the array as it came."""
    if content_type == STRING:
        return _each(value, lambda item: item.decode("utf-8") if isinstance(item, bytes) else str(item), name)
    if content_type == BASE64:
        return _each(value, _from_base64, name)
    if content_type == DATETIME:
        return _each(value, _from_iso, name).astype("datetime64[us]")
    return value


def single_input(inputs: Mapping[str, np.ndarray], content_type: str = NUMPY) -> tuple[str, np.ndarray]:
    """The request's one input, as MLServer's single-input request codecs (``np``, ``str``) take it."""
    if len(inputs) != 1:
        raise codec_error(
            f"The '{content_type}' codec only supports a single input tensor ({len(inputs)} were received)"
        )
    ((name, value),) = inputs.items()
    return name, value


def columns(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The request as ``pd`` reads it: each input one column named by the input, a value per row (an input of
    shape ``[N]`` or ``[N, 1]``), every column as long as the others."""
    found: dict[str, np.ndarray] = {}
    for name, value in inputs.items():
        if value.ndim == 2 and value.shape[1] == 1:
            value = value[:, 0]
        if value.ndim != 1:
            raise codec_error(
                f"input '{name}' of shape {list(value.shape)} cannot be a column of the '{PANDAS}' codec's DataFrame: "
                "send one value per row (shape [N] or [N, 1])"
            )
        found[name] = value
    lengths = {len(value) for value in found.values()}
    if len(lengths) > 1:
        sizes = ", ".join(f"{name} {len(value)}" for name, value in found.items())
        raise codec_error(f"the '{PANDAS}' codec's columns must be as long as each other ({sizes})")
    return found


def output_parameters(value: np.ndarray) -> dict[str, Any]:
    """What MLServer's ``np`` codec puts on an output it encodes."""
    return {"content_type": NUMPY}


def encode_output(value: np.ndarray, content_type: str) -> tuple[np.ndarray, dict[str, Any]]:
    """An output as MLServer's codec for ``content_type`` encodes it, with the parameters it puts on it.

    ``str`` is MLServer's ``StringCodec``: BYTES, each value its UTF-8 text, one per row (``[N, 1]``), and
    ``"content_type": "str"``. MLServer encodes only text so (a number's ``encode`` fails there, a 500): here a
    number is sent as its text. Every other content type (``np``, none, those MLServer has no output codec for) is
    MLServer's numpy codec: the array as it is, one value per row as ``[N, 1]``, ``"content_type": "np"``.
    """
    if content_type != STRING:
        return batch_shaped(value), output_parameters(value)
    shaped = batch_shaped(value)
    texts = np.empty(shaped.shape, dtype=object)
    texts.reshape(-1)[:] = [_utf8(item) for item in shaped.reshape(-1).tolist()]
    return texts, {"content_type": STRING}


def _utf8(item: Any) -> bytes:
    if isinstance(item, bytes):
        return item
    return str(item).encode("utf-8")


def batch_shaped(value: np.ndarray) -> np.ndarray:
    """An output as MLServer's ``np`` codec shapes it: one value per row is ``[N, 1]``, not ``[N]``."""
    return value.reshape(-1, 1) if value.ndim == 1 else value


# ------------------------------------------------------------------------------------------- elements
def _each(value: np.ndarray, convert: Any, name: str) -> np.ndarray:
    out = np.empty(value.shape, dtype=object)
    flat = out.reshape(-1)
    for index, item in enumerate(value.reshape(-1).tolist()):
        try:
            flat[index] = convert(item)
        except (ValueError, TypeError, binascii.Error) as exc:
            raise codec_error(f"input '{name}', element {index}: {exc}") from None
    return out


def _from_base64(item: Any) -> bytes:
    raw = item if isinstance(item, bytes) else str(item).encode()
    return base64.b64decode(raw, validate=True)


def _from_iso(item: Any) -> datetime.datetime:
    text = item.decode("utf-8") if isinstance(item, bytes) else str(item)
    return datetime.datetime.fromisoformat(text)
