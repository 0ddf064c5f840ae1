"""workbench's own REST endpoints, outside TF Serving's ``/v1``: health and live statistics.

- ``GET /workbench/v1/health``: the server answers, with its models and ports;
- ``GET /workbench/v1/stats``: a JSON snapshot of rolling windows per model version;
- ``GET /workbench/v1/stats/stream``: the same snapshot pushed as server-sent events, ``?interval=`` seconds
  apart (default 0.25), for live charts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from workbench.engine.status import Code, ServingError
from workbench.frontends.rest import error_response, json_response
from workbench.protocol.json_tensor import dumps

PREFIX = "/workbench/v1"


def management_routes(
    snapshot: Callable[[], dict[str, Any]], health: Callable[[], dict[str, Any]], stopping: asyncio.Event
) -> list[Route]:
    async def health_endpoint(_: Request) -> Response:
        return json_response(dumps(health()))

    async def stats(_: Request) -> Response:
        return json_response(dumps(snapshot()))

    async def stats_stream(request: Request) -> Response:
        try:
            interval = float(request.query_params.get("interval", "0.25"))
        except ValueError:
            return error_response(ServingError(Code.INVALID_ARGUMENT, "interval must be a number of seconds"))
        if not 0.05 <= interval <= 60:
            return error_response(ServingError(Code.INVALID_ARGUMENT, "interval must be between 0.05 and 60 seconds"))

        async def events() -> AsyncIterator[bytes]:
            while not stopping.is_set() and not await request.is_disconnected():
                yield b"data: " + json.dumps(snapshot(), separators=(",", ":")).encode() + b"\n\n"
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stopping.wait(), interval)

        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(events(), media_type="text/event-stream", headers=headers)

    return [
        Route(f"{PREFIX}/health", health_endpoint, methods=["GET"]),
        Route(f"{PREFIX}/stats", stats, methods=["GET"]),
        Route(f"{PREFIX}/stats/stream", stats_stream, methods=["GET"]),
    ]
