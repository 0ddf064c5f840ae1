"""Tracing's logic in-process: the OTEL_* settings read, W3C trace context taken from headers and metadata (and a
malformed one ignored), the spans of requests, batches and unbatched calls through a real BatchScheduler on fakes,
and the notebook client's propagation. Spans go to the SDK's in-memory exporter; no sockets."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
from fakes import FakeServable
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from workbench.batching.interest import Interest
from workbench.batching.scheduler import BatchScheduler
from workbench.client.trace_context import trace_headers, with_trace_headers, with_trace_metadata
from workbench.config.batching_parameters import BatchingParameters
from workbench.core.errors import Code, ServingError
from workbench.observability import tracing
from workbench.observability.tracing import INCOMING, Incoming, Tracing, configured, http_route, otlp_protocol

PARENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
PARENT_SPAN = "b7ad6b7169203331"
TRACEPARENT = f"00-{PARENT_TRACE}-{PARENT_SPAN}-01"


# ------------------------------------------------------------------------------------------------ settings
@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, []),
        ({"OTEL_TRACES_EXPORTER": ""}, []),
        ({"OTEL_TRACES_EXPORTER": "none"}, []),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, ["otlp"]),
        ({"OTEL_TRACES_EXPORTER": "OTLP, console"}, ["otlp", "console"]),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, []),
    ],
)
def test_tracing_is_on_only_when_an_exporter_is_named(environ: dict[str, str], expected: list[str]) -> None:
    assert configured(environ) == expected


def test_an_unknown_exporter_is_refused_by_name() -> None:
    with pytest.raises(ServingError) as raised:
        configured({"OTEL_TRACES_EXPORTER": "otlp,zipkin"})
    assert raised.value.code == Code.INVALID_ARGUMENT
    assert "OTEL_TRACES_EXPORTER names zipkin" in raised.value.message


def test_otlp_protocol_defaults_to_http_and_the_traces_variable_wins() -> None:
    assert otlp_protocol({}) == "http/protobuf"
    assert otlp_protocol({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}) == "grpc"
    both = {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}
    assert otlp_protocol(both) == "http/protobuf"
    with pytest.raises(ServingError, match="http/json"):
        otlp_protocol({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})


@pytest.mark.parametrize(
    ("environ", "exporter", "service"),
    [
        ({"OTEL_TRACES_EXPORTER": "otlp"}, "opentelemetry.exporter.otlp.proto.http", "workbench"),
        (
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_SERVICE_NAME": "digits"},
            "opentelemetry.exporter.otlp.proto.grpc",
            "digits",
        ),
        ({"OTEL_TRACES_EXPORTER": "otlp_proto_grpc"}, "opentelemetry.exporter.otlp.proto.grpc", "workbench"),
    ],
)
def test_set_up_from_the_environment_once_per_process(
    monkeypatch: pytest.MonkeyPatch, environ: dict[str, str], exporter: str, service: str
) -> None:
    for name in ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", **environ}.items():
        monkeypatch.setenv(name, value)
    first = tracing.start_from_environment()
    try:
        assert first is not None and tracing.active is first
        assert tracing.start_from_environment() is first  # a second server of the process shares it
        (processor,) = first.provider._active_span_processor._span_processors
        assert type(processor).__name__ == "BatchSpanProcessor"
        # Where the SDK keeps the processor's exporter (1.30's attribute, or newer releases' shared batcher).
        chosen = getattr(processor, "span_exporter", None) or processor._batch_processor._exporter
        assert type(chosen).__module__.startswith(exporter)
        assert first.provider.resource.attributes["service.name"] == service
        assert first.provider.resource.attributes["service.instance.id"]
        tracing.stop()
        assert tracing.active is first  # the other server still uses it
    finally:
        tracing.stop()
    assert tracing.active is None


def test_off_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)
    assert tracing.start_from_environment() is None and tracing.active is None
    tracing.stop()  # a server that did not start it: nothing to do
    assert tracing.active is None


def test_http_route_names_model_version_and_label_by_placeholder() -> None:
    assert http_route("/v1/models/hp:predict", "hp") == "/v1/models/{model}:predict"
    assert http_route("/v1/models/hp/versions/3:predict", "hp") == "/v1/models/{model}/versions/{version}:predict"
    assert http_route("/v1/models/hp/labels/stable:regress", "hp") == "/v1/models/{model}/labels/{label}:regress"
    assert http_route("/v2/models/hp/versions/2/infer", "hp") == "/v2/models/{model}/versions/{version}/infer"


def test_trace_headers_are_read_from_asgi_headers_and_grpc_metadata() -> None:
    headers = [(b"content-type", b"application/json"), (b"traceparent", TRACEPARENT.encode()), (b"tracestate", b"a=1")]
    assert Incoming(0, headers=headers).trace_headers() == ([TRACEPARENT], ["a=1"])
    metadata = (("x-workbench-key", "k"), ("traceparent", TRACEPARENT), ("tracestate", "a=1"), ("tracestate", "b=2"))
    assert Incoming(0, metadata=metadata).trace_headers() == ([TRACEPARENT], ["a=1", "b=2"])
    assert Incoming(0, metadata=()).trace_headers() == ([], [])


# ------------------------------------------------------------------------------------------------ spans
class Traced:
    """Tracing on, into the SDK's in-memory exporter, with the malformed headers it counted."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.invalid: list[str] = []
        self.tracing = Tracing(provider, self.invalid.append)

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        return [span for span in self.exporter.get_finished_spans() if name is None or span.name == name]


@pytest.fixture
def traced(monkeypatch: pytest.MonkeyPatch) -> Iterator[Traced]:
    on = Traced()
    monkeypatch.setattr(tracing, "active", on.tracing)
    monkeypatch.setattr(tracing, "batches", on.tracing)  # as start_from_environment sets both
    yield on
    on.tracing.shutdown()


def rest_call(traceparent: str | None, path: str = "/v1/models/m:predict") -> Incoming:
    headers = [(b"traceparent", traceparent.encode())] if traceparent is not None else []
    return Incoming(time.time_ns(), headers=headers, http_method="POST", path=path)


def test_a_request_continues_the_callers_trace(traced: Traced) -> None:
    INCOMING.set(rest_call(TRACEPARENT))
    request = traced.tracing.start_request("m", "predict", "rest", "")
    assert request is not None
    request.resolved(3)
    request.ran("serving_default")
    request.end(None)
    (server,) = traced.spans("POST /v1/models/{model}:predict")
    assert server.kind == SpanKind.SERVER
    assert server.context.trace_id == int(PARENT_TRACE, 16)
    assert server.parent is not None and server.parent.span_id == int(PARENT_SPAN, 16) and server.parent.is_remote
    assert dict(server.attributes or {}) == {
        "workbench.model.name": "m",
        "workbench.api": "predict",
        "workbench.protocol": "rest",
        "http.request.method": "POST",
        "http.route": "/v1/models/{model}:predict",
        "url.path": "/v1/models/m:predict",
        "url.scheme": "http",
        "workbench.model.version": 3,
        "workbench.model.signature": "serving_default",
        "workbench.status_code": "OK",
        "http.response.status_code": 200,
    }
    (answer,) = traced.spans("answer")
    assert answer.parent is not None and answer.parent.span_id == server.context.span_id
    assert traced.invalid == []


@pytest.mark.parametrize(
    "malformed",
    [
        f"00-{PARENT_TRACE.upper()}-{PARENT_SPAN}-01",  # hex must be lower case
        f"00-{'0' * 32}-{PARENT_SPAN}-01",  # an all-zero trace id
        f"00-{PARENT_TRACE}-{'0' * 16}-01",  # an all-zero parent id
        f"ff-{PARENT_TRACE}-{PARENT_SPAN}-01",  # version ff is forbidden
        f"00-{PARENT_TRACE}-{PARENT_SPAN}-01-extra",  # version 00 has exactly four fields
        "garbage",
    ],
)
def test_a_malformed_traceparent_starts_a_new_trace_and_is_counted(traced: Traced, malformed: str) -> None:
    INCOMING.set(rest_call(malformed))
    request = traced.tracing.start_request("m", "predict", "rest", "")
    assert request is not None
    request.end(None)
    (server,) = traced.spans()
    assert server.parent is None  # a root: the header was ignored, as W3C Trace Context says
    assert server.context.trace_id != int(PARENT_TRACE, 16)
    assert traced.invalid == ["rest"]


def test_a_later_version_of_traceparent_is_read_by_its_known_fields(traced: Traced) -> None:
    INCOMING.set(rest_call(f"01-{PARENT_TRACE}-{PARENT_SPAN}-01-what-comes-next"))
    request = traced.tracing.start_request("m", "predict", "rest", "")
    assert request is not None
    request.end(None)
    (server,) = traced.spans()
    assert server.context.trace_id == int(PARENT_TRACE, 16) and traced.invalid == []


def test_a_grpc_request_is_named_and_attributed_as_an_rpc(traced: Traced) -> None:
    INCOMING.set(
        Incoming(
            time.time_ns(),
            metadata=(("traceparent", TRACEPARENT),),
            rpc_method="/tensorflow.serving.PredictionService/Predict",
        )
    )
    request = traced.tracing.start_request("m", "predict", "grpc", "sig")
    assert request is not None
    request.end(ServingError(Code.NOT_FOUND, "Servable not found for request: Latest(m)"))
    (server,) = traced.spans()
    assert server.name == "tensorflow.serving.PredictionService/Predict"
    attributes = dict(server.attributes or {})
    assert attributes["rpc.system"] == "grpc"
    assert attributes["rpc.service"] == "tensorflow.serving.PredictionService"
    assert attributes["rpc.method"] == "Predict"
    assert attributes["rpc.grpc.status_code"] == Code.NOT_FOUND.value
    assert attributes["workbench.model.signature"] == "sig"
    assert attributes["error.type"] == "NOT_FOUND"
    assert server.status.status_code == StatusCode.ERROR
    assert server.status.description == "NOT_FOUND: Servable not found for request: Latest(m)"


def test_a_rest_error_records_its_http_status(traced: Traced) -> None:
    INCOMING.set(rest_call(None))
    request = traced.tracing.start_request("m", "predict", "rest", "")
    assert request is not None
    request.end(ServingError(Code.INVALID_ARGUMENT, "bad"))
    (server,) = traced.spans()
    assert dict(server.attributes or {})["http.response.status_code"] == 400
    assert server.parent is None  # no traceparent: a new trace


def test_what_no_frontend_call_carries_is_not_traced(traced: Traced) -> None:
    INCOMING.set(None)
    assert traced.tracing.start_request("m", "predict", "rest", "") is None
    INCOMING.set(rest_call(TRACEPARENT, "/workbench/v1/batch"))  # a job started over REST, running in its context
    assert traced.tracing.start_request("m", "predict", "batch", "") is None
    assert traced.spans() == []


def test_a_second_request_of_one_call_is_a_child_and_a_streams_are_each_a_server_span(traced: Traced) -> None:
    INCOMING.set(rest_call(TRACEPARENT))
    first = traced.tracing.start_request("m", "predict", "rest", "")
    copy = traced.tracing.start_request("m", "predict", "shadow", "")  # a shadow's copy, in the request's context
    assert first is not None and copy is not None
    copy.end(None)
    first.end(None)
    shadow, server = traced.spans()
    assert shadow.kind == SpanKind.INTERNAL and shadow.parent is not None
    assert shadow.parent.span_id == server.context.span_id

    traced.exporter.clear()
    stream = Incoming(time.time_ns(), metadata=(), rpc_method="/inference.GRPCInferenceService/ModelStreamInfer")
    stream.stream = True
    INCOMING.set(stream)
    for _ in range(2):
        request = traced.tracing.start_request("m", "predict", "v2-grpc", "")
        assert request is not None
        request.end(None)
    assert [span.kind for span in traced.spans()] == [SpanKind.SERVER, SpanKind.SERVER]


# ------------------------------------------------------------------------------------------------ batches
def params(**fields: Any) -> BatchingParameters:
    return BatchingParameters(**{"num_batch_threads": 1, **fields}).validate("the test")


async def traced_request(
    traced: Traced, scheduler: BatchScheduler, servable: FakeServable, value: float, traceparent: str
) -> np.ndarray:
    """One request as the data plane runs it: its span, its interest carrying it, its batch task."""
    INCOMING.set(rest_call(traceparent))  # a task of its own: its own context
    request = traced.tracing.start_request("m", "predict", "rest", "")
    interest = Interest()
    interest.trace = request
    signature = servable.signatures["serving_default"]
    try:
        result = await scheduler.run(servable, signature, {"x": np.asarray([[value]], np.float32)}, ["y"], interest)
    except BaseException as exc:
        assert request is not None
        request.end(exc)
        raise
    assert request is not None
    request.ran(signature.name)
    request.end(None)
    return result["y"]


def parents(count: int) -> list[str]:
    return [f"00-{index + 1:032x}-{index + 1:016x}-01" for index in range(count)]


def run_requests(traced: Traced, scheduler: BatchScheduler, servable: FakeServable, count: int) -> list[Any]:
    async def all_of_them() -> list[Any]:
        tasks = [
            asyncio.ensure_future(traced_request(traced, scheduler, servable, float(i), parent))
            for i, parent in enumerate(parents(count))
        ]
        return await asyncio.gather(*tasks, return_exceptions=True)

    return asyncio.run(all_of_them())


@pytest.fixture
def executor() -> Iterator[ThreadPoolExecutor]:
    pool = ThreadPoolExecutor(max_workers=2)
    yield pool
    pool.shutdown(wait=True)


def test_a_batch_links_every_request_in_it_and_each_request_links_its_batch(
    traced: Traced, executor: ThreadPoolExecutor
) -> None:
    servable = FakeServable()
    batching = params(max_batch_size=3, batch_timeout_micros=10_000_000)  # three rows fill it: it starts at once
    scheduler = BatchScheduler(executor, lambda _: batching)
    answers = run_requests(traced, scheduler, servable, 3)
    assert [a.tolist() for a in answers] == [[[1.0]], [[2.0]], [[3.0]]] and servable.batches == [3]

    servers = {span.context.trace_id: span for span in traced.spans("POST /v1/models/{model}:predict")}
    assert set(servers) == {int(parent.split("-")[1], 16) for parent in parents(3)}
    (batch,) = traced.spans("batch")
    assert {link.context.span_id for link in batch.links} == {span.context.span_id for span in servers.values()}
    assert batch.parent is not None and batch.parent.span_id in {span.context.span_id for span in servers.values()}
    assert dict(batch.attributes or {}) == {
        "workbench.model.name": "m",
        "workbench.model.version": 1,
        "workbench.model.signature": "serving_default",
        "workbench.batch.requests": 3,
        "workbench.batch.rows": 3,
        "workbench.batch.padded_rows": 3,
    }
    (run,) = traced.spans("model run")
    assert run.parent is not None and run.parent.span_id == batch.context.span_id
    assert batch.start_time is not None and run.start_time is not None and batch.start_time <= run.start_time
    queues = traced.spans("queue")
    assert len(queues) == 3
    for queue in queues:
        assert queue.parent is not None
        server = servers[queue.context.trace_id]
        assert queue.parent.span_id == server.context.span_id
        assert [link.context.span_id for link in queue.links] == [batch.context.span_id]
        assert queue.end_time == batch.start_time
    assert len(traced.spans("answer")) == 3


def test_a_request_its_caller_did_not_sample_records_nothing(traced: Traced, executor: ThreadPoolExecutor) -> None:
    """parentbased sampling (the default): a caller's unsampled trace (flags 00) is not recorded here either; a batch
    it shares with a sampled request links to that one alone."""
    servable = FakeServable()
    batching = params(max_batch_size=2, batch_timeout_micros=10_000_000)
    scheduler = BatchScheduler(executor, lambda _: batching)
    sampled, unsampled = f"00-{1:032x}-{1:016x}-01", f"00-{2:032x}-{2:016x}-00"

    async def both() -> list[Any]:
        return await asyncio.gather(
            *(asyncio.ensure_future(traced_request(traced, scheduler, servable, 1.0, p)) for p in (sampled, unsampled))
        )

    asyncio.run(both())
    assert servable.batches == [2]
    assert {span.context.trace_id for span in traced.spans()} == {1}
    (batch,) = traced.spans("batch")
    assert [link.context.trace_id for link in batch.links] == [1]
    assert dict(batch.attributes or {})["workbench.batch.requests"] == 2


def test_a_failed_batch_is_an_error_in_every_request(traced: Traced, executor: ThreadPoolExecutor) -> None:
    servable = FakeServable()
    servable.fail_with = ServingError(Code.INVALID_ARGUMENT, "x is not what the model takes")
    batching = params(max_batch_size=2, batch_timeout_micros=10_000_000)
    answers = run_requests(traced, BatchScheduler(executor, lambda _: batching), servable, 2)
    assert all(isinstance(answer, ServingError) for answer in answers)
    (batch,) = traced.spans("batch")
    assert batch.status.status_code == StatusCode.ERROR
    assert batch.status.description == "INVALID_ARGUMENT: x is not what the model takes"
    assert traced.spans("model run") == []  # it never returned
    for server in traced.spans("POST /v1/models/{model}:predict"):
        assert server.status.status_code == StatusCode.ERROR
        assert dict(server.attributes or {})["http.response.status_code"] == 400


@pytest.mark.parametrize("inline", [False, True])
def test_an_unbatched_call_has_its_queue_and_run_under_its_request(
    traced: Traced, executor: ThreadPoolExecutor, inline: bool
) -> None:
    servable = FakeServable()
    scheduler = BatchScheduler(executor, lambda _: None, inline_cheap_calls=inline)
    run_requests(traced, scheduler, servable, 1)
    (server,) = traced.spans("POST /v1/models/{model}:predict")
    children = {span.name: span for span in traced.spans() if span.parent is not None and span.name != server.name}
    assert set(children) == {"queue", "model run", "answer"}
    assert all(span.parent is not None and span.parent.span_id == server.context.span_id for span in children.values())
    assert traced.spans("batch") == []


def test_tracing_off_records_nothing(executor: ThreadPoolExecutor) -> None:
    assert tracing.active is None
    servable = FakeServable()
    batching = params(max_batch_size=2, batch_timeout_micros=10_000_000)
    scheduler = BatchScheduler(executor, lambda _: batching)

    async def two() -> list[Any]:
        signature = servable.signatures["serving_default"]
        feed = {"x": np.asarray([[1.0]], np.float32)}
        return await asyncio.gather(*(scheduler.run(servable, signature, feed, ["y"], Interest()) for _ in range(2)))

    assert len(asyncio.run(two())) == 2 and servable.batches == [2]


# ------------------------------------------------------------------------------------------------ the client
def test_the_client_sends_the_current_spans_context_and_nothing_without_one() -> None:
    assert trace_headers() == {}
    assert with_trace_headers({"X-Workbench-Key": "k"}) == {"X-Workbench-Key": "k"}
    assert with_trace_metadata(()) is None
    tracer = TracerProvider().get_tracer("notebook")
    with tracer.start_as_current_span("cell") as cell:
        context = cell.get_span_context()
        expected = f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"
        assert trace_headers()["traceparent"] == expected
        assert with_trace_headers({"X-Workbench-Key": "k"}) == {"traceparent": expected, "X-Workbench-Key": "k"}
        assert with_trace_metadata((("x-workbench-key", "k"),)) == [("x-workbench-key", "k"), ("traceparent", expected)]
    assert trace.get_current_span() is trace.INVALID_SPAN


def test_the_client_adds_nothing_in_another_thread_without_a_span() -> None:
    tracer = TracerProvider().get_tracer("notebook")
    seen: list[dict[str, str]] = []
    with tracer.start_as_current_span("cell"):
        thread = threading.Thread(target=lambda: seen.append(trace_headers()))  # contexts do not cross threads
        thread.start()
        thread.join()
    assert seen == [{}]


def test_a_model_runner_records_its_traced_requests_times_as_plain_tuples() -> None:
    """In a runner (no tracer), a traced request's Interest.trace is a list: the batch it ran in appends its queue,
    the batch and the model run, in wall-clock nanoseconds; requests that are not traced get nothing."""
    from types import SimpleNamespace

    from workbench.runners.timings import RunnerTimings

    recorder = RunnerTimings()
    traced: list[Any] = []
    enqueued = time.perf_counter()
    tasks = [
        SimpleNamespace(rows=2, enqueued=enqueued, interest=SimpleNamespace(trace=traced)),
        SimpleNamespace(rows=1, enqueued=enqueued, interest=SimpleNamespace(trace=None)),
    ]
    started = time.perf_counter()
    before = time.time_ns()
    time.sleep(0.002)  # the batch ran longer than its model call
    recorder.batch_ran("m", 3, "serving_default", tasks, started, 3, 4, 0.001)
    names = [record[0] for record in traced]
    assert names == ["queue", "batch", "model run"]
    (_, q_start, q_end, _), (_, b_start, b_end, batch), (_, r_start, r_end, _) = traced
    assert q_start <= q_end == b_start <= r_start <= r_end == b_end
    assert abs(b_start - before) < 50_000_000  # the perf_counter times land on the wall clock
    assert batch == {
        "workbench.model.name": "m",
        "workbench.model.version": 3,
        "workbench.model.signature": "serving_default",
        "workbench.batch.requests": 2,
        "workbench.batch.rows": 3,
        "workbench.batch.padded_rows": 4,
    }
    alone: list[Any] = []
    recorder.ran_alone(alone, time.perf_counter(), None)  # failed before its call: its wait alone
    assert [record[0] for record in alone] == ["queue"]
    recorder.ran_alone(None, time.perf_counter(), 0.001)  # not traced: nothing, and no error
