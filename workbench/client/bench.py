"""A closed-loop load generator for TF Serving's and the Open Inference Protocol's (v2) REST and gRPC predict APIs.

N concurrent clients each send a request, wait for its answer, and send the next, for a duration or a
request count; the result has throughput and latency percentiles. It must not be the bottleneck it
measures, so requests are encoded once up front and answers are not decoded (only their status is read):
gRPC goes through ``grpc.aio`` with pre-serialized bytes, and REST through a minimal HTTP/1.1 keep-alive
client on asyncio streams, a few times cheaper per request than a general HTTP client library. v2 requests are
built by :mod:`workbench.protocol.v2_client`, as :class:`~workbench.client.Client` builds them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import ssl
import time
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from workbench.client.protocols import GRPC_PROTOCOLS, V2_PROTOCOLS, canonical_protocol
from workbench.client.protocols import PROTOCOLS as PROTOCOLS  # the front ends' --protocol choices, defaults here
from workbench.client.tls import ClientTLS
from workbench.config.vocabulary import Argument, renamed_keywords
from workbench.core.signatures import DEFAULT_SIGNATURE
from workbench.protocol import v2_client as v2

PREDICT_METHOD = "/tensorflow.serving.PredictionService/Predict"

# The defaults of every front end (``workbench bench``, ``%serve bench``, the functions here), so that the same
# command measures the same thing wherever it is typed. REST, because it is what a notebook's client, curl and a
# browser speak and what ``%serve predict`` and ``Client`` use by default; gRPC is one flag away. Five seconds:
# after the warm-up requests, enough samples for a stable p99 even at a few hundred requests/s, and short enough
# to keep a notebook cell interactive.
DEFAULT_PROTOCOL = "rest"
DEFAULT_DURATION_S = 5.0
DEFAULT_CONCURRENCY = 1
# The load's options, declared once for `workbench bench` and `%serve bench`: each takes them in its own order.
LOAD_ARGUMENTS: Mapping[str, Argument] = {
    "protocol": Argument.of("--protocol", choices=PROTOCOLS, default=DEFAULT_PROTOCOL, help="the API to load"),
    "grpc": Argument.of(
        "--grpc", dest="protocol", action="store_const", const="grpc", help="short for --protocol=grpc"
    ),
    "signature_name": Argument.of(
        "--signature_name", default="", metavar="NAME", help="the signature (default: serving_default)"
    ),
    "concurrency": Argument.of(
        "--concurrency",
        "--concurrency-range",
        dest="concurrency",
        default=str(DEFAULT_CONCURRENCY),
        metavar="N|START:END[:STEP]",
        help="clients in flight at once (closed loop); a range measures each, as perf_analyzer's --concurrency-range",
    ),
    "request_rate": Argument.of(
        "--request_rate",
        "--request-rate-range",
        dest="request_rate",
        default=None,
        metavar="R|START:END[:STEP]",
        help="requests a second, sent whatever the answers (open loop), instead of --concurrency; a range measures "
        "each",
    ),
    "request_distribution": Argument.of(
        "--request_distribution",
        "--request-distribution",
        dest="request_distribution",
        choices=("constant", "poisson"),
        default="constant",
        help="how --request_rate's requests are spaced (default: constant)",
    ),
    "measurement_interval": Argument.of(
        "--measurement_interval",
        "--measurement-interval",
        dest="measurement_interval",
        type=float,
        default=None,
        metavar="MS",
        help="measure in windows of MS milliseconds until three agree, as perf_analyzer (default 5000 where a "
        "range, a rate or an export asks for windows)",
    ),
    "stability_percentage": Argument.of(
        "--stability_percentage",
        "--stability-percentage",
        dest="stability_percentage",
        type=float,
        default=None,
        metavar="P",
        help="how close (in %%) the last three windows' throughput and latency must be (default 10)",
    ),
    "max_trials": Argument.of(
        "--max_trials",
        "--max-trials",
        dest="max_trials",
        type=int,
        default=None,
        metavar="N",
        help="windows to try before a point is reported unstable (default 10)",
    ),
    "shared_memory": Argument.of(
        "--shared_memory",
        "--shared-memory",
        dest="shared_memory",
        choices=("none", "system"),
        default="none",
        help="system: the inputs travel in a shared-memory region (v2 protocols, a server on this host), measured "
        "in windows",
    ),
    "csv": Argument.of(
        "--csv", "-f", dest="csv", default=None, metavar="FILE", help="write the points as perf_analyzer's CSV"
    ),
    "duration": Argument.of(
        "--duration", type=float, metavar="S", help=f"seconds to run (default: {DEFAULT_DURATION_S:g})"
    ),
    "requests": Argument.of(
        "--requests", type=int, metavar="N", help="stop after this many requests instead of a duration"
    ),
}
# gRPC clients per channel. One channel is one HTTP/2 connection, and the kernel gives a connection to one worker
# of `workbench serve --num_workers`: a channel per few clients spreads the load over the workers, as many
# independent clients would, while a few clients still share a connection as real ones do.
CLIENTS_PER_CHANNEL = 4


@dataclasses.dataclass
class BenchResult:
    protocol: str
    model: str
    concurrency: int
    requests: int
    errors: int
    seconds: float
    latencies_ms: list[float] = dataclasses.field(repr=False, default_factory=list)

    @property
    def requests_per_second(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.latencies_ms, q)) if self.latencies_ms else float("nan")

    def summary(self) -> dict[str, Any]:
        return {
            "protocol": self.protocol,
            "model": self.model,
            "concurrency": self.concurrency,
            "requests": self.requests,
            "errors": self.errors,
            "seconds": round(self.seconds, 3),
            "requests_per_second": round(self.requests_per_second, 1),
            "p50_ms": round(self.percentile(50), 3),
            "p95_ms": round(self.percentile(95), 3),
            "p99_ms": round(self.percentile(99), 3),
        }


def rest_predict_body(inputs: Mapping[str, np.ndarray], signature_name: str = "") -> bytes:
    """A columnar ``:predict`` body for ``inputs``."""
    doc: dict[str, Any] = {"inputs": {k: np.asarray(v).tolist() for k, v in inputs.items()}}
    if signature_name:
        doc["signature_name"] = signature_name
    return json.dumps(doc, separators=(",", ":")).encode()


def grpc_predict_bytes(model: str, inputs: Mapping[str, np.ndarray], signature_name: str = "") -> bytes:
    import workbench.runtime.tensorflow_protos  # noqa: F401  # isort: skip  (no tensorflow/__init__)
    from tensorflow_serving.apis import predict_pb2

    from workbench.protocol.tensor_proto import from_numpy

    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = signature_name
    for alias, value in inputs.items():
        from_numpy(np.asarray(value), request.inputs[alias])
    return request.SerializeToString()


class _Clock:
    """Shared stop condition of the clients: a deadline and/or a request budget."""

    def __init__(self, duration: float | None, total: int | None) -> None:
        self.deadline = time.perf_counter() + duration if duration else None
        self.remaining = total

    def take(self) -> bool:
        if self.deadline is not None and time.perf_counter() >= self.deadline:
            return False
        if self.remaining is not None:
            if self.remaining <= 0:
                return False
            self.remaining -= 1
        return True


async def read_answer(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One HTTP/1.1 answer on a keep-alive connection: its status code (three digits) and its body."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    return head[9:12], await reader.readexactly(length)


async def _rest_client(
    host: str, port: int, request: bytes, clock: _Clock, result: BenchResult, tls: ssl.SSLContext | None
) -> None:
    reader, writer = await asyncio.open_connection(host, port, ssl=tls)
    try:
        while clock.take():
            started = time.perf_counter()
            writer.write(request)
            status, _ = await read_answer(reader)
            result.latencies_ms.append((time.perf_counter() - started) * 1000)
            result.requests += 1
            if status != b"200":
                result.errors += 1
    finally:
        writer.close()


async def _grpc_client(
    channel: Any, method: str, request: bytes, clock: _Clock, result: BenchResult, timeout: float
) -> None:
    import grpc

    call = channel.unary_unary(method)  # bytes in, bytes out: no client-side protobuf work
    while clock.take():
        started = time.perf_counter()
        try:
            await call(request, timeout=timeout)
        except grpc.aio.AioRpcError:
            result.errors += 1
        result.latencies_ms.append((time.perf_counter() - started) * 1000)
        result.requests += 1


def resolve_load(concurrency: int, duration: float | None, requests: int | None) -> tuple[float | None, int | None]:
    """Check a front end's load options (named as its flags are) and resolve the default stop condition.

    Returns ``(duration, requests)``: a request count, or else a duration (:data:`DEFAULT_DURATION_S` if none).
    """
    if concurrency < 1:
        raise ValueError("--concurrency must be at least 1")
    if duration is not None and requests is not None:
        raise ValueError("give --duration or --requests, not both")
    if (duration is not None and duration <= 0) or (requests is not None and requests < 1):
        raise ValueError("--duration and --requests must be positive")
    if requests is not None:
        return None, requests
    return (DEFAULT_DURATION_S if duration is None else duration), None


def _http_request(
    protocol: str,
    host: str,
    port: int,
    model: str,
    inputs: Mapping[str, np.ndarray],
    signature_name: str,
    binary_data: bool | None,
) -> bytes:
    """One whole HTTP/1.1 request (head and body), sent as is by every REST client of the load."""
    headers = {"Content-Type": "application/json"}
    if protocol == "rest":
        path, body = f"/v1/models/{model}:predict", rest_predict_body(inputs, signature_name)
    else:
        request = v2.rest_infer_request(inputs, binary_data=binary_data)
        path, body, headers = f"/v2/models/{model}/infer", request.body, request.headers
    return http_post(host, port, path, body, headers)


def http_post(host: str, port: int, path: str, body: bytes, headers: Mapping[str, str]) -> bytes:
    """A whole HTTP/1.1 POST, head and body, as a load sends it again and again on a keep-alive connection."""
    head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    return f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


def _grpc_request(
    protocol: str, model: str, inputs: Mapping[str, np.ndarray], signature_name: str
) -> tuple[str, bytes]:
    """The method and the serialized request every gRPC client of the load sends."""
    if protocol == "grpc":
        return PREDICT_METHOD, grpc_predict_bytes(model, inputs, signature_name)
    return v2.INFER_METHOD, v2.grpc_infer_request(model, inputs).SerializeToString()


def grpc_method(protocol: str) -> str:
    """The gRPC method a load of ``protocol`` calls."""
    return PREDICT_METHOD if canonical_protocol(protocol) == "grpc" else v2.INFER_METHOD


def encode_requests(
    target: str,
    protocol: str,
    model: str,
    inputs: Sequence[Mapping[str, np.ndarray]],
    signature_name: str = "",
    binary_data: bool | None = None,
) -> list[bytes]:
    """Each of ``inputs`` as the load sends it, encoded once: a whole HTTP/1.1 request for REST (to ``target``), a
    serialized message for gRPC (to :func:`grpc_method`)."""
    protocol = canonical_protocol(protocol)
    if protocol in GRPC_PROTOCOLS:
        return [_grpc_request(protocol, model, one, signature_name)[1] for one in inputs]
    url = urlsplit(target if "://" in target else f"http://{target}")
    host, port = url.hostname or "127.0.0.1", url.port or (443 if url.scheme == "https" else 80)
    return [_http_request(protocol, host, port, model, one, signature_name, binary_data) for one in inputs]


@renamed_keywords(clients="concurrency", signature="signature_name")
async def run_load_async(
    target: str,
    protocol: str,
    model: str,
    inputs: Mapping[str, np.ndarray],
    *,
    concurrency: int = DEFAULT_CONCURRENCY,
    duration: float | None = DEFAULT_DURATION_S,
    requests: int | None = None,
    signature_name: str = "",
    warmup_requests: int = 20,
    timeout: float = 30.0,
    binary_data: bool | None = None,
    tls: ClientTLS | None = None,
) -> BenchResult:
    """Drive ``target`` (``http://host:port``, ``https://host:port`` or ``host:port`` for REST, ``host:port`` for
    gRPC) and measure it.

    ``protocol`` is one of :data:`PROTOCOLS`; v2 requests run the model's ``serving_default`` signature, and over
    REST send their tensors as :class:`~workbench.client.Client` does (``binary_data``: None, raw bytes for
    large tensors; True, always; False, JSON only). ``clients=`` and ``signature=`` (the magic's earlier option
    names) are accepted for ``concurrency=`` and ``signature_name=``. ``tls`` secures gRPC (and says how an https
    target is checked: by default, against the system's trust store).
    """
    if duration is None and requests is None:
        raise ValueError("give a duration or a request count")
    protocol = canonical_protocol(protocol)
    if protocol in V2_PROTOCOLS and signature_name not in ("", DEFAULT_SIGNATURE):
        raise ValueError(f"the v2 protocol runs a model's {DEFAULT_SIGNATURE} signature, not {signature_name!r}")
    result = BenchResult(protocol=protocol, model=model, concurrency=concurrency, requests=0, errors=0, seconds=0)
    if protocol not in GRPC_PROTOCOLS:
        url = urlsplit(target if "://" in target else f"http://{target}")
        https = url.scheme == "https"
        host, port = url.hostname or "127.0.0.1", url.port or (443 if https else 80)
        request = _http_request(protocol, host, port, model, inputs, signature_name, binary_data)
        context = (tls or ClientTLS()).ssl_context() if https else None  # one context: sessions are reused

        def client(clock: _Clock, into: BenchResult) -> Any:
            return _rest_client(host, port, request, clock, into, context)

        await asyncio.gather(
            *(client(_Clock(None, warmup_requests), BenchResult(**_blank(result))) for _ in range(min(concurrency, 4)))
        )
        clock = _Clock(duration, requests)
        started = time.perf_counter()
        await asyncio.gather(*(client(clock, result) for _ in range(concurrency)))
    else:
        import grpc

        method, payload = _grpc_request(protocol, model, inputs, signature_name)
        options = [
            ("grpc.max_receive_message_length", -1),
            ("grpc.max_send_message_length", -1),
            # Channels of one process share connections unless told not to: each channel its own connection.
            ("grpc.use_local_subchannel_pool", 1),
        ]
        credentials = tls.grpc_credentials() if tls is not None else None
        channels = [
            grpc.aio.secure_channel(target, credentials, options=options)
            if credentials is not None
            else grpc.aio.insecure_channel(target, options=options)
            for _ in range(-(-concurrency // CLIENTS_PER_CHANNEL))
        ]
        try:
            await asyncio.gather(
                *(
                    _grpc_client(
                        channels[i % len(channels)],
                        method,
                        payload,
                        _Clock(None, warmup_requests),
                        BenchResult(**_blank(result)),
                        timeout,
                    )
                    for i in range(max(4, len(channels)))  # every connection warm
                )
            )
            clock = _Clock(duration, requests)
            started = time.perf_counter()
            await asyncio.gather(
                *(
                    _grpc_client(channels[i // CLIENTS_PER_CHANNEL], method, payload, clock, result, timeout)
                    for i in range(concurrency)
                )
            )
        finally:
            await asyncio.gather(*(channel.close() for channel in channels))
    result.seconds = time.perf_counter() - started
    return result


def _blank(result: BenchResult) -> dict[str, Any]:
    return {
        "protocol": result.protocol,
        "model": result.model,
        "concurrency": result.concurrency,
        "requests": 0,
        "errors": 0,
        "seconds": 0.0,
    }


def run_load(target: str, protocol: str, model: str, inputs: Mapping[str, np.ndarray], **kwargs: Any) -> BenchResult:
    """Synchronous :func:`run_load_async`, on a fresh event loop (a thread of its own inside a notebook's kernel)."""
    from workbench.runtime.loop import run_to_completion

    return run_to_completion(lambda: run_load_async(target, protocol, model, inputs, **kwargs))


def format_table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in columns}
    lines = ["  ".join(c.rjust(widths[c]) for c in columns)]
    lines += ["  ".join(str(r.get(c, "")).rjust(widths[c]) for c in columns) for r in rows]
    return "\n".join(lines)


def input_dtypes(
    target: str, protocol: str, model: str, signature_name: str = "", tls: ClientTLS | None = None
) -> dict[str, np.dtype[Any]]:
    """The signature's input dtypes, read from the server's metadata (so JSON numbers get the right type)."""
    from workbench.client.facade import Client

    grpc = canonical_protocol(protocol) in GRPC_PROTOCOLS
    url = None if grpc else (target if "://" in target else f"http://{target}")
    files = dataclasses.asdict(tls) if tls is not None else {}
    with Client(url, target if grpc else None, protocol=protocol, tls=tls is not None, **files) as client:
        signature = client.signature(model, signature_name)
    return {alias: spec.dtype for alias, spec in signature.inputs.items()}
