"""Closing the REST port without losing a request already on its way.

A drain must refuse new connections and answer every request of the connections accepted before it (TF Serving's
and Kubernetes' contract for a rolling update). Three kinds of connection look idle to uvicorn's own shutdown, which
closes them, and each can carry a request the client has already sent:

- **waiting in the kernel's accept queue**: the client's handshake is done and its request sent, but the event loop
  has not called ``accept`` yet. Closing the listening socket resets them. :func:`drain` accepts them first.
- **in their handshake**: the client's ``connect`` has returned (it had the server's SYN-ACK) and it sent its request,
  but the kernel had not yet moved the connection into the accept queue (its last ACK waits for the softirq, which
  a busy machine runs late). Closing the listening socket resets these too: 2 of 8 clients in one drain with every
  core busy. On Linux, :func:`drain` first makes the listening socket drop new connections' SYNs (a socket filter;
  their clients try again a second later and are refused), waits for the handshakes in progress to finish, and
  only then accepts the queue and closes the port.
- **accepted, request not read yet**: a client on a new connection per request sends it right after connecting;
  closing the connection before its bytes are read drops it (the client sees a reset). Such a connection is kept
  until its request is answered, with ``Connection: close`` (or, if it stays silent, :data:`FRESH_WAIT_SECONDS`).
- **between two requests on a keep-alive connection, the next one in the socket's receive buffer**: the same. A
  keep-alive connection is closed only when nothing has arrived on it (the kernel's count of unread bytes is zero);
  over TLS the close waits :data:`TLS_CLOSE_SECONDS` at most for the client's close_notify, which an idle client
  never sends (every HTTPS drain used to last its whole budget), then aborts.

Connections accepted during the drain (from the accept queue, or by the loop just before the port closed) are
*born draining*: they answer one request and close.
"""

from __future__ import annotations

import array
import asyncio
import ctypes
import fcntl
import functools
import socket
import struct
import sys
import termios
import time
import weakref
from typing import Any

import uvicorn

from workbench.server.http_writes import CoalescingHttpProtocol, GatheringTransport

# How long a connection accepted before the drain may stay silent: its client connected to send a request, and
# sends it within milliseconds on any network, seconds on a machine with every core busy; a pre-opened connection of
# a pool that never sends is then closed (Go's http.Server.Shutdown gives new connections 5 s).
FRESH_WAIT_SECONDS = 10.0
# An idle TLS connection is closed with TLS's close_notify, then aborted this long after if the client has not
# answered with its own (an idle keep-alive client never does). Aborting at once lost answers on a loaded machine
# (3 in one drain of 8 clients), and so did 2 s with every core busy; uvicorn's own wait is 30 s.
TLS_CLOSE_SECONDS = 5.0
# TCP handshakes in progress on the port when the drain starts (the client's connect returned, the server's kernel
# has not queued the connection yet) are waited for this long at most: milliseconds, unless a client never sends its
# last ACK.
TCP_HANDSHAKE_WAIT_SECONDS = 1.0
# A TLS handshake in progress when the drain starts is waited for this long at most (its protocol exists before its
# connection is made; a failed handshake's lingers until collected).
HANDSHAKE_WAIT_SECONDS = 5.0


class DrainState:
    """One uvicorn server's drain: whether it has begun, and the connections still in their TLS handshake."""

    def __init__(self) -> None:
        self.draining = False
        self.opening: weakref.WeakSet[DrainingHttpProtocol] = weakref.WeakSet()

    def handshakes_pending(self) -> bool:
        now = time.monotonic()
        return any(now - protocol.born < HANDSHAKE_WAIT_SECONDS for protocol in list(self.opening))


def drain_state(server_state: Any) -> DrainState:
    """The drain state kept beside uvicorn's ``ServerState`` (one per server, shared by its connections)."""
    state: DrainState | None = getattr(server_state, "workbench_drain", None)
    if state is None:
        state = DrainState()
        server_state.workbench_drain = state
    return state


def unread_bytes(transport: asyncio.BaseTransport) -> int:
    """Bytes the client sent that the kernel holds unread for this connection (0 where that cannot be told)."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return 0
    count = array.array("i", [0])
    try:
        fcntl.ioctl(sock.fileno(), termios.FIONREAD, count)
    except (OSError, ValueError):  # closed meanwhile, or not a socket the call applies to
        return 0
    return count[0]


class DrainingHttpProtocol(CoalescingHttpProtocol):
    """uvicorn's HTTP/1.1 protocol (writing as :class:`CoalescingHttpProtocol`) that drains without losing requests."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._drain = drain_state(self.server_state)
        self.born = time.monotonic()
        self._drain.opening.add(self)
        self._reading = False  # a request has begun arriving and its headers are not complete yet
        self._closing = False  # answer what is in progress or on its way with Connection: close, then close
        self._silence: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._drain.opening.discard(self)
        super().connection_made(transport)
        if self._drain.draining:  # accepted as the port closed: its request is coming
            self._close_after_answer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._drain.opening.discard(self)
        if self._silence is not None:
            self._silence.cancel()
            self._silence = None
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        self._reading = True
        if self._silence is not None:
            self._silence.cancel()
            self._silence = None
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._reading = False
        super().on_headers_complete()
        if self._closing and self.cycle is not None:
            self.cycle.keep_alive = False  # answered with Connection: close, and the connection closes after it

    def _idle(self) -> bool:
        return not self._reading and (self.cycle is None or self.cycle.response_complete)

    def shutdown(self) -> None:
        """The server drains: close this connection now if no request is in it or on its way, else after the
        answer to that request."""
        if self._closing or self.transport is None:
            return
        if self.cycle is not None and self._idle() and unread_bytes(self.transport) == 0:
            self._close_idle()  # between requests, nothing sent: safe to close now
        else:
            self._close_after_answer()

    def _close_after_answer(self) -> None:
        self._closing = True
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.keep_alive = False  # uvicorn's own shutdown for a connection answering
        elif self._idle():  # fresh, or its next request is in the receive buffer: wait for it, a while
            self._silence = self.loop.call_later(FRESH_WAIT_SECONDS, self._silent)

    def _silent(self) -> None:
        self._silence = None
        if self._idle() and not self.transport.is_closing():
            self._close_idle()

    def _close_idle(self) -> None:
        transport = self.transport
        transport.close()
        if isinstance(transport, GatheringTransport) and transport.get_extra_info("sslcontext") is not None:
            # TLS's graceful close waits for the client's close_notify, which an idle client never sends, until the
            # drain's budget runs out: the connection is aborted once the client had time to read its last answer.
            self.loop.call_later(TLS_CLOSE_SECONDS, self._abort_unless_closed)

    def _abort_unless_closed(self) -> None:
        if self.parser is not None:  # uvicorn drops the parser when the connection is lost
            self.transport.abort()


# Linux's SO_ATTACH_FILTER, and a classic BPF program run on each segment reaching the listening socket (at the TCP
# header): a SYN without ACK, a new connection's first segment, is dropped; every other one (the last ACK of a
# handshake in progress, its data) passes.
_SO_ATTACH_FILTER = 26
_DROP_NEW_CONNECTIONS = [
    (0x30, 0, 0, 13),  # ldb [13]: the TCP flags
    (0x54, 0, 0, 0x12),  # and #(SYN | ACK)
    (0x15, 0, 1, 0x02),  # jeq #SYN: drop, else keep
    (0x06, 0, 0, 0),  # ret #0: drop
    (0x06, 0, 0, 0xFFFFFFFF),  # ret: keep the whole segment
]
_TCP_SYN_RECV = "03"  # the state /proc/net/tcp gives a connection whose handshake the server has not finished


def refuse_new_connections(listeners: list[socket.socket]) -> bool:
    """Make the listening sockets drop new connections' SYNs, letting the handshakes in progress finish (Linux).
    False where that cannot be done (another system): the port is then closed without waiting for them."""
    if not sys.platform.startswith("linux"):
        return False
    program = b"".join(struct.pack("HBBI", *instruction) for instruction in _DROP_NEW_CONNECTIONS)
    buffer = ctypes.create_string_buffer(program)  # kept alive until setsockopt has copied it
    fprog = struct.pack("HP", len(_DROP_NEW_CONNECTIONS), ctypes.addressof(buffer))
    try:
        for listener in listeners:
            listener.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER, fprog)
    except OSError:
        return False
    return True


def handshakes_in_progress(ports: set[int]) -> int:
    """Connections to these local ports in SYN_RECV (the kernel's /proc/net/tcp and tcp6; 0 where unreadable)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as rows:
                next(rows, None)
                for row in rows:
                    fields = row.split(None, 4)
                    if len(fields) > 3 and fields[3] == _TCP_SYN_RECV and int(fields[1].rsplit(":", 1)[1], 16) in ports:
                        count += 1
        except (OSError, ValueError):
            continue
    return count


def accept_waiting(listeners: list[socket.socket]) -> list[socket.socket]:
    """Every connection in the listening sockets' accept queues, accepted now (non-blocking)."""
    accepted: list[socket.socket] = []
    for listener in listeners:
        while True:
            try:
                connection, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                break
            except OSError:  # the socket is closed already
                break
            connection.setblocking(False)
            accepted.append(connection)
    return accepted


async def drain(server: uvicorn.Server, listeners: list[socket.socket], grace: float) -> bool:
    """Close ``server``'s port and drain its connections within ``grace`` seconds (see the module's docstring);
    True when every request finished, False when uvicorn cancelled what still ran at the end of the grace."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace
    state = drain_state(server.server_state)
    state.draining = True  # what is accepted from now on answers one request, with Connection: close
    # No new connection from here on; the handshakes in progress finish into the accept queue (the loop accepts
    # them meanwhile, born draining).
    if refuse_new_connections(listeners):
        ports = {listener.getsockname()[1] for listener in listeners}
        settle = loop.time() + min(TCP_HANDSHAKE_WAIT_SECONDS, grace)
        while handshakes_in_progress(ports) and loop.time() < settle:
            await asyncio.sleep(0.002)
    # The accept queues are taken in, then the port closed, in one step of the loop: nothing is left in a queue.
    waiting = accept_waiting(listeners)
    for listener in server.servers:
        listener.close()
    for sock in listeners:
        sock.close()
    config = server.config
    factory = functools.partial(
        config.http_protocol_class,  # type: ignore[call-arg]
        config=config,
        server_state=server.server_state,
        app_state=server.lifespan.state,
    )
    opened = [
        loop.create_task(loop.connect_accepted_socket(factory, connection, ssl=config.ssl))  # type: ignore[arg-type]
        for connection in waiting
    ]
    for task in opened:
        task.add_done_callback(_settled)
    config.timeout_graceful_shutdown = grace  # type: ignore[assignment]  # asyncio.wait_for takes fractions
    server.should_exit = True
    # uvicorn's shutdown: every connection told (idle ones close, the others after their answer), then waited for.
    await server.shutdown()
    # Connections made after uvicorn began waiting (TLS handshakes finishing) are born draining: wait for them too.
    left = server.server_state
    while (state.handshakes_pending() or left.connections or left.tasks) and loop.time() < deadline:
        await asyncio.sleep(0.05)
    finished = not (left.connections or left.tasks) and loop.time() < deadline
    for task in opened:
        task.cancel()  # a no-op for those done
    return finished


def _settled(task: asyncio.Task[Any]) -> None:
    """A connection taken from the accept queue was set up, or was not (a failed handshake, a client gone): nothing
    of its is left to answer then. Its exception is read so that asyncio does not log it as never retrieved."""
    if not task.cancelled():
        task.exception()
