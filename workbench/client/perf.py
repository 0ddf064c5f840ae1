"""Measurement as perf_analyzer does it: a point's load runs without pause while it is measured window by window
until the windows agree, and the server says how its share of each request was spent.

- Load at a point is either **concurrency** (closed loop: N clients, each sending its next request once the last is
  answered) or **request rate** (open loop: requests sent at fixed or Poisson-distributed times whatever the
  answers, so a server that falls behind shows it as queueing and growing latency, not as a slower client).
- A point is **measured** after a warm-up, in windows of ``interval`` seconds, until the last three windows' throughput
  and mean latency are each within ``percentage`` % of their means (perf_analyzer's ``--stability-percentage``), or
  ``max_trials`` windows have run (then the point says it was not stable). Its figures are those three windows'.
- The **server's side** comes from the Open Inference Protocol's statistics extension (``/v2/models/{m}/stats``, or
  gRPC ``ModelStatistics``), read at the windows' edges: the time requests queued and ran, per request, and the mean
  batch the server formed. What remains of the latency is the network's and the two ends' sending and receiving.
  Servers without the extension (TF Serving) leave those columns empty.
- Requests are encoded once, before the load starts, and answers are not decoded: the client spends as little as it
  can, so that it measures the server rather than itself. Several requests (``--input_data``) are sent in turn.

:func:`perf_rows` names the figures as perf_analyzer's CSV does (times in microseconds), so its users' scripts read
them unchanged; workbench's own columns come after.
"""

from __future__ import annotations

import asyncio
import csv
import dataclasses
import itertools
import math
import ssl
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from workbench.client.tls import ClientTLS

DEFAULT_INTERVAL_S = 5.0  # perf_analyzer's --measurement-interval, 5000 ms
DEFAULT_STABILITY_PERCENTAGE = 10.0
DEFAULT_MAX_TRIALS = 10
DEFAULT_WARMUP_S = 1.0
STABLE_WINDOWS = 3  # as perf_analyzer: the last three windows must agree
MAX_IN_FLIGHT = 4096  # open loop: requests outstanding at once before the client itself becomes the limit
STATS_METHOD = "/inference.GRPCInferenceService/ModelStatistics"
STAGES = ("queue", "compute_input", "compute_infer", "compute_output")  # the statistics extension's, in order

# perf_analyzer's CSV columns (-f), in its order, then workbench's own.
PERF_COLUMNS = (
    "Inferences/Second",
    "Network+Server Send/Recv",
    "Server Queue",
    "Server Compute Input",
    "Server Compute Infer",
    "Server Compute Output",
    "p50 latency",
    "p90 latency",
    "p95 latency",
    "p99 latency",
    "Avg latency",
)
WORKBENCH_COLUMNS = ("Requests", "Errors", "Delayed Requests", "Avg Batch", "Windows", "Stable")


@dataclasses.dataclass(frozen=True)
class Point:
    """What load a point puts on the server: ``concurrency`` clients, or ``request_rate`` requests a second."""

    concurrency: int | None = None
    request_rate: float | None = None
    distribution: str = "constant"  # of an open loop's sending times: constant or poisson

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (self.request_rate is None):
            raise ValueError("a point has a concurrency or a request rate")
        if self.distribution not in ("constant", "poisson"):
            raise ValueError(f"the request distribution is constant or poisson, not {self.distribution!r}")


@dataclasses.dataclass(frozen=True)
class Stability:
    """How a point is measured (perf_analyzer's flags of the same names)."""

    interval_s: float = DEFAULT_INTERVAL_S
    percentage: float = DEFAULT_STABILITY_PERCENTAGE
    max_trials: int = DEFAULT_MAX_TRIALS
    warmup_s: float = DEFAULT_WARMUP_S

    def __post_init__(self) -> None:
        if self.interval_s <= 0 or self.percentage <= 0 or self.max_trials < STABLE_WINDOWS or self.warmup_s < 0:
            raise ValueError(
                f"the measurement interval and stability percentage must be positive, and --max_trials at least "
                f"{STABLE_WINDOWS}"
            )


@dataclasses.dataclass(frozen=True)
class ServerTimes:
    """The server's statistics over a span: requests that succeeded, and their total nanoseconds in each stage."""

    requests: int
    queue_ns: int
    compute_input_ns: int
    compute_infer_ns: int
    compute_output_ns: int
    inferences: int
    executions: int

    def __sub__(self, earlier: ServerTimes) -> ServerTimes:
        return ServerTimes(
            *(a - b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(earlier), strict=True))
        )

    def per_request_us(self, stage_ns: int) -> float | None:
        return stage_ns / self.requests / 1000 if self.requests else None


@dataclasses.dataclass
class PointResult:
    point: Point
    requests: int
    errors: int
    seconds: float
    rows_per_request: int
    latencies_us: list[float] = dataclasses.field(repr=False)
    delayed: int = 0  # open loop: requests sent late (the client could not keep the schedule)
    windows: int = 0
    stable: bool = False
    server: ServerTimes | None = None

    @property
    def inferences_per_second(self) -> float:
        return self.requests * self.rows_per_request / self.seconds if self.seconds else 0.0

    @property
    def requests_per_second(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    def latency_us(self, q: float) -> float:
        return float(np.percentile(self.latencies_us, q)) if self.latencies_us else math.nan

    @property
    def mean_latency_us(self) -> float:
        return float(np.mean(self.latencies_us)) if self.latencies_us else math.nan


# --------------------------------------------------------------------------------------------------- ranges
def parse_range(text: str, kind: Callable[[str], Any] = int) -> list[Any]:
    """``N``, or ``start:end[:step]`` as perf_analyzer's ranges: start, start+step, ... up to end (step 1)."""
    parts = [part.strip() for part in str(text).split(":")]
    if not 1 <= len(parts) <= 3 or not all(parts):
        raise ValueError(f"a range is N or start:end[:step], not {text!r}")
    try:
        values = [kind(part) for part in parts]
    except ValueError:
        raise ValueError(f"a range is N or start:end[:step] of numbers, not {text!r}") from None
    if any(value <= 0 for value in values):
        raise ValueError(f"a range's values are positive, not {text!r}")
    if len(values) == 1:
        return values
    start, end = values[0], values[1]
    step = values[2] if len(values) == 3 else kind("1")
    if end < start:
        raise ValueError(f"a range ends after it starts, not {text!r}")
    count = int(math.floor((end - start) / step + 1e-9)) + 1
    return [kind(str(start + i * step)) if kind is int else start + i * step for i in range(count)]


# --------------------------------------------------------------------------------------------- transports
class _Rest:
    """Keep-alive HTTP/1.1 connections, one request at a time each; as many as the requests in flight."""

    def __init__(self, host: str, port: int, tls: ssl.SSLContext | None) -> None:
        self.host, self.port, self.tls = host, port, tls
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def send(self, request: bytes) -> bool:
        from workbench.client.bench import read_answer

        connection = (
            self._idle.pop() if self._idle else await asyncio.open_connection(self.host, self.port, ssl=self.tls)
        )
        reader, writer = connection
        try:
            writer.write(request)
            status, _ = await read_answer(reader)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            writer.close()
            return False
        self._idle.append(connection)
        return status == b"200"

    async def close(self) -> None:
        for _, writer in self._idle:
            writer.close()
        self._idle.clear()


class _Grpc:
    """Requests spread over a few channels (HTTP/2 connections), as many at once as are in flight."""

    def __init__(self, channels: Sequence[Any], method: str, timeout: float) -> None:
        self._calls = [channel.unary_unary(method) for channel in channels]  # bytes in, bytes out
        self._next = itertools.cycle(self._calls)
        self.timeout = timeout

    async def send(self, request: bytes) -> bool:
        import grpc

        try:
            await next(self._next)(request, timeout=self.timeout)
        except grpc.aio.AioRpcError:
            return False
        return True


Send = Callable[[bytes], Awaitable[bool]]
Record = Callable[[float, float, bool], None]


# -------------------------------------------------------------------------------------------------- loads
async def _closed_loop(send: Send, requests: Iterator[bytes], clients: int, record: Record, stop: asyncio.Event) -> int:
    async def client() -> None:
        while not stop.is_set():
            request = next(requests)
            started = time.perf_counter()
            ok = await send(request)
            record(started, time.perf_counter(), ok)

    await asyncio.gather(*(client() for _ in range(clients)))
    return 0


async def _open_loop(
    send: Send, requests: Iterator[bytes], point: Point, record: Record, stop: asyncio.Event, seed: int
) -> int:
    """Send at the point's rate until stopped; how many requests went late (the client's own shortfall)."""
    assert point.request_rate is not None
    rng = np.random.default_rng(seed)
    mean_gap = 1.0 / point.request_rate
    in_flight: set[asyncio.Task[None]] = set()
    delayed = 0

    async def one(request: bytes) -> None:
        started = time.perf_counter()
        ok = await send(request)
        record(started, time.perf_counter(), ok)

    due = time.perf_counter()
    while not stop.is_set():
        due += float(rng.exponential(mean_gap)) if point.distribution == "poisson" else mean_gap
        wait = due - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)
        elif wait < -0.001:  # the loop could not keep up with the schedule
            delayed += 1
        if len(in_flight) >= MAX_IN_FLIGHT:
            delayed += 1
            await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
        task = asyncio.get_running_loop().create_task(one(next(requests)))
        in_flight.add(task)
        task.add_done_callback(in_flight.discard)
    if in_flight:
        await asyncio.wait(in_flight)
    return delayed


# ------------------------------------------------------------------------------------------- statistics
def server_times(doc: dict[str, Any]) -> ServerTimes:
    """The statistics extension's answer (every version of the model summed: a canary's traffic spans two)."""
    totals = [0] * 7
    for row in doc.get("model_stats", []):
        stats = row.get("inference_stats", {})
        values = (
            int(stats.get("success", {}).get("count", 0)),
            *(int(stats.get(stage, {}).get("ns", 0)) for stage in STAGES),
            int(row.get("inference_count", 0)),
            int(row.get("execution_count", 0)),
        )
        totals = [total + value for total, value in zip(totals, values, strict=True)]
    return ServerTimes(*totals)


async def _rest_stats(host: str, port: int, tls: ssl.SSLContext | None, model: str) -> ServerTimes | None:
    import orjson

    from workbench.client.bench import read_answer

    try:
        reader, writer = await asyncio.open_connection(host, port, ssl=tls)
    except OSError:
        return None
    try:
        writer.write(f"GET /v2/models/{model}/stats HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        status, body = await read_answer(reader)
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        return None
    finally:
        writer.close()
    if status != b"200":
        return None  # a server without the statistics extension (TF Serving)
    try:
        return server_times(orjson.loads(body))
    except (ValueError, TypeError, AttributeError):
        return None


async def _grpc_stats(channel: Any, model: str) -> ServerTimes | None:
    import grpc
    from google.protobuf.json_format import MessageToDict
    from tritonclient.grpc import service_pb2

    call = channel.unary_unary(
        STATS_METHOD,
        request_serializer=service_pb2.ModelStatisticsRequest.SerializeToString,
        response_deserializer=service_pb2.ModelStatisticsResponse.FromString,
    )
    try:
        answer = await call(service_pb2.ModelStatisticsRequest(name=model), timeout=10)
    except grpc.aio.AioRpcError:
        return None  # a server without the statistics extension (TF Serving)
    return server_times(MessageToDict(answer, preserving_proto_field_name=True))


# ----------------------------------------------------------------------------------------------- measuring
@dataclasses.dataclass
class _Window:
    start: float
    end: float
    latencies: list[float]
    errors: int
    server: ServerTimes | None

    @property
    def throughput(self) -> float:
        return len(self.latencies) / (self.end - self.start)

    @property
    def mean_latency(self) -> float:
        return float(np.mean(self.latencies)) if self.latencies else math.nan


def _stable(windows: Sequence[_Window], percentage: float) -> bool:
    if len(windows) < STABLE_WINDOWS or any(not window.latencies for window in windows):
        return False
    for figure in (lambda w: w.throughput, lambda w: w.mean_latency):
        values = [figure(window) for window in windows]
        mean = sum(values) / len(values)
        if any(abs(value - mean) > mean * percentage / 100 for value in values):
            return False
    return True


async def measure_point(
    send: Send,
    requests: Sequence[bytes],
    point: Point,
    stability: Stability,
    stats: Callable[[], Awaitable[ServerTimes | None]] | None = None,
    rows_per_request: int = 1,
    seed: int = 0,
) -> PointResult:
    """Put ``point``'s load on the server and measure it until stable (see the module's docstring)."""
    finished: list[tuple[float, float, bool]] = []  # (end, latency µs, ok), in the order answers came

    def record(started: float, ended: float, ok: bool) -> None:
        finished.append((ended, (ended - started) * 1e6, ok))

    cycle = itertools.cycle(requests)
    stop = asyncio.Event()
    if point.concurrency is not None:
        load = asyncio.ensure_future(_closed_loop(send, cycle, point.concurrency, record, stop))
    else:
        load = asyncio.ensure_future(_open_loop(send, cycle, point, record, stop, seed))
    try:
        await asyncio.sleep(stability.warmup_s)
        edge, edge_stats, taken = time.perf_counter(), await stats() if stats else None, len(finished)
        windows: list[_Window] = []
        while len(windows) < stability.max_trials and not load.done():
            await asyncio.sleep(stability.interval_s)
            now, now_stats, upto = time.perf_counter(), await stats() if stats else None, len(finished)
            done = finished[taken:upto]
            server = now_stats - edge_stats if now_stats is not None and edge_stats is not None else None
            latencies = [latency for _, latency, ok in done if ok]
            windows.append(_Window(edge, now, latencies, sum(1 for *_, ok in done if not ok), server))
            edge, edge_stats, taken = now, now_stats, upto
            if _stable(windows[-STABLE_WINDOWS:], stability.percentage):
                break
    finally:
        stop.set()
        delayed = await load
    used = windows[-STABLE_WINDOWS:]
    servers = [window.server for window in used]
    return PointResult(
        point=point,
        requests=sum(len(window.latencies) + window.errors for window in used),
        errors=sum(window.errors for window in used),
        seconds=sum(window.end - window.start for window in used),
        rows_per_request=rows_per_request,
        latencies_us=[latency for window in used for latency in window.latencies],
        delayed=delayed,
        windows=len(windows),
        stable=_stable(used, stability.percentage),
        server=_sum(servers) if servers and all(s is not None for s in servers) else None,
    )


def _sum(parts: Sequence[ServerTimes | None]) -> ServerTimes:
    fields = [dataclasses.astuple(part) for part in parts if part is not None]
    return ServerTimes(*(sum(values) for values in zip(*fields, strict=True)))


async def measure_async(
    target: str,
    protocol: str,
    model: str,
    requests: Sequence[bytes],
    points: Sequence[Point],
    stability: Stability = Stability(),
    *,
    rows_per_request: int = 1,
    tls_context: ssl.SSLContext | None = None,
    grpc_credentials: Any = None,
    timeout: float = 30.0,
    on_point: Callable[[PointResult], None] | None = None,
) -> list[PointResult]:
    """Each point measured in turn, on the same connections. ``requests``: the encoded requests the load sends in
    turn (what :mod:`workbench.client.bench` encodes: whole HTTP requests for REST, serialized messages for gRPC);
    ``on_point`` is told each point's result as it is measured."""
    from workbench.client.protocols import GRPC_PROTOCOLS

    if protocol in GRPC_PROTOCOLS:
        import grpc

        from workbench.client.bench import grpc_method

        options = [("grpc.max_receive_message_length", -1), ("grpc.use_local_subchannel_pool", 1)]
        channels = [
            grpc.aio.secure_channel(target, grpc_credentials, options=options)
            if grpc_credentials is not None
            else grpc.aio.insecure_channel(target, options=options)
            for _ in range(4)
        ]
        transport = _Grpc(channels, grpc_method(protocol), timeout)

        async def stats() -> ServerTimes | None:
            return await _grpc_stats(channels[0], model)

        try:
            return await _each_point(transport.send, requests, points, stability, stats, rows_per_request, on_point)
        finally:
            await asyncio.gather(*(channel.close() for channel in channels))
    url = urlsplit(target if "://" in target else f"http://{target}")
    host, port = url.hostname or "127.0.0.1", url.port or (443 if url.scheme == "https" else 80)
    rest = _Rest(host, port, tls_context if url.scheme == "https" else None)

    async def rest_stats() -> ServerTimes | None:
        return await _rest_stats(host, port, rest.tls, model)

    try:
        return await _each_point(rest.send, requests, points, stability, rest_stats, rows_per_request, on_point)
    finally:
        await rest.close()


async def _each_point(
    send: Send,
    requests: Sequence[bytes],
    points: Sequence[Point],
    stability: Stability,
    stats: Callable[[], Awaitable[ServerTimes | None]],
    rows_per_request: int,
    on_point: Callable[[PointResult], None] | None,
) -> list[PointResult]:
    results = []
    for point in points:
        result = await measure_point(send, requests, point, stability, stats, rows_per_request)
        results.append(result)
        if on_point is not None:
            on_point(result)
    return results


# ----------------------------------------------------------------------------------------------- reporting
def perf_rows(results: Sequence[PointResult]) -> list[dict[str, Any]]:
    """Each point as a row of perf_analyzer's CSV (times in µs, rounded), then workbench's columns."""
    rows = []
    for result in results:
        point = result.point
        first = (
            {"Concurrency": point.concurrency}
            if point.concurrency is not None
            else {"Request Rate": point.request_rate}
        )
        server = result.server
        mean = result.mean_latency_us

        in_server = (
            sum(server.per_request_us(ns) or 0.0 for ns in _stages(server)) if server and server.requests else None
        )
        row: dict[str, Any] = {
            **first,
            "Inferences/Second": round(result.inferences_per_second, 2),
            "Network+Server Send/Recv": _us(mean - in_server) if in_server is not None else None,
            "Server Queue": _us(server.per_request_us(server.queue_ns)) if server else None,
            "Server Compute Input": _us(server.per_request_us(server.compute_input_ns)) if server else None,
            "Server Compute Infer": _us(server.per_request_us(server.compute_infer_ns)) if server else None,
            "Server Compute Output": _us(server.per_request_us(server.compute_output_ns)) if server else None,
            "p50 latency": _us(result.latency_us(50)),
            "p90 latency": _us(result.latency_us(90)),
            "p95 latency": _us(result.latency_us(95)),
            "p99 latency": _us(result.latency_us(99)),
            "Avg latency": _us(mean),
            "Requests": result.requests,
            "Errors": result.errors,
            "Delayed Requests": result.delayed,
            "Avg Batch": round(server.inferences / server.executions, 2) if server and server.executions else None,
            "Windows": result.windows,
            "Stable": result.stable,
        }
        rows.append(row)
    return rows


def _stages(server: ServerTimes) -> tuple[int, ...]:
    return (server.queue_ns, server.compute_input_ns, server.compute_infer_ns, server.compute_output_ns)


def _us(value: float | None) -> int | None:
    return None if value is None or math.isnan(value) else int(round(value))


def write_csv(path: str, rows: Sequence[dict[str, Any]]) -> None:
    """perf_analyzer's ``-f`` file: a header row, then a row a point (an empty cell where a figure is unknown)."""
    if not rows:
        return
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows({key: "" if value is None else value for key, value in row.items()} for row in rows)


# ----------------------------------------------------------------------------------------------- front ends
def concurrency_levels(text: str) -> list[int]:
    """``--concurrency``'s clients: a number, or a range of them."""
    try:
        levels = parse_range(text)
    except ValueError:
        if text.strip().lstrip("-").isdigit():
            raise ValueError("--concurrency must be at least 1") from None
        raise
    return levels


def points_of(concurrency: str | None, request_rate: str | None, distribution: str = "constant") -> list[Point]:
    """The points ``--concurrency`` or ``--request_rate`` name (a value or a range): one or the other."""
    if request_rate:
        return [Point(request_rate=rate, distribution=distribution) for rate in parse_range(request_rate, float)]
    return [Point(concurrency=clients) for clients in concurrency_levels(concurrency or "1")]


def run_measurement(
    target: str,
    protocol: str,
    model: str,
    inputs: Sequence[Mapping[str, np.ndarray]],
    points: Sequence[Point],
    stability: Stability = Stability(),
    *,
    signature_name: str = "",
    tls: ClientTLS | None = None,
    on_point: Callable[[PointResult], None] | None = None,
    shared_memory: str = "none",
) -> list[PointResult]:
    """Measure ``points`` in turn, sending ``inputs`` (one request each) in turn; see :func:`measure_async`.
    ``shared_memory="system"``: the inputs travel in a system shared-memory region (the v2 protocol's extension, a
    server on this host), as perf_analyzer's ``--shared-memory system``."""
    from workbench.client.bench import encode_requests
    from workbench.client.load_inputs import rows_of
    from workbench.client.protocols import GRPC_PROTOCOLS, V2_PROTOCOLS, canonical_protocol
    from workbench.runtime.loop import run_to_completion

    if not inputs:
        raise ValueError("no requests to send")
    protocol = canonical_protocol(protocol)
    grpc = protocol in GRPC_PROTOCOLS
    context = (tls or ClientTLS()).ssl_context() if not grpc and target.startswith("https://") else None
    credentials = tls.grpc_credentials() if grpc and tls is not None else None
    rows = rows_of(dict(inputs[0]))

    def measure(requests: list[bytes]) -> list[PointResult]:
        return run_to_completion(
            lambda: measure_async(
                target,
                protocol,
                model,
                requests,
                points,
                stability,
                rows_per_request=rows,
                tls_context=context,
                grpc_credentials=credentials,
                on_point=on_point,
            )  # fmt: skip
        )

    if shared_memory == "none":
        return measure(encode_requests(target, protocol, model, inputs, signature_name))
    if shared_memory != "system":
        raise ValueError(f"shared memory is none or system (workbench has no CUDA), not {shared_memory!r}")
    if protocol not in V2_PROTOCOLS:
        raise ValueError("shared memory is the v2 protocol's extension: --protocol v2 or v2-grpc")
    from workbench.client import shared_memory_load as shm
    from workbench.client.bench import http_post

    with shm.shared_inputs(target, protocol, inputs) as (region, placed):
        if grpc:
            return measure([shm.grpc_message(model, region, where) for where in placed])
        url = urlsplit(target if "://" in target else f"http://{target}")
        host, port, path = url.hostname or "127.0.0.1", url.port or 80, f"/v2/models/{model}/infer"
        headers = {"Content-Type": "application/json"}
        return measure([http_post(host, port, path, shm.rest_body(region, where), headers) for where in placed])


TABLE_COLUMNS = (
    "Inferences/Second",
    "p50 latency",
    "p99 latency",
    "Avg latency",
    "Server Queue",
    "Server Compute Infer",
    "Network+Server Send/Recv",
    "Avg Batch",
    "Errors",
    "Stable",
)


_WINDOW_OPTIONS = ("measurement_interval", "stability_percentage", "max_trials")


def windowed(args: Any) -> bool:
    """Whether a front end's parsed options ask for windows until stable (else one fixed-length measurement, as
    ``--duration`` and ``--requests`` give)."""
    return bool(
        len(concurrency_levels(args.concurrency)) > 1
        or args.request_rate
        or args.csv
        or getattr(args, "shared_memory", "none") != "none"
        or any(
            getattr(args, name) is not None for name in ("measurement_interval", "stability_percentage", "max_trials")
        )
    )


def stability_of(args: Any) -> Stability:
    """The measurement a front end's options name (perf_analyzer's defaults for those not given)."""
    if args.duration is not None or args.requests is not None:
        raise ValueError("--duration and --requests make one fixed measurement: not with ranges, rates or windows")
    interval = args.measurement_interval
    return Stability(
        interval_s=interval / 1000 if interval is not None else DEFAULT_INTERVAL_S,
        percentage=args.stability_percentage if args.stability_percentage is not None else DEFAULT_STABILITY_PERCENTAGE,
        max_trials=args.max_trials if args.max_trials is not None else DEFAULT_MAX_TRIALS,
    )


@dataclasses.dataclass(frozen=True)
class LoadPlan:
    """What a front end's load options ask for: points measured in windows (``points``), or one fixed-length
    closed-loop measurement of ``clients`` for ``duration`` seconds or ``requests`` requests."""

    points: list[Point] | None
    stability: Stability | None
    clients: int = 1
    duration: float | None = None
    requests: int | None = None


def plan_of(args: Any) -> LoadPlan:
    """The plan ``workbench bench``'s or ``%serve bench``'s parsed options name (ValueError: a usage mistake)."""
    from workbench.client.bench import resolve_load

    if windowed(args):
        points = points_of(args.concurrency, args.request_rate, args.request_distribution)
        return LoadPlan(points, stability_of(args))
    clients = concurrency_levels(args.concurrency)[0]
    duration, requests = resolve_load(clients, args.duration, args.requests)
    return LoadPlan(None, None, clients, duration, requests)


def report(results: Sequence[PointResult], csv_path: str | None = None) -> tuple[list[dict[str, Any]], str]:
    """The points as perf_analyzer's rows (written to ``csv_path`` when given) and as a table to print."""
    from workbench.client.bench import format_table

    rows = perf_rows(results)
    if csv_path:
        write_csv(csv_path, rows)
    return rows, format_table(rows, [next(iter(rows[0])), *TABLE_COLUMNS]) if rows else ""
