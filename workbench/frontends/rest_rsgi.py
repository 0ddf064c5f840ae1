"""TF Serving's inference routes in granian's own interface (RSGI): what ``--http_server=granian`` answers without ASGI.

Under granian, a request reaches Python as an RSGI scope and protocol object (both Rust's): turning them into an
ASGI scope, ``receive`` and ``send`` costs more than the answer of a small ``:predict``. :class:`RsgiInference`
answers ``:predict``, ``:classify`` and ``:regress`` from them directly, with ``RestApi.inference``, as
:class:`~workbench.frontends.rest.RestApp` answers them in raw ASGI: the same bytes, statuses and headers
(``x-model-name``, ``x-model-version``, then ``content-type``); the request-size limit, the stickiness key and the
trace context read as there. Every other request goes on to the Starlette app (through
:mod:`workbench.server.asgi_over_rsgi`).
"""

from __future__ import annotations

import functools
import re
from typing import Any

from starlette.requests import ClientDisconnect

from workbench.core.sticky import STICKY_HEADER
from workbench.frontends import rest_asgi
from workbench.frontends.rest import RestApi, answered_by, prediction_match
from workbench.observability import tracing

_STICKY = STICKY_HEADER.lower()  # RSGI's header names are lower case (hyper's)
_JSON = ("content-type", "application/json")


@functools.lru_cache(maxsize=1024)  # once per servable, not once per request
def _answer_headers(name: str, version: int) -> tuple[tuple[str, str], ...]:
    return (*((k.lower(), v) for k, v in answered_by(name, version).items()), _JSON)


async def read_body(proto: Any, headers: Any, limit: int) -> bytes:
    """The request's whole body, refused with RESOURCE_EXHAUSTED once over ``limit`` bytes (declared or sent); a
    client gone before its body arrived is Starlette's ``ClientDisconnect``, as under uvicorn."""
    length = headers.get("content-length")
    try:
        if length is not None:
            # Declared: refused unread when over the limit; else read whole in Rust (hyper holds a body to its
            # declared length, so it cannot grow past it).
            if length.isdigit() and int(length) > limit:
                raise rest_asgi.too_large(limit)
            body: bytes = await proto()
            return body
        chunks: list[bytes] = []  # chunked: counted as it arrives, refused once over the limit
        size = 0
        async for chunk in proto:
            if chunk:
                size += len(chunk)
                if size > limit:
                    raise rest_asgi.too_large(limit)
                chunks.append(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)
    except RuntimeError:  # granian's RSGIProtocolError: the body's stream broke (the client went)
        raise ClientDisconnect() from None


def raw_headers(scope: Any) -> list[tuple[bytes, bytes]]:
    """An RSGI scope's headers as ASGI gives them (lower-case names, bytes)."""
    return [(name.encode("latin-1"), value.encode("latin-1")) for name, value in scope.headers.items()]


class RsgiInference:
    """``:predict``, ``:classify`` and ``:regress`` of one :class:`RestApi`, answered from RSGI."""

    def __init__(self, api: RestApi) -> None:
        self._api = api

    def match(self, scope: Any) -> re.Match[str] | None:
        """The route's match when this request is one of the three; None for anything else."""
        if scope.method != "POST" or scope.proto != "http":
            return None
        path: str = scope.path
        return prediction_match(path) if path.startswith("/v1/") else None

    async def answer(self, match: re.Match[str], scope: Any, proto: Any) -> None:
        """Answer the request :meth:`match` matched (errors included: nothing raises but a cancellation)."""
        if tracing.active is not None:  # as RestApp does for an ASGI request
            tracing.active.http_arrived({"headers": raw_headers(scope), "method": scope.method, "path": scope.path})
        api = self._api
        headers = scope.headers
        status, body, servable = await api.inference(
            match,
            functools.partial(read_body, proto, headers, api.max_request_bytes),
            scope.path,
            headers.get(_STICKY),
        )
        proto.response_bytes(status, _answer_headers(*servable) if servable is not None else (_JSON,), body)
