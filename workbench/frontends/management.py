"""workbench's own REST endpoints, outside TF Serving's ``/v1``: health, live statistics, version management.

Reading:
- ``GET /workbench/v1/health``: the server answers, with its readiness (as ``/readyz``), models and ports;
- ``GET /workbench/v1/stats``: a JSON snapshot of rolling windows per model version;
- ``GET /workbench/v1/stats/stream``: the same snapshot as server-sent events, ``?interval=`` seconds apart;
- ``GET /workbench/v1/models[/{model}]``: versions, states, load errors, labels, traffic shares, routing.
- ``GET /workbench/v1/models/{model}/drift``: each monitored version's features against their drift reference.

Changing (``POST``, with ``Authorization: Bearer <token>`` when the server was given a management token):
- ``/workbench/v1/models/{model}:promote`` ``{"version": N}`` (with ``"if": "agreement >= 0.99 and p99_ms <= 20"``:
  only if N's shadow record meets it, else FAILED_PRECONDITION with its figures) · ``:rollback`` · ``:canary``
  ``{"version": N, "weight": 0.1}`` (weight 0 ends it) · ``:shadow`` ``{"version": N, "fraction": 0.5}`` (a copy
  of that share of default traffic, answered to nobody and compared; 0 ends it) ·
  ``/workbench/v1/models/{model}/versions/{N}:load`` · ``:unload`` · ``:batching`` ``{"batching_parameters":
  "max_batch_size { value: 8 } ..."}`` (the model's own batching parameters, written beside its versions; null
  removes them).
Each change is atomic, stored in the model's repository (``routing.json`` beside its versions, read by every
replica) and answered with the model's new description. A body may carry ``"generation": N``, the routing
generation the caller last saw (``GET`` answers it): the change is then refused with 409 ABORTED if the routing
moved on since, instead of overwriting a change the caller has not seen.

Reads go through the data plane, changes through the control plane.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from workbench.core.errors import Code, ServingError
from workbench.frontends.auth import bearer_matches
from workbench.frontends.rest import error_response, json_response
from workbench.planes.controlplane import CONDITION_HELP, ControlPlane
from workbench.planes.dataplane import Dataplane
from workbench.protocol.json_tensor import dumps

PREFIX = "/workbench/v1"
_MODEL_ACTION = re.compile(r"([^/:]+):(promote|rollback|canary|shadow|batching)")
_VERSION_ACTION = re.compile(r"([^/:]+)/versions/(\d+):(load|unload)")


def management_routes(dataplane: Dataplane, controlplane: ControlPlane, token: str = "") -> list[Route]:
    """``token``: the bearer token the changes need (none when empty)."""

    async def health(_: Request) -> Response:
        return json_response(dumps(dataplane.health()))

    async def stats(_: Request) -> Response:
        return json_response(dumps(dataplane.stats_snapshot()))

    async def stats_stream(request: Request) -> Response:
        try:
            interval = float(request.query_params.get("interval", "0.25"))
        except ValueError:
            return error_response(ServingError(Code.INVALID_ARGUMENT, "interval must be a number of seconds"))
        if not 0.05 <= interval <= 60:
            return error_response(ServingError(Code.INVALID_ARGUMENT, "interval must be between 0.05 and 60 seconds"))

        stopping = dataplane.stopped

        async def events() -> AsyncIterator[bytes]:
            while not stopping.is_set() and not await request.is_disconnected():
                yield b"data: " + json.dumps(dataplane.stats_snapshot(), separators=(",", ":")).encode() + b"\n\n"
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stopping.wait(), interval)

        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(events(), media_type="text/event-stream", headers=headers)

    async def models(request: Request) -> Response:
        name = request.path_params.get("name")
        try:
            described = dataplane.describe(name)
        except ServingError as exc:
            return error_response(exc)
        return json_response(dumps(described[0] if name else {"models": described}))

    async def drift(request: Request) -> Response:
        """A model's drift per monitored version (docs/request-logs-and-drift.md); an unknown model is 404."""
        name = request.path_params["name"]
        try:
            dataplane.describe(name)  # NOT_FOUND, in the models endpoint's words
        except ServingError as exc:
            return error_response(exc)
        monitor = dataplane.drift
        versions = monitor.report(name) if monitor is not None else []
        thresholds = monitor.thresholds.as_dict() if monitor is not None else {}
        return json_response(dumps({"model": name, "thresholds": thresholds, "versions": versions}))

    async def change(request: Request) -> Response:
        """The POST endpoints: authorize, parse, run the (possibly slow) change off the loop, describe."""
        try:
            if token and not bearer_matches(request.headers.get("authorization", ""), token):
                raise ServingError(Code.UNAUTHENTICATED, "This server's management API needs its bearer token")
            name, action = await _parse_action(request, request.path_params["target"], controlplane)
            # A promotion or canary may wait for a version to load: never on the event loop.
            await asyncio.get_running_loop().run_in_executor(None, action)
            return json_response(dumps(dataplane.describe(name)[0]))
        except ServingError as exc:
            return error_response(exc)

    return [
        Route(f"{PREFIX}/health", health, methods=["GET"]),
        Route(f"{PREFIX}/stats", stats, methods=["GET"]),
        Route(f"{PREFIX}/stats/stream", stats_stream, methods=["GET"]),
        Route(f"{PREFIX}/models", models, methods=["GET"]),
        Route(f"{PREFIX}/models/{{name:str}}", models, methods=["GET"]),
        Route(f"{PREFIX}/models/{{name:str}}/drift", drift, methods=["GET"]),
        Route(f"{PREFIX}/models/{{target:path}}", change, methods=["POST"]),
    ]


async def _json_object(request: Request) -> dict[str, Any]:
    body = await request.body()
    if not body.strip():
        return {}
    try:
        doc = json.loads(body)
    except ValueError as exc:
        raise ServingError(Code.INVALID_ARGUMENT, f"Request body is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ServingError(Code.INVALID_ARGUMENT, "Request body must be a JSON object")
    return doc


def _int_field(doc: dict[str, Any], key: str) -> int:
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ServingError(Code.INVALID_ARGUMENT, f'"{key}" must be a non-negative integer, got {json.dumps(value)}')
    return value


def _generation(doc: dict[str, Any]) -> int | None:
    """The optional ``"generation"`` a change expects the model's routing to be at."""
    return _int_field(doc, "generation") if doc.get("generation") is not None else None


async def _parse_action(request: Request, target: str, control: ControlPlane) -> tuple[str, Callable[[], object]]:
    """The model a POST changes, and the change itself, ready to run."""
    if match := _MODEL_ACTION.fullmatch(target):
        name, verb = match.groups()
        doc = await _json_object(request)
        generation = _generation(doc)
        if verb == "promote":
            version = _int_field(doc, "version")
            condition = doc.get("if")
            if condition is not None and not isinstance(condition, str):
                raise ServingError(Code.INVALID_ARGUMENT, CONDITION_HELP)
            return name, functools.partial(control.promote, name, version, generation=generation, only_if=condition)
        if verb == "rollback":
            return name, functools.partial(control.rollback, name, generation=generation)
        if verb == "batching":
            text = doc.get("batching_parameters")
            if text is not None and not isinstance(text, str):
                raise ServingError(
                    Code.INVALID_ARGUMENT, '"batching_parameters" is TF Serving\'s text format, or null to remove'
                )
            return name, functools.partial(control.set_batching, name, text)
        version = _int_field(doc, "version")
        field = "fraction" if verb == "shadow" else "weight"
        share = doc.get(field)
        if isinstance(share, bool) or not isinstance(share, (int, float)):
            raise ServingError(
                Code.INVALID_ARGUMENT, f'"{field}" must be a number from 0 to 1, got {json.dumps(share)}'
            )
        change = control.set_shadow if verb == "shadow" else control.set_canary
        return name, functools.partial(change, name, version, float(share), generation=generation)
    if match := _VERSION_ACTION.fullmatch(target):
        name, version_text, verb = match.groups()
        generation = _generation(await _json_object(request))
        method = control.load_version if verb == "load" else control.unload_version
        return name, functools.partial(method, name, int(version_text), generation=generation)
    raise ServingError(Code.INVALID_ARGUMENT, f"Malformed request: POST {PREFIX}/models/{target}")
