"""Drains at random moments lose no request a client had sent: a new connection per request, as scripts and many
load balancers make them, over every REST API (TF Serving's, v2, TorchServe's), plain and TLS, and gRPC.

A rolling update's contract (TF Serving's, Kubernetes'): once a drain starts, new connections are refused; every
connection the server accepted before has its request read and answered (with ``Connection: close``), and an idle
keep-alive connection is closed only between requests. A request is *lost* when its client connected, sent it, and
got no answer (a reset, a closed connection, a 5xx); one whose connection was refused was never accepted, and a
client then goes elsewhere.

Clients and drains run concurrently, so these are the conditions of a real rollout: the drain lands while some
connections are in the kernel's accept queue, some accepted with their request not yet read, some answering.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import json
import random
import shutil
import signal
import socket
import ssl
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import requests
import tensorflow as tf
import trustme
from model_archives import write_mar
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc
from test_cli import START_DEADLINE_S, Workbench
from waiting import wait_until

from workbench.config.options import ServerOptions
from workbench.server import ServerThread, http_drain

DRAINS = 10  # per transport: 20 drains in all, plain and TLS
# Each REST API's inference route, its body for x = 1, and what hp2 (y = x / 2 + 2) answers there.
ROUTES: list[tuple[str, dict, Callable[[dict], bool]]] = [
    ("/v1/models/hp:predict", {"instances": [1.0]}, lambda got: got == {"predictions": [2.5]}),
    (
        "/v2/models/hp/infer",
        {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0]}]},
        lambda got: got["outputs"][0]["data"] == [2.5],
    ),
    ("/predictions/halfplus", {"x": [1.0]}, lambda got: got == {"y": [2.5]}),
]
# TorchServe's handler interface, in plain Python: the same y = x / 2 + 2 from a model archive.
HANDLER = """
import json


class HalfPlusTwo:
    def initialize(self, context):
        self.initialized = True

    def handle(self, data, context):
        bodies = [row.get("data") or row.get("body") for row in data]
        rows = [json.loads(body) if isinstance(body, (bytes, bytearray)) else body for body in bodies]
        return [{"y": [v / 2 + 2 for v in row["x"]]} for row in rows]
"""


@dataclasses.dataclass
class Tally:
    """What one client saw: answers, refusals (never accepted) and losses (accepted, never answered)."""

    answered: int = 0
    refused: int = 0
    lost: list[str] = dataclasses.field(default_factory=list)
    # gRPC's core answers CANCELLED to a call that reached its transport as the server stopped but that it never
    # handed to the application (grpc/grpc#41785, the same core as TF Serving's): the server's own count of the
    # requests it ran tells whether such a call was accepted (see ``assert_every_counted_request_answered``).
    cancelled_by_grpc_core: int = 0


def refused_at_connect(exc: requests.ConnectionError) -> bool:
    """The server took no connection: nothing listened, or the listening socket went before accepting it."""
    text = repr(exc)
    return "Connection refused" in text or "NewConnectionError" in text


class FreshConnections(threading.Thread):
    """Sends one route's request on a new connection each time, until its connection is refused or ``stop``."""

    def __init__(self, base: str, route: int, verify: str | bool, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.url = base + ROUTES[route][0]
        self.body, self.right = ROUTES[route][1], ROUTES[route][2]
        self.verify, self.stop = verify, stop
        self.tally = Tally()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                # No Session: a new connection per request, closed after its answer.
                r = requests.post(self.url, json=self.body, verify=self.verify, timeout=60)
            except requests.ConnectionError as exc:
                if refused_at_connect(exc):
                    self.tally.refused += 1
                    return
                self.tally.lost.append(repr(exc))
                return
            if r.status_code == 200 and self.right(r.json()):
                self.tally.answered += 1
            else:
                self.tally.lost.append(f"{r.status_code} {r.text[:200]}")
                return


class FreshChannels(threading.Thread):
    """The same over gRPC: a new channel (so a new connection) per Predict. UNAVAILABLE is gRPC's refusal."""

    def __init__(self, target: str, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.target, self.stop = target, stop
        self.url = target
        self.tally = Tally()

    def run(self) -> None:
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "hp"
        request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([1.0], np.float32)))
        while not self.stop.is_set():
            try:
                with grpc.insecure_channel(self.target) as channel:
                    response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=60)
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.UNAVAILABLE:
                    self.tally.refused += 1
                    return
                if exc.code() == grpc.StatusCode.CANCELLED and exc.details() == "CANCELLED":
                    self.tally.cancelled_by_grpc_core += 1
                    return
                self.tally.lost.append(f"{exc.code().name}: {exc.details()}")
                return
            if list(response.outputs["y"].float_val) == [2.5]:
                self.tally.answered += 1
            else:
                self.tally.lost.append(str(response))
                return


def write_halfplus_repository(root: Path, model_store: Path) -> Path:
    """hp (a SavedModel) and halfplus (a TorchServe model archive) in ``root``, both y = x / 2 + 2."""
    shutil.copytree(model_store / "hp2_tf2", root / "hp" / "1")
    write_mar(
        root / "halfplus.mar",
        {"modelName": "halfplus", "modelVersion": "1.0", "handler": "handler.py"},
        {"handler.py": HANDLER},
    )
    return root


def write_server_certificate(folder: Path) -> tuple[Path, Path, Path]:
    """(CA, the server's chain, its key) for 127.0.0.1, written in ``folder``."""
    ca = trustme.CA()
    issued = ca.issue_cert("127.0.0.1")
    (folder / "ca.pem").write_bytes(ca.cert_pem.bytes())
    (folder / "server.pem").write_bytes(b"".join(blob.bytes() for blob in issued.cert_chain_pems))
    (folder / "server.key").write_bytes(issued.private_key_pem.bytes())
    return folder / "ca.pem", folder / "server.pem", folder / "server.key"


@pytest.fixture(scope="module")
def repository(model_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_halfplus_repository(tmp_path_factory.mktemp("drain-connections"), model_store)


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    return write_server_certificate(tmp_path_factory.mktemp("drain-pki"))


@contextlib.contextmanager
def clients_of(rest_url: str, grpc_target: str | None, verify: str | bool) -> Iterator[list]:
    """8 clients (REST on each API, and gRPC where given), each sending on new connections; stopped on leaving."""
    stop = threading.Event()
    clients: list[FreshConnections | FreshChannels] = [
        FreshConnections(rest_url, index % len(ROUTES), verify, stop) for index in range(6 if grpc_target else 8)
    ]
    if grpc_target:
        clients += [FreshChannels(grpc_target, stop) for _ in range(2)]
    for client in clients:
        client.start()
    try:
        yield clients
    finally:
        stop.set()
        for client in clients:
            client.join(timeout=120)


def requests_counted(server: ServerThread, model: str) -> float:
    """The requests for ``model`` the server ran, by TF Serving's ``request_count`` (every API counts there)."""
    return sum(
        sample.value
        for family in server.server.metrics.registry.collect()
        for sample in family.samples
        if sample.name == ":tensorflow:serving:request_count" and sample.labels.get("model_name") == model
    )


def assert_every_counted_request_answered(server: ServerThread, clients: list, what: str) -> None:
    """Each request hp ran was answered to its client: a call cancelled by gRPC's core was never run."""
    answered = sum(client.tally.answered for client in clients if not client.url.endswith("/predictions/halfplus"))
    assert requests_counted(server, "hp") == answered, f"{what}: hp ran requests its clients never got answers to"


def assert_nothing_lost(clients: list, what: str, server_log: str = "") -> None:
    lost = [loss for client in clients for loss in client.tally.lost]
    assert not lost, f"{what}: {len(lost)} accepted requests lost: {lost[:5]}" + (
        f"; the server's log:\n{server_log[-6000:]}" if server_log else ""
    )
    assert all(not client.is_alive() for client in clients), f"{what}: a client still waits for an answer"


def drain_options(repository: Path, **tls: str) -> ServerOptions:
    """The repository served on free ports, with a drain long enough that only a lost request can end one early."""
    return ServerOptions(
        model_repository=str(repository), allow_python_models=True, rest_api_port=-1, port=0, drain_seconds=60, **tls
    )


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
def test_drains_at_random_moments_lose_no_request_on_new_connections(repository, certificate, tls):
    ca, cert, key = certificate
    tls_fields = {"rest_api_ssl_cert_file": str(cert), "rest_api_ssl_key_file": str(key)} if tls else {}
    pace = random.Random(41)  # the moments vary from drain to drain, the same in every run
    answered = 0
    for drain in range(DRAINS):
        server = ServerThread(drain_options(repository, **tls_fields)).start()
        # gRPC's own clients on every other drain of plain HTTP (the gRPC port has no TLS here).
        grpc_target = server.grpc_target if not tls and drain % 2 else None
        with clients_of(server.rest_url, grpc_target, str(ca) if tls else False) as clients:
            wait_until(lambda: all(c.tally.answered or c.tally.lost for c in clients), 60, 0.005, "first answers")
            threading.Event().wait(pace.uniform(0.0, 0.05))  # the drain lands anywhere in the clients' cycle
            server.stop()
            for client in clients:  # each ends on its first refused connection
                client.join(timeout=120)
            assert_nothing_lost(clients, f"drain {drain}")
            assert_every_counted_request_answered(server, clients, f"drain {drain}")
        answered += sum(client.tally.answered for client in clients)
    assert answered >= DRAINS * 8  # every client was answered before each drain


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a socket filter on the listening socket: Linux's")
def test_a_draining_port_drops_new_connections_and_keeps_the_ones_it_has():
    """The first step of a REST drain: the listening socket drops new connections' SYNs (their clients are refused
    once the port closes), while a connection already made (in the accept queue, its request sent) stays whole."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        listener.setblocking(False)  # as a server's: accept_waiting takes what is queued and stops
        port = listener.getsockname()[1]
        made = socket.create_connection(("127.0.0.1", port), timeout=30)
        made.sendall(b"GET / HTTP/1.1\r\n")
        assert http_drain.refuse_new_connections([listener])
        with socket.socket() as late:
            late.settimeout(1.5)  # a dropped SYN is sent again after 1 s, dropped again
            with pytest.raises(TimeoutError):
                late.connect(("127.0.0.1", port))
        assert http_drain.handshakes_in_progress({port}) == 0
        (accepted,) = http_drain.accept_waiting([listener])
        with accepted, made:
            accepted.setblocking(True)
            assert accepted.recv(64) == b"GET / HTTP/1.1\r\n"  # the segments after the handshake pass the filter
    with socket.socket() as after, pytest.raises(ConnectionRefusedError):
        after.connect(("127.0.0.1", port))


def test_an_https_drain_answers_a_connection_that_has_not_sent_its_request_yet(repository, certificate):
    """A connection the server accepted but whose request it has not read looks idle; closing it then drops a request
    already on its way. Here the client connects (TLS handshake done), the drain starts, then the request leaves:
    it is answered, with ``Connection: close``."""
    ca, cert, key = certificate
    options = drain_options(repository, rest_api_ssl_cert_file=str(cert), rest_api_ssl_key_file=str(key))
    server = ServerThread(options).start()
    context = ssl.create_default_context(cafile=str(ca))
    connection = http.client.HTTPSConnection("127.0.0.1", server.server.rest_port, context=context, timeout=60)
    connection.connect()
    stopping = threading.Thread(target=server.stop, daemon=True)
    stopping.start()
    wait_until(lambda: server.server.readiness().ready is False, 30, 0.01, "the drain started")
    connection.request("POST", "/v1/models/hp:predict", body=b'{"instances": [1.0]}')
    response = connection.getresponse()
    assert (response.status, response.read()) == (200, b'{"predictions":[2.5]}')
    if response.getheader("connection") != "close":
        # granian answers a request that arrives before its graceful shutdown begins (the drain's first steps take
        # the accept queue in) as any other, then closes the connection once it is idle: the next read is its end.
        assert options.chosen_http_server() == "granian", "uvicorn answers it with Connection: close"
        connection.sock.settimeout(60)
        assert connection.sock.recv(1) == b""
    connection.close()
    stopping.join(timeout=120)
    assert not stopping.is_alive()


@pytest.mark.parametrize("runners", ["in_process", "1"])
def test_sigterm_to_workers_loses_no_request_on_new_connections(repository, tmp_path, runners):
    """``workbench serve --num_workers=2`` (and with a model runner) under SIGTERM, clients on new connections: each
    worker drains its own port's accept queue and connections."""
    for attempt in range(2):
        sigterm_workers_under_clients(repository, tmp_path / f"attempt{attempt}", runners, f"SIGTERM {attempt}")


def sigterm_workers_under_clients(repository: Path, folder: Path, runners: str, what: str) -> None:
    """Start ``workbench serve`` with two workers, send SIGTERM while 8 clients send, and check nothing was lost."""
    ready = folder / "ready.json"
    cwd = folder / "cwd"
    cwd.mkdir(parents=True)
    wb = Workbench(
        cwd,
        "--num_workers=2",
        f"--model_runners={runners}",
        f"--model_repository={repository}",
        "--allow_python_models",
        "--rest_api_port=-1",
        "--port=0",
        "--drain_seconds=60",
        f"--ready_file={ready}",
    )
    try:
        wait_until(lambda: ready.exists() or wb.proc.poll() is not None, START_DEADLINE_S, 0.1, "the ready file")
        assert wb.proc.poll() is None, wb.stderr[-3000:]
        ports = json.loads(ready.read_text())
        rest, target = f"http://127.0.0.1:{ports['rest_port']}", f"127.0.0.1:{ports['grpc_port']}"
        with clients_of(rest, target, False) as clients:
            wait_until(lambda: all(c.tally.answered or c.tally.lost for c in clients), 60, 0.01, "first answers")
            threading.Event().wait(random.uniform(0.0, 0.2))
            wb.proc.send_signal(signal.SIGTERM)
            for client in clients:
                client.join(timeout=120)
            code = wb.wait(120)  # first: a loss is told with the whole drain's log (which worker, which phase)
            assert_nothing_lost(clients, what, wb.stderr)
            # No call held a worker to the end of its budget (one gRPC core took in and never handed over is
            # cancelled at once: workbench.server.grpc_drain).
            assert "Drain budget" not in wb.stderr, wb.stderr[-6000:]
        assert code == 0, wb.stderr[-3000:]
    finally:
        wb.kill()
