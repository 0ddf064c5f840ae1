"""Raw ASGI for the REST hot path: a request body read from ``receive`` and a JSON answer sent on ``send``.

TF Serving's ``:predict``, ``:classify`` and ``:regress`` are nearly every request a serving port gets, and under
load Starlette's layers around one (its middleware stack, router, ``Request`` and ``Response`` objects) cost more
of the event loop's time than the answer itself. :class:`workbench.frontends.rest.RestApp` answers them with these
two functions instead, and they keep what Starlette would do: the same ``ClientDisconnect``, the same headers in
the same order (``content-length`` then ``content-type``, lower-case names), the same two ``send`` messages.
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from workbench.core.errors import Code, ServingError

RawHeaders = Sequence[tuple[bytes, bytes]]

_JSON = (b"content-type", b"application/json")


def too_large(limit: int) -> ServingError:
    return ServingError(
        Code.RESOURCE_EXHAUSTED,
        f"Request body is larger than the server's limit of {limit} bytes "
        "(workbench serve --rest_api_max_request_bytes)",
    )


def declared_too_large(headers: RawHeaders, limit: int) -> bool:
    """Whether the request's Content-Length already says its body is over ``limit`` (refused before reading it)."""
    for name, value in headers:
        if name == b"content-length":  # ASGI servers give header names in lower case
            return value.isdigit() and int(value) > limit
    return False


def header(headers: RawHeaders, name: bytes) -> str | None:
    """A request header's value (``name`` in lower case, as ASGI servers give them), None when it has none."""
    for found, value in headers:
        if found == name:
            return value.decode("latin-1")
    return None


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """The whole request body, refused with RESOURCE_EXHAUSTED once over ``limit`` bytes (declared or sent)."""
    if declared_too_large(scope["headers"], limit):
        raise too_large(limit)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        kind = message["type"]
        if kind == "http.request":
            chunk = message.get("body", b"")
            if chunk:
                size += len(chunk)
                if size > limit:
                    raise too_large(limit)
                chunks.append(chunk)
            if not message.get("more_body", False):
                break
        elif kind == "http.disconnect":
            raise ClientDisconnect()
    # One chunk is the common case (a body that fits the server's read buffer): no copy.
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def send_json(send: Send, status: int, body: bytes, headers: RawHeaders = ()) -> None:
    """``body`` as an ``application/json`` answer, with ``headers`` first (as Starlette's ``Response`` orders them)."""
    raw = [*headers, (b"content-length", str(len(body)).encode("latin-1")), _JSON]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})
