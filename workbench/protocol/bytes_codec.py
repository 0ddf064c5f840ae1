"""How byte strings travel: the one home of the two encodings every protocol uses for them.

Raw BYTES tensors (the Open Inference Protocol's binary data over REST, ``raw_input_contents`` and
``raw_output_contents`` over gRPC, shared-memory regions): each element, row-major, as a 4-byte little-endian length
and its bytes, as Triton writes them. JSON bytes (TF Serving's REST API, v2's JSON ``data``): a string that is not
text travels as ``{"b64": "<base64>"}``.

Pure functions on bytes and numpy: no sockets, no framework. The errors are the codec's own (:class:`TruncatedLength`,
:class:`TruncatedElement`, ``binascii.Error``); each caller says them in its protocol's words.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

B64 = "b64"
LENGTH = struct.Struct("<I")  # the length before each raw BYTES element


# ------------------------------------------------------------------------------------ raw BYTES tensors
class MalformedBytes(ValueError):
    """A raw BYTES buffer that does not split into whole elements."""


class TruncatedLength(MalformedBytes):
    """The buffer ends inside an element's 4-byte length."""

    def __init__(self, offset: int, size: int) -> None:
        super().__init__(f"the data ends inside an element's 4-byte length (at byte {offset} of {size})")
        self.offset, self.size = offset, size


class TruncatedElement(MalformedBytes):
    """An element's length runs past the end of the buffer."""

    def __init__(self, length: int, remaining: int) -> None:
        super().__init__(f"an element says it has {length} bytes, but only {remaining} remain")
        self.length, self.remaining = length, remaining


def pack_bytes(values: np.ndarray) -> bytes:
    """A BYTES tensor in raw form: each element (row-major) as a 4-byte little-endian length and its bytes; an
    element that is not bytes is written as its text in UTF-8."""
    parts: list[bytes] = []
    for element in values.ravel():
        data = element if isinstance(element, bytes) else str(element).encode()
        parts += (LENGTH.pack(len(data)), data)
    return b"".join(parts)


def unpack_bytes(buffer: bytes | memoryview) -> np.ndarray:
    """The elements of a raw BYTES buffer, flat, as a numpy ``object`` array of ``bytes`` (the caller checks their
    count against the tensor's shape); :class:`MalformedBytes` where the buffer does not split into elements."""
    elements: list[bytes] = []
    view, offset = memoryview(buffer), 0
    end = len(view)
    while offset < end:
        if offset + LENGTH.size > end:
            raise TruncatedLength(offset, end)
        (length,) = LENGTH.unpack_from(view, offset)
        offset += LENGTH.size
        if offset + length > end:
            raise TruncatedElement(length, end - offset)
        elements.append(bytes(view[offset : offset + length]))
        offset += length
    array = np.empty(len(elements), dtype=object)
    array[:] = elements
    return array


# ----------------------------------------------------------------------------------------- JSON bytes
def is_b64(value: Any) -> bool:
    """Whether a JSON value is exactly ``{"b64": "<text>"}``."""
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get(B64), str)


def to_b64(data: bytes) -> dict[str, str]:
    """Bytes as the JSON object ``{"b64": ...}``."""
    return {B64: base64.b64encode(data).decode("ascii")}


def from_b64(value: Mapping[str, Any], *, validate: bool = True) -> bytes:
    """The bytes of a ``{"b64": ...}`` object; ``binascii.Error`` (a ValueError) where the text is not base64.

    ``validate`` refuses characters outside the base64 alphabet (what a server must do with a request); without it
    they are skipped, as a client reading an answer has always done."""
    return base64.b64decode(value[B64], validate=validate)
