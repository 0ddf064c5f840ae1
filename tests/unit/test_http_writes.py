"""The REST port's gathering transport: what one event-loop step writes leaves in one ``write``, in order.

Every REST test in tests/wire goes through it under uvicorn; these pin down its own rules on a transport that
records what reaches it.
"""

from __future__ import annotations

import asyncio

from workbench.server.http_writes import GatheringTransport


class RecordingTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_write_buffer_size(self) -> int:
        return 0


def test_a_responses_start_and_body_leave_in_one_write_at_the_next_step():
    async def main() -> tuple[list[bytes], list[bytes]]:
        real = RecordingTransport()
        gathering = GatheringTransport(real, asyncio.get_running_loop())
        gathering.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
        gathering.write(b"{}")
        gathering.write(memoryview(b"next"))  # another response finished in the same step
        during = list(real.writes)
        assert gathering.get_write_buffer_size() == 44
        await asyncio.sleep(0)
        return during, real.writes

    during, after = asyncio.run(main())
    assert during == [], "nothing leaves during the step that wrote it"
    assert after == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}next"]


def test_a_large_body_leaves_at_once_after_what_was_gathered_and_close_sends_what_waits():
    async def main() -> RecordingTransport:
        real = RecordingTransport()
        gathering = GatheringTransport(real, asyncio.get_running_loop())
        large = b"x" * (64 * 1024)
        gathering.write(b"head")
        gathering.write(large)
        assert real.writes == [b"head", large]
        gathering.write(b"tail")
        gathering.close()
        assert real.writes == [b"head", large, b"tail"] and real.closed
        gathering.write(b"late")  # written after the connection closed: dropped, as the real transport would
        await asyncio.sleep(0)
        return real

    real = asyncio.run(main())
    assert real.writes[-1] == b"tail"


def test_everything_else_is_the_real_transports():
    async def main() -> None:
        real = RecordingTransport()
        gathering = GatheringTransport(real, asyncio.get_running_loop())
        assert gathering.is_closing() is False
        real.closed = True
        assert gathering.is_closing() is True

    asyncio.run(main())
