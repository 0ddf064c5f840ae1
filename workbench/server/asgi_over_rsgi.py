"""An ASGI app called from granian's RSGI interface: one port, one interface, every route.

granian runs one interface a port (RSGI, ASGI or WSGI), and its RSGI interface is the one fast enough for the
inference routes. Everything else on the REST port (status, metadata, v2, management, probes, metrics, streams) is
Starlette's ASGI app; :class:`AsgiOverRsgi` calls it with an ASGI scope, ``receive`` and ``send`` made from the
RSGI scope and protocol, as an ASGI server would:

- the scope: HTTP 1.1 or 2, the method, the percent-decoded path (RSGI's own), the query string, the headers
  (lower-case names, as hyper gives them; granian leaves out a header whose value is not visible ASCII), the
  client's and server's addresses;
- ``receive``: the body, whole in one message when its length is declared (read in Rust), else chunk by chunk as
  it arrives; then ``http.disconnect`` once the client goes;
- ``send``: a response of one body message is answered in one call; one of several is streamed, each chunk as it
  is sent; a ``send`` after the client went raises ``OSError`` (ASGI's rule, which Starlette's streaming
  responses catch);
- an app that raises before answering is answered 500, as uvicorn does, and logged.

Websockets are off: workbench has no websocket route.
"""

from __future__ import annotations

import logging
from typing import Any

from starlette.types import ASGIApp, Message

from workbench.frontends.rest_rsgi import raw_headers

log = logging.getLogger("workbench.server")

_ASGI = {"version": "3.0", "spec_version": "2.3"}
_SERVER_ERROR = (500, [("content-type", "text/plain; charset=utf-8")], b"Internal Server Error")


def address(text: str) -> tuple[str, int] | None:
    """RSGI's ``host:port`` (``[v6]:port`` for IPv6) as ASGI's (host, port)."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def asgi_scope(scope: Any) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": _ASGI,
        "http_version": scope.http_version,
        "method": scope.method,
        "scheme": scope.scheme,
        "path": scope.path,
        "query_string": scope.query_string.encode("latin-1"),
        "root_path": "",
        "headers": raw_headers(scope),
        "client": address(scope.client),
        "server": address(scope.server),
    }


class _Exchange:
    """One request's ``receive`` and ``send`` over its RSGI protocol object."""

    __slots__ = ("_proto", "_declared", "_chunks", "_body_done", "_start", "_stream", "answered")

    def __init__(self, proto: Any, declared: bool) -> None:
        self._proto = proto
        self._declared = declared  # a Content-Length: the body is read whole, in Rust
        self._chunks: Any = None  # the body's chunks, for one sent without a length
        self._body_done = False
        self._start: tuple[int, list[tuple[str, str]]] | None = None
        self._stream: Any = None  # the response's body stream, once a second body message is coming
        self.answered = False  # the response has begun (its status and headers are the client's)

    async def receive(self) -> Message:
        if not self._body_done:
            try:
                if self._declared:
                    self._body_done = True
                    return {"type": "http.request", "body": await self._proto(), "more_body": False}
                if self._chunks is None:
                    self._chunks = aiter(self._proto)  # once: granian's body can be taken once
                while True:
                    try:
                        chunk = await anext(self._chunks)
                    except StopAsyncIteration:
                        self._body_done = True
                        return {"type": "http.request", "body": b"", "more_body": False}
                    if chunk:
                        return {"type": "http.request", "body": chunk, "more_body": True}
            except RuntimeError:  # granian's RSGIProtocolError: the body's stream broke, the client went
                self._body_done = True
                return {"type": "http.disconnect"}
        await self._proto.client_disconnect()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            headers = [(name.decode("latin-1"), value.decode("latin-1")) for name, value in message.get("headers", ())]
            self._start = (message["status"], headers)
        elif kind == "http.response.body":
            body, more = message.get("body", b""), message.get("more_body", False)
            if self._stream is None:
                if self._start is None:
                    raise RuntimeError("ASGI: http.response.body before http.response.start")
                if self.answered:
                    return  # the response is complete: ASGI servers ignore what follows
                status, headers = self._start
                self.answered = True
                if not more:
                    self._proto.response_bytes(status, headers, body)
                    return
                self._stream = self._proto.response_stream(status, headers)
            if body:
                try:
                    await self._stream.send_bytes(body)
                except RuntimeError as exc:  # granian's RSGIProtocolClosed: the client went
                    raise OSError("the client disconnected") from exc
            if not more:
                self._stream = None  # dropping granian's transport ends the response's body

    def close(self) -> None:
        """The app is done: answer 500 if it sent nothing, and end a stream it left open."""
        if not self.answered:
            self.answered = True
            self._proto.response_bytes(*_SERVER_ERROR)
        self._stream = None


class AsgiOverRsgi:
    """``app`` (ASGI 3, HTTP only) as an RSGI callable."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Any, proto: Any) -> None:
        if scope.proto != "http":  # a websocket: no route takes one
            proto.close(403)
            return
        exchange = _Exchange(proto, "content-length" in scope.headers)
        try:
            await self.app(asgi_scope(scope), exchange.receive, exchange.send)
        except Exception:
            log.exception("REST %s %s failed", scope.method, scope.path)
        else:
            if not exchange.answered:
                log.error("REST %s %s: the app returned without answering", scope.method, scope.path)
        exchange.close()
