"""The request path: what workbench's server costs over the bare stacks it runs on, granian against uvicorn, start-up.

Run: `.venv/bin/python benchmarks/request_path.py` (about 20 minutes on 2 cores).
Prints tables and writes benchmarks/results/request_path.json. Everything is measured in this one run, one server
under load at a time, each a child process on 127.0.0.1, by load generators in this process (and h2load and wrk
where installed); every row is the median of --rounds measurements:

1. the ceilings: a bare grpc.aio PredictionService and a bare Starlette app (under uvicorn with httptools and
   uvloop, and under granian) answering half_plus_two's exact answer without a model: parse the request, send
   the answer. Workbench's rows are also given as a ratio of these (``vs_bare``); and the bare gRPC server with
   each request handed to a thread and back, the floor of any server that keeps model calls off its event loop
   (``vs_bare_hop``: what is left is workbench's own cost). Rows of workbench bench's client against one server
   process also give its event-loop thread's CPU µs per request (``loop_us``), which bounds a Python server's rate;
2. `workbench serve` (one worker) on half_plus_two, batching off and on, 1 and 32 clients, over gRPC (workbench
   bench's grpc.aio client; h2load) and REST (workbench bench's HTTP/1.1 client; wrk). Both servers are up at
   once and take turns round by round, so that batching on against off is not decided by when each ran;
3. a compute-bound CNN (≈12 M multiply-adds an image), 64 clients, batching off and on, gRPC and REST;
4. one REST predict's p50 with one client against the in-process signature call;
5. granian against uvicorn: the bare app, then workbench's own REST app (the very object `workbench serve`
   serves, with its dataplane, on one loop with gRPC) served under both in one process;
6. `--num_workers` (when workbench has it): the half_plus_two rows with one worker per core;
7. start-up, spawning `workbench serve` to its first answered predict, for a TensorFlow repository and a
   scikit-learn one, as now and with TensorFlow imported first (what every start paid before
   workbench/runtime/tensorflow_protos.py).

On a 2-core machine the load generator shares the cores with the server: absolute figures are low, and the
ratios (every server measured the same way, in the same minutes) are the result.

`--rest_only` (a few minutes) measures the REST hot path alone at --clients (32) and writes
benchmarks/results/request_path_rest.json: the bare apps (Starlette under uvicorn and granian, a bare RSGI app under
granian), `workbench serve` of this checkout on uvicorn and with `--http_server=granian` and, with `--baseline_tree
DIR`, of another one the same two ways (before and after in one run), and workbench's app under uvicorn, granian's
ASGI and granian's RSGI (workbench/server/granian_http.py's RestRsgi), all up at once and taking turns round by
round; each row with the CPU µs a request cost the server (``proc_us``) and its event loop (``loop_us``, where that
is the process's main thread), steadier than requests/s on a shared machine, and its requests/s over bare Starlette
on uvicorn's (``vs_bare``) and over `workbench serve` on uvicorn's (``vs_serve_uvicorn``).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from _common import (
    ServeProcess,
    free_port,
    load_row,
    loop_cpu_seconds,
    median_row,
    process_cpu_seconds,
    save_results,
    save_small_cnn,
    stop_process,
    taking_turns,
    write_config,
)
from frontends import in_process_median_ms

from workbench.client.bench import format_table, grpc_predict_bytes, run_load
from workbench.demo import save_half_plus_two

# The HTTP servers the REST rows compare (granian is one of workbench's dependencies: --http_server=granian).
HTTP_SERVERS = ("uvicorn", "granian")
HP2 = "half_plus_two"
HOP = "bare grpc.aio + thread hop"  # the bare server, each request handed to a thread and back
GRANIAN_SERVE = "workbench serve --http_server=granian"
REST_BARE = "bare Starlette/uvicorn"  # the REST ceiling every REST row is a share of
HP2_INPUTS = {"x": np.array([[2.0]], np.float32)}
HP2_REST_ANSWER = {"outputs": [[3.0]]}  # half_plus_two's answer to workbench bench's columnar body
BATCHING = """
max_batch_size { value: 64 }
batch_timeout_micros { value: 0 }
max_enqueued_batches { value: 100 }
num_batch_threads { value: 1 }
"""


# ================================================================================= the servers, as child processes
def bare_predict_response() -> Any:
    """What workbench's gRPC Predict answers half_plus_two for x = [[2.0]] (checked against it in every run)."""
    import workbench.runtime.tensorflow_protos  # noqa: F401  # isort: skip  (no tensorflow/__init__)
    from tensorflow_serving.apis import predict_pb2

    from workbench.protocol.tensor_proto import from_numpy

    response = predict_pb2.PredictResponse()
    response.model_spec.name = HP2
    response.model_spec.version.value = 1
    response.model_spec.signature_name = "serving_default"
    from_numpy(np.array([[3.0]], np.float32), response.outputs["y"])
    return response


async def serve_bare_grpc(port: int, hop: bool = False, metadata: Path | None = None) -> None:
    """grpc.aio with TF Serving's generated PredictionService: the request parsed, one fixed answer sent.

    ``hop``: each request first goes to a thread and back (an empty call through ``run_in_executor``), the least
    any server that keeps model calls off its event loop pays; the rest of what workbench costs is its own.
    ``metadata``: a file holding a serialized ``GetModelMetadataResponse``, answered to every GetModelMetadata
    (perf_analyzer asks for it once, to learn the inputs, before its load).
    """
    import workbench.runtime.tensorflow_protos  # noqa: F401  # isort: skip  (no tensorflow/__init__)
    from tensorflow_serving.apis import get_model_metadata_pb2, prediction_service_pb2_grpc

    answer = bare_predict_response()
    threads = ThreadPoolExecutor(max_workers=4)
    described = get_model_metadata_pb2.GetModelMetadataResponse()
    if metadata is not None:
        described.ParseFromString(metadata.read_bytes())

    class Bare(prediction_service_pb2_grpc.PredictionServiceServicer):
        async def Predict(self, request: Any, context: Any) -> Any:  # noqa: N802 - the generated name
            if hop:
                await asyncio.get_running_loop().run_in_executor(threads, int)
            return answer

        async def GetModelMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802 - the generated name
            return described

    server = grpc.aio.server()
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(Bare(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def bare_rest_app() -> Any:
    """Starlette with one route, TF Serving's predict path: the body read and parsed, one fixed answer sent."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    answer = json.dumps(HP2_REST_ANSWER).encode()

    async def predict(request: Request) -> Response:
        json.loads(await request.body())
        return Response(answer, media_type="application/json")

    return Starlette(routes=[Route("/v1/models/{name}:predict", predict, methods=["POST"])])


def bare_rsgi_app() -> Any:
    """The bare app in granian's own interface (RSGI): the body read and parsed, one fixed answer sent."""
    answer = json.dumps(HP2_REST_ANSWER).encode()
    headers = [("content-type", "application/json")]

    async def app(scope: Any, proto: Any) -> None:
        json.loads(await proto())
        proto.response_bytes(200, headers, answer)

    return app


async def serve_rsgi(app: Any, port: int) -> None:
    from granian.constants import Interfaces
    from granian.server.embed import Server

    await Server(app, "127.0.0.1", port, interface=Interfaces.RSGI, log_enabled=False).serve()


async def serve_asgi(app: Any, port: int, http_server: str) -> None:
    """``app`` on ``port`` under uvicorn (httptools, the running uvloop) or granian, as workbench would embed it."""
    if http_server == "granian":
        from granian.constants import Interfaces
        from granian.server.embed import Server

        # ASGINL: no lifespan, as workbench runs uvicorn (lifespan="off").
        await Server(app, "127.0.0.1", port, interface=Interfaces.ASGINL, log_enabled=False).serve()
        return
    import uvicorn

    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, http="httptools", loop="none", lifespan="off", log_config=None,
        access_log=False, timeout_keep_alive=30,
    )  # fmt: skip
    await uvicorn.Server(config).serve()


def serve_workbench_app_thrice(base_path: str, uvicorn_port: int, granian_port: int, rsgi_port: int) -> None:
    """One workbench server (gRPC, dataplane, REST under uvicorn) whose REST app granian also serves on a port, and
    whose inference an RSGI app on a third port answers under granian."""
    from workbench.config.options import ServerOptions
    from workbench.runtime.heap import LongLivedHeap
    from workbench.server import ServerThread

    options = ServerOptions(port=0, rest_api_port=uvicorn_port, model_name=HP2, model_base_path=base_path)
    running = ServerThread(options).start()
    LongLivedHeap().settle()  # as `workbench serve` does once its models load
    # The app `workbench serve` built for uvicorn (its Ports keep the uvicorn.Server): the same routes, dataplane
    # and loop behind every port, so they differ by the HTTP server (and interface) only.
    from workbench.server.granian_http import RestRsgi

    uvicorn_server, _ = running.server._ports._http[0]
    app = uvicorn_server.config.app
    # What `workbench serve --http_server=granian` runs: the inference routes in RSGI, the rest through Starlette.
    asyncio.run_coroutine_threadsafe(serve_rsgi(RestRsgi(app), rsgi_port), running._loop)
    served = asyncio.run_coroutine_threadsafe(serve_asgi(app, granian_port, "granian"), running._loop)
    served.result()


def child_main(kind: str, args: list[str]) -> None:
    from workbench.runtime.loop import new_event_loop

    if kind == "workbench-app":
        serve_workbench_app_thrice(args[0], int(args[1]), int(args[2]), int(args[3]))
        return
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    port = int(args[0])
    if kind in ("bare-grpc", "bare-grpc-hop"):
        metadata = Path(args[1]) if len(args) > 1 else None
        loop.run_until_complete(serve_bare_grpc(port, hop=kind == "bare-grpc-hop", metadata=metadata))
    elif kind == "bare-rsgi-granian":
        loop.run_until_complete(serve_rsgi(bare_rsgi_app(), port))
    else:  # bare-rest-uvicorn, bare-rest-granian
        loop.run_until_complete(serve_asgi(bare_rest_app(), port, kind.removeprefix("bare-rest-")))


class Child:
    """This script as a server child process (``--child KIND ARGS``), up once ``ready()`` says so."""

    def __init__(self, kind: str, *args: object, log: Path) -> None:
        self.log = log
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, __file__, "--child", kind, *map(str, args)],
                env=env, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def wait(self, ready: Callable[[], bool], timeout: float = 180) -> None:
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server child exited:\n{self.log.read_text()[-3000:]}")
            try:
                if ready():
                    return
            except (OSError, grpc.RpcError):  # not listening yet
                pass
            time.sleep(0.05)
        raise TimeoutError("server child did not answer in time")

    def stop(self) -> None:
        stop_process(self.proc)


class StartupProcess(ServeProcess):
    """`workbench serve` as a child, optionally importing TensorFlow before anything else (start-up as it was)."""

    def __init__(self, *flags: str, import_tensorflow_first: bool) -> None:
        first = "import tensorflow; " if import_tensorflow_first else ""
        code = f"{first}import sys; from workbench.cli import main; sys.exit(main(sys.argv[1:]))"
        self._spawn([sys.executable, "-c", code], *flags)


# ====================================================================================== answers, checked and timed
def rest_answer(url: str, model: str = HP2) -> Any:
    body = json.dumps({"inputs": {"x": [[2.0]]}}).encode()
    request = urllib.request.Request(f"{url}/v1/models/{model}:predict", data=body)
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def answers_rest(port: int) -> bool:
    return bool(rest_answer(f"http://127.0.0.1:{port}") == HP2_REST_ANSWER)


def grpc_answer(target: str) -> Any:
    import workbench.runtime.tensorflow_protos  # noqa: F401  # isort: skip  (no tensorflow/__init__)
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    with grpc.insecure_channel(target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        return stub.Predict(predict_pb2.PredictRequest.FromString(grpc_predict_bytes(HP2, HP2_INPUTS)), timeout=10)


@dataclass(frozen=True)
class Plan:
    duration: float  # seconds a measurement
    rounds: int  # measurements a row; the row is the median one (by requests/s)


def median_round(plan: Plan, measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``measure()`` ``plan.rounds`` times in a row: the median by requests/s, with every round's requests/s.

    Other work on a shared machine comes in bursts; the median keeps one burst from deciding a row.
    """
    return median_row([measure() for _ in range(plan.rounds)])


def load(
    name: str, target: str, protocol: str, clients: int, plan: Plan, loop_pid: int | None = None, **extra: Any
) -> dict[str, Any]:
    """workbench bench's closed loop (grpc.aio client, or its HTTP/1.1 keep-alive client) against ``target``: the
    median of ``plan.rounds`` rounds (see :func:`bench_once`)."""
    return median_round(
        plan, functools.partial(bench_once, name, target, protocol, clients, plan.duration, loop_pid, **extra)
    )


def bench_once(
    name: str, target: str, protocol: str, clients: int, duration: float, loop_pid: int | None = None, **extra: Any
) -> dict[str, Any]:
    """One round of workbench bench's closed loop against ``target``.

    With ``loop_pid`` (the server process, whose main thread runs its event loop) the row also gives that thread's
    CPU µs per request (``loop_us``): what bounds a Python server's rate, and steadier than the rate on a shared
    machine. It counts the client's warm-up requests too (80, about 1% of a round).
    """
    inputs = extra.pop("inputs", HP2_INPUTS)
    model = extra.pop("model", HP2)
    before = loop_cpu_seconds(loop_pid) if loop_pid is not None else 0.0
    result = run_load(target, protocol, model, inputs, concurrency=clients, duration=duration)
    row = load_row(name, result, **extra)
    if loop_pid is not None and result.requests:
        row["loop_us"] = round((loop_cpu_seconds(loop_pid) - before) / result.requests * 1e6, 1)
    return row


def h2load_row(name: str, target: str, clients: int, plan: Plan) -> dict[str, Any] | None:
    """gRPC Predict from h2load (nghttp2's HTTP/2 load generator, in C): a pre-framed request, one stream a client."""
    if shutil.which("h2load") is None:
        return None
    return median_round(plan, lambda: _h2load_once(name, target, clients, plan.duration))


def _h2load_once(name: str, target: str, clients: int, duration: float) -> dict[str, Any]:
    message = grpc_predict_bytes(HP2, HP2_INPUTS)
    with tempfile.NamedTemporaryFile(suffix=".grpc", delete=False) as frame:
        frame.write(b"\x00" + len(message).to_bytes(4, "big") + message)  # gRPC's length-prefixed message
    try:
        done = subprocess.run(
            ["h2load", f"--clients={clients}", "--max-concurrent-streams=1", f"--duration={round(duration * 1000)}ms",
             "--warm-up-time=1", f"--data={frame.name}", "--header=content-type: application/grpc",
             "--header=te: trailers", f"http://{target}/tensorflow.serving.PredictionService/Predict"],
            capture_output=True, text=True, timeout=duration + 60,
        )  # fmt: skip
    finally:
        os.unlink(frame.name)
    rate = re.search(r"finished in [\d.]+\w+, ([\d.]+) req/s", done.stdout)
    succeeded = re.search(r"requests: \d+ total, \d+ started, \d+ done, (\d+) succeeded, (\d+) failed", done.stdout)
    mean = re.search(r"time for request:\s+\S+\s+\S+\s+(\S+)", done.stdout)
    if not (rate and succeeded and mean):
        return {"server": name, "protocol": "grpc (h2load)", "clients": clients, "error": done.stdout[-500:]}
    return {
        "server": name,
        "protocol": "grpc (h2load)",
        "clients": clients,
        "requests_per_second": float(rate.group(1)),
        "mean_ms": _ms(mean.group(1)),
        "errors": int(succeeded.group(2)),
    }


def wrk_row(name: str, url: str, clients: int, plan: Plan) -> dict[str, Any] | None:
    """REST predict from wrk (HTTP/1.1 keep-alive, in C): the same body workbench bench sends."""
    if shutil.which("wrk") is None:
        return None
    return median_round(plan, lambda: _wrk_once(name, url, clients, plan.duration))


def _wrk_once(name: str, url: str, clients: int, duration: float) -> dict[str, Any]:
    body = json.dumps({"inputs": {"x": [[2.0]]}}, separators=(",", ":"))
    script = f'wrk.method = "POST"\nwrk.body = {json.dumps(body)}\nwrk.headers["Content-Type"] = "application/json"\n'
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as lua:
        lua.write(script)
    try:
        done = subprocess.run(
            ["wrk", "--threads=1", f"--connections={clients}", f"--duration={max(1, round(duration))}s",
             "--latency", f"--script={lua.name}", f"{url}/v1/models/{HP2}:predict"],
            capture_output=True, text=True, timeout=duration + 60,
        )  # fmt: skip
    finally:
        os.unlink(lua.name)
    rate = re.search(r"Requests/sec:\s+([\d.]+)", done.stdout)
    p50 = re.search(r"^\s+50%\s+(\S+)", done.stdout, re.MULTILINE)
    p99 = re.search(r"^\s+99%\s+(\S+)", done.stdout, re.MULTILINE)
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", done.stdout)
    if not (rate and p50 and p99):
        return {"server": name, "protocol": "rest (wrk)", "clients": clients, "error": done.stdout[-500:]}
    return {
        "server": name,
        "protocol": "rest (wrk)",
        "clients": clients,
        "requests_per_second": float(rate.group(1)),
        "p50_ms": _ms(p50.group(1)),
        "p99_ms": _ms(p99.group(1)),
        "errors": int(non_2xx.group(1)) if non_2xx else 0,
    }


def _ms(text: str) -> float:
    """``1.23ms``, ``456.00us``, ``1.2s`` (h2load's and wrk's units) in milliseconds."""
    number, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text).groups()  # type: ignore[union-attr]
    return round(float(number) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit], 3)


def measurements(
    name: str, grpc_target: str, rest_url: str, clients: int, plan: Plan, loop_pid: int | None = None
) -> list[Callable[[], dict[str, Any]]]:
    """One round each of gRPC and REST at ``clients`` from every generator at hand (workbench bench, then h2load and
    wrk), in that order."""
    found: list[Callable[[], dict[str, Any]]] = [
        functools.partial(bench_once, name, grpc_target, "grpc", clients, plan.duration, loop_pid),
        functools.partial(bench_once, name, rest_url, "rest", clients, plan.duration, loop_pid),
    ]
    if shutil.which("h2load") is not None:
        found.append(functools.partial(_h2load_once, name, grpc_target, clients, plan.duration))
    if shutil.which("wrk") is not None:
        found.append(functools.partial(_wrk_once, name, rest_url, clients, plan.duration))
    return found


# ================================================================================================ the measurements
def ceilings(root: Path, plan: Plan) -> list[dict[str, Any]]:
    """The bare stacks, each a child process answering half_plus_two's answer (checked first) without a model."""
    grpc_port, hop_port = free_port(), free_port()
    rest_ports = {server: free_port() for server in HTTP_SERVERS}
    children = [
        Child("bare-grpc", grpc_port, log=root / "bare-grpc.log"),
        Child("bare-grpc-hop", hop_port, log=root / "bare-grpc-hop.log"),
    ]
    children += [Child(f"bare-rest-{s}", port, log=root / f"bare-{s}.log") for s, port in rest_ports.items()]
    rows: list[dict[str, Any] | None] = []  # None: h2load or wrk is not installed
    try:
        grpc_target, hop_target = f"127.0.0.1:{grpc_port}", f"127.0.0.1:{hop_port}"
        for child, target in zip(children[:2], (grpc_target, hop_target), strict=True):
            child.wait(functools.partial(lambda t: grpc_answer(t) == bare_predict_response(), target))
        for child, port in zip(children[2:], rest_ports.values(), strict=True):
            child.wait(functools.partial(answers_rest, port))
        for clients in (1, 32):
            rows.append(load("bare grpc.aio", grpc_target, "grpc", clients, plan, children[0].proc.pid))
            rows.append(h2load_row("bare grpc.aio", grpc_target, clients, plan))
            rows.append(load(HOP, hop_target, "grpc", clients, plan, children[1].proc.pid))
            rows.append(h2load_row(HOP, hop_target, clients, plan))
            for (server, port), child in zip(rest_ports.items(), children[2:], strict=True):
                url = f"http://127.0.0.1:{port}"
                rows.append(load(f"bare Starlette/{server}", url, "rest", clients, plan, child.proc.pid))
                rows.append(wrk_row(f"bare Starlette/{server}", url, clients, plan))
    finally:
        for child in children:
            child.stop()
    return [r for r in rows if r is not None]


def workbench_rows(config: Path, root: Path, plan: Plan, *flags: str, name: str) -> list[dict[str, Any]]:
    """Batching off and on, both servers up at once and measured taking turns (:func:`_common.taking_turns`)."""
    batching = ["--enable_batching", f"--batching_parameters_file={root / 'batching.txt'}"]
    # One worker's event loop is the serve process's main thread; with --num_workers the loops are the workers'.
    workers = any(f.startswith("--num_workers") for f in flags)
    servers: dict[str, ServeProcess] = {}
    rows: list[dict[str, Any]] = []
    try:
        servers[f"{name}, batching off"] = ServeProcess(config, *flags)
        servers[f"{name}, batching on"] = ServeProcess(config, *flags, *batching)
        for server in servers.values():
            server.wait_for_answer(HP2, {"instances": [[1.0]]})
            every_worker_answers(server)
            assert rest_answer(server.rest_url) == HP2_REST_ANSWER
            assert grpc_answer(server.grpc_target) == bare_predict_response(), "bare answer differs"
            run_load(server.rest_url, "rest", HP2, HP2_INPUTS, concurrency=8, duration=1.0)  # every worker warm
        for clients in (1, 32):
            per_server = [
                measurements(label, s.grpc_target, s.rest_url, clients, plan, None if workers else s.proc.pid)
                for label, s in servers.items()
            ]
            for same_generator in zip(*per_server, strict=True):
                rows += taking_turns(plan.rounds, same_generator)
    finally:
        for server in servers.values():
            server.stop()
    return sorted(rows, key=lambda r: (r["server"], r["clients"]))


def every_worker_answers(server: ServeProcess, in_a_row: int = 20, timeout: float = 180) -> None:
    """Wait until ``in_a_row`` new connections in a row get an answer over each protocol.

    Workers share the ports (SO_REUSEPORT) and the kernel spreads new connections over those listening, so the
    first answer says one worker is up, not all; a worker still loading answers NOT_FOUND.
    """
    deadline = time.perf_counter() + timeout
    answered = 0
    while answered < in_a_row:
        if time.perf_counter() > deadline:
            raise TimeoutError("not every worker answered in time")
        try:
            rest_answer(server.rest_url)
            grpc_answer(server.grpc_target)
            answered += 1
        except (OSError, grpc.RpcError):
            answered = 0
            time.sleep(0.05)


def cnn_rows(config: Path, root: Path, plan: Plan) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    image = {"images": np.random.default_rng(0).random((1, 784), dtype=np.float32)}
    for batching in (False, True):
        extra = ["--enable_batching", f"--batching_parameters_file={root / 'batching.txt'}"] if batching else []
        server = ServeProcess(config, *extra)
        label = f"workbench CNN, batching {'on' if batching else 'off'}"
        try:
            server.wait_for_answer("cnn", {"instances": [[0.0] * 784]})
            for protocol, target in (("grpc", server.grpc_target), ("rest", server.rest_url)):
                rows.append(load(label, target, protocol, 64, plan, model="cnn", inputs=image))
        finally:
            server.stop()
    return rows


def one_request(config: Path, root: Path, plan: Plan) -> dict[str, Any]:
    server = ServeProcess(config)
    try:
        server.wait_for_answer(HP2, {"instances": [[1.0]]})
        rest = run_load(server.rest_url, "rest", HP2, HP2_INPUTS, concurrency=1, duration=plan.duration)
    finally:
        server.stop()
    in_process = in_process_median_ms(root / HP2 / "1", HP2_INPUTS)
    return {
        "rest_p50_ms": round(rest.percentile(50), 3),
        "in_process_p50_ms": round(in_process, 3),
        "server_adds_ms": round(rest.percentile(50) - in_process, 3),
    }


def granian_rows(root: Path, plan: Plan) -> list[dict[str, Any]]:
    """Workbench's REST app under uvicorn and under granian (ASGI, and its inference in RSGI), in one process, on one
    loop with its gRPC server."""
    ports = {"uvicorn": free_port(), "granian": free_port(), "granian RSGI": free_port()}
    child = Child("workbench-app", root / HP2, *ports.values(), log=root / "workbench-app.log")
    rows: list[dict[str, Any]] = []
    try:
        for port in ports.values():
            child.wait(functools.partial(answers_rest, port))
        for clients in (1, 32):
            for server, port in ports.items():
                rows.append(load(f"workbench app/{server}", f"http://127.0.0.1:{port}", "rest", clients, plan))
                extra = wrk_row(f"workbench app/{server}", f"http://127.0.0.1:{port}", clients, plan)
                if extra is not None:
                    rows.append(extra)
    finally:
        child.stop()
    return rows


# ==================================================================================== --rest_only: the REST hot path
@dataclass(frozen=True)
class RestTarget:
    """One server of the REST comparison: ``pid`` whose CPU a request costs (None: shared with other targets), and
    whether its event loop is that process's main thread (then ``loop_us`` is measured too)."""

    name: str
    url: str
    pid: int | None
    loop_is_main: bool


def rest_once(target: RestTarget, clients: int, duration: float) -> dict[str, Any]:
    """One round against ``target`` (wrk where installed, else workbench bench's client), with the CPU µs a request
    cost the server's process (``proc_us``) and its event loop (``loop_us``) where they can be told apart."""
    pid = target.pid
    loop0 = loop_cpu_seconds(pid) if pid is not None and target.loop_is_main else 0.0
    proc0 = process_cpu_seconds(pid) if pid is not None else 0.0
    if shutil.which("wrk") is not None:
        row = _wrk_once(target.name, target.url, clients, duration)
        seconds = max(1, round(duration))  # what wrk runs for
    else:
        row = bench_once(target.name, target.url, "rest", clients, duration)
        seconds = duration
    served = (row.get("requests_per_second") or 0.0) * seconds
    if pid is not None and served:
        row["proc_us"] = round((process_cpu_seconds(pid) - proc0) / served * 1e6, 1)
        if target.loop_is_main:
            row["loop_us"] = round((loop_cpu_seconds(pid) - loop0) / served * 1e6, 1)
    return row


def rest_path_rows(root: Path, config: Path, plan: Plan, baseline: Path | None, clients: int) -> list[dict[str, Any]]:
    """REST predict on half_plus_two at ``clients`` clients: the bare apps (Starlette under uvicorn and granian, RSGI
    under granian), `workbench serve` (this checkout, and ``baseline``'s), and workbench's app under uvicorn,
    granian and granian's RSGI, every server up at once and measured taking turns (:func:`_common.taking_turns`)."""
    ports = {kind: free_port() for kind in ("bare-rest-uvicorn", "bare-rest-granian", "bare-rsgi-granian")}
    app_ports = {"uvicorn": free_port(), "granian": free_port(), "granian RSGI": free_port()}
    children = {kind: Child(kind, port, log=root / f"{kind}.log") for kind, port in ports.items()}
    app_child = Child("workbench-app", root / HP2, *app_ports.values(), log=root / "workbench-app.log")
    servers = {"workbench serve": ServeProcess(config), GRANIAN_SERVE: ServeProcess(config, "--http_server=granian")}
    if baseline is not None:
        servers["workbench serve (baseline)"] = ServeProcess(config, tree=baseline)
        servers[f"{GRANIAN_SERVE} (baseline)"] = ServeProcess(config, "--http_server=granian", tree=baseline)
    names = {"bare-rest-uvicorn": REST_BARE, "bare-rest-granian": "bare Starlette/granian"}
    names["bare-rsgi-granian"] = "bare RSGI/granian"
    try:
        targets = []
        for kind, child in children.items():
            child.wait(functools.partial(answers_rest, ports[kind]))
            url = f"http://127.0.0.1:{ports[kind]}"
            targets.append(RestTarget(names[kind], url, child.proc.pid, kind == "bare-rest-uvicorn"))
        for name, server in servers.items():
            server.wait_for_answer(HP2, {"instances": [[1.0]]})
            assert rest_answer(server.rest_url) == HP2_REST_ANSWER
            targets.append(RestTarget(name, server.rest_url, server.proc.pid, True))
        for server_name, port in app_ports.items():
            app_child.wait(functools.partial(answers_rest, port))
            targets.append(RestTarget(f"workbench app/{server_name}", f"http://127.0.0.1:{port}", None, False))
        for target in targets:  # warm every server and connection pool before the first measured round
            rest_once(target, clients, 1.0)
        measures = [functools.partial(rest_once, t, clients, plan.duration) for t in targets]
        rows = taking_turns(plan.rounds, measures)
    finally:
        for process in [*children.values(), app_child]:
            process.stop()
        for server in servers.values():
            server.stop()
    bare = next(r for r in rows if r["server"] == REST_BARE)
    on_uvicorn = next(r for r in rows if r["server"] == "workbench serve")
    for r in rows:
        if r.get("requests_per_second") and bare.get("requests_per_second"):
            r["vs_bare"] = round(r["requests_per_second"] / bare["requests_per_second"], 3)
        if r.get("requests_per_second") and on_uvicorn.get("requests_per_second"):
            r["vs_serve_uvicorn"] = round(r["requests_per_second"] / on_uvicorn["requests_per_second"], 3)
        if r.get("loop_us") and bare.get("loop_us"):
            r["loop_vs_bare"] = round(bare["loop_us"] / r["loop_us"], 3)  # the loop's rate bound, over the bare one's
    return rows


def rest_only(args: argparse.Namespace) -> None:
    """``--rest_only``: :func:`rest_path_rows`, printed and written to benchmarks/results/request_path_rest.json
    (request_path_rest_{N}_clients.json for another --clients)."""
    plan = Plan(args.duration, args.rounds)
    baseline = Path(args.baseline_tree).resolve() if args.baseline_tree else None
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        save_half_plus_two(root / HP2 / "1")
        config = write_config(root / "hp2.config", {HP2: root / HP2})
        rows = rest_path_rows(root, config, plan, baseline, args.clients)
    columns = ["server", "protocol", "clients", "requests_per_second", "p50_ms", "p99_ms", "errors"]
    print(f"REST predict, half_plus_two, {args.clients} clients; vs_bare: requests/s over {REST_BARE}'s:")
    print(format_table(rows, [*columns, "loop_us", "proc_us", "vs_bare", "vs_serve_uvicorn", "loop_vs_bare"]))
    path = save_results(
        "request_path_rest" if args.clients == 32 else f"request_path_rest_{args.clients}_clients",
        {
            "duration_s": args.duration,
            "rounds": args.rounds,
            "clients": args.clients,
            "cpus": os.cpu_count(),
            "baseline_tree": str(baseline) if baseline else None,
            "generator": "wrk" if shutil.which("wrk") else "workbench bench",
            "rows": rows,
        },
    )
    print(f"\nwrote {path}")


def has_num_workers() -> bool:
    done = subprocess.run(
        [sys.executable, "-m", "workbench", "serve", "--help"], capture_output=True, text=True, timeout=120
    )
    return "--num_workers" in done.stdout


def startup_rows(root: Path, sklearn_config: Path, tf_config: Path, repeats: int) -> list[dict[str, Any]]:
    """Median seconds from spawning `workbench serve` to its first answered predict, as now and as before."""
    digits_row = [[0.0] * 64]
    cases = [
        ("TensorFlow (half_plus_two)", tf_config, HP2, {"instances": [[1.0]]}),
        ("scikit-learn (digits)", sklearn_config, "digits", {"instances": digits_row}),
    ]
    rows = []
    for repository, config, model, body in cases:
        for before in (True, False):
            seconds = []
            for _ in range(repeats):
                server = StartupProcess(f"--model_config_file={config}", import_tensorflow_first=before)
                try:
                    seconds.append(server.wait_for_answer(model, body))
                finally:
                    server.stop()
            rows.append(
                {
                    "repository": repository,
                    "start": "TensorFlow imported first (before)" if before else "now",
                    "median_s": round(statistics.median(seconds), 2),
                    "runs_s": [round(s, 2) for s in seconds],
                }
            )
    return rows


def ratios(rows: list[dict[str, Any]], ceiling_rows: list[dict[str, Any]]) -> None:
    """Each workbench row's requests/s as a share of the bare stack's at the same protocol, generator and clients."""
    bare = {"grpc": "bare grpc.aio", "rest": REST_BARE}
    for r in rows:
        if not r.get("requests_per_second"):
            continue
        kind = "grpc" if r["protocol"].startswith("grpc") else "rest"
        for key, server in (("vs_bare", bare[kind]), ("vs_bare_hop", HOP)):
            ceiling = next(
                (
                    c
                    for c in ceiling_rows
                    if c["server"] == server and c["protocol"] == r["protocol"] and c["clients"] == r["clients"]
                ),
                None,
            )
            if ceiling and ceiling.get("requests_per_second"):
                r[key] = round(r["requests_per_second"] / ceiling["requests_per_second"], 2)


def save_sklearn_digits(folder: Path) -> None:
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression

    from workbench.platforms import sklearn as platform

    x, y = load_digits(return_X_y=True)
    folder.mkdir(parents=True)
    platform.write(LogisticRegression(max_iter=300).fit(x, y), folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="measurements a row (the median is reported)")
    parser.add_argument("--startup_repeats", type=int, default=3, help="start-ups per case (the median is reported)")
    parser.add_argument(
        "--rest_only", action="store_true", help="only the REST hot path at --clients (request_path_rest.json)"
    )
    parser.add_argument("--clients", type=int, default=32, help="--rest_only: concurrent clients (wrk connections)")
    parser.add_argument(
        "--baseline_tree",
        help="--rest_only: also serve the workbench of this checkout (before and after in one run), e.g. "
        "`git worktree add /tmp/base main`",
    )
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)  # this script as one of the servers
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow's first import, here and in children
    if args.child:
        child_main(args.child[0], args.child[1:])
        return
    if args.rest_only:
        rest_only(args)
        return
    plan = Plan(args.duration, args.rounds)

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        save_half_plus_two(root / HP2 / "1")
        save_small_cnn(root / "cnn" / "1")
        save_sklearn_digits(root / "digits" / "1")
        (root / "batching.txt").write_text(BATCHING)
        hp2_config = write_config(root / "hp2.config", {HP2: root / HP2})
        cnn_config = write_config(root / "cnn.config", {"cnn": root / "cnn"})
        sklearn_config = root / "sklearn.config"
        sklearn_config.write_text(
            f'model_config_list {{ config {{ name: "digits" base_path: "{root / "digits"}" '
            'model_platform: "sklearn" } }\n'
        )

        ceiling = ceilings(root, plan)
        served = workbench_rows(hp2_config, root, plan, name="workbench 1 worker")
        workers_note = "--num_workers is not in this workbench yet: skipped"
        if has_num_workers():
            workers = os.cpu_count() or 1
            served += workbench_rows(
                hp2_config, root, plan, f"--num_workers={workers}", name=f"workbench {workers} workers"
            )
            workers_note = f"{workers} workers (one per core)"
        cnn = cnn_rows(cnn_config, root, plan)
        single = one_request(hp2_config, root, plan)
        granian = granian_rows(root, plan) if "granian" in HTTP_SERVERS else []
        startup = startup_rows(root, sklearn_config, hp2_config, args.startup_repeats)
    ratios(served, ceiling)

    columns = ["server", "protocol", "clients", "requests_per_second", "p50_ms", "p99_ms", "errors"]
    print("The bare stacks (half_plus_two's answer, no model):")
    print(format_table(ceiling, [*columns, "mean_ms", "loop_us"]))
    print(f"\nworkbench serve on half_plus_two ({workers_note}); vs_bare: requests/s over the bare stack's:")
    print(format_table(served, [*columns, "mean_ms", "loop_us", "vs_bare", "vs_bare_hop"]))
    print("\nThe CNN, 64 clients:")
    print(format_table(cnn, columns))
    print(
        f"\nOne REST predict, one client: p50 {single['rest_p50_ms']} ms; the in-process call "
        f"{single['in_process_p50_ms']} ms; the server adds {single['server_adds_ms']} ms"
    )
    print("\nworkbench's REST app (one process, one loop with gRPC) under uvicorn and granian:")
    print(format_table(granian, columns) if granian else "granian is not installed (the bench extra): skipped")
    print("\nStart-up, spawn to first answered predict:")
    print(format_table(startup, ["repository", "start", "median_s", "runs_s"]))
    path = save_results(
        "request_path",
        {
            "duration_s": args.duration,
            "rounds": args.rounds,
            "cpus": os.cpu_count(),
            "generators": {"h2load": shutil.which("h2load") is not None, "wrk": shutil.which("wrk") is not None},
            "ceilings": ceiling,
            "workbench": served,
            "workers": workers_note,
            "cnn_64_clients": cnn,
            "one_request": single,
            "granian_vs_uvicorn": granian,
            "startup": startup,
        },
    )
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
