"""TFRecord files without TensorFlow: the framing, checked with its CRC32C checksums.

A record is ``length`` (uint64, little-endian), the masked CRC32C of those 8 bytes, ``length`` bytes of data and
the masked CRC32C of the data. A file being written may end in part of a record: :func:`read_records` stops
there when asked to (``partial_tail="stop"``), so a reader can follow a request log while the server writes it.
Checksums come from google-crc32c (Google's C library, hardware-accelerated where the CPU has CRC32C
instructions): a checksum in pure Python runs at about 10 MB/s and would hold the GIL that the server's
request path needs while the log writer works.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from typing import Literal

import google_crc32c


def masked_crc(data: bytes) -> int:
    """TFRecord's checksum: the CRC32C rotated right by 15 bits plus a constant."""
    crc = google_crc32c.value(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def encode_record(data: bytes) -> bytes:
    """One record, framed: what a TFRecord file holds for ``data``."""
    header = struct.pack("<Q", len(data))
    return header + struct.pack("<I", masked_crc(header)) + data + struct.pack("<I", masked_crc(data))


class CorruptRecord(ValueError):
    """A TFRecord file whose framing or checksums are wrong (or that is no TFRecord file at all).

    ``reason`` says what, in TensorFlow's own words ("truncated record at 12", "corrupted record at 0"); the
    message adds the file.
    """

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        super().__init__(f"{os.fspath(path)}: {reason}")
        self.reason = reason


def read_records(path: str | os.PathLike[str], partial_tail: Literal["stop", "raise"] = "raise") -> Iterator[bytes]:
    """The records of one local TFRecord file, in order, each checked against its checksums."""
    with open(path, "rb") as f:
        data = f.read()
    yield from records_in(data, path, partial_tail)


def records_in(
    data: bytes, path: str | os.PathLike[str], partial_tail: Literal["stop", "raise"] = "raise"
) -> Iterator[bytes]:
    """The records framed in ``data``, the bytes of the TFRecord file ``path`` (named in errors), however read.

    Split from :func:`read_records` so that a file read through fsspec (an object store) is parsed the same way.
    """
    offset, end = 0, len(data)
    while offset < end:
        if end - offset < 12:
            if partial_tail == "stop":
                return
            raise CorruptRecord(path, f"truncated record at {offset}")
        header = data[offset : offset + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[offset + 8 : offset + 12])
        if masked_crc(header) != length_crc:
            raise CorruptRecord(path, f"corrupted record at {offset}")
        start = offset + 12
        if end - start < length + 4:
            if partial_tail == "stop":
                return
            raise CorruptRecord(path, f"truncated record at {offset}")
        record = data[start : start + length]
        (data_crc,) = struct.unpack("<I", data[start + length : start + length + 4])
        if masked_crc(record) != data_crc:
            raise CorruptRecord(path, f"corrupted record at {offset}")
        yield record
        offset = start + length + 4
