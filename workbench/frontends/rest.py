"""TF Serving's REST API (``/v1/...``) on Starlette: decode JSON, call the dataplane, encode JSON.

Routing follows TF Serving's own two regular expressions, so anything under ``/v1`` that they do not match
is the same ``Malformed request: <METHOD> <path>`` error TF Serving gives. Every answer, errors included, is
``application/json``; nothing reaching here can produce a 500 with a traceback. Successful ``:predict``,
``:classify`` and ``:regress`` answers also say which servable answered, in ``X-Model-Name`` and
``X-Model-Version`` headers (a workbench addition; the bodies stay TF Serving's).

Those three are answered before Starlette sees them (:class:`RestApp`, with :mod:`workbench.frontends.rest_asgi`):
on a busy port they are nearly every request, and Starlette's layers cost more than the rest of the answer.
"""

from __future__ import annotations

import functools
import logging
import re
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from workbench.core.errors import Code, ServingError, from_exception
from workbench.core.sticky import STICKY_HEADER
from workbench.frontends import rest_asgi
from workbench.frontends.hot_routes import HotRoute, answer_asgi, hot_match
from workbench.observability import tracing
from workbench.observability.metrics import CONTENT_TYPE as PROMETHEUS_CONTENT_TYPE
from workbench.planes.dataplane import Dataplane, ModelSpec
from workbench.protocol import json_tensor
from workbench.protocol.examples import input_from_json, serialized_examples
from workbench.protocol.serving_protos import model_spec_proto, model_status_proto, to_json_dict
from workbench.protocol.signature_defs import signature_def_map

log = logging.getLogger(__name__)

JSON = "application/json"

# A workbench addition: which servable answered an inference request. gRPC responses say it in model_spec;
# TF Serving's REST bodies have no place for it, so it travels in headers and the bodies stay TF Serving's.
MODEL_NAME_HEADER = "X-Model-Name"
MODEL_VERSION_HEADER = "X-Model-Version"

METRICS_PATH = "/metrics"  # Prometheus metrics, always on

STICKY_HEADER_RAW = STICKY_HEADER.lower().encode()  # as ASGI servers give header names
PREDICTION_PATH = re.compile(
    r"/v1/models/([^/:]+)(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?:(classify|regress|predict)",
    re.IGNORECASE,
)
_STATUS_PATH = re.compile(
    r"/v1/models(?:/([^/:]+))?(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?(?:/(metadata))?",
    re.IGNORECASE,
)
_MAX_INT64 = (1 << 63) - 1


@functools.lru_cache(maxsize=1024)  # a port sees a few paths over and over: the regex once per path, not per request
def prediction_match(path: str) -> re.Match[str] | None:
    """:data:`PREDICTION_PATH`'s match of a request's whole path (None: not an inference route)."""
    return PREDICTION_PATH.fullmatch(path)


# A POST under /v1 another module answers (asynchronous inference): the path's match, the path, the body, the headers.
PostHandler = Callable[[re.Match[str], str, bytes, Mapping[str, str]], Awaitable[Response]]
# An inference request's answer: HTTP status, JSON body, and the servable that answered, (name, version), or None.
Answer = tuple[int, bytes, "tuple[str, int] | None"]


def json_response(body: bytes, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    return Response(body, status_code=status, media_type=JSON, headers=headers)


def answered_by(name: str, version: int) -> dict[str, str]:
    """The headers naming the model and version that answered (a name that is not ASCII is percent-encoded)."""
    return {MODEL_NAME_HEADER: _header_name(name), MODEL_VERSION_HEADER: str(version)}


@functools.lru_cache(maxsize=1024)  # once per model name, not once per request
def _header_name(name: str) -> str:
    return urllib.parse.quote(name, safe=_HEADER_SAFE)


# Printable ASCII but "%", which marks an escape: every model name a URL path can carry, as it was written.
_HEADER_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) != "%")


@functools.lru_cache(maxsize=1024)
def _raw_answered_by(name: str, version: int) -> tuple[tuple[bytes, bytes], ...]:
    """:func:`answered_by` as raw ASGI headers (Starlette's lower-case names), once per servable."""
    return tuple((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in answered_by(name, version).items())


def error_response(error: ServingError) -> Response:
    return json_response(json_tensor.encode_error(error.message), error.http_status)


def _version(text: str | None) -> int | None:
    if not text:
        return None
    value = int(text)
    if value > _MAX_INT64:
        raise ServingError(Code.INVALID_ARGUMENT, f"Failed to convert version: {text} to numeric.")
    return value


class RestApi:
    """The handlers; :func:`create_app` mounts them."""

    def __init__(
        self,
        dataplane: Dataplane,
        timeout_ms: int,
        max_request_bytes: int,
        more_posts: Sequence[tuple[re.Pattern[str], PostHandler]] = (),
    ) -> None:
        self.dataplane = dataplane
        self.timeout = timeout_ms / 1000 if timeout_ms > 0 else None
        self.max_request_bytes = max_request_bytes
        self.more_posts = tuple(more_posts)

    async def _body(self, request: Request) -> bytes:
        return await rest_asgi.read_body(request.scope, request.receive, self.max_request_bytes)

    async def v1(self, request: Request) -> Response:
        # The path as the client sent it (percent-decoded), not request.url.path: building a URL drops tabs and
        # newlines (urllib's rule), which made "hp%0A" name the model hp, and re-escapes "\\", "?" and "#".
        path, method = request.scope["path"], request.method
        match = prediction_match(path)
        if method == "POST" and match:
            key = request.headers.get(STICKY_HEADER)
            status, body, servable = await self.inference(match, functools.partial(self._body, request), path, key)
            return json_response(body, status, answered_by(*servable) if servable is not None else None)
        try:
            if method == "POST":
                for pattern, handler in self.more_posts:
                    if more := pattern.fullmatch(path):
                        return await handler(more, path, await self._body(request), request.headers)
            match = _STATUS_PATH.fullmatch(path)
            if method == "GET" and match:
                name, version, label, metadata = match.groups()
                if not name:
                    raise ServingError(Code.INVALID_ARGUMENT, "Missing model name in request.")
                spec = ModelSpec(name=name, version=_version(version), label=label)
                return await (self._metadata(spec) if metadata else self._status(spec))
            raise ServingError(Code.INVALID_ARGUMENT, f"Malformed request: {method} {path}")
        except ServingError as exc:
            return error_response(exc)
        except Exception as exc:  # a bug must still answer JSON, and be logged
            log.exception("REST %s %s failed", method, path)
            return error_response(from_exception(exc))

    async def inference(
        self, match: re.Match[str], body: Callable[[], Awaitable[bytes]], path: str, key: str | None = None
    ) -> Answer:
        """A POST that :data:`PREDICTION_PATH` matched: ``:predict``, ``:classify`` or ``:regress``, errors
        answered too (nothing raises but a cancellation). ``body()`` reads the request's body; ``key`` is its
        stickiness key."""
        try:
            name, version, label, verb = match.groups()
            spec = ModelSpec(name=name, version=_version(version), label=label, key=key)
            data = await body()
            verb = verb.lower()
            if verb == "predict":  # here, not in a coroutine of its own: nearly every request is one
                answered, answer = await self.dataplane.infer(spec, "rest", json_tensor.PredictBody(data), self.timeout)
                return 200, answer, (spec.name, answered)
            return await self._examples(verb, spec, data)
        except ServingError as exc:
            return exc.http_status, json_tensor.encode_error(exc.message), None
        except Exception as exc:  # a bug must still answer JSON, and be logged
            log.exception("REST %s %s failed", "POST", path)
            error = from_exception(exc)
            return error.http_status, json_tensor.encode_error(error.message), None

    async def _examples(self, api: str, spec: ModelSpec, body: bytes) -> Answer:
        """``:classify`` and ``:regress``: tf.Examples from JSON in, ``{"results": …}`` out."""
        with await self.dataplane.admit(spec, api, "rest", self.timeout) as call:
            signature_name, request_input = input_from_json(body)
            examples = serialized_examples(request_input)
            if api == "classify":
                _, labelled = await self.dataplane.classify(call, signature_name, examples, self.timeout)
                body = json_tensor.encode_classify_response(labelled)
            else:
                _, values = await self.dataplane.regress(call, signature_name, examples, self.timeout)
                body = json_tensor.encode_regress_response(values)
            return 200, body, (spec.name, call.version)

    async def _status(self, spec: ModelSpec) -> Response:
        await self.dataplane.loaded(spec.name, self.timeout)
        statuses = self.dataplane.model_status(spec.name, spec.version, spec.label)
        return json_response(json_tensor.dumps(to_json_dict(model_status_proto(statuses))))

    async def _metadata(self, spec: ModelSpec) -> Response:
        await self.dataplane.loaded(spec.name, self.timeout, spec)
        with self.dataplane.handle(spec) as servable:
            body = {
                "model_spec": to_json_dict(model_spec_proto(spec.name, servable.version, spec.signature_name)),
                "metadata": {"signature_def": to_json_dict(signature_def_map(servable))},
            }
            return json_response(json_tensor.dumps(body))


class RestApp(Starlette):
    """Starlette, with TF Serving's ``:predict``, ``:classify`` and ``:regress`` answered before it, in raw ASGI.

    Everything else (status, metadata, v2, management, probes, metrics, and every error path of routing) is
    Starlette's, as before. The answers are the same bytes, headers and statuses the ``/v1`` route gives (it runs
    the same :meth:`RestApi.inference`), so whether a request took this path shows nowhere but in its cost. With
    CORS on, every request goes through Starlette's CORS middleware instead.
    """

    def __init__(
        self, api: RestApi, *, answer_inference: bool, hot_routes: Sequence[HotRoute] = (), **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self._api = api if answer_inference else None
        # More routes answered before Starlette (v2 …/infer, TorchServe /predictions): frontends/hot_routes.py
        self._hot = tuple(hot_routes) if answer_inference else ()

    @property
    def inference_api(self) -> RestApi | None:
        """The handlers of the inference routes this app answers before Starlette (None with CORS on: then every
        request is Starlette's), for an HTTP server's own interface to answer them too
        (:mod:`workbench.frontends.rest_rsgi`)."""
        return self._api

    @property
    def hot_routes(self) -> tuple[HotRoute, ...]:
        """The other routes this app answers before Starlette (none with CORS on), for an HTTP server's own interface
        to answer them too (:mod:`workbench.frontends.hot_routes_rsgi`)."""
        return self._hot

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if tracing.active is not None and scope["type"] == "http":
            # Its traceparent is read if it reaches the data plane (an inference request), not before. Every HTTP
            # request sets its own, so none needs resetting.
            tracing.active.http_arrived(scope)
        api = self._api
        # A root_path (a mount, a proxy's prefix) changes what Starlette's router matches: those go to Starlette.
        if api is not None and scope["type"] == "http" and not scope.get("root_path"):
            path, method = scope["path"], scope["method"]
            match = prediction_match(path) if method == "POST" and path.startswith("/v1/") else None
            if match is not None:
                limit = api.max_request_bytes
                key = rest_asgi.header(scope["headers"], STICKY_HEADER_RAW)
                status, body, servable = await api.inference(
                    match, functools.partial(rest_asgi.read_body, scope, receive, limit), path, key
                )
                headers = _raw_answered_by(*servable) if servable is not None else ()
                await rest_asgi.send_json(send, status, body, headers)
                return
            hot = hot_match(self._hot, method, path) if self._hot else None
            if hot is not None:
                await answer_asgi(*hot, scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def create_app(
    dataplane: Dataplane,
    *,
    timeout_ms: int = 30000,
    max_request_bytes: int = 256 * 1024 * 1024,
    enable_cors: bool = False,
    prometheus_path: str | None = None,
    extra_routes: list[Route] | None = None,
    more_posts: Sequence[tuple[re.Pattern[str], PostHandler]] = (),
    first_routes: Sequence[Route] = (),
    hot_routes: Sequence[HotRoute] = (),
) -> RestApp:
    """``first_routes`` are matched before TF Serving's ``/v1`` (OpenAI's endpoints under it), ``extra_routes``
    after everything of TF Serving's; ``hot_routes`` are answered before Starlette (each has its Starlette route
    among the others too, which answers the same)."""
    api = RestApi(dataplane, timeout_ms, max_request_bytes, more_posts)
    routes = [*first_routes]
    routes.append(Route("/v1/{rest:path}", api.v1, methods=["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD"]))
    routes.append(Route("/v1", api.v1, methods=["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD"]))

    async def prometheus(_: Request) -> Response:
        return Response(dataplane.metrics_exposition(), media_type=PROMETHEUS_CONTENT_TYPE)

    # /metrics is always on (where KServe's annotations and most scrapers look); a monitoring config's
    # prometheus_config adds TF Serving's path, /monitoring/prometheus/metrics by default.
    for path in dict.fromkeys(filter(None, (METRICS_PATH, prometheus_path))):
        routes.append(Route(path, prometheus, methods=["GET"]))
    routes.extend(extra_routes or [])
    middleware = []
    if enable_cors:
        middleware.append(
            Middleware(
                CORSMiddleware,
                allow_origins=["*"],
                allow_methods=["*"],
                allow_headers=["*"],
                expose_headers=[MODEL_NAME_HEADER, MODEL_VERSION_HEADER],  # readable by browser clients too
            )
        )

    async def not_found(request: Request, exc: Exception) -> Response:
        return error_response(ServingError(Code.NOT_FOUND, f"Not found: {request.method} {request.url.path}"))

    async def method_not_allowed(request: Request, exc: Exception) -> Response:
        return error_response(
            ServingError(Code.INVALID_ARGUMENT, f"Malformed request: {request.method} {request.url.path}")
        )

    handlers: dict[int, Callable[[Request, Exception], Awaitable[Response]]] = {
        404: not_found,
        405: method_not_allowed,
    }
    app = RestApp(
        api,
        answer_inference=not enable_cors,
        hot_routes=hot_routes,
        routes=routes,
        middleware=middleware,
        exception_handlers=handlers,  # type: ignore[arg-type]
    )
    # A path with a trailing "/" is a path no route has: 404 (400 under /v1), as TF Serving answers, not a redirect
    # to another path built from the request's Host header.
    app.router.redirect_slashes = False
    return app
