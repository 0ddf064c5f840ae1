"""uvicorn's HTTP/1.1 protocol with a response's writes leaving in one send.

An ASGI answer is two messages, its start and its body, and uvicorn writes each to the socket as it comes: two
``send`` calls for every response. On a loopback or LAN link each costs a trip through the kernel's TCP stack and
wakes the client once more for a response it cannot use yet. Under load those two writes were a quarter of the
REST worker's event loop (py-spy, 32 clients).

:class:`CoalescingHttpProtocol` hands uvicorn a transport that gathers what is written during one event-loop step
and sends it at the start of the loop's next step (``call_soon``): the start and body of a response, and the
responses of other requests finished in the same step on the same connection, leave together. Nothing waits for
more data than the step already produced, so no answer is delayed by more than the rest of that step. Large writes
(a body of 64 KiB or more) go out at once, after what is gathered, without a copy. Closing sends what is gathered
first. Draining is :mod:`workbench.server.http_drain`'s.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

# A body this large already costs more to copy than a second send: it is written as it comes.
_LARGE = 64 * 1024


class GatheringTransport:
    """A transport whose small writes of one event-loop step leave in one ``write`` at the next step."""

    __slots__ = ("_transport", "_loop", "_pending")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        pending = self._pending
        if len(data) >= _LARGE:
            if pending is not None:
                self.flush()
            self._transport.write(data)
        elif pending is None:
            self._pending = [bytes(data)]
            self._loop.call_soon(self.flush)
        else:
            pending.append(bytes(data))

    def writelines(self, lines: Any) -> None:
        for data in lines:
            self.write(data)

    def flush(self) -> None:
        """Send what is gathered now (a no-op when nothing is)."""
        pending, self._pending = self._pending, None
        if pending and not self._transport.is_closing():
            self._transport.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def get_write_buffer_size(self) -> int:
        pending = self._pending
        return self._transport.get_write_buffer_size() + (sum(map(len, pending)) if pending else 0)

    def __getattr__(self, name: str) -> Any:  # everything else is the real transport's
        return getattr(self._transport, name)


class CoalescingHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, writing through a :class:`GatheringTransport`."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(GatheringTransport(transport, self.loop))  # type: ignore[arg-type]
