"""TorchServe's REST APIs on workbench's REST port: inference (``/ping``, ``/predictions``), management (``/models``).

- ``GET /ping`` → ``{"status": "Healthy"}`` (500 ``Unhealthy`` while the server is not ready);
- ``POST|PUT /predictions/{model}[/{version}]``: the body as it is (``curl -T kitten.jpg``), or a multipart form's
  ``data`` field (``curl -F data=@kitten.jpg``; else its first field); the answer is the handler's, with the status
  and content type it set (JSON by default). ``{version}`` is TorchServe's version string ("1.0"), or workbench's
  version number;
- ``GET /models[?limit=&next_page_token=]`` list · ``GET /models/{m}[/{version}|/all]`` describe ·
  ``POST /models?url=x.mar`` register (an archive in the model store, or an http(s) URL of one, downloaded into the
  store: loaded, and kept) · ``DELETE
  /models/{m}[/{version}]`` unregister (the version is unloaded; the default one only when it is the last, and the
  model goes with it, as in TorchServe) · ``PUT /models/{m}[/{version}]?min_worker=N`` scale workers ·
  ``PUT /models/{m}/{version}/set-default``.

Errors are TorchServe's: ``{"code": 404, "type": "ModelNotFoundException", "message": "Model not found: x"}``. What
each call does is :mod:`workbench.frontends.torchserve_api`'s (shared with the gRPC API). The management routes need
the management token when the server has one.
"""

from __future__ import annotations

import email.parser
import email.policy
import functools
import json
import logging
import re
from collections.abc import Callable
from typing import Any

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from workbench.core.errors import Code, ServingError
from workbench.core.sticky import STICKY_HEADER
from workbench.frontends.hot_routes import (
    Answer,
    Arrival,
    StarletteArrival,
    answer_of,
    answer_of_response,
    as_response,
    route_pattern,
)
from workbench.frontends.torchserve_api import DEFAULT_LIMIT, TYPES, TorchServeApi, TorchServeError, http_status
from workbench.platforms import torchserve as ts_platform

PROTOCOL = "torchserve"
_STICKY = STICKY_HEADER.lower()  # hot routes read header names in lower case
_PREDICTIONS = route_pattern("/predictions/{model:str}")
_VERSION_PREDICTIONS = route_pattern("/predictions/{model:str}/{version:str}")

log = logging.getLogger(__name__)


def error_response(status: int, message: str, kind: str = "") -> Response:
    body = {"code": status, "type": kind or TYPES.get(status, "InternalServerException"), "message": message}
    return Response(json.dumps(body, indent=2), status, media_type="application/json")


def _status_response(message: str, status: int = 200) -> Response:
    return Response(json.dumps({"status": message}, indent=2), status, media_type="application/json")


def _json(value: Any) -> Response:
    return Response(json.dumps(value, indent=2), 200, media_type="application/json")


def _answers(handler: Callable[[TorchServeRest, Request], Any]) -> Callable[[TorchServeRest, Request], Any]:
    """Every error becomes TorchServe's JSON error; a ServingError keeps its code's status."""

    @functools.wraps(handler)
    async def wrapped(self: TorchServeRest, request: Request) -> Response:
        try:
            return await handler(self, request)  # type: ignore[no-any-return]
        except TorchServeError as exc:
            return error_response(exc.status, exc.message, exc.kind)
        except ServingError as exc:
            return error_response(http_status(exc), exc.message)

    return wrapped


class TorchServeRest:
    """The routes' handlers, on :class:`~workbench.frontends.torchserve_api.TorchServeApi`."""

    def __init__(self, api: TorchServeApi, timeout_ms: int, max_request_bytes: int) -> None:
        self.api = api
        self.timeout = timeout_ms / 1000 if timeout_ms > 0 else None
        self.max_request_bytes = max_request_bytes

    def _authorize(self, request: Request) -> None:
        self.api.authorize(request.headers.get("authorization", ""))

    # ------------------------------------------------------------------------------------- inference
    @_answers
    async def ping(self, request: Request) -> Response:
        if self.api.healthy():
            return _status_response("Healthy")
        return Response(json.dumps({"status": "Unhealthy"}, indent=2), 500, media_type="application/json")

    @_answers
    async def predict(self, request: Request) -> Response:
        """``/predictions`` through Starlette (with CORS on, or under a root path); :meth:`answer` takes it
        otherwise."""
        params = request.path_params
        return as_response(await self._predict(params["model"], params.get("version"), StarletteArrival(request)))

    def match(self, method: str, path: str) -> re.Match[str] | None:
        """A :class:`~workbench.frontends.hot_routes.HotRoute`: ``POST|PUT /predictions/…``, answered before
        Starlette."""
        if (method == "POST" or method == "PUT") and path.startswith("/predictions/"):
            return _prediction_match(path)
        return None

    async def answer(self, match: re.Match[str], request: Arrival) -> Answer:
        """The answer to a ``/predictions`` request :meth:`match` matched, as its Starlette route answers it (a bug
        is Starlette's plain 500, logged)."""
        try:
            return await self._predict(match["model"], match.groupdict().get("version"), request)
        except TorchServeError as exc:
            return answer_of_response(error_response(exc.status, exc.message, exc.kind))
        except ServingError as exc:
            return answer_of_response(error_response(http_status(exc), exc.message))
        except Exception:
            log.exception("TorchServe REST %s failed", match.string)
            return answer_of(b"Internal Server Error", 500, "text/plain")

    async def _predict(self, model: str, version: str | None, request: Arrival) -> Answer:
        body = await self._body(request)
        data, meta = _request_input(body, request.header("content-type") or "", request.headers())
        answer = await self.api.predict(model, version, data, meta, PROTOCOL, self.timeout, request.header(_STICKY))
        return answer_of(answer.body, answer.status, answer.content_type)

    async def _body(self, request: Arrival) -> bytes:
        try:
            return await request.body(self.max_request_bytes)
        except ServingError as exc:
            if exc.code is not Code.RESOURCE_EXHAUSTED:
                raise
            raise TorchServeError(413, "BadRequestException", "Request body exceeds the server's limit") from None

    # ------------------------------------------------------------------------------------- management
    @_answers
    async def list_models(self, request: Request) -> Response:
        self._authorize(request)
        limit = _int_param(request, "limit", DEFAULT_LIMIT)
        return _json(self.api.list_models(limit, _int_param(request, "next_page_token", 0)))

    @_answers
    async def describe(self, request: Request) -> Response:
        self._authorize(request)
        model = request.path_params["model"]
        return _json(await self.api.describe(model, request.path_params.get("version"), self.timeout))

    @_answers
    async def register(self, request: Request) -> Response:
        self._authorize(request)
        url = request.query_params.get("url", "")
        workers = _int_param(request, "initial_workers", 1)
        return _status_response(await self.api.register(url, workers, request.query_params.get("model_name", "")))

    @_answers
    async def unregister(self, request: Request) -> Response:
        self._authorize(request)
        model = request.path_params["model"]
        return _status_response(await self.api.unregister(model, request.path_params.get("version")))

    @_answers
    async def scale(self, request: Request) -> Response:
        self._authorize(request)
        min_workers = _int_param(request, "min_worker", 1)
        max_workers = _int_param(request, "max_worker", min_workers)
        synchronous = request.query_params.get("synchronous", "false").lower() == "true"
        message = self.api.scale(
            request.path_params["model"], request.path_params.get("version"), min_workers, max_workers, synchronous
        )
        return _status_response(message, 200 if synchronous else 202)

    @_answers
    async def set_default(self, request: Request) -> Response:
        self._authorize(request)
        model, version = request.path_params["model"], request.path_params["version"]
        return _status_response(await self.api.set_default(model, version))


@functools.lru_cache(maxsize=1024)  # a port sees a few paths over and over: the regex once per path, not per request
def _prediction_match(path: str) -> re.Match[str] | None:
    """``/predictions``' match, as Starlette's routes match it (the model's first, then a version's)."""
    return _PREDICTIONS.match(path) or _VERSION_PREDICTIONS.match(path)


def _int_param(request: Request, name: str, default: int) -> int:
    value = request.query_params.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise TorchServeError(400, "BadRequestException", f"Invalid value for {name}: {value}") from None


def _request_input(body: bytes, content_type: str, sent: Headers) -> tuple[bytes, bytes]:
    """The request's input and its description (``request`` input): a multipart form's ``data`` field (else its
    first field), or the whole body, named ``body`` as TorchServe names it."""
    headers = {k: v for k, v in sent.items()}
    if content_type.startswith("multipart/form-data"):
        message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
            b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body
        )
        parts = [p for p in message.iter_parts() if p.get_param("name", header="content-disposition")]
        if not parts:
            raise TorchServeError(400, "BadRequestException", "The multipart form holds no field")
        chosen = next((p for p in parts if p.get_param("name", header="content-disposition") == "data"), parts[0])
        name = str(chosen.get_param("name", header="content-disposition"))
        payload = chosen.get_payload(decode=True)
        part_type = chosen.get_content_type() if chosen.get("content-type") else "text/plain"
        data = payload if isinstance(payload, bytes) else b""
        return data, ts_platform.request_meta(name, part_type, headers)
    return body, ts_platform.request_meta("body", content_type.split(";")[0].strip(), headers)


def torchserve_routes(rest: TorchServeRest) -> list[Route]:
    return [
        Route("/ping", rest.ping, methods=["GET", "POST"]),
        Route("/predictions/{model:str}", rest.predict, methods=["POST", "PUT"]),
        Route("/predictions/{model:str}/{version:str}", rest.predict, methods=["POST", "PUT"]),
        Route("/models", rest.list_models, methods=["GET"]),
        Route("/models", rest.register, methods=["POST"]),
        Route("/models/{model:str}", rest.describe, methods=["GET"]),
        Route("/models/{model:str}", rest.scale, methods=["PUT"]),
        Route("/models/{model:str}", rest.unregister, methods=["DELETE"]),
        Route("/models/{model:str}/{version:str}/set-default", rest.set_default, methods=["PUT"]),
        Route("/models/{model:str}/{version:str}", rest.describe, methods=["GET"]),
        Route("/models/{model:str}/{version:str}", rest.scale, methods=["PUT"]),
        Route("/models/{model:str}/{version:str}", rest.unregister, methods=["DELETE"]),
    ]
