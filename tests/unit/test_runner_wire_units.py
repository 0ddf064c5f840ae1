"""The model runners' transport: shared-memory arenas and the frames that carry tensors through them."""

from __future__ import annotations

import socket

import numpy as np
import pytest

from workbench.batching.scheduler import BatchRecord
from workbench.core.errors import Code, ServingError
from workbench.runners import wire
from workbench.runners.arena import ALIGN, Arena


@pytest.fixture
def arena():
    area = Arena(1 << 20)
    yield area
    area.close()


def test_blocks_are_aligned_disjoint_and_reused_once_freed(arena):
    first, second, third = arena.allocate(100), arena.allocate(ALIGN * 3), arena.allocate(1)
    assert (first, second, third) == (0, ALIGN * 2, ALIGN * 5)
    arena.free(second)
    assert arena.allocate(ALIGN) == ALIGN * 2  # first fit: the hole the freed block left
    assert arena.used_bytes == ALIGN * 4


def test_freed_neighbours_merge_so_a_large_block_fits_again(arena):
    blocks = [arena.allocate(1 << 18) for _ in range(4)]
    assert arena.allocate(1) is None  # full
    for offset in (blocks[1], blocks[3], blocks[2], blocks[0]):  # out of order: both-sided merges
        arena.free(offset)
    assert arena.used_bytes == 0
    assert arena.allocate(1 << 20) == 0


def test_a_peer_maps_the_same_memory_through_the_socket(arena):
    left, right = socket.socketpair()
    with left, right:
        wire.send_arena(left, arena)
        peer = wire.receive_arena(right)
    try:
        arena.memory[10:15] = b"hello"
        assert bytes(peer.memory[10:15]) == b"hello"
        assert peer.size == arena.size
    finally:
        peer.close()


def test_a_greeting_from_something_else_is_refused():
    left, right = socket.socketpair()
    with left, right:
        left.sendall(b"GET / HTTP/1.1\r\n\r\n")
        with pytest.raises(ConnectionError, match="not a workbench model runner"):
            wire.receive_arena(right)


def frames_of(data: bytes) -> list[memoryview]:
    return list(wire.FrameReader().feed(data))


def test_large_tensors_travel_in_shared_memory_and_arrive_as_views(arena):
    big = np.arange(64 * 1024, dtype=np.float32).reshape(-1, 64)
    small = np.array([1.5, 2.5], np.float32)
    frame, spans = wire.encode((wire.INFER, 7, {"big": big, "small": small}), arena)
    assert len(spans) == 1 and spans[0][1] == big.nbytes  # the small one went in the message
    assert len(frame) < big.nbytes // 10
    (message,) = [wire.decode(f, arena) for f in frames_of(frame)]
    (kind, rid, feed), seen = message
    assert (kind, rid, seen) == (wire.INFER, 7, spans)
    np.testing.assert_array_equal(feed["big"], big)
    np.testing.assert_array_equal(feed["small"], small)
    arena.memory[spans[0][0] : spans[0][0] + 4] = np.float32(42).tobytes()  # a view: the sender's memory
    assert feed["big"][0, 0] == 42


def test_without_room_in_the_arena_a_tensor_travels_inside_the_message():
    tiny = Arena(wire.INLINE_BYTES)
    try:
        big = np.ones(wire.INLINE_BYTES // 4 + 16, np.float32)
        frame, spans = wire.encode((wire.REPLIES, [(1, True, {"y": big})]), tiny)
        assert spans == []
        ((message, _),) = [wire.decode(f, tiny) for f in frames_of(frame)]
        np.testing.assert_array_equal(message[1][0][2]["y"], big)
    finally:
        tiny.close()


def test_strings_and_records_travel_too(arena):
    texts = np.array([b"a", b"bc"], dtype=object)
    record = BatchRecord("m", 1, "serving_default", 3, 4, 2, (0.1, 0.2), 0.5)
    frame, _ = wire.encode((wire.BATCH, record, texts), arena)
    (((_, got, strings), _),) = [wire.decode(f, arena) for f in frames_of(frame)]
    assert got == record and list(strings) == [b"a", b"bc"]


def test_frames_split_anywhere_come_out_whole_and_in_order():
    frames = b"".join(wire.encode((wire.CANCEL, rid), None)[0] for rid in range(5))
    reader = wire.FrameReader()
    got = []
    for at in range(0, len(frames), 3):
        got += [wire.decode(frame, None)[0] for frame in reader.feed(frames[at : at + 3])]
    assert got == [(wire.CANCEL, rid) for rid in range(5)]


def test_errors_travel_as_code_and_message():
    travelled = wire.error_of(ServingError(Code.NOT_FOUND, "no such model"))
    assert wire.error_from(travelled).code is Code.NOT_FOUND
    assert wire.error_from(travelled).message == "no such model"
    assert wire.error_from(wire.error_of(ValueError("bad"))).message == "ValueError: bad"  # INTERNAL, named
