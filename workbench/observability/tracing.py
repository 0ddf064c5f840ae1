"""OpenTelemetry tracing: W3C trace context in, a trace per request out over OTLP. Off unless configured.

Everything OpenTelemetry lives here. The rest of the server sees one module attribute, :data:`active`: None while
tracing is off (the default), so the request path then costs one attribute check and nothing of OpenTelemetry is
imported. :func:`start_from_environment` turns it on when ``OTEL_TRACES_EXPORTER`` names an exporter (``otlp``,
``otlp_proto_http``, ``otlp_proto_grpc``, ``console``); the SDK reads the rest of the standard ``OTEL_*`` variables
itself (endpoints, headers, sampler, batch processor, resource). Why the variables and no flag of our own: they are
what the OpenTelemetry Operator, the collector's docs and every other SDK-instrumented server use, workers and model
runners inherit them, and one switch cannot disagree with another.

What a traced request records (see docs/tracing.md for the picture):

- a SERVER span per inference request, continuing the caller's ``traceparent``/``tracestate`` (REST headers, gRPC
  metadata), named and attributed per OpenTelemetry's HTTP and RPC semantic conventions, with the model, version,
  signature and the request's canonical status;
- ``queue``: its wait in the batch queue (or for an inference thread), a child linked to the batch it joined;
- ``batch``: one per batch run, linked to every request span in it, in the trace of the first of them;
- ``model run``: the model's call for that batch, a child of ``batch``;
- ``answer``: from the model's outputs to the encoded answer.

A malformed ``traceparent`` is ignored, as W3C Trace Context requires of a receiver: the request is served and its
span starts a new trace. It is counted (``workbench_trace_context_invalid_total``) and logged at debug level.

Each process exports its own spans (a worker of ``--num_workers`` sets tracing up when its server starts), through a
batch span processor whose export runs on its own thread; :func:`stop` flushes it when the server stops. A model
runner exports nothing: it records a traced request's ``queue``, ``batch`` and ``model run`` as plain times
(:mod:`workbench.runners.timings`) and sends them back with the answer, and the frontend that sent the request makes
them spans under its ``model runner`` span, in the request's trace.
"""

from __future__ import annotations

import contextvars
import inspect
import logging
import os
import re
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from workbench.core.errors import Code, ServingError, from_exception, http_status

if TYPE_CHECKING:  # only imported once tracing is on
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

log = logging.getLogger(__name__)

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
_TRACEPARENT_RAW = b"traceparent"
_TRACESTATE_RAW = b"tracestate"

EXPORTERS = ("otlp", "otlp_proto_http", "otlp_proto_grpc", "console")
DEFAULT_SERVICE_NAME = "workbench"


class TracedTask(Protocol):
    """A batch task as the spans see it (workbench.batching.interest.BatchTask)."""

    rows: int
    enqueued: float  # time.perf_counter() when it was queued

    @property
    def interest(self) -> Any: ...  # its Interest, whose ``trace`` is the request's RequestSpan (or None)


def batch_attributes(
    model: str, version: int, signature: str, requests: int, rows: int, padded_rows: int
) -> dict[str, Any]:
    """A ``batch`` span's attributes (made here, or in a model runner: workbench.runners.timings)."""
    return {
        "workbench.model.name": model,
        "workbench.model.version": version,
        "workbench.model.signature": signature,
        "workbench.batch.requests": requests,
        "workbench.batch.rows": rows,
        "workbench.batch.padded_rows": padded_rows,
    }


class BatchSpans(Protocol):
    """What the batcher reports its runs to (:data:`batches`): :class:`Tracing`, or a model runner's recorder."""

    def batch_ran(
        self,
        model: str,
        version: int,
        signature: str,
        tasks: Sequence[TracedTask],
        started: float,
        rows: int,
        padded_rows: int,
        run_seconds: float | None,
        error: BaseException | None = None,
    ) -> None: ...

    def ran_alone(self, request: Any, enqueued: float, run_seconds: float | None) -> None: ...


# ------------------------------------------------------------------------------------------------ incoming context
class Incoming:
    """What a frontend knows of one call before the data plane does: its carrier of trace context (ASGI headers or
    gRPC metadata, read only if the call reaches the data plane), when it arrived, and how to name its span.

    Set in a context variable by :meth:`Tracing.http_arrived` and the gRPC handlers :meth:`Tracing.grpc_handler`
    wraps; the first inference request of the call takes it (:meth:`Tracing.start_request`).
    """

    __slots__ = ("headers", "metadata", "arrived_ns", "http_method", "path", "rpc_method", "stream", "span")

    def __init__(
        self,
        arrived_ns: int,
        *,
        headers: Sequence[tuple[bytes, bytes]] | None = None,
        metadata: Iterable[tuple[str, Any]] | None = None,
        http_method: str = "",
        path: str = "",
        rpc_method: str = "",
        stream: bool = False,
    ) -> None:
        self.arrived_ns = arrived_ns
        self.headers, self.metadata = headers, metadata
        self.http_method, self.path, self.rpc_method = http_method, path, rpc_method
        self.stream = stream  # a gRPC stream: each request on it is a server span of its own
        self.span: RequestSpan | None = None  # the call's request span, once it has one

    def trace_headers(self) -> tuple[list[str], list[str]]:
        """The call's ``traceparent`` and ``tracestate`` values (each header may repeat)."""
        parents: list[str] = []
        states: list[str] = []
        if self.headers is not None:
            for name, value in self.headers:
                if name == _TRACEPARENT_RAW:
                    parents.append(value.decode("latin-1"))
                elif name == _TRACESTATE_RAW:
                    states.append(value.decode("latin-1"))
        elif self.metadata is not None:
            for key, item in self.metadata:
                if key == TRACEPARENT:
                    parents.append(item.decode("latin-1") if isinstance(item, bytes) else str(item))
                elif key == TRACESTATE:
                    states.append(item.decode("latin-1") if isinstance(item, bytes) else str(item))
        return parents, states


INCOMING: contextvars.ContextVar[Incoming | None] = contextvars.ContextVar("workbench_trace_incoming", default=None)


def _dict_getter() -> Any:
    from opentelemetry.propagators.textmap import DefaultGetter

    return DefaultGetter()


# ------------------------------------------------------------------------------------------------ the request span
class RequestSpan:
    """The spans of one inference request: its SERVER span, and when its outputs came back (for ``answer``)."""

    __slots__ = ("tracing", "span", "answered_ns", "http", "grpc")

    def __init__(self, tracing: Tracing, span: Span, http: bool, grpc: bool) -> None:
        self.tracing, self.span = tracing, span
        self.answered_ns: int | None = None
        self.http, self.grpc = http, grpc

    def resolved(self, version: int) -> None:
        self.span.set_attribute("workbench.model.version", version)

    def ran(self, signature: str) -> None:
        """The model's outputs are back: the ``answer`` span starts (the signature is known by now)."""
        self.answered_ns = time.time_ns()
        self.span.set_attribute("workbench.model.signature", signature)

    def end(self, exc: BaseException | None) -> None:
        """The answer is encoded (or the request failed with ``exc``): end the ``answer`` span and the request's."""
        from opentelemetry.trace import Status, StatusCode

        span, now = self.span, time.time_ns()
        if not span.is_recording():  # not sampled: nothing of it is exported, so nothing more is made
            span.end(now)
            return
        if self.answered_ns is not None:
            self.tracing.child(self, "answer", self.answered_ns, now)
        code = _code_of(exc)
        span.set_attribute("workbench.status_code", code.name)
        if self.http:
            span.set_attribute("http.response.status_code", http_status(code))
        if self.grpc:
            span.set_attribute("rpc.grpc.status_code", code.value)
        if exc is not None:
            error = exc if isinstance(exc, ServingError) else from_exception(exc)
            span.set_attribute("error.type", code.name)
            span.set_status(Status(StatusCode.ERROR, f"{code.name}: {error.message}"))
        span.end(now)


def _code_of(exc: BaseException | None) -> Code:
    if exc is None:
        return Code.OK
    if isinstance(exc, ServingError):
        return exc.code
    if type(exc).__name__ == "CancelledError":
        return Code.CANCELLED
    return from_exception(exc).code


_VERSION_SEGMENT = re.compile(r"/(versions|labels)/[^/:]+")


def http_route(path: str, model: str) -> str:
    """``path`` with its model, version and label as placeholders: a span name of few distinct values (the HTTP
    semantic conventions' ``http.route``), e.g. ``/v1/models/{model}/versions/{version}:predict``."""
    named = path.replace(f"/models/{model}", "/models/{model}", 1)
    return _VERSION_SEGMENT.sub(
        lambda m: "/versions/{version}" if m.group(1) == "versions" else "/labels/{label}", named
    )


# ------------------------------------------------------------------------------------------------ tracing
class Tracing:
    """The tracer of this process, with its provider (whose batch processor exports) and W3C propagator."""

    def __init__(self, provider: TracerProvider, on_invalid: Callable[[str], None] | None = None) -> None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        from workbench.runtime.version import __version__

        self.provider = provider
        self.tracer: Tracer = provider.get_tracer("workbench", __version__)
        self._propagator = TraceContextTextMapPropagator()
        self._getter = _dict_getter()
        self._on_invalid = on_invalid or (lambda protocol: None)
        # Spans take nanoseconds since the epoch; batches and queues are timed with perf_counter.
        self._epoch_offset_ns = time.time_ns() - time.perf_counter_ns()

    # ------------------------------------------------------------------ where calls come in
    def http_arrived(self, scope: Mapping[str, Any]) -> None:
        """An HTTP request arrived (an ASGI scope): its headers are read if it reaches the data plane."""
        INCOMING.set(
            Incoming(time.time_ns(), headers=scope["headers"], http_method=scope["method"], path=scope["path"])
        )

    def grpc_handler(self, handler: Any, method: str) -> Any:
        """``handler`` (a grpc.RpcMethodHandler of ``method``, "/package.Service/Method") whose behavior first notes
        the call's metadata and arrival for :meth:`start_request`. Wrapped at registration: untraced servers pay
        nothing per call."""
        streaming = bool(handler.request_streaming or handler.response_streaming)
        for field in ("unary_unary", "unary_stream", "stream_unary", "stream_stream"):
            behavior = getattr(handler, field)
            if behavior is not None:
                return handler._replace(**{field: _noting_call(behavior, method, streaming)})
        return handler

    # ------------------------------------------------------------------ the request's spans
    def start_request(self, model: str, api: str, protocol: str, signature: str) -> RequestSpan | None:
        """The span of an inference request entering the data plane; None for one that no frontend call carries,
        and for a batch job's rows (a job started over REST runs in its request's context, long after it)."""
        incoming = INCOMING.get()
        if incoming is None or protocol == "batch":
            return None
        from opentelemetry.trace import SpanKind, set_span_in_context

        attributes: dict[str, Any] = {
            "workbench.model.name": model,
            "workbench.api": api,
            "workbench.protocol": protocol,
        }
        if signature:
            attributes["workbench.model.signature"] = signature
        owner = incoming.span
        if owner is not None and not incoming.stream:
            # A second request of one call (a shadow's copy of it): a child of the call's request span.
            span = self.tracer.start_span(
                f"{api} {model}", set_span_in_context(owner.span), SpanKind.INTERNAL, attributes
            )
            return RequestSpan(self, span, False, False)
        parent = self._parent(incoming, protocol)
        http = incoming.headers is not None
        if http:
            route = http_route(incoming.path, model)
            name = f"{incoming.http_method} {route}"
            attributes.update(
                {
                    "http.request.method": incoming.http_method,
                    "http.route": route,
                    "url.path": incoming.path,
                    "url.scheme": "http",
                }
            )
        else:
            name = incoming.rpc_method.lstrip("/")
            service, _, rpc = name.partition("/")
            attributes.update({"rpc.system": "grpc", "rpc.service": service, "rpc.method": rpc})
        span = self.tracer.start_span(name, parent, SpanKind.SERVER, attributes, start_time=incoming.arrived_ns)
        request = RequestSpan(self, span, http, not http)
        if incoming.span is None:
            incoming.span = request
        return request

    def _parent(self, incoming: Incoming, protocol: str) -> Context | None:
        """The caller's context from the call's headers; None (a new trace) when it sent none or a malformed one."""
        parents, states = incoming.trace_headers()
        if not parents:
            return None
        carrier = {TRACEPARENT: parents[0] if len(parents) == 1 else ",".join(parents)}
        if states:
            carrier[TRACESTATE] = ",".join(states)
        context = self._propagator.extract(carrier, getter=self._getter)
        from opentelemetry.trace import get_current_span

        if not get_current_span(context).get_span_context().is_valid:
            self._on_invalid(protocol)
            log.debug("Ignored a malformed traceparent %r (W3C Trace Context: a new trace starts)", parents[:2])
            return None
        return context

    def child(self, request: RequestSpan, name: str, start_ns: int, end_ns: int, links: Sequence[Any] = ()) -> None:
        """A finished child span of ``request``'s, from ``start_ns`` to ``end_ns``."""
        from opentelemetry.trace import SpanKind, set_span_in_context

        span = self.tracer.start_span(
            name, set_span_in_context(request.span), SpanKind.INTERNAL, links=links, start_time=start_ns
        )
        span.end(end_ns)

    def _ns(self, perf_seconds: float) -> int:
        return int(perf_seconds * 1e9) + self._epoch_offset_ns

    def batch_ran(
        self,
        model: str,
        version: int,
        signature: str,
        tasks: Sequence[TracedTask],
        started: float,
        rows: int,
        padded_rows: int,
        run_seconds: float | None,
        error: BaseException | None = None,
    ) -> None:
        """A batch ran (``started``: perf_counter when it left its queue; ``run_seconds``: its model call, None when
        it failed before one): its ``batch`` span, linked to every traced request in it, with ``model run`` under
        it, and each traced request's ``queue`` span, linked to the batch. Called from the thread that ran it."""
        from opentelemetry.trace import Link, SpanKind, Status, StatusCode, set_span_in_context

        requests = [(task, task.interest.trace) for task in tasks if task.interest is not None]
        # The recorded (sampled) requests: the others export nothing, so nothing is made for them.
        traced = [(task, request) for task, request in requests if request is not None and request.span.is_recording()]
        if not traced:
            return
        end_ns = time.time_ns()
        start_ns = self._ns(started)
        owner = traced[0][1]  # in the trace of the first recorded request: a batch is sampled when one of its is
        links = [Link(request.span.get_span_context()) for _, request in traced]
        attributes = batch_attributes(model, version, signature, len(tasks), rows, padded_rows)
        batch = self.tracer.start_span(
            "batch", set_span_in_context(owner.span), SpanKind.INTERNAL, attributes, links, start_time=start_ns
        )
        if run_seconds is not None:
            run = self.tracer.start_span(
                "model run", set_span_in_context(batch), SpanKind.INTERNAL, start_time=end_ns - int(run_seconds * 1e9)
            )
            run.end(end_ns)
        if error is not None:
            batch.set_status(Status(StatusCode.ERROR, f"{_code_of(error).name}: {from_exception(error).message}"))
        batch.end(end_ns)
        to_batch = [Link(batch.get_span_context())]
        for task, request in traced:
            self.child(request, "queue", self._ns(task.enqueued), start_ns, to_batch)

    def ran_alone(self, request: RequestSpan, enqueued: float, run_seconds: float | None) -> None:
        """An unbatched call of ``request`` ran: its wait for a thread (``queue``) and its ``model run``."""
        if not request.span.is_recording():
            return
        end_ns = time.time_ns()
        run_ns = end_ns - int(run_seconds * 1e9) if run_seconds is not None else end_ns
        self.child(request, "queue", self._ns(enqueued), run_ns)
        if run_seconds is not None:
            self.child(request, "model run", run_ns, end_ns)

    @staticmethod
    def recording(request: RequestSpan | None) -> bool:
        """Whether ``request`` is traced and its spans are recorded (sampled): only then is anything made for it."""
        return request is not None and request.span.is_recording()

    def ran_remotely(
        self, request: RequestSpan, runner: str, started: float, records: Sequence[tuple[str, int, int, Any]] = ()
    ) -> None:
        """A model runner (another process) batched and ran ``request``'s rows: a ``model runner`` span, from the
        call to the answer, and under it what the runner recorded (``records``: its ``queue``, ``batch`` and ``model
        run``, as :mod:`workbench.runners.timings` makes them)."""
        if not request.span.is_recording():
            return
        from opentelemetry.trace import SpanKind, set_span_in_context

        span = self.tracer.start_span(
            "model runner",
            set_span_in_context(request.span),
            SpanKind.CLIENT,
            {"workbench.runner": runner},
            start_time=self._ns(started),
        )
        within = set_span_in_context(span)
        for name, start_ns, end_ns, attributes in records:
            self.tracer.start_span(name, within, SpanKind.INTERNAL, attributes, start_time=start_ns).end(end_ns)
        span.end()

    def shutdown(self) -> None:
        """Export what is still buffered, then stop the exporter."""
        self.provider.shutdown()


def _noting_call(behavior: Callable[..., Any], method: str, streaming: bool) -> Callable[..., Any]:
    """``behavior`` (a gRPC method's), first setting the call's :class:`Incoming`."""

    def note(context: Any) -> None:
        # Each call runs in a task of its own (gRPC's aio server): the variable needs no reset.
        INCOMING.set(Incoming(time.time_ns(), metadata=context.invocation_metadata() or (), rpc_method=method,
                              stream=streaming))  # fmt: skip

    if inspect.isasyncgenfunction(behavior):

        async def noting_stream(request: Any, context: Any) -> Any:
            note(context)
            async for response in behavior(request, context):
                yield response

        return noting_stream

    async def noting(request: Any, context: Any) -> Any:
        note(context)
        return await behavior(request, context)

    return noting


# ------------------------------------------------------------------------------------------------ set-up
active: Tracing | None = None
# What the batcher reports batches to: ``active`` while tracing is on; in a model runner, its recorder
# (workbench.runners.timings); None otherwise, which costs the batcher one attribute check.
batches: BatchSpans | None = None
_servers = 0  # the servers of this process that started tracing (a process may run several: tests, notebooks)


def configured(environ: Mapping[str, str] | None = None) -> list[str]:
    """The span exporters ``OTEL_TRACES_EXPORTER`` names (empty: tracing is off). ``OTEL_SDK_DISABLED=true`` turns it
    off whatever the exporter; an exporter this server does not know is refused by name."""
    environ = os.environ if environ is None else environ
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    names = [name.strip().lower() for name in environ.get("OTEL_TRACES_EXPORTER", "").split(",") if name.strip()]
    if "none" in names:
        return []
    unknown = [name for name in names if name not in EXPORTERS]
    if unknown:
        raise ServingError(
            Code.INVALID_ARGUMENT,
            f"OTEL_TRACES_EXPORTER names {', '.join(unknown)}: workbench exports spans with "
            f"{', '.join(EXPORTERS)} (or none)",
        )
    return names


def otlp_protocol(environ: Mapping[str, str] | None = None) -> str:
    """``http/protobuf`` (OpenTelemetry's default) or ``grpc``, from OTEL_EXPORTER_OTLP(_TRACES)_PROTOCOL."""
    environ = os.environ if environ is None else environ
    protocol = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or ""
    ).strip() or "http/protobuf"
    if protocol not in ("http/protobuf", "grpc"):
        raise ServingError(
            Code.INVALID_ARGUMENT,
            f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol}: workbench exports OTLP as http/protobuf or grpc",
        )
    return protocol


def _exporter(name: str) -> Any:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    protocol = {"otlp_proto_http": "http/protobuf", "otlp_proto_grpc": "grpc"}.get(name) or otlp_protocol()
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        return GrpcExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    return HttpExporter()


def _resource() -> Any:
    from opentelemetry.sdk.resources import Resource

    detected = Resource.create()  # OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME
    own: dict[str, Any] = {"service.instance.id": f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"}
    if str(detected.attributes.get("service.name", "")).startswith("unknown_service"):
        own["service.name"] = DEFAULT_SERVICE_NAME
    return detected.merge(Resource(own))


def start_from_environment(on_invalid: Callable[[str], None] | None = None) -> Tracing | None:
    """Turn tracing on in this process when the environment asks for it (:func:`configured`); None when it does not.

    ``on_invalid(protocol)`` counts a malformed traceparent. Raises INVALID_ARGUMENT for an exporter or protocol
    this server does not know, FAILED_PRECONDITION when the OpenTelemetry packages are missing. Once on, it stays on
    for the process (a second server of it shares the tracer) until :func:`stop`.
    """
    global active, batches, _servers
    names = configured()
    if not names:
        return None
    if active is not None:
        _servers += 1
        return active
    try:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise ServingError(
            Code.FAILED_PRECONDITION,
            f"OTEL_TRACES_EXPORTER is set but OpenTelemetry is not installed ({exc}): "
            'pip install "workbench-serving[tracing]"',
        ) from None
    try:
        exporters = [_exporter(name) for name in names]
    except ImportError as exc:
        raise ServingError(
            Code.FAILED_PRECONDITION,
            f"OTEL_TRACES_EXPORTER={','.join(names)} needs an exporter that is not installed ({exc}): "
            'pip install "workbench-serving[tracing]"',
        ) from None
    provider = TracerProvider(resource=_resource())  # its sampler: OTEL_TRACES_SAMPLER (+ _ARG)
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))  # OTEL_BSP_*: export off the request path
    active, _servers = Tracing(provider, on_invalid), 1
    batches = active
    log.info(
        "Tracing on: spans exported with %s (sampler %s)",
        ", ".join(names if names != ["otlp"] else [f"otlp ({otlp_protocol()})"]),
        os.environ.get("OTEL_TRACES_SAMPLER", "parentbased_always_on"),
    )
    return active


def stop() -> None:
    """A server that started tracing stopped: once no other server of the process uses it, export what is buffered
    and turn tracing off."""
    global active, batches, _servers
    _servers = max(0, _servers - 1)
    if _servers:
        return
    tracing, active, batches = active, None, None
    if tracing is not None:
        tracing.shutdown()
