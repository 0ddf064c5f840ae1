"""Drain and probes of real ``workbench serve`` processes: SIGTERM under load loses no accepted request, readiness
turns false before the ports close, liveness answers from the start, and a second signal exits at once.

Requests are held inside the server by a gated model (tests/models.py's ``save_gated``): while the gate file
exists, every call waits. So the test knows, without timing, that requests are running or queued when the
signal arrives, and decides when they may finish.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import shutil
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import models
import numpy as np
import pytest
import requests
import tensorflow as tf
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc
from test_cli import START_DEADLINE_S, Workbench, free_port
from waiting import model_config_text, place_atomically, wait_until

from workbench.config.options import ServerOptions
from workbench.server import ServerThread

ONE = {"instances": [1.0]}
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


# ------------------------------------------------------------------------------------------------ the gate
@dataclasses.dataclass
class Gate:
    """The gated model's version folder, and the files that hold its calls and count them."""

    version: Path
    gate: Path
    held_dir: Path

    def close(self) -> None:
        """From now on every call waits (markers of earlier calls are cleared first)."""
        shutil.rmtree(self.held_dir, ignore_errors=True)
        self.held_dir.mkdir()
        self.gate.touch()

    def open(self) -> None:
        self.gate.unlink(missing_ok=True)

    def held(self) -> int:
        """Calls that have waited at the gate since it closed."""
        return len(list(self.held_dir.iterdir()))


@pytest.fixture(scope="module")
def gated_model(tmp_path_factory: pytest.TempPathFactory) -> Gate:
    root = tmp_path_factory.mktemp("gated")
    gate = Gate(root / "store" / "1", root / "gate", root / "held")
    gate.held_dir.mkdir()
    models.save_gated(gate.version, gate.gate, gate.held_dir)
    return gate


# The gated model's calls wait on a file (I/O): a server must keep them on its inference threads, as its
# --inline_cheap_calls help says, or the first held call would hold the event loop and every request with it.
ON_THREADS = "--inline_cheap_calls=false"


@pytest.fixture
def gated(gated_model: Gate) -> Iterator[Gate]:
    """The gated model, its gate open again after the test whatever happened."""
    yield gated_model
    gated_model.open()


def gated_repo(gate: Gate, base: Path, warmup: bool = False) -> Path:
    """A model base path holding the gated model as version 1 (replaying one request at load with ``warmup``)."""
    shutil.copytree(gate.version, base / "1")
    if warmup:
        models.write_warmup_file(base / "1", [models.predict_log("gated", {"x": np.array([1.0], np.float32)})])
    return base


# ------------------------------------------------------------------------------------------------ processes
@pytest.fixture
def run_workbench(tmp_path: Path) -> Iterator[Callable[..., Workbench]]:
    started: list[Workbench] = []

    def start(*flags: str) -> Workbench:
        cwd = tmp_path / f"cwd{len(started)}"
        cwd.mkdir()
        started.append(Workbench(cwd, *flags))
        return started[-1]

    yield start
    for wb in started:
        wb.kill()


@dataclasses.dataclass
class Ports:
    rest: int
    grpc: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.rest}"

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.grpc}"

    def flags(self) -> list[str]:
        return [f"--rest_api_port={self.rest}", f"--port={self.grpc}"]


def answering(wb: Workbench, check: Callable[[], bool]) -> Callable[[], bool]:
    """``check``, failing at once (with the server's log) if the process has exited."""

    def predicate() -> bool:
        if wb.proc.poll() is not None:
            pytest.fail(f"workbench exited with {wb.proc.returncode}; stderr:\n{wb.stderr[-3000:]}")
        return check()

    return predicate


def probe(url: str) -> tuple[int, dict[str, str]]:
    r = requests.get(url, timeout=30)
    return r.status_code, r.json()


def health(target: str) -> int:
    with grpc.insecure_channel(target) as channel:
        return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=30).status


def rest_refuses(port: int) -> bool:
    """True once nothing listens on ``port`` any more: a new connection is refused."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=10).close()
    except ConnectionRefusedError:
        return True
    return False


def grpc_refuses(target: str) -> bool:
    """True once a new gRPC channel cannot reach the server (UNAVAILABLE)."""
    try:
        health(target)
    except grpc.RpcError as exc:
        return exc.code() == grpc.StatusCode.UNAVAILABLE
    return False


def queue_depth(url: str, model: str) -> float:
    """Rows waiting for a batch (the ``workbench_queue_depth`` gauge on ``/metrics``)."""
    text = requests.get(url + "/metrics", timeout=30).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "workbench_queue_depth" and sample.labels.get("model") == model
    )


# ------------------------------------------------------------------------------------------------ clients
@dataclasses.dataclass(frozen=True)
class Outcome:
    ok: bool  # a response, and the right one
    refused: bool  # no response: the server refused the connection (REST) or was UNAVAILABLE (gRPC)
    detail: str


class Client(threading.Thread):
    """Sends predict requests one after another until one does not succeed; records every outcome in order."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.outcomes: list[Outcome] = []

    def send(self) -> Outcome:
        raise NotImplementedError

    def run(self) -> None:
        while True:
            outcome = self.send()
            self.outcomes.append(outcome)
            if not outcome.ok:
                return


class RestClient(Client):
    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = url + "/v1/models/gated:predict"

    def run(self) -> None:
        with requests.Session() as self.session:  # keep-alive, as real clients do
            super().run()

    def send(self) -> Outcome:
        try:
            r = self.session.post(self.url, json=ONE, timeout=300)
        except requests.ConnectionError as exc:
            return Outcome(False, "Connection refused" in str(exc), repr(exc))
        return Outcome(r.status_code == 200 and r.json() == {"predictions": [2.0]}, False, f"{r.status_code} {r.text}")


class GrpcClient(Client):
    def __init__(self, target: str) -> None:
        super().__init__()
        self.target = target

    def run(self) -> None:
        with grpc.insecure_channel(self.target) as channel:
            self.stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            super().run()

    def send(self) -> Outcome:
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "gated"
        request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([1.0], np.float32)))
        try:
            response = self.stub.Predict(request, timeout=300)
        except grpc.RpcError as exc:
            code = exc.code()
            return Outcome(False, code == grpc.StatusCode.UNAVAILABLE, f"{code.name}: {exc.details()}")
        return Outcome(list(response.outputs["y"].float_val) == [2.0], False, "OK")


# ------------------------------------------------------------------------------------------------ tests
def test_sigterm_under_load_loses_no_accepted_request(gated, run_workbench, tmp_path):
    base = gated_repo(gated, tmp_path / "gated")
    batching = tmp_path / "batching.txt"  # 2 calls run at once, one request each; the others queue for a batch
    batching.write_text("max_batch_size { value: 1 }\nnum_batch_threads { value: 2 }\n")
    ports = Ports(free_port(), free_port())
    wb = run_workbench(
        *ports.flags(),
        "--model_name=gated",
        ON_THREADS,
        f"--model_base_path={base}",
        "--enable_batching",
        f"--batching_parameters_file={batching}",
        "--drain_seconds=300",
    )
    wait_until(answering(wb, lambda: probe(ports.url + "/readyz")[0] == 200), START_DEADLINE_S, 0.1, "ready")

    clients: list[Client] = [RestClient(ports.url) for _ in range(4)] + [GrpcClient(ports.target) for _ in range(4)]
    for client in clients:
        client.start()
    wait_until(lambda: all(len(c.outcomes) >= 3 for c in clients), 120, what="every client answered 3 times")
    gated.close()
    # Every client's request is inside the server: 2 running in the model, held, and 6 queued for a batch.
    wait_until(
        answering(wb, lambda: gated.held() == 2 and queue_depth(ports.url, "gated") == 6),
        120,
        what="2 requests held and 6 queued",
    )
    sigterm_and_expect_a_drain(wb, ports, gated, clients)
    log = wb.stderr
    phases = [
        "Draining (SIGTERM): not ready any more",
        "Refusing new connections",
        "Every accepted request finished",
        "Stopped",
    ]
    assert all(phase in log for phase in phases), log[-3000:]
    assert [log.index(phase) for phase in phases] == sorted(log.index(phase) for phase in phases)


def sigterm_and_expect_a_drain(wb, ports, gated, clients: list) -> None:
    """SIGTERM with every client's request held: both ports refuse at once, no held request ends until the gate
    opens, then each is answered, the next request of each client is refused at connect, and the server exits 0."""
    before = [len(c.outcomes) for c in clients]
    wb.proc.send_signal(signal.SIGTERM)
    wait_until(lambda: rest_refuses(ports.rest) and grpc_refuses(ports.target), 60, what="both ports refusing")
    assert wb.proc.poll() is None, "the server exited with accepted requests unanswered"
    assert [len(c.outcomes) for c in clients] == before, "a held request ended before it was released"

    gated.open()
    assert wb.wait(300) == 0, wb.stderr[-3000:]
    for client in clients:
        client.join(timeout=60)
        assert not client.is_alive()
    for client, sent in zip(clients, before, strict=True):
        answered, (last,) = client.outcomes[: sent + 1], client.outcomes[sent + 1 :]
        assert all(o.ok for o in answered), [o for o in answered if not o.ok]  # incl. the request held at SIGTERM
        assert last.refused, last  # the next request: refused at connect, never an error response
    assert "Traceback" not in wb.stderr


def test_readiness_turns_false_before_the_ports_close_and_a_second_signal_exits(gated, run_workbench, tmp_path):
    base = gated_repo(gated, tmp_path / "gated")
    ports = Ports(free_port(), free_port())
    wb = run_workbench(
        *ports.flags(),
        "--model_name=gated",
        ON_THREADS,
        f"--model_base_path={base}",
        "--drain_delay_seconds=500",  # far longer than this test: the second signal must cut it short
        "--drain_seconds=600",
    )
    wait_until(answering(wb, lambda: probe(ports.url + "/readyz")[0] == 200), START_DEADLINE_S, 0.1, "ready")
    assert probe(ports.url + "/readyz") == (200, {"status": "ready"})
    assert health(ports.target) == SERVING
    channel = grpc.insecure_channel(ports.target)
    watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), timeout=300)
    watched: list[object] = []  # the statuses streamed, then "ended" or the error that ended the stream

    def follow() -> None:
        try:
            watched.extend(reply.status for reply in watch)
            watched.append("ended")
        except grpc.RpcError as exc:
            watched.append(exc.code())

    watcher = threading.Thread(target=follow, daemon=True)
    watcher.start()
    wait_until(lambda: watched == [SERVING], 60, what="the health watch's first status")

    wb.proc.send_signal(signal.SIGTERM)
    wait_until(answering(wb, lambda: probe(ports.url + "/readyz")[0] == 503), 60, what="/readyz 503")
    status, body = probe(ports.url + "/readyz")
    assert body["status"] == "draining" and "shutting down" in body["reason"]
    assert probe(ports.url + "/healthz") == (200, {"status": "alive"})
    assert health(ports.target) == NOT_SERVING
    watcher.join(timeout=60)  # a draining server ends health watches: they do not hold the drain open
    assert watched == [SERVING, NOT_SERVING, "ended"]
    channel.close()
    # Not ready, yet still taking new connections (for load balancers that have not noticed yet).
    with requests.Session() as fresh:
        r = fresh.post(ports.url + "/v1/models/gated:predict", json=ONE, timeout=60)
    assert r.status_code == 200 and r.json() == {"predictions": [2.0]}
    assert "Still taking new connections for 500s" in wb.stderr

    wb.proc.send_signal(signal.SIGTERM)
    assert wb.wait(60) == 128 + signal.SIGTERM
    assert "Second SIGTERM: exiting at once with status 143" in wb.stderr


def test_probes_from_start_up_until_every_model_has_a_version(gated, run_workbench, tmp_path, model_store):
    gated_base = gated_repo(gated, tmp_path / "gated", warmup=True)  # its warmup request waits at the gate
    late_base = tmp_path / "late"
    late_base.mkdir()
    config = tmp_path / "models.config"
    config.write_text(model_config_text(("gated", gated_base, ""), ("late", late_base, "")))
    ports = Ports(free_port(), free_port())
    gated.close()
    wb = run_workbench(
        *ports.flags(), f"--model_config_file={config}", "--file_system_poll_wait_seconds=0.2", ON_THREADS
    )

    # Loading at start-up (held by the gate): alive, not ready, and the status API says what TF Serving's does.
    wait_until(answering(wb, lambda: gated.held() == 1), START_DEADLINE_S, 0.1, "the warmup request held")
    assert probe(ports.url + "/healthz") == (200, {"status": "alive"})
    assert probe(ports.url + "/readyz") == (503, {"status": "starting", "reason": "loading models at start-up"})
    assert health(ports.target) == NOT_SERVING
    # A status request for a model still in its first load waits for it, as if the port had opened after the load
    # (TF Serving's start-up, which scripts written for it expect).
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        status = pool.submit(requests.get, ports.url + "/v1/models/gated", timeout=120)
        time.sleep(0.5)
        assert not status.done()
        gated.open()
        answered = status.result(timeout=120).json()
    assert [s["state"] for s in answered["model_version_status"]] == ["AVAILABLE"]

    wait_until(answering(wb, lambda: probe(ports.url + "/readyz")[1]["status"] != "starting"), 120, what="loaded")
    assert probe(ports.url + "/readyz") == (503, {"status": "unavailable", "reason": "model late has no version yet"})
    assert health(ports.target) == NOT_SERVING

    place_atomically(model_store / "hp2_tf2", late_base / "1")
    wait_until(answering(wb, lambda: probe(ports.url + "/readyz")[0] == 200), 120, what="ready")
    assert probe(ports.url + "/readyz") == (200, {"status": "ready"})
    assert health(ports.target) == SERVING

    wb.proc.send_signal(signal.SIGTERM)  # idle: the drain ends at once
    assert wb.wait(120) == 0, wb.stderr[-3000:]
    assert rest_refuses(ports.rest)


def test_a_signal_while_models_load_at_start_up_exits_at_once(gated, run_workbench, tmp_path):
    base = gated_repo(gated, tmp_path / "gated", warmup=True)
    ports = Ports(free_port(), free_port())
    gated.close()
    wb = run_workbench(*ports.flags(), "--model_name=gated", f"--model_base_path={base}", ON_THREADS)
    wait_until(answering(wb, lambda: gated.held() == 1), START_DEADLINE_S, 0.1, "the warmup request held")
    wb.proc.send_signal(signal.SIGINT)
    assert wb.wait(60) == 0, wb.stderr[-3000:]  # the gate stays closed: nothing waited for the load
    assert "SIGINT while loading models at start-up: exiting now" in wb.stderr


# ------------------------------------------------------------------------------------------------ in-process
def test_readyz_names_a_model_whose_versions_failed(make_repo, tmp_path):
    good = make_repo("good", {1: "hp2_tf2"})
    broken = tmp_path / "broken"
    models.write_corrupt_version(broken / "1")
    config = tmp_path / "models.config"
    config.write_text(model_config_text(("good", good, ""), ("broken", broken, "")))
    with ServerThread(
        ServerOptions(model_config_file=str(config), rest_api_port=-1, port=0, file_system_poll_wait_seconds=0)
    ) as server:
        r = requests.get(server.rest_url + "/readyz", timeout=30)
        assert r.status_code == 503
        body = r.json()
        assert body["status"] == "unavailable"
        assert body["reason"].startswith("model broken has no AVAILABLE version (version 1 END: ")
        assert "good" not in body["reason"]
        assert requests.get(server.rest_url + "/healthz", timeout=30).status_code == 200
        # /v1/models keeps TF Serving's meaning: the model's status, answered with 200.
        assert requests.get(server.rest_url + "/v1/models/broken", timeout=30).status_code == 200
