"""OpenTelemetry tracing end to end: `workbench serve` exporting OTLP to receivers the tests run.

The receivers are real OTLP endpoints written here with opentelemetry-proto: an HTTP server taking
``POST /v1/traces`` (``application/x-protobuf`` ExportTraceServiceRequest), and a gRPC TraceService. The server is a
real ``workbench serve`` process with two workers and batching on, configured by the standard ``OTEL_*`` variables
only; requests carry W3C ``traceparent`` headers and metadata, several at once so that batches hold several.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import http.server
import json
import random
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import requests
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

import workbench.runtime.tensorflow_protos  # noqa: F401  # isort: skip  (TF Serving's protos, no tensorflow)
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.waiting import wait_until
from tests.wire.test_cli import free_port, workbench_env

MODEL = """
import numpy as np


class Model:
    inputs = {"x": ("float32", [-1, 2])}
    outputs = {"y": ("float32", [-1, 2])}

    def predict(self, inputs):
        return {"y": inputs["x"] * 2}
"""
# Four rows fill a batch at once; fewer wait up to a second for company (so concurrent requests share a batch).
BATCHING = "max_batch_size { value: 4 } batch_timeout_micros { value: 1000000 } num_batch_threads { value: 1 }"
CONCURRENT = 4
SPAN_WAIT_S = 30


# ------------------------------------------------------------------------------------------------ receivers
class Spans:
    """Every span a receiver decoded, with its resource's attributes; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: list[tuple[dict[str, Any], Any]] = []
        self.requests = 0

    def add(self, export: trace_service_pb2.ExportTraceServiceRequest) -> None:
        with self._lock:
            self.requests += 1
            for resource_spans in export.resource_spans:
                resource = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    self._spans.extend((resource, span) for span in scope_spans.spans)

    def all(self) -> list[Any]:
        with self._lock:
            return [span for _, span in self._spans]

    def resources(self) -> list[dict[str, Any]]:
        with self._lock:
            return [resource for resource, _ in self._spans]

    def trace(self, trace_id: bytes) -> list[Any]:
        return [span for span in self.all() if span.trace_id == trace_id]

    def named(self, name: str) -> list[Any]:
        return [span for span in self.all() if span.name == name]


def _value(value: Any) -> Any:
    return getattr(value, value.WhichOneof("value")) if value.WhichOneof("value") else None


def attributes(span: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in span.attributes}


class OtlpHttpReceiver(http.server.ThreadingHTTPServer):
    """OTLP/HTTP, binary protobuf: what a collector's ``otlphttp`` receiver takes."""

    daemon_threads = True

    def __init__(self) -> None:
        self.spans = Spans()
        spans = self.spans

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/x-protobuf":
                    self.send_error(400 if self.path == "/v1/traces" else 404)
                    return
                export = trace_service_pb2.ExportTraceServiceRequest()
                export.ParseFromString(body)
                spans.add(export)
                answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()


class OtlpGrpcReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    """OTLP/gRPC: opentelemetry.proto.collector.trace.v1.TraceService/Export."""

    def __init__(self) -> None:
        self.spans = Spans()
        self.server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self.server)
        self.endpoint = f"http://127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    def Export(self, request: Any, context: Any) -> Any:  # noqa: N802
        self.spans.add(request)
        return trace_service_pb2.ExportTraceServiceResponse()


# ------------------------------------------------------------------------------------------------ the server
class TracedServer:
    """A `workbench serve` process with the OTEL_* variables it was given, and clients of its ports."""

    def __init__(self, proc: subprocess.Popen[bytes], log: Path, rest_port: int, grpc_port: int) -> None:
        self.proc, self.log = proc, log
        self.rest = f"http://127.0.0.1:{rest_port}"
        self.grpc_target = f"127.0.0.1:{grpc_port}"
        self.channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
        self.tfs = prediction_service_pb2_grpc.PredictionServiceStub(self.channel)
        self.v2 = service_pb2_grpc.GRPCInferenceServiceStub(self.channel)

    def wait_ready(self) -> None:
        def ready() -> bool:
            assert self.proc.poll() is None, self.log.read_text(errors="replace")[-3000:]
            with contextlib.suppress(requests.RequestException):
                return requests.get(self.rest + "/v2/models/m/ready", timeout=2).status_code == 200
            return False

        wait_until(ready, timeout=120, what="the traced server to get ready")

    def stop(self) -> int:
        """SIGTERM (a drain, which exports the spans still buffered); the exit status."""
        self.channel.close()
        self.proc.terminate()
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            pytest.fail(f"workbench did not stop within 30 s: {self.log.read_text(errors='replace')[-3000:]}")


def model_repository(root: Path) -> Path:
    repo = root / "repo"
    (repo / "m" / "1").mkdir(parents=True)
    (repo / "m" / "1" / "model.py").write_text(textwrap.dedent(MODEL))
    (root / "batching.txt").write_text(BATCHING)
    return repo


def start_server(root: Path, environ: dict[str, str], *flags: str) -> TracedServer:
    rest_port, grpc_port = free_port(), free_port()
    cwd = root / f"serve-{rest_port}"
    cwd.mkdir()
    env = {**workbench_env(), **environ}
    log = cwd / "output.txt"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "workbench", "serve", f"--rest_api_port={rest_port}", f"--port={grpc_port}",
                f"--model_repository={model_repository(root)}", "--allow_python_models",
                "--enable_batching", f"--batching_parameters_file={root / 'batching.txt'}", *flags,
            ],
            cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    server = TracedServer(proc, log, rest_port, grpc_port)
    server.wait_ready()
    return server


def otel_environment(endpoint: str, protocol: str = "http/protobuf") -> dict[str, str]:
    return {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_SERVICE_NAME": "traced-workbench",
        "OTEL_BSP_SCHEDULE_DELAY": "50",  # export within 50 ms rather than 5 s: the tests wait for the spans
    }


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpHttpReceiver]:
    receiver = OtlpHttpReceiver()
    yield receiver
    receiver.shutdown()


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory, receiver: OtlpHttpReceiver) -> Iterator[TracedServer]:
    """Two workers, each exporting its own spans over OTLP/HTTP."""
    server = start_server(tmp_path_factory.mktemp("traced"), otel_environment(receiver.endpoint), "--num_workers=2")
    yield server
    assert server.stop() == 0


# ------------------------------------------------------------------------------------------------ the callers
def new_parent() -> tuple[str, bytes, bytes]:
    """A client's traceparent, with its trace id and span id as the spans' bytes."""
    trace_id, span_id = random.getrandbits(128) | 1, random.getrandbits(64) | 1
    return f"00-{trace_id:032x}-{span_id:016x}-01", trace_id.to_bytes(16, "big"), span_id.to_bytes(8, "big")


def tfs_rest(server: TracedServer, traceparent: str) -> None:
    r = requests.post(
        server.rest + "/v1/models/m:predict",
        json={"instances": [[1.0, 2.0]]},
        headers={"traceparent": traceparent, "tracestate": "vendor=abc"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    assert r.json() == {"predictions": [[2.0, 4.0]]}


def tfs_grpc(server: TracedServer, traceparent: str) -> None:
    from workbench.protocol.tensor_proto import from_numpy

    request = predict_pb2.PredictRequest()
    request.model_spec.name = "m"
    from_numpy(np.asarray([[1.0, 2.0]], dtype=np.float32), request.inputs["x"])
    response = server.tfs.Predict(request, timeout=30, metadata=(("traceparent", traceparent),))
    assert list(response.outputs["y"].float_val) == [2.0, 4.0]


def v2_rest(server: TracedServer, traceparent: str) -> None:
    body = {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1.0, 2.0]}]}
    r = requests.post(server.rest + "/v2/models/m/infer", json=body, headers={"traceparent": traceparent}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == [2.0, 4.0]


def v2_grpc(server: TracedServer, traceparent: str) -> None:
    request = service_pb2.ModelInferRequest(model_name="m")
    tensor = request.inputs.add(name="x", datatype="FP32", shape=[1, 2])
    tensor.contents.fp32_contents.extend([1.0, 2.0])
    response = server.v2.ModelInfer(request, timeout=30, metadata=(("traceparent", traceparent),))
    assert np.frombuffer(response.raw_output_contents[0], np.float32).tolist() == [2.0, 4.0]


def v2_grpc_stream(server: TracedServer, traceparent: str) -> None:
    """One request on a ModelStreamInfer stream, the stream's metadata carrying the context."""
    request = service_pb2.ModelInferRequest(model_name="m")
    tensor = request.inputs.add(name="x", datatype="FP32", shape=[1, 2])
    tensor.contents.fp32_contents.extend([1.0, 2.0])
    responses = server.v2.ModelStreamInfer(iter([request]), timeout=30, metadata=(("traceparent", traceparent),))
    (response,) = list(responses)
    assert not response.error_message, response.error_message
    assert np.frombuffer(response.infer_response.raw_output_contents[0], np.float32).tolist() == [2.0, 4.0]


PROTOCOLS: dict[str, tuple[Callable[[TracedServer, str], None], str]] = {
    "tfs-rest": (tfs_rest, "POST /v1/models/{model}:predict"),
    "tfs-grpc": (tfs_grpc, "tensorflow.serving.PredictionService/Predict"),
    "v2-rest": (v2_rest, "POST /v2/models/{model}/infer"),
    "v2-grpc": (v2_grpc, "inference.GRPCInferenceService/ModelInfer"),
}


def spans_of(receiver: OtlpHttpReceiver | OtlpGrpcReceiver, trace_id: bytes, names: set[str]) -> dict[str, list[Any]]:
    """The spans of one trace by name, once every name in ``names`` has arrived."""
    found: dict[str, list[Any]] = {}

    def arrived() -> bool:
        found.clear()
        for span in receiver.spans.trace(trace_id):
            found.setdefault(span.name, []).append(span)
        return names <= set(found)

    wait_until(arrived, timeout=SPAN_WAIT_S, what=f"spans {names} of a trace")
    return found


# ------------------------------------------------------------------------------------------------ the tests
@pytest.mark.parametrize("protocol", list(PROTOCOLS))
def test_concurrent_requests_continue_their_traces_and_share_batches(
    traced: TracedServer, receiver: OtlpHttpReceiver, protocol: str
) -> None:
    call, server_span_name = PROTOCOLS[protocol]
    parents = [new_parent() for _ in range(CONCURRENT)]
    with concurrent.futures.ThreadPoolExecutor(CONCURRENT) as pool:
        list(pool.map(lambda parent: call(traced, parent[0]), parents))

    request_spans = {}
    for _, trace_id, parent_span_id in parents:
        spans = spans_of(receiver, trace_id, {server_span_name, "queue", "answer"})
        (server,) = spans[server_span_name]
        assert server.parent_span_id == parent_span_id  # the client's span is the server span's parent
        assert server.kind == server.SPAN_KIND_SERVER
        assert server.status.code != server.status.STATUS_CODE_ERROR
        found = attributes(server)
        assert found["workbench.model.name"] == "m"
        assert found["workbench.model.version"] == 1
        assert found["workbench.model.signature"] == "serving_default"
        if "rest" in protocol:
            assert (found["http.request.method"], found["http.response.status_code"]) == ("POST", 200)
        else:
            assert (found["rpc.system"], found["rpc.grpc.status_code"]) == ("grpc", 0)
        if protocol == "tfs-rest":
            assert server.trace_state == "vendor=abc"
        (queue,) = spans["queue"]
        (answer,) = spans["answer"]
        assert queue.parent_span_id == server.span_id and answer.parent_span_id == server.span_id
        assert server.start_time_unix_nano <= queue.start_time_unix_nano <= queue.end_time_unix_nano
        assert answer.end_time_unix_nano <= server.end_time_unix_nano
        (to_batch,) = queue.links  # the queue span names the batch the request joined
        request_spans[server.span_id] = (server, to_batch.span_id)

    # Every batch links to each request in it; it lives in the trace of one of them, with the model's run under it.
    batch_ids = {batch_id for _, batch_id in request_spans.values()}
    wait_until(lambda: batch_ids <= {s.span_id for s in receiver.spans.named("batch")}, SPAN_WAIT_S, what="batches")
    batches = [span for span in receiver.spans.named("batch") if span.span_id in batch_ids]
    in_batches = 0
    for batch in batches:
        linked = {link.span_id for link in batch.links}
        members = {span_id for span_id, (_, batch_id) in request_spans.items() if batch_id == batch.span_id}
        assert linked == members
        assert attributes(batch)["workbench.batch.requests"] == len(members)
        assert attributes(batch)["workbench.batch.rows"] == len(members)
        assert batch.parent_span_id in members and batch.trace_id == request_spans[batch.parent_span_id][0].trace_id
        runs = [span for span in receiver.spans.trace(batch.trace_id) if span.parent_span_id == batch.span_id]
        assert [span.name for span in runs] == ["model run"]
        in_batches += len(members)
    assert in_batches == CONCURRENT
    assert len(batches) < CONCURRENT  # several requests shared a batch


def test_each_worker_exports_its_own_spans_once(traced: TracedServer, receiver: OtlpHttpReceiver) -> None:
    parents = [new_parent() for _ in range(8)]
    with concurrent.futures.ThreadPoolExecutor(len(parents)) as pool:
        list(pool.map(lambda parent: tfs_rest(traced, parent[0]), parents))
    for _, trace_id, _ in parents:
        spans_of(receiver, trace_id, {"POST /v1/models/{model}:predict"})
    span_ids = [span.span_id for span in receiver.spans.all()]
    assert len(span_ids) == len(set(span_ids))  # nothing exported twice (by two processes, or twice by one)
    resources = receiver.spans.resources()
    assert {resource["service.name"] for resource in resources} == {"traced-workbench"}
    assert len({resource["service.instance.id"] for resource in resources}) <= 2


def test_malformed_traceparent_is_served_in_a_new_trace_and_counted(
    traced: TracedServer, receiver: OtlpHttpReceiver
) -> None:
    def invalid_count() -> float:
        text = requests.get(traced.rest + "/metrics", timeout=10).text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("workbench_trace_context_invalid_total{")
        )

    before, since = invalid_count(), time.time_ns()
    trace_id = random.getrandbits(128) | 1
    malformed = [
        f"00-{trace_id:032X}-00f067aa0ba902b7-01",  # upper-case hex
        f"00-{trace_id:032x}-0000000000000000-01",  # an all-zero parent id
        "not a traceparent",
    ]

    def send(value: str) -> None:
        r = requests.post(
            traced.rest + "/v1/models/m:predict",
            json={"instances": [[1.0, 2.0]]},
            headers={"traceparent": value},
            timeout=30,
        )
        assert r.status_code == 200, r.text  # served as if it had sent none

    with concurrent.futures.ThreadPoolExecutor(len(malformed)) as pool:
        list(pool.map(send, malformed))
    wait_until(lambda: invalid_count() == before + len(malformed), timeout=SPAN_WAIT_S, what="the count")

    def roots() -> list[Any]:  # the server spans of those requests: each the root of a trace of its own
        return [
            span
            for span in receiver.spans.named("POST /v1/models/{model}:predict")
            if span.start_time_unix_nano >= since
        ]

    wait_until(lambda: len(roots()) == len(malformed), timeout=SPAN_WAIT_S, what="the new traces' spans")
    assert all(not span.parent_span_id for span in roots())
    assert len({span.trace_id for span in roots()}) == len(malformed)
    assert trace_id.to_bytes(16, "big") not in {span.trace_id for span in roots()}


@pytest.mark.parametrize(
    ("protocol", "server_span_name"),
    [("rest", "POST /v1/models/{model}:predict"), ("grpc", "tensorflow.serving.PredictionService/Predict")],
)
def test_notebook_client_under_a_current_span_is_the_parent(
    traced: TracedServer, receiver: OtlpHttpReceiver, protocol: str, server_span_name: str
) -> None:
    """The notebook's Client sends its current span's context: the server's span is that span's child."""
    from opentelemetry.sdk.trace import TracerProvider

    import workbench

    tracer = TracerProvider().get_tracer("notebook")
    client = workbench.Client(traced.rest, traced.grpc_target, protocol=protocol)
    x = np.asarray([[1.0, 2.0]], dtype=np.float32)
    try:
        with tracer.start_as_current_span("notebook cell") as cell:
            answer = client.predict("m", {"x": x})
            context = cell.get_span_context()
    finally:
        client.close()
    np.testing.assert_array_equal(answer["y"], x * 2)
    spans = spans_of(receiver, context.trace_id.to_bytes(16, "big"), {server_span_name})
    (server,) = spans[server_span_name]
    assert server.parent_span_id == context.span_id.to_bytes(8, "big")


def test_export_over_otlp_grpc(tmp_path: Path) -> None:
    receiver = OtlpGrpcReceiver()
    try:
        server = start_server(tmp_path, otel_environment(receiver.endpoint, "grpc"))
        try:
            unary, streamed = new_parent(), new_parent()
            with concurrent.futures.ThreadPoolExecutor(2) as pool:  # together: one batch, no wait for company
                done = [pool.submit(v2_grpc, server, unary[0]), pool.submit(v2_grpc_stream, server, streamed[0])]
                for future in done:
                    future.result()
            for name, (_, trace_id, parent_span_id) in [("ModelInfer", unary), ("ModelStreamInfer", streamed)]:
                spans = spans_of(receiver, trace_id, {f"inference.GRPCInferenceService/{name}", "queue", "answer"})
                (root,) = spans[f"inference.GRPCInferenceService/{name}"]
                assert root.parent_span_id == parent_span_id
        finally:
            assert server.stop() == 0
    finally:
        receiver.server.stop(None)


OFF_CHECK = """
import json, sys
import requests
from workbench.config.options import ServerOptions
from workbench.server import ServerThread

server = ServerThread(ServerOptions(rest_api_port=-1, port=0, model_repository=sys.argv[1], allow_python_models=True))
server.start()
r = requests.post(
    f"{server.rest_url}/v1/models/m:predict",
    json={"instances": [[1.0, 2.0]]},
    headers={"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
    timeout=30,
)
server.stop()
print(json.dumps({"status": r.status_code, "otel": sorted(m for m in sys.modules if m.startswith("opentelemetry"))}))
"""


def test_tracing_off_imports_no_opentelemetry(tmp_path: Path) -> None:
    """No OTEL_TRACES_EXPORTER: a request with a traceparent is served, and OpenTelemetry is never imported."""
    env = {k: v for k, v in workbench_env().items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", OFF_CHECK, str(model_repository(tmp_path))],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"status": 200, "otel": []}


def test_unknown_exporter_refuses_to_start(tmp_path: Path) -> None:
    env = dict(workbench_env(), OTEL_TRACES_EXPORTER="zipkin")
    done = subprocess.run(
        [sys.executable, "-m", "workbench", "serve", "--rest_api_port=0", "--port=0",
         f"--model_repository={model_repository(tmp_path)}", "--allow_python_models"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert "OTEL_TRACES_EXPORTER names zipkin" in done.stderr, done.stderr[-2000:]


def test_model_runners_record_their_part_and_the_frontend_exports_it_in_the_trace(tmp_path: Path) -> None:
    """With model runners, the frontend that sent a request has a ``model runner`` span, and under it what the runner
    (another process, which exports nothing itself) recorded of the request: its ``queue``, the ``batch`` it ran in
    and the batch's ``model run``, within the frontend's span and in the same trace."""
    receiver = OtlpHttpReceiver()
    try:
        server = start_server(tmp_path, otel_environment(receiver.endpoint), "--num_workers=1", "--model_runners=1")
        try:
            parents = [new_parent() for _ in range(2)]
            with concurrent.futures.ThreadPoolExecutor(len(parents)) as pool:
                list(pool.map(lambda parent: v2_rest(server, parent[0]), parents))
            for _, trace_id, parent_span_id in parents:
                names = {"POST /v2/models/{model}/infer", "model runner", "answer", "queue", "batch", "model run"}
                spans = spans_of(receiver, trace_id, names)
                (root,) = spans["POST /v2/models/{model}/infer"]
                (runner,) = spans["model runner"]
                assert root.parent_span_id == parent_span_id and runner.parent_span_id == root.span_id
                assert attributes(runner)["workbench.runner"] == "runner-0"
                (queue,), (batch,), (run,) = spans["queue"], spans["batch"], spans["model run"]
                assert queue.parent_span_id == batch.parent_span_id == run.parent_span_id == runner.span_id
                assert attributes(batch)["workbench.model.name"] == "m"
                assert attributes(batch)["workbench.batch.rows"] >= 1
                # In the runner, in order, within the frontend's span (one clock: the same machine).
                assert runner.start_time_unix_nano <= queue.start_time_unix_nano <= queue.end_time_unix_nano
                assert queue.end_time_unix_nano == batch.start_time_unix_nano
                assert batch.start_time_unix_nano <= run.start_time_unix_nano <= run.end_time_unix_nano
                assert run.end_time_unix_nano == batch.end_time_unix_nano <= runner.end_time_unix_nano
        finally:
            assert server.stop() == 0
    finally:
        receiver.shutdown()
