"""``workbench serve --http_server=granian``: the REST port on granian, as a process, answering as on uvicorn.

The inference routes are answered in granian's RSGI interface (workbench/frontends/rest_rsgi.py), everything else by
the same Starlette app through workbench/server/asgi_over_rsgi.py; TLS, keep-alive, pipelining, the request-size
limit, the headers and the drain are the server's (workbench/server/granian_http.py). The REST suites run whole on
granian too (`make test-granian`, tests/conftest.py's --http-server); this file checks what is granian's own.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import signal
import socket
import ssl
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from test_cli import START_DEADLINE_S, Workbench
from test_drain_connections import (
    ROUTES,
    assert_nothing_lost,
    clients_of,
    write_halfplus_repository,
    write_server_certificate,
)
from waiting import wait_until

from workbench.config.options import HTTP_SERVER_ENV, ServerOptions
from workbench.config.serve_options import FlagError, serve_options
from workbench.core.errors import ServingError

LIMIT = 4096  # --rest_api_max_request_bytes of the servers here
METRICS = "/monitoring/prometheus/metrics"
PREDICT = ("/v1/models/hp:predict", b'{"instances": [1.0, 2.0]}', b'{"predictions":[2.5,3.0]}')


@pytest.fixture(scope="module")
def repository(model_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_halfplus_repository(tmp_path_factory.mktemp("granian-models"), model_store)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    return write_server_certificate(tmp_path_factory.mktemp("granian-pki"))


class Served:
    """A ``workbench serve --http_server=granian`` process and its ports."""

    def __init__(self, folder: Path, repository: Path, *flags: str) -> None:
        folder.mkdir(parents=True)
        ready = folder / "ready.json"
        monitoring = folder / "monitoring.config"
        monitoring.write_text(f'prometheus_config {{ enable: true path: "{METRICS}" }}\n')
        self.wb = Workbench(
            folder,
            "--http_server=granian",
            f"--model_repository={repository}",
            "--allow_python_models",
            "--rest_api_port=-1",
            "--port=0",
            f"--rest_api_max_request_bytes={LIMIT}",
            f"--monitoring_config_file={monitoring}",
            "--drain_seconds=60",
            f"--ready_file={ready}",
            *flags,
        )
        wait_until(lambda: ready.exists() or self.wb.proc.poll() is not None, START_DEADLINE_S, 0.1, "the ready file")
        assert self.wb.proc.poll() is None, self.wb.stderr[-3000:]
        self.rest_port = json.loads(ready.read_text())["rest_port"]
        # The models load after the ports open: the ready file says the ports are bound.
        scheme = "https" if any(flag.startswith("--rest_api_ssl_cert_file") for flag in flags) else "http"
        self.url = f"{scheme}://127.0.0.1:{self.rest_port}"

    def wait_for_models(self, verify: str | bool = False) -> None:
        def ready() -> bool:
            return requests.get(self.url + "/readyz", verify=verify, timeout=30).status_code == 200

        wait_until(ready, START_DEADLINE_S, 0.1, "models loaded")


@pytest.fixture(scope="module")
def served(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    server = Served(tmp_path_factory.mktemp("granian") / "plain", repository)
    try:
        server.wait_for_models()
        yield server
    finally:
        server.wb.kill()


@pytest.fixture(scope="module")
def served_tls(repository: Path, pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    ca, cert, key = pki
    server = Served(
        tmp_path_factory.mktemp("granian") / "tls",
        repository,
        f"--rest_api_ssl_cert_file={cert}",
        f"--rest_api_ssl_key_file={key}",
    )
    try:
        server.wait_for_models(verify=str(ca))
        yield server
    finally:
        server.wb.kill()


# ------------------------------------------------------------------------------------------------ the flag
def test_the_http_server_is_the_flag_else_the_environment_else_uvicorn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(HTTP_SERVER_ENV, raising=False)
    source = ["--model_repository=models"]
    assert serve_options(source).chosen_http_server() == "uvicorn"
    assert serve_options([*source, "--http_server=granian"]).chosen_http_server() == "granian"
    monkeypatch.setenv(HTTP_SERVER_ENV, "granian")
    assert serve_options(source).chosen_http_server() == "granian"
    assert serve_options([*source, "--http_server=uvicorn"]).chosen_http_server() == "uvicorn"
    with pytest.raises(FlagError, match="--http_server=nginx: expected uvicorn or granian"):
        serve_options([*source, "--http_server=nginx"])
    monkeypatch.setenv(HTTP_SERVER_ENV, "nginx")
    with pytest.raises(ServingError, match=r"\$WORKBENCH_HTTP_SERVER=nginx: expected uvicorn or granian"):
        ServerOptions().chosen_http_server()


# ------------------------------------------------------------------------------------------------ answers
def test_inference_routes_answer_with_workbench_headers(served: Served) -> None:
    path, body, answer = PREDICT
    r = requests.post(served.url + path, data=body, timeout=30)
    assert (r.status_code, r.content) == (200, answer)
    assert r.headers["x-model-name"] == "hp" and r.headers["x-model-version"] == "1"
    assert r.headers["content-type"] == "application/json"
    assert r.headers["server"] == "granian"  # granian's port, not uvicorn's
    assert "(granian)" in served.wb.stderr  # "Exporting HTTP/REST API at ... (granian)"
    for route, request, right in ROUTES:  # TF Serving's, v2's and TorchServe's inference routes
        r = requests.post(served.url + route, json=request, timeout=30)
        assert r.status_code == 200 and right(r.json()), (route, r.text)
    r = requests.post(served.url + path, data=b"{not json", timeout=30)
    assert r.status_code == 400 and r.json()["error"].startswith("JSON Parse error")


def test_errors_and_starlette_routes_answer_as_on_uvicorn(served: Served) -> None:
    r = requests.get(served.url + "/v1/models/hp", timeout=30)
    assert r.status_code == 200
    assert r.json()["model_version_status"][0]["state"] == "AVAILABLE"
    r = requests.get(served.url + "/v1/models/hp/metadata", timeout=30)
    assert "serving_default" in r.json()["metadata"]["signature_def"]["signature_def"]
    r = requests.get(served.url + METRICS, timeout=30)
    assert r.status_code == 200 and ":tensorflow:serving:request_count" in r.text
    r = requests.post(served.url + "/v1/models/nope:predict", json={"instances": [1.0]}, timeout=30)
    assert r.status_code == 404 and r.json() == {"error": "Servable not found for request: Latest(nope)"}
    r = requests.get(served.url + "/nothing/here", timeout=30)
    assert (r.status_code, r.json()) == (404, {"error": "Not found: GET /nothing/here"})
    r = requests.get(served.url + "/v2/models/hp/ready?probe=1", timeout=30)
    assert r.status_code == 200  # a query string reaches the app


def test_a_body_over_the_limit_is_refused_declared_or_streamed(served: Served) -> None:
    too_large = b'{"instances": [' + b"1.0, " * LIMIT + b"1.0]}"
    limit = f"larger than the server's limit of {LIMIT} bytes (workbench serve --rest_api_max_request_bytes)"
    for path in ("/v1/models/hp:predict", "/v2/models/hp/infer"):  # RSGI's route, and one through Starlette
        declared = requests.post(served.url + path, data=too_large, timeout=30)
        chunked = requests.post(served.url + path, data=iter([too_large[:1000], too_large[1000:]]), timeout=30)
        for r in (declared, chunked):
            # RESOURCE_EXHAUSTED, which TF Serving's REST API (and workbench's v2) answers 429, as on uvicorn.
            assert r.status_code == 429, (path, r.text)
            assert r.json() == {"error": f"Request body is {limit}"}
    # A chunked body under the limit is read whole.
    path, body, answer = PREDICT
    r = requests.post(served.url + path, data=iter([body[:5], body[5:]]), timeout=30)
    assert (r.status_code, r.content) == (200, answer)


def test_keep_alive_and_pipelining(served: Served) -> None:
    path, body, answer = PREDICT
    connection = http.client.HTTPConnection("127.0.0.1", served.rest_port, timeout=30)
    connection.connect()
    first = connection.sock
    for route in (path, "/v1/models/hp"):  # RSGI's route and Starlette's, on one connection
        for _ in range(3):
            connection.request("POST" if route == path else "GET", route, body=body if route == path else None)
            response = connection.getresponse()
            assert response.status == 200
            response.read()
            assert connection.sock is first  # the same connection: kept alive
    connection.close()
    # HTTP/1.1 pipelining: two requests in one write, two answers in order.
    request = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    with socket.create_connection(("127.0.0.1", served.rest_port), timeout=30) as sock:
        sock.sendall(request + request)
        received = b""
        while received.count(answer) < 2:
            chunk = sock.recv(65536)
            assert chunk, received
            received += chunk
    assert received.count(b"HTTP/1.1 200") == 2


def test_a_client_gone_mid_request_leaves_the_server_answering(served: Served) -> None:
    path, body, answer = PREDICT
    with socket.create_connection(("127.0.0.1", served.rest_port), timeout=30) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body[:5])
    with socket.create_connection(("127.0.0.1", served.rest_port), timeout=30) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n".encode() + body[:5])
    r = requests.post(served.url + path, data=body, timeout=30)
    assert (r.status_code, r.content) == (200, answer)


def test_tls(served_tls: Served, pki) -> None:
    ca, _, _ = pki
    path, body, answer = PREDICT
    with requests.Session() as session:
        for _ in range(2):
            r = session.post(served_tls.url + path, data=body, verify=str(ca), timeout=30)
            assert (r.status_code, r.content) == (200, answer)
        r = session.get(served_tls.url + "/v1/models/hp", verify=str(ca), timeout=30)
        assert r.status_code == 200
    with pytest.raises(requests.exceptions.SSLError):  # a client that does not trust the CA
        requests.post(served_tls.url + path, data=body, timeout=30)
    tls12 = ssl.create_default_context(cafile=str(ca))
    tls12.maximum_version = ssl.TLSVersion.TLSv1_2  # as uvicorn (Python's ssl), TLS 1.2 clients are served
    connection = http.client.HTTPSConnection("127.0.0.1", served_tls.rest_port, context=tls12, timeout=30)
    connection.request("POST", path, body=body)
    assert connection.getresponse().read() == answer
    connection.close()


# ------------------------------------------------------------------------------------------------ drains
def refused_now(port: int) -> bool:
    """Whether a new connection to ``port`` is refused (a draining port drops SYNs first: that times out, False)."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    return False


def open_connection(port: int, ca: Path | None) -> socket.socket:
    """A connection to ``port`` (its TLS handshake done, trusting ``ca``, where given), nothing sent on it."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    if ca is None:
        return sock
    return ssl.create_default_context(cafile=str(ca)).wrap_socket(sock, server_hostname="127.0.0.1")


def unread_by_server(server_port: int, client_port: int) -> int | None:
    """The bytes the server's end of the connection (127.0.0.1:server_port ↔ :client_port) has not read yet, from
    the kernel's table of TCP sockets (None before the server's end exists)."""
    with open("/proc/net/tcp") as rows:
        next(rows)
        for row in rows:
            fields = row.split()
            local, remote, queues = fields[1], fields[2], fields[4]
            if int(local.split(":")[1], 16) == server_port and int(remote.split(":")[1], 16) == client_port:
                return int(queues.split(":")[1], 16)
    return None


def read_response(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc/net/tcp")
@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
def test_a_drain_answers_requests_granian_has_begun_reading_and_closes_connections_that_sent_nothing(
    repository: Path, pki, tmp_path: Path, tls: bool
) -> None:
    """Once granian stops accepting (the port refusing new connections), a connection whose request it has begun to
    read is answered, with ``Connection: close``; one that has sent nothing is closed without an answer (hyper's
    graceful shutdown; uvicorn's drain waits for it: the difference workbench/server/granian_http.py states)."""
    ca, cert, key = pki
    flags = [f"--rest_api_ssl_cert_file={cert}", f"--rest_api_ssl_key_file={key}"] if tls else []
    server = Served(tmp_path / "server", repository, *flags)
    try:
        server.wait_for_models(verify=str(ca) if tls else False)
        path, body, answer = PREDICT
        head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n".encode()
        begun = open_connection(server.rest_port, ca if tls else None)
        begun.sendall(head)  # the request's first line and a header: the rest comes during the drain
        silent = open_connection(server.rest_port, ca if tls else None)
        client_port = begun.getsockname()[1]
        wait_until(lambda: unread_by_server(server.rest_port, client_port) == 0, 30, 0.01, "granian read the bytes")
        server.wb.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: refused_now(server.rest_port), 60, 0.05, "the port refusing new connections")
        begun.sendall(b"\r\n" + body)
        response = read_response(begun)
        assert response.startswith(b"HTTP/1.1 200 OK\r\n") and response.endswith(answer), response
        assert b"\r\nconnection: close\r\n" in response.lower()
        # Closed, never a partial answer (a reset, or TLS without close_notify, is no answer either).
        with contextlib.suppress(ConnectionResetError, ssl.SSLError):
            assert read_response(silent) == b""
        begun.close()
        silent.close()
        assert server.wb.wait(60) == 0, server.wb.stderr[-3000:]
        assert "Every accepted request finished" in server.wb.stderr
    finally:
        server.wb.kill()


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
def test_sigterm_loses_no_request_on_new_connections(repository: Path, pki, tmp_path: Path, tls: bool) -> None:
    """8 clients on a new connection per request (TF Serving's, v2's and TorchServe's routes), SIGTERM at a moment
    that varies: every request a client sent on a connection the server accepted is answered."""
    ca, cert, key = pki
    flags = [f"--rest_api_ssl_cert_file={cert}", f"--rest_api_ssl_key_file={key}"] if tls else []
    for attempt, pause in enumerate((0.0, 0.031)):
        server = Served(tmp_path / f"server{attempt}", repository, *flags)
        try:
            server.wait_for_models(verify=str(ca) if tls else False)
            with clients_of(server.url, None, str(ca) if tls else False) as clients:
                wait_until(lambda: all(c.tally.answered or c.tally.lost for c in clients), 60, 0.01, "first answers")
                threading.Event().wait(pause)
                server.wb.proc.send_signal(signal.SIGTERM)
                for client in clients:
                    client.join(timeout=120)
                code = server.wb.wait(120)
                assert_nothing_lost(clients, f"SIGTERM {attempt}", server.wb.stderr)
            assert code == 0, server.wb.stderr[-3000:]
            assert "Every accepted request finished" in server.wb.stderr
        finally:
            server.wb.kill()
