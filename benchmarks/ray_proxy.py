"""Ray Serve's proxies against `workbench serve` alone, on the same model in the same run: what the proxies cost.

Run: `.venv/bin/python benchmarks/ray_proxy.py [--duration S] [--rounds R] [--clients N ...] [--out FILE]`
(about 4 minutes on 2 cores with the defaults). Prints tables and writes benchmarks/results/ray_proxy.json.

One half_plus_two repository (workbench.demo) is served twice, side by side:

1. `workbench serve --model_repository=…` alone, a child process on free ports (``--port=0 --rest_api_port=-1``,
   read back from its ``--ready_file``);
2. `workbench.ray.deploy(repository, num_replicas=1)` on a local single-node Ray started here (``ray.init``): one
   replica running the same engine behind Ray's HTTP proxy (REST) and gRPC proxy (TF Serving's
   PredictionService). One node is enough to measure what a request pays to cross Ray's proxy and its router into
   a replica; more nodes add the network, not the proxy;
3. last, on the same proxies, a bare Ray Serve deployment in place of workbench's application, answering
   half_plus_two's fixed answers without a model: what Ray's proxies allow on this machine (measured after 1 and 2,
   not in turns with them).

Both must give half_plus_two's exact answer over REST (``requests``) and gRPC (the tensorflow-serving-api stub)
before any load. Then `workbench bench`'s closed-loop generator (REST: its HTTP/1.1 keep-alive client; gRPC:
grpc.aio with pre-serialised requests) drives each server at each ``--clients`` count over each protocol, the two
servers taking turns (the order alternates between rounds), so a burst of other work on a shared machine hits both
alike; each row is the median of ``--rounds`` measurements by requests/s. Ray stays up (idle) while the server alone
is measured. Ratios: Ray's requests/s over the server's alone, Ray's p50 and p99 minus the server's alone (ms), and
workbench through Ray over bare Ray Serve.

Start-up: the server alone, spawn to first answered predict; Ray, ``ray.init`` to first answered predict through the
proxy, of which ``deploy()`` (Serve's controller and proxies, then the replica loading the repository) is
``deployment.started_seconds``; and ``shutdown()``.

On a 2-core machine the load generator, Ray's processes and the servers share the cores: absolute figures are low
and move between runs, and the ratios (measured in the same minutes) are the result.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from _common import free_port, load_row, stop_process, taking_turns

from workbench.client.bench import format_table, run_load
from workbench.demo import save_half_plus_two
from workbench.ray.grpc_methods import REPLICA_METADATA
from workbench.ray.replica import REPLICA_HEADER

HP2 = "half_plus_two"
HP2_INPUTS = {"x": np.array([[2.0]], np.float32)}
HP2_REST_ANSWER = {"outputs": [[3.0]]}  # half_plus_two's answer to workbench bench's columnar body
READY_TIMEOUT_S = 300.0  # a cold Ray start and a TensorFlow import on a busy 2-core machine
SERVERS = ("workbench alone", "Ray Serve proxies", "bare Ray Serve (no model)")
PROTOCOLS = ("rest", "grpc")


@dataclass(frozen=True)
class Plan:
    duration: float  # seconds a measurement
    rounds: int  # measurements a row; the row is the median one (by requests/s)
    clients: tuple[int, ...]  # closed-loop clients, one set of rows each


@dataclass(frozen=True)
class Endpoints:
    """Where a server answers: REST base URL and gRPC ``host:port``."""

    rest_url: str
    grpc_target: str


def wait_until(ready: Callable[[], Any], what: str, timeout: float = READY_TIMEOUT_S) -> Any:
    """Poll ``ready()`` until it returns something truthy; a connection refused or an RPC error means "not yet"."""
    import grpc
    import requests

    deadline = time.perf_counter() + timeout
    while True:
        try:
            value = ready()
            if value:
                return value
        except (OSError, requests.RequestException, grpc.RpcError):
            pass
        if time.perf_counter() > deadline:
            raise TimeoutError(f"{what}: not ready after {timeout:g} s")
        time.sleep(0.05)


# ============================================================================================= answers, checked
def rest_answer(session: Any, rest_url: str) -> tuple[Any, str | None]:
    """half_plus_two's REST answer for x = [[2.0]], and the replica that gave it (None from the server alone)."""
    response = session.post(f"{rest_url}/v1/models/{HP2}:predict", json={"inputs": {"x": [[2.0]]}}, timeout=10)
    response.raise_for_status()
    return response.json(), response.headers.get(REPLICA_HEADER)


def grpc_answer(target: str) -> tuple[float, str | None]:
    """half_plus_two's gRPC Predict answer for x = [[2.0]] from the real stub, and the replica's trailing metadata."""
    import grpc

    import workbench.runtime.tensorflow_protos  # noqa: F401  # isort: skip  (no tensorflow/__init__)
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    from workbench.protocol.tensor_proto import from_numpy, to_numpy

    request = predict_pb2.PredictRequest()
    request.model_spec.name = HP2
    from_numpy(HP2_INPUTS["x"], request.inputs["x"])
    with grpc.insecure_channel(target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        response, call = stub.Predict.with_call(request, timeout=10)
    replica = dict(call.trailing_metadata() or ()).get(REPLICA_METADATA)
    return float(to_numpy(response.outputs["y"], "y").item()), replica


def check_answers(endpoints: Endpoints, through_ray: bool) -> bool:
    """Both protocols give half_plus_two's exact answer; through Ray, from a workbench replica (it says which).

    Raises the client's error while a server or proxy is not answering yet (:func:`wait_until` retries those), and
    AssertionError on a wrong answer.
    """
    import requests

    with requests.Session() as session:
        answer, rest_replica = rest_answer(session, endpoints.rest_url)
    value, grpc_replica = grpc_answer(endpoints.grpc_target)
    if answer != HP2_REST_ANSWER or value != 3.0:
        raise AssertionError(f"wrong answers: REST {answer}, gRPC {value}")
    if through_ray and not (rest_replica and grpc_replica):
        raise AssertionError("an answer through Ray's proxies did not come from a workbench replica")
    return True


# ======================================================================================= the two servers
def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally blocks that stop Ray and the server


class ServeAlone:
    """`workbench serve` on ``repository`` as a child process on ports it picks, read back from its ready file."""

    def __init__(self, repository: Path, workdir: Path) -> None:
        self.ready_file = workdir / "serve-ready.json"
        self.log = workdir / "serve.log"
        self.started = time.perf_counter()
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "workbench", "serve", f"--model_repository={repository}", "--port=0",
                 "--rest_api_port=-1", f"--ready_file={self.ready_file}"],
                env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"), stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def wait(self) -> tuple[Endpoints, float]:
        """Its endpoints once it answers a predict, and the seconds from spawning it to that first answer."""
        import requests

        def ready() -> dict[str, Any] | None:
            if self.proc.poll() is not None:
                raise RuntimeError(f"workbench serve exited:\n{self.log.read_text()[-3000:]}")
            return json.loads(self.ready_file.read_text()) if self.ready_file.exists() else None

        ports = wait_until(ready, "workbench serve's ready file")
        endpoints = Endpoints(f"http://127.0.0.1:{ports['rest_port']}", f"127.0.0.1:{ports['grpc_port']}")
        with requests.Session() as session:
            wait_until(lambda: rest_answer(session, endpoints.rest_url), "workbench serve's first answer")
        return endpoints, time.perf_counter() - self.started

    def stop(self) -> None:
        stop_process(self.proc)


@contextmanager
def ray_deployment(repository: Path, start: dict[str, Any]) -> Iterator[tuple[Endpoints, Any]]:
    """A local single-node Ray with ``workbench.ray.deploy(repository, num_replicas=1)``; torn down on exit.

    Fills ``start`` with the start-up figures (and the shutdown's on exit). Ray is stopped however the block ends
    (an error, Ctrl-C, SIGTERM), so no raylet, GCS or replica outlives this script.
    """
    import ray
    import requests

    import workbench.ray

    began = time.perf_counter()
    deployment: workbench.ray.RayDeployment | None = None
    try:
        # address="local": a new Ray for this script, never one another process on this machine happens to run.
        ray.init(
            address="local",
            num_cpus=os.cpu_count(),
            include_dashboard=False,
            log_to_driver=False,
            object_store_memory=100 * 1024**2,
        )
        # Ray's core worker installs a SIGTERM handler that aborts the process, which would leave the server and
        # Ray's agents behind: ours again, so that SIGTERM unwinds through the cleanup below.
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
        start["ray_init_s"] = round(time.perf_counter() - began, 2)
        deployment = workbench.ray.deploy(repository, num_replicas=1, http_port=free_port(), grpc_port=free_port())
        start["deploy_started_seconds"] = round(deployment.started_seconds, 2)
        endpoints = Endpoints(deployment.rest_url, deployment.grpc_target)
        with requests.Session() as session:
            wait_until(lambda: rest_answer(session, endpoints.rest_url), "Ray's first answer")
        start["ray_init_to_first_answer_s"] = round(time.perf_counter() - began, 2)
        yield endpoints, deployment
    finally:
        stopping = time.perf_counter()
        try:
            if deployment is not None:
                deployment.shutdown()
                start["deployment_shutdown_s"] = round(time.perf_counter() - stopping, 2)
        finally:
            ray.shutdown()
            start["ray_shutdown_s"] = round(time.perf_counter() - stopping, 2)


class BareRayServe:
    """A Ray Serve deployment answering half_plus_two's exact answers without a model: Ray's own ceiling.

    ``__call__`` answers any HTTP request (Ray's HTTP proxy) with the REST answer; ``Predict`` answers TF Serving's
    gRPC Predict (Ray's gRPC proxy, through the PredictionService workbench.ray registered) with a fixed response.
    """

    def __init__(self) -> None:
        import workbench.runtime.tensorflow_protos  # noqa: F401  # isort: skip  (no tensorflow/__init__)
        from tensorflow_serving.apis import predict_pb2

        from workbench.protocol.tensor_proto import from_numpy

        self.rest_answer = json.dumps(HP2_REST_ANSWER).encode()
        self.grpc_answer = predict_pb2.PredictResponse()
        self.grpc_answer.model_spec.name = HP2
        self.grpc_answer.model_spec.version.value = 1
        self.grpc_answer.model_spec.signature_name = "serving_default"
        from_numpy(np.array([[3.0]], np.float32), self.grpc_answer.outputs["y"])

    async def __call__(self, request: Any) -> Any:
        from starlette.responses import Response

        json.loads(await request.body())  # read and parsed, as a model server would
        return Response(self.rest_answer, media_type="application/json")

    async def Predict(self, request: Any) -> Any:  # noqa: N802 - the RPC's name, which Ray routes by
        return self.grpc_answer


def bare_ray_rows(deployment: Any, endpoints: Endpoints, plan: Plan) -> list[dict[str, Any]]:
    """Workbench's application replaced by :class:`BareRayServe` on the same proxies, and measured the same way."""
    from ray import serve

    import workbench.ray

    serve.delete(deployment.name)
    bare = serve.deployment(BareRayServe, max_ongoing_requests=workbench.ray.deployment.DEFAULT_MAX_ONGOING_REQUESTS)
    serve.run(bare.bind(), name="bare", route_prefix="/", blocking=False)
    try:
        # serve.run returns once the application runs; each proxy learns its routes a moment later.
        wait_until(lambda: check_answers(endpoints, through_ray=False), "bare Ray Serve's answers")
        return measure({SERVERS[2]: endpoints}, plan)
    finally:
        serve.delete("bare")


# ============================================================================================= measuring
def measure(servers: dict[str, Endpoints], plan: Plan) -> list[dict[str, Any]]:
    """Every (server, protocol, clients) ``plan.rounds`` times, the servers taking turns; the median round each."""

    def once(server: str, protocol: str, clients: int) -> dict[str, Any]:
        endpoints = servers[server]
        target = endpoints.grpc_target if protocol == "grpc" else endpoints.rest_url
        result = run_load(target, protocol, HP2, HP2_INPUTS, concurrency=clients, duration=plan.duration)
        return load_row(server, result)

    rows = []
    for clients in plan.clients:
        for protocol in PROTOCOLS:
            rows += taking_turns(plan.rounds, [functools.partial(once, s, protocol, clients) for s in servers])
    return rows


def ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ray over the server alone at each protocol and client count: requests/s ratio, p50 and p99 differences.

    Also workbench through Ray over bare Ray Serve: how close the replica gets to what Ray's proxies allow here.
    """
    alone = {(r["protocol"], r["clients"]): r for r in rows if r["server"] == SERVERS[0]}
    bare = {(r["protocol"], r["clients"]): r for r in rows if r["server"] == SERVERS[2]}
    out = []
    for ray_row in (r for r in rows if r["server"] == SERVERS[1]):
        base = alone[(ray_row["protocol"], ray_row["clients"])]
        ceiling = bare.get((ray_row["protocol"], ray_row["clients"]))
        out.append(
            {
                "protocol": ray_row["protocol"],
                "clients": ray_row["clients"],
                "ray_over_alone_requests_per_second": round(
                    ray_row["requests_per_second"] / base["requests_per_second"], 2
                ),
                "p50_added_ms": round(ray_row["p50_ms"] - base["p50_ms"], 3),
                "p99_added_ms": round(ray_row["p99_ms"] - base["p99_ms"], 3),
                "ray_over_bare_ray_requests_per_second": (
                    round(ray_row["requests_per_second"] / ceiling["requests_per_second"], 2) if ceiling else None
                ),
            }
        )
    return out


def machine() -> dict[str, Any]:
    import ray

    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "ray": ray.__version__,
        "platform": platform.platform(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="measurements a row (the median is reported)")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 16], help="client counts to measure")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "ray_proxy.json", help="results JSON"
    )
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    plan = Plan(args.duration, args.rounds, tuple(args.clients))

    start: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        repository = root / "models"
        save_half_plus_two(repository / HP2 / "1")
        alone = ServeAlone(repository, root)
        try:
            alone_endpoints, spawn_to_answer = alone.wait()
            start["workbench_alone_spawn_to_first_answer_s"] = round(spawn_to_answer, 2)
            check_answers(alone_endpoints, through_ray=False)
            with ray_deployment(repository, start) as (ray_endpoints, deployment):
                wait_until(lambda: check_answers(ray_endpoints, through_ray=True), "Ray's gRPC and REST answers")
                rows = measure({SERVERS[0]: alone_endpoints, SERVERS[1]: ray_endpoints}, plan)
                rows += bare_ray_rows(deployment, ray_endpoints, plan)
        finally:
            alone.stop()
    rows.sort(key=lambda r: (r["clients"], PROTOCOLS.index(r["protocol"]), SERVERS.index(r["server"])))
    compared = ratios(rows)

    print(f"half_plus_two, median of {plan.rounds} rounds of {plan.duration:g} s (workbench bench's generator):")
    print(format_table(rows, ["server", "protocol", "clients", "requests_per_second", "p50_ms", "p99_ms", "errors"]))
    print("\nRay's proxies over workbench serve alone:")
    print(
        format_table(
            compared,
            [
                "protocol",
                "clients",
                "ray_over_alone_requests_per_second",
                "p50_added_ms",
                "p99_added_ms",
                "ray_over_bare_ray_requests_per_second",
            ],
        )
    )
    print("\nStart-up and shutdown, seconds:")
    print("\n".join(f"  {name}: {seconds}" for name, seconds in start.items()))

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "model": "half_plus_two (workbench.demo), one repository served both ways",
                "machine": machine(),
                "ray_cluster": "local, single node (ray.init on this machine); one replica (num_replicas=1)",
                "duration_s": plan.duration,
                "rounds": plan.rounds,
                "clients": list(plan.clients),
                "rows": rows,
                "ray_vs_alone": compared,
                "startup": start,
                "notes": [
                    "Both servers run the same engine on the same repository; the difference is Ray's HTTP or gRPC "
                    "proxy and its router in front of the replica (an extra process hop each way).",
                    "The servers take turns within each round (the order alternates); Ray stays up, idle, while "
                    "the server alone is measured.",
                    "bare Ray Serve (no model): after those rows, workbench's application is replaced on the same "
                    "proxies by a deployment answering half_plus_two's fixed answers (REST body parsed, gRPC Predict "
                    "through workbench.ray's PredictionService registration): Ray's own ceiling on this machine, "
                    "measured the same way (not interleaved).",
                    "Load from workbench bench's closed-loop generator in this process, sharing the machine's "
                    "cores with the servers and Ray's processes: read the ratios, not the absolute figures.",
                    "deploy_started_seconds is workbench.ray.deploy()'s own figure (Serve's controller and proxies "
                    "started, then the replica loading the repository); ray_init_to_first_answer_s adds starting Ray.",
                ],
            },
            indent=2,
        )
        + "\n"
    )
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
