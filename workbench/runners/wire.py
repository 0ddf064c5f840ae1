"""The messages between a frontend and a model runner: pickled tuples, tensors out of band in shared memory.

A frame is ``<u32 length><u32 pickle length><pickle><u64 offset, u64 size>*`` : the message pickled with protocol 5,
whose large contiguous buffers (numpy arrays' data) are not copied into the pickle but written into the sender's
:class:`~workbench.runners.arena.Arena`, listed after it as (offset, size). The receiver unpickles with views on the
sender's arena in their place, so a request's tensors reach the model without another copy. Buffers under
:data:`INLINE_BYTES`, and any buffer when the arena is full, travel inside the pickle: for small tensors that is
cheaper than a block's bookkeeping.

Messages are tuples whose first item is their kind. Frontend → runner: :data:`LOAD`, :data:`UNLOAD`, :data:`INFER`,
:data:`CANCEL`, :data:`FREE` (blocks of the runner's arena the frontend has read). Runner → frontend: :data:`REPLIES`
(the answers to LOADs and INFERs of one turn of the runner's loop, together), :data:`BATCH` (a batch record, for
the frontend's metrics) and :data:`TIMINGS` (what happened to a traced INFER in the runner, sent just before its
answer: :mod:`workbench.runners.timings`).
"""

from __future__ import annotations

import os
import pickle
import socket
import struct
from collections.abc import Iterator
from typing import Any

from workbench.core.errors import Code, ServingError
from workbench.runners.arena import Arena

LOAD, UNLOAD, INFER, CANCEL, FREE, REPLIES, BATCH, TIMINGS = range(8)

INLINE_BYTES = 16 << 10
_HEADER = struct.Struct("<II")
_SPAN = struct.Struct("<QQ")

Spans = list[tuple[int, int]]


def encode(message: tuple[Any, ...], arena: Arena | None) -> tuple[bytes, Spans]:
    """One frame for ``message``, and the blocks of ``arena`` its tensors were written to (the sender frees them
    once the peer says it is done with them)."""
    spans: Spans = []

    def out_of_band(buffer: pickle.PickleBuffer) -> bool:
        view = buffer.raw()
        size = view.nbytes
        if arena is None or size < INLINE_BYTES:
            return True  # in band
        offset = arena.allocate(size)
        if offset is None:
            return True
        arena.memory[offset : offset + size] = view
        spans.append((offset, size))
        return False

    body = pickle.dumps(message, protocol=5, buffer_callback=out_of_band)
    tail = b"".join(_SPAN.pack(offset, size) for offset, size in spans)
    return _HEADER.pack(len(body) + len(tail) + 4, len(body)) + body + tail, spans


def decode(frame: memoryview, arena: Arena | None) -> tuple[tuple[Any, ...], Spans]:
    """The message of one frame (without its length word) and the blocks of the peer's ``arena`` it views."""
    (body_size,) = struct.unpack_from("<I", frame, 0)
    body = frame[4 : 4 + body_size]
    spans = [_SPAN.unpack_from(frame, at) for at in range(4 + body_size, len(frame), _SPAN.size)]
    if not spans:
        return pickle.loads(body), spans  # noqa: S301 - frames from this server's own runner process
    if arena is None:
        raise ValueError("a frame viewing shared memory arrived before the arena was mapped")
    memory = arena.memory
    return pickle.loads(body, buffers=[memory[offset : offset + size] for offset, size in spans]), spans  # noqa: S301 - frames from this server's own runner process


class FrameReader:
    """Frames out of a byte stream that arrives in pieces: :meth:`feed` each piece, iterate what completed."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> Iterator[memoryview]:
        buffer = self._buffer
        buffer += data
        at, end = 0, len(buffer)
        frames = []
        while end - at >= 4:
            (size,) = struct.unpack_from("<I", buffer, at)
            if end - at - 4 < size:
                break
            frames.append(bytes(buffer[at + 4 : at + 4 + size]))
            at += 4 + size
        if at:
            del buffer[:at]
        return (memoryview(frame) for frame in frames)


def error_of(exc: BaseException) -> tuple[int, str]:
    """An error as it travels: its code and message (exceptions themselves need not pickle)."""
    if isinstance(exc, ServingError):
        return exc.code.value, exc.message
    from workbench.core.errors import from_exception

    error = from_exception(exc)
    return error.code.value, error.message


def error_from(travelled: tuple[int, str]) -> ServingError:
    code, message = travelled
    return ServingError(Code(code), message)


# ------------------------------------------------------------------------------------------------ handshake
GREETING = b"workbench-runner/1"
_SIZE = struct.Struct("<Q")


def send_arena(sock: socket.socket, arena: Arena) -> None:
    """Pass ``arena``'s memory to the peer (its descriptor rides on the greeting, SCM_RIGHTS)."""
    socket.send_fds(sock, [GREETING + _SIZE.pack(arena.size)], [arena.fd])


def receive_arena(sock: socket.socket) -> Arena:
    """Map the arena the peer passed with :func:`send_arena`."""
    data, fds, _flags, _addr = socket.recv_fds(sock, len(GREETING) + _SIZE.size, 1)
    if not data.startswith(GREETING) or len(fds) != 1:
        for fd in fds:
            os.close(fd)
        raise ConnectionError(f"not a workbench model runner's greeting: {data[:32]!r}")
    (size,) = _SIZE.unpack_from(data, len(GREETING))
    return Arena(size, fds[0])
