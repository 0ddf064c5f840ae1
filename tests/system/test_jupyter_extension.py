"""The Jupyter server extension (workbench.jupyter): listing and proxying real workbench servers.

A real Jupyter server (pytest-jupyter's ``jp_serverapp``) with the extension enabled, in front of real workbench
servers on loopback ports. One plain tornado server stands in where a test must see exactly what the proxy sent.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import tornado.httpserver
import tornado.testing
import tornado.web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPResponse

from workbench.jupyter import server_records as registry
from workbench.jupyter.server_records import ServerRecord
from workbench.server import ServerThread

pytest_plugins = ["pytest_jupyter.jupyter_server"]

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "s3cret"
Fetch = Callable[..., Any]


@pytest.fixture
def workbench_server(
    runtime_dir: Path, serve: Callable[..., ServerThread], make_repo: Callable[..., Path]
) -> ServerThread:
    """A real server on a repository with model ``hp`` (v1 half_plus_two, v2 half_plus_three; v2 served)."""
    repository = make_repo("hp", {1: "hp2_tf2", 2: "hp3_tf2"}).parent
    return serve(model_repository=str(repository), management_token=TOKEN)


def _record_id(server: ServerThread) -> str:
    return f"{os.getpid()}-{server.server.rest_port}"


def _fake_record(**fields: object) -> ServerRecord:
    """A record of this (live) process, as a server elsewhere in it would write."""
    values: dict[str, object] = {
        "pid": os.getpid(),
        "name": "fake",
        "rest_host": "127.0.0.1",
        "grpc_host": "127.0.0.1",
        "grpc_port": None,
        "process_start": registry._process_start(os.getpid()),
    }
    values.update(fields)
    record = ServerRecord(**values)  # type: ignore[arg-type]
    assert registry.register(record) is not None
    return record


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _refused(fetch: Fetch, *parts: str, **kwargs: Any) -> HTTPResponse:
    with pytest.raises(HTTPClientError) as caught:
        await fetch(*parts, **kwargs)
    assert caught.value.response is not None
    return caught.value.response


class _Echo(tornado.web.RequestHandler):
    """Answers with what it was sent (method, path, query, headers, body), and counts requests."""

    seen: list[dict[str, Any]]

    def initialize(self, seen: list[dict[str, Any]]) -> None:
        self.seen = seen

    def _echo(self) -> None:
        request = {
            "method": self.request.method,
            "path": self.request.path,
            "query": self.request.query,
            "headers": {k.lower(): v for k, v in self.request.headers.items()},
            "body": self.request.body.decode(),
        }
        self.seen.append(request)
        self.set_status(201 if self.request.method == "PUT" else 200)
        self.set_header("Content-Type", "application/x-echo")
        self.finish(json.dumps(request))

    get = post = put = delete = _echo  # type: ignore[assignment]


@pytest.fixture
def echo(runtime_dir: Path, jp_asyncio_loop: Any) -> Iterator[tuple[ServerRecord, list[dict[str, Any]]]]:
    """A registered loopback server that records what reaches it (on the test's loop, where the proxy runs)."""
    seen: list[dict[str, Any]] = []
    sock, port = tornado.testing.bind_unused_port()
    server = tornado.httpserver.HTTPServer(tornado.web.Application([(r"/.*", _Echo, {"seen": seen})]))
    server.add_sockets([sock])
    yield _fake_record(id="echo-1", rest_port=port), seen
    server.stop()


# ------------------------------------------------------------------------------------------------ wiring
def test_the_installed_config_enables_the_extension() -> None:
    config = json.loads((ROOT / "jupyter-config/jupyter_server_config.d/workbench.json").read_text())
    assert config == {"ServerApp": {"jpserver_extensions": {"workbench.jupyter": True}}}
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    shared = project["tool"]["hatch"]["build"]["targets"]["wheel"]["shared-data"]
    assert shared["jupyter-config/jupyter_server_config.d"] == "etc/jupyter/jupyter_server_config.d"


async def test_the_extension_is_loaded(jp_serverapp: Any) -> None:
    extension = jp_serverapp.extension_manager.extensions["workbench.jupyter"]
    assert extension.enabled and list(extension.extension_points) == ["workbench.jupyter"]


# ------------------------------------------------------------------------------------------------ listing
async def test_lists_a_running_server_with_its_models(
    jp_fetch: Fetch, jp_base_url: str, workbench_server: ServerThread
) -> None:
    response = await jp_fetch("workbench", "api", "servers")
    assert response.headers["Content-Type"].startswith("application/json")
    (server,) = json.loads(response.body)["servers"]
    assert server["id"] == _record_id(workbench_server)
    assert (server["pid"], server["name"], server["rest_port"], server["grpc_port"]) == (
        os.getpid(),
        "models",
        workbench_server.server.rest_port,
        workbench_server.server.grpc_port,
    )
    assert server["model_repository"].endswith("models") and server["token_required"] is True
    assert server["proxy_url"] == f"{jp_base_url}workbench/proxy/{server['id']}/"
    assert "error" not in server
    (model,) = server["models"]
    assert model["name"] == "hp"
    assert [(v["version"], v["state"]) for v in model["versions"] if v["state"] == "AVAILABLE"] == [(2, "AVAILABLE")]


async def test_lists_servers_that_do_not_answer_with_the_reason(jp_fetch: Fetch, runtime_dir: Path) -> None:
    gone = _fake_record(id="gone-1", rest_port=_closed_port(), started=1.0)
    grpc_only = _fake_record(id="grpc-1", rest_port=None, grpc_port=_closed_port(), started=2.0)
    remote = _fake_record(id="remote-1", rest_host="192.0.2.7", rest_port=8501, started=3.0)
    response = await jp_fetch("workbench", "api", "servers")
    servers = json.loads(response.body)["servers"]
    assert [s["id"] for s in servers] == [gone.id, grpc_only.id, remote.id]
    assert all("models" not in s and s["error"] for s in servers)
    assert "REST API is off" in servers[1]["error"] and servers[1]["proxy_url"] is None
    assert "not a loopback address" in servers[2]["error"] and servers[2]["proxy_url"] is None


async def test_lists_a_server_that_answers_nonsense_with_the_reason(
    jp_fetch: Fetch, echo: tuple[ServerRecord, list[dict[str, Any]]]
) -> None:
    record, seen = echo
    (server,) = json.loads((await jp_fetch("workbench", "api", "servers")).body)["servers"]
    assert server["error"] == "answered something other than a workbench model list"
    assert seen[-1]["path"] == "/workbench/v1/models" and "authorization" not in seen[-1]["headers"]


async def test_lists_nothing_when_no_server_runs(jp_fetch: Fetch, runtime_dir: Path) -> None:
    response = await jp_fetch("workbench", "api", "servers")
    assert json.loads(response.body) == {"servers": []}


# ------------------------------------------------------------------------------------------------ proxying
async def test_proxies_model_status_and_predict(jp_fetch: Fetch, workbench_server: ServerThread) -> None:
    server_id = _record_id(workbench_server)
    status = await jp_fetch("workbench", "proxy", server_id, "v1", "models", "hp")
    assert status.code == 200 and status.headers["Content-Type"].startswith("application/json")
    assert json.loads(status.body)["model_version_status"][0]["version"] == "2"

    predict = await jp_fetch(
        "workbench",
        "proxy",
        server_id,
        "v1/models/hp:predict",
        method="POST",
        body=json.dumps({"instances": [1.0, 2.0]}),
        headers={"Content-Type": "application/json"},
    )
    assert json.loads(predict.body) == {"predictions": [3.5, 4.0]}  # half_plus_three: v2


async def test_forwards_upstream_errors_as_they_are(jp_fetch: Fetch, workbench_server: ServerThread) -> None:
    response = await _refused(jp_fetch, "workbench", "proxy", _record_id(workbench_server), "v1/models/nope")
    assert response.code == 404 and "nope" in json.loads(response.body)["error"]


async def test_proxies_management_with_the_workbench_token(jp_fetch: Fetch, workbench_server: ServerThread) -> None:
    parts = ("workbench", "proxy", _record_id(workbench_server), "workbench/v1/models/hp/versions/1:load")
    # Jupyter's token authorizes the proxy, not the model server's management API.
    denied = await _refused(jp_fetch, *parts, method="POST", body="")
    assert denied.code == 401

    loaded = await jp_fetch(*parts, method="POST", body="", headers={"X-Workbench-Token": TOKEN})
    versions = {v["version"]: v["state"] for v in json.loads(loaded.body)["versions"]}
    assert versions == {1: "AVAILABLE", 2: "AVAILABLE"}
    promoted = await jp_fetch(
        "workbench",
        "proxy",
        _record_id(workbench_server),
        "workbench/v1/models/hp:promote",
        method="POST",
        body=json.dumps({"version": 1}),
        headers={"X-Workbench-Token": TOKEN, "Content-Type": "application/json"},
    )
    assert promoted.code == 200
    predict = await jp_fetch(
        "workbench",
        "proxy",
        _record_id(workbench_server),
        "v1/models/hp:predict",
        method="POST",
        body=json.dumps({"instances": [1.0]}),
    )
    assert json.loads(predict.body) == {"predictions": [2.5]}  # half_plus_two: v1 now serves


async def test_forwards_method_query_body_and_only_the_right_headers(
    jp_fetch: Fetch, echo: tuple[ServerRecord, list[dict[str, Any]]]
) -> None:
    record, seen = echo
    response = await jp_fetch(
        "workbench",
        "proxy",
        record.id,
        "some/path:verb",
        method="PUT",
        body='{"a": 1}',
        params={"x": "1", "y": "two words"},
        headers={
            "Content-Type": "application/json",
            "Cookie": "_xsrf=abc; session=jupyter",
            "X-Workbench-Token": "mgmt",
        },
    )
    assert response.code == 201 and response.headers["Content-Type"] == "application/x-echo"
    (sent,) = seen
    assert (sent["method"], sent["path"], sent["body"]) == ("PUT", "/some/path:verb", '{"a": 1}')
    assert sent["query"] == "x=1&y=two+words"
    assert sent["headers"]["content-type"] == "application/json"
    assert sent["headers"]["authorization"] == "Bearer mgmt"  # never Jupyter's own token
    assert "cookie" not in sent["headers"] and "x-workbench-token" not in sent["headers"]

    await jp_fetch("workbench", "proxy", record.id, "v1/models", method="DELETE")
    assert seen[-1]["method"] == "DELETE" and "authorization" not in seen[-1]["headers"]


async def test_an_encoded_path_cannot_change_the_target(
    jp_fetch: Fetch, echo: tuple[ServerRecord, list[dict[str, Any]]]
) -> None:
    record, seen = echo
    # jp_fetch quotes the path: '?', '#' and '@' arrive encoded and must stay part of the upstream path.
    await jp_fetch("workbench", "proxy", record.id, "@evil.example/a?b#c")
    assert seen[-1]["path"] == "/@evil.example/a%3Fb%23c" and seen[-1]["query"] == ""


# ------------------------------------------------------------------------------------------------ refusals
async def test_refuses_unknown_servers(jp_fetch: Fetch, runtime_dir: Path) -> None:
    response = await _refused(jp_fetch, "workbench", "proxy", "12345-8501", "v1/models/hp")
    assert response.code == 404
    assert json.loads(response.body) == {"error": "unknown workbench server 12345-8501"}
    dotted = await _refused(jp_fetch, "workbench", "proxy", "..", "v1/models")
    assert dotted.code == 404


async def test_refuses_a_record_of_a_dead_process(jp_fetch: Fetch, runtime_dir: Path) -> None:
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    record = _fake_record(id="dead-1", pid=child.pid, rest_port=_closed_port())
    response = await _refused(jp_fetch, "workbench", "proxy", record.id, "v1/models")
    assert response.code == 404
    assert not (runtime_dir / "dead-1.json").exists()


@pytest.mark.parametrize("host", ["192.0.2.7", "example.com", "10.0.0.1"])
async def test_never_forwards_to_a_host_that_is_not_loopback(
    jp_fetch: Fetch, echo: tuple[ServerRecord, list[dict[str, Any]]], host: str
) -> None:
    record, seen = echo
    # Same port as the echo server: were the host ignored, the request would reach it.
    remote = _fake_record(id="remote-1", rest_host=host, rest_port=record.rest_port)
    response = await _refused(jp_fetch, "workbench", "proxy", remote.id, "v1/models", method="POST", body="{}")
    assert response.code == 404
    assert json.loads(response.body) == {"error": "unknown workbench server remote-1"}
    assert seen == []


async def test_a_wildcard_bind_is_reached_on_loopback(
    jp_fetch: Fetch, echo: tuple[ServerRecord, list[dict[str, Any]]]
) -> None:
    record, seen = echo
    wildcard = _fake_record(id="wildcard-1", rest_host="0.0.0.0", rest_port=record.rest_port)
    response = await jp_fetch("workbench", "proxy", wildcard.id, "v1/models")
    assert response.code == 200 and seen[-1]["path"] == "/v1/models"


async def test_refuses_a_server_without_rest(jp_fetch: Fetch, runtime_dir: Path) -> None:
    record = _fake_record(id="grpc-1", rest_port=None, grpc_port=8500)
    response = await _refused(jp_fetch, "workbench", "proxy", record.id, "v1/models")
    assert response.code == 404


async def test_refuses_the_stats_stream(jp_fetch: Fetch, echo: tuple[ServerRecord, list[dict[str, Any]]]) -> None:
    record, seen = echo
    response = await _refused(jp_fetch, "workbench", "proxy", record.id, "workbench/v1/stats/stream")
    assert response.code == 400 and "poll /workbench/v1/stats" in json.loads(response.body)["error"]
    assert seen == []


async def test_an_unreachable_server_is_a_bad_gateway(jp_fetch: Fetch, runtime_dir: Path) -> None:
    record = _fake_record(id="gone-1", rest_port=_closed_port())
    response = await _refused(jp_fetch, "workbench", "proxy", record.id, "v1/models")
    assert response.code == 502 and "did not answer" in json.loads(response.body)["error"]


# ------------------------------------------------------------------------------------------------ auth
@pytest.mark.parametrize("parts", [("workbench", "api", "servers"), ("workbench", "proxy", "echo-1", "v1/models")])
async def test_jupyters_token_is_required(
    jp_fetch: Fetch, echo: tuple[ServerRecord, list[dict[str, Any]]], parts: tuple[str, ...]
) -> None:
    _, seen = echo
    response = await _refused(jp_fetch, *parts, headers={"Authorization": ""})
    assert response.code == 403
    wrong = await _refused(jp_fetch, *parts, method="POST", body="{}", headers={"Authorization": "token wrong"})
    assert wrong.code == 403
    assert seen == []


async def test_a_raw_request_without_the_token_is_refused(
    jp_serverapp: Any, jp_base_url: str, http_server_client: Any, workbench_server: ServerThread
) -> None:
    path = f"workbench/proxy/{_record_id(workbench_server)}/v1/models/hp"
    url = f"http://127.0.0.1:{jp_serverapp.port}{jp_base_url}{path}"
    client = AsyncHTTPClient()
    with pytest.raises(HTTPClientError) as caught:
        await client.fetch(url)
    assert caught.value.code == 403
