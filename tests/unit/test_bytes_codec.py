"""The one home of the byte-string encodings (workbench.protocol.bytes_codec): raw BYTES tensors' length-prefixed
elements and JSON's ``{"b64": ...}``. Pure functions: no framework, no sockets."""

from __future__ import annotations

import binascii
import struct

import numpy as np
import pytest

from workbench.protocol.bytes_codec import (
    B64,
    LENGTH,
    MalformedBytes,
    TruncatedElement,
    TruncatedLength,
    from_b64,
    is_b64,
    pack_bytes,
    to_b64,
    unpack_bytes,
)


def objects(*values: bytes) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    array[:] = values
    return array


@pytest.mark.parametrize(
    "values",
    [
        (b"a", b"bc"),
        (b"", b"\x00", b""),  # empty elements, and trailing NULs numpy's fixed-width bytes would drop
        (b"\xff" * 70_000,),  # longer than 16 bits of length
        (),
    ],
    ids=["text", "empty-elements", "long", "no-elements"],
)
def test_raw_bytes_round_trip(values: tuple[bytes, ...]) -> None:
    packed = pack_bytes(objects(*values))
    assert len(packed) == sum(LENGTH.size + len(v) for v in values)
    back = unpack_bytes(packed)
    assert back.dtype == object and back.shape == (len(values),) and back.tolist() == list(values)
    assert unpack_bytes(memoryview(packed)).tolist() == list(values)


def test_raw_bytes_are_little_endian_lengths_row_major() -> None:
    grid = np.array([[b"ab", b""], [b"c", b"de"]], dtype=object)
    assert pack_bytes(grid) == b"".join(struct.pack("<I", len(v)) + v for v in (b"ab", b"", b"c", b"de"))
    assert pack_bytes(grid.T) == b"".join(struct.pack("<I", len(v)) + v for v in (b"ab", b"c", b"", b"de"))


def test_elements_that_are_not_bytes_are_written_as_text() -> None:
    assert unpack_bytes(pack_bytes(np.array(["hé", 7], dtype=object))).tolist() == ["hé".encode(), b"7"]
    assert unpack_bytes(pack_bytes(np.array(["x", "yz"]))).tolist() == [b"x", b"yz"]


@pytest.mark.parametrize("cut", [1, 2, 3])
def test_a_buffer_ending_inside_a_length(cut: int) -> None:
    packed = pack_bytes(objects(b"ab")) + b"\x05\x00\x00\x00"[:cut]
    with pytest.raises(TruncatedLength) as caught:
        unpack_bytes(packed)
    assert isinstance(caught.value, MalformedBytes) and isinstance(caught.value, ValueError)
    assert (caught.value.offset, caught.value.size) == (6, 6 + cut)


def test_an_element_running_past_the_end() -> None:
    with pytest.raises(TruncatedElement) as caught:
        unpack_bytes(struct.pack("<I", 5) + b"abc")
    assert (caught.value.length, caught.value.remaining) == (5, 3)
    assert str(caught.value) == "an element says it has 5 bytes, but only 3 remain"


def test_an_empty_buffer_holds_no_elements() -> None:
    assert unpack_bytes(b"").shape == (0,)
    assert pack_bytes(np.empty((0, 3), dtype=object)) == b""


def test_b64_round_trip_and_shape() -> None:
    for data in (b"", b"\x00\xff", "héllo".encode()):
        value = to_b64(data)
        assert list(value) == [B64] and is_b64(value)
        assert from_b64(value) == data
    assert to_b64(b"\x00\xff") == {"b64": "AP8="}


@pytest.mark.parametrize("value", [{"b64": 3}, {"b64": "AA==", "extra": 1}, {"x": "AA=="}, ["AA=="], "AA==", None])
def test_only_an_object_of_one_b64_string_is_b64(value: object) -> None:
    assert not is_b64(value)


def test_invalid_b64_is_refused_unless_lenient() -> None:
    with pytest.raises(binascii.Error):
        from_b64({"b64": "!!"})
    with pytest.raises(binascii.Error):
        from_b64({"b64": "AP8=\n"})
    assert from_b64({"b64": "AP8=\n"}, validate=False) == b"\x00\xff"  # a client reading an answer skips them
