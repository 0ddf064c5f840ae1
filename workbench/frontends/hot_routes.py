"""Routes answered before Starlette, from whichever interface the HTTP server speaks: v2's ``…/infer`` and
TorchServe's ``/predictions``.

Under load, Starlette's layers around a small inference request (middleware, router, ``Request``, ``Response``)
cost about as much of the event loop as the answer itself; TF Serving's ``:predict`` skips them already
(:class:`workbench.frontends.rest.RestApp`). A :class:`HotRoute` is another such route: it matches a request by
its method and path, reads it through an :class:`Arrival` (made from uvicorn's ASGI scope here, or from granian's
RSGI scope in :mod:`workbench.frontends.hot_routes_rsgi`) and gives its answer as Starlette's ``Response`` would
send it (:data:`Answer`): status, headers (``content-length`` and ``content-type`` included, in Starlette's
order) and body. The same route's Starlette handler answers through :func:`as_response`, so a request answers the
same bytes whichever way it came (CORS on, or a ``root_path``, sends every request through Starlette).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Protocol

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import compile_path
from starlette.types import Receive, Scope, Send

from workbench.frontends import rest_asgi

RawHeaders = list[tuple[bytes, bytes]]
# An answer as Starlette's Response sends it: the status, the raw headers (lower-case names, content-length and
# content-type among them, in Response's order) and the body.
Answer = tuple[int, RawHeaders, bytes]

_CONTENT_LENGTH = b"content-length"


class Arrival(Protocol):
    """What a hot route reads of its request, from either server's interface."""

    @property
    def peer(self) -> str:
        """The client's host ("" when the server does not know it)."""
        ...

    def header(self, name: str) -> str | None:
        """A request header's value (``name`` in lower case), None when the request has none."""
        ...

    def headers(self) -> Headers:
        """All its headers, as Starlette's ``request.headers`` (for the rarer requests that need them all)."""
        ...

    async def body(self, limit: int) -> bytes:
        """The whole body, refused with RESOURCE_EXHAUSTED once over ``limit`` bytes (declared or sent); a client gone
        meanwhile is Starlette's ``ClientDisconnect``."""
        ...


class HotRoute(Protocol):
    def match(self, method: str, path: str) -> re.Match[str] | None:
        """The route's match of a request's method and (percent-decoded) path; None: not this route's."""
        ...

    async def answer(self, match: re.Match[str], request: Arrival) -> Answer:
        """The answer to the request :meth:`match` matched (errors included: nothing raises but a cancellation)."""
        ...


def answer_of(body: bytes, status: int = 200, media_type: str = "application/json") -> Answer:
    """``body`` answered with ``status`` as Starlette's ``Response(body, status, media_type=media_type)`` sends it:
    its length (but for a status that has no body), then its type (a text type with its charset)."""
    if status < 200 or status in (204, 304):
        return status, [_content_type(media_type)], body
    return status, [(_CONTENT_LENGTH, str(len(body)).encode("latin-1")), _content_type(media_type)], body


@functools.lru_cache(maxsize=256)  # a route answers a few types: each one's header once
def _content_type(media_type: str) -> tuple[bytes, bytes]:
    if media_type.startswith("text/") and "charset=" not in media_type.lower():
        media_type += "; charset=utf-8"  # Response.charset
    return b"content-type", media_type.encode("latin-1")


def with_header(name: bytes, value: bytes, answer: Answer) -> Answer:
    """``answer`` with one header before the others, as a Response given ``headers={name: value}`` sends it."""
    status, headers, body = answer
    return status, [(name, value), *headers], body


def answer_of_response(response: Response) -> Answer:
    """A Starlette response (of one body) as an :data:`Answer`."""
    return response.status_code, list(response.raw_headers), bytes(response.body)


class _Answered(Response):
    """An :data:`Answer` as a Starlette response, its headers as they are."""

    def __init__(self, answer: Answer) -> None:
        self.status_code, headers, self.body = answer
        self.raw_headers = list(headers)
        self.background = None


def as_response(answer: Answer) -> Response:
    """``answer`` for a Starlette route (the hot route's own handler, for requests that come through Starlette)."""
    return _Answered(answer)


# ------------------------------------------------------------------------------------------- from ASGI
class AsgiArrival:
    """A request of an ASGI server (uvicorn's), as a hot route reads it."""

    __slots__ = ("_scope", "_receive")

    def __init__(self, scope: Scope, receive: Receive) -> None:
        self._scope, self._receive = scope, receive

    @property
    def peer(self) -> str:
        client = self._scope.get("client")
        return str(client[0]) if client else ""

    def header(self, name: str) -> str | None:
        return rest_asgi.header(self._scope["headers"], name.encode("latin-1"))

    def headers(self) -> Headers:
        return Headers(scope=self._scope)

    async def body(self, limit: int) -> bytes:
        return await rest_asgi.read_body(self._scope, self._receive, limit)


class StarletteArrival:
    """A request that came through Starlette's router, as a hot route reads it (its Starlette handler's)."""

    __slots__ = ("_request",)

    def __init__(self, request: Request) -> None:
        self._request = request

    @property
    def peer(self) -> str:
        client = self._request.client
        return client.host if client is not None else ""

    def header(self, name: str) -> str | None:
        return self._request.headers.get(name)

    def headers(self) -> Headers:
        return self._request.headers

    async def body(self, limit: int) -> bytes:
        return await rest_asgi.read_body(self._request.scope, self._request.receive, limit)


def hot_match(routes: Sequence[HotRoute], method: str, path: str) -> tuple[HotRoute, re.Match[str]] | None:
    """The first of ``routes`` that matches, with its match."""
    for route in routes:
        found = route.match(method, path)
        if found is not None:
            return route, found
    return None


async def answer_asgi(route: HotRoute, match: re.Match[str], scope: Scope, receive: Receive, send: Send) -> None:
    """Answer an ASGI request ``route`` matched: the two messages Starlette's ``Response`` sends."""
    status, headers, body = await route.answer(match, AsgiArrival(scope, receive))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def route_pattern(template: str) -> re.Pattern[str]:
    """A Starlette path template's regular expression, as its router matches it (``pattern.match(path)``): a hot
    route takes exactly the paths its Starlette route does."""
    return compile_path(template)[0]
