""":mod:`workbench.frontends.hot_routes` in granian's own interface (RSGI): v2's ``…/infer`` and TorchServe's
``/predictions`` answered from the RSGI scope and protocol, without an ASGI scope, ``receive`` and ``send`` made for
them (:mod:`workbench.server.asgi_over_rsgi`) nor Starlette's layers.

A hot route reads the request through :class:`RsgiArrival` as it would under uvicorn (the request-size limit, a
client gone mid-body, the client's address, the headers) and its answer leaves as the ASGI bridge sends a Starlette
response: the same status, headers (content-length among them) and body.
"""

from __future__ import annotations

import re
from typing import Any

from starlette.datastructures import Headers

from workbench.frontends.hot_routes import HotRoute
from workbench.frontends.rest_rsgi import raw_headers, read_body
from workbench.observability import tracing


class RsgiArrival:
    """A request of granian's RSGI interface, as a hot route reads it."""

    __slots__ = ("_scope", "_proto")

    def __init__(self, scope: Any, proto: Any) -> None:
        self._scope, self._proto = scope, proto

    @property
    def peer(self) -> str:
        """The client's host, as the ASGI bridge's scope gives it ("" where granian gives no ``host:port``)."""
        host, _, port = str(self._scope.client).rpartition(":")
        return host.strip("[]") if host and port.isdigit() else ""

    def header(self, name: str) -> str | None:
        value: str | None = self._scope.headers.get(name)  # RSGI's header names are lower case (hyper's)
        return value

    def headers(self) -> Headers:
        return Headers(raw=raw_headers(self._scope))

    async def body(self, limit: int) -> bytes:
        return await read_body(self._proto, self._scope.headers, limit)


async def answer_rsgi(route: HotRoute, match: re.Match[str], scope: Any, proto: Any) -> None:
    """Answer an RSGI request ``route`` matched (errors included: nothing raises but a cancellation)."""
    if tracing.active is not None:  # as RestApp does for an ASGI request
        tracing.active.http_arrived({"headers": raw_headers(scope), "method": scope.method, "path": scope.path})
    status, headers, body = await route.answer(match, RsgiArrival(scope, proto))
    proto.response_bytes(status, [(name.decode("latin-1"), value.decode("latin-1")) for name, value in headers], body)
