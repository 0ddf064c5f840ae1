"""v2's ``…/infer``, TorchServe's ``/predictions`` and OpenAI's ``/embeddings`` answered before Starlette
(workbench/frontends/hot_routes.py, and hot_routes_rsgi.py under granian) against the same requests through
Starlette's routes, byte for byte.

With CORS on, every request goes through Starlette (its middleware, router and the routes' own handlers), so a server
with CORS on and one without differ by the path a request takes alone: their statuses, headers (names, values,
order) and bodies must be the same, errors included. Real servers, real models, raw HTTP; under
``--http-server=granian`` (`make test-granian`) the same holds of granian's RSGI path against its ASGI bridge.
"""

from __future__ import annotations

import http.client
import json
import shutil
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_torchserve import CUSTOM_HANDLER, write_mar
from text_models import HASHER, PARROT, write_model

from workbench.config.options import ServerOptions
from workbench.frontends.openai_api import OpenAIApi
from workbench.frontends.torchserve_rest import TorchServeRest
from workbench.frontends.v2_rest import V2Rest
from workbench.server import ServerThread

LIMIT = 4096  # --rest_api_max_request_bytes of both servers
LENGTH = "Inference-Header-Content-Length"


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Path:
    """hp: y = x/2 + 2 (TensorFlow, FP32 [batch, 1]); doubler: a TorchServe archive ({"x": [...]} → {"y": [...]});
    hasher: a text embedder and parrot a text generator (Python models)."""
    root = tmp_path_factory.mktemp("hot-models")
    write_model(root, "hasher", HASHER)
    write_model(root, "parrot", PARROT)
    shutil.copytree(model_store / "hp2_tf2", root / "hp" / "1")
    write_mar(
        root / "doubler.mar",
        {"modelName": "doubler", "modelVersion": "1.0", "handler": "handler.py"},
        {"handler.py": CUSTOM_HANDLER.encode(), "scale.txt": b"2.0"},
    )
    return root


@pytest.fixture(scope="module")
def servers(repository: Path) -> Iterator[tuple[ServerThread, ServerThread]]:
    """The same server twice: hot routes on, and CORS on (every request through Starlette)."""

    def options(cors: bool) -> ServerOptions:
        return ServerOptions(
            rest_api_port=-1,
            port=0,
            model_repository=str(repository),
            allow_python_models=True,
            rest_api_max_request_bytes=LIMIT,
            rest_api_enable_cors_support=cors,
        )

    with ServerThread(options(False)) as hot, ServerThread(options(True)) as starlette:
        yield hot, starlette


def exchange(server: ServerThread, method: str, path: str, body: bytes, headers: dict[str, str]) -> tuple:
    """(status, headers in order, names in lower case, body) of one request over a fresh connection. Left out: the
    date; CORS's vary; and ``connection``, the HTTP server's word on the connection: granian closes one whose body
    was refused unread (over the limit) when hyper had not read all of it yet, which depends on timing alone."""
    connection = http.client.HTTPConnection(server.rest_url.removeprefix("http://"), timeout=60)
    try:
        connection.request(method, path, body, headers)
        response = connection.getresponse()
        kept = [(k.lower(), v) for k, v in response.getheaders() if k.lower() not in ("date", "vary", "connection")]
        return response.status, kept, response.read()
    finally:
        connection.close()


def v2(inputs: list[dict], **more: object) -> bytes:
    return json.dumps({"inputs": inputs, **more}).encode()


X = {"name": "x", "shape": [2, 1], "datatype": "FP32", "data": [1.0, 3.0]}
RAW_X = struct.pack("<2f", 1.0, 3.0)


def framed(header: dict, raw: bytes) -> tuple[bytes, dict[str, str]]:
    """A body in the binary tensor extension's form, and its header length."""
    text = json.dumps(header).encode()
    return text + raw, {LENGTH: str(len(text))}


BINARY, BINARY_HEADERS = framed(
    {
        "inputs": [{"name": "x", "shape": [2, 1], "datatype": "FP32", "parameters": {"binary_data_size": 8}}],
        "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
    },
    RAW_X,
)

REQUESTS: list[tuple[str, str, bytes, dict[str, str]]] = [
    ("POST", "/v2/models/hp/infer", v2([X]), {}),
    ("POST", "/v2/models/hp/versions/1/infer", v2([X], id="r-1", outputs=[{"name": "y"}]), {}),
    ("POST", "/v2/models/hp/infer", BINARY, BINARY_HEADERS),
    ("POST", "/v2/models/hp/infer", v2([X], parameters={"binary_data_output": True}), {}),
    ("POST", "/v2/models/hp/infer", v2([X]), {"X-Workbench-Key": "user-7"}),
    ("POST", "/v2/models/nope/infer", v2([X]), {}),  # 404, Triton's words
    ("POST", "/v2/models/hp/versions/9/infer", v2([X]), {}),  # an unknown version
    ("POST", "/v2/models/hp/versions/canary/infer", v2([X]), {}),  # an unknown label
    ("POST", "/v2/models/hp/infer", b"{not json", {}),
    ("POST", "/v2/models/hp/infer", v2([{**X, "datatype": "INT64", "data": [1, 3]}]), {}),  # the wrong datatype
    ("POST", "/v2/models/hp/infer", v2([{**X, "shape": [3, 1]}]), {}),
    ("POST", "/v2/models/hp/infer", BINARY, {LENGTH: "99999"}),  # a header length past the body
    ("POST", "/v2/models/hp/infer", v2([{**X, "data": [1.0] * 2000, "shape": [2000, 1]}]), {}),  # over the limit
    ("POST", "/v2/models/hp/versions/1/infer/", v2([X]), {}),  # no such route: Starlette's answer on both
    ("GET", "/v2/models/hp/infer", b"", {}),  # a route's path, another method: Starlette's too
    ("POST", "/predictions/doubler", b'{"x": [1.0, 2.0]}', {"Content-Type": "application/json"}),
    ("PUT", "/predictions/doubler/1.0", b'{"x": [0.5]}', {"Content-Type": "application/json"}),
    ("POST", "/predictions/doubler", b'{"x": [1.0]}', {"X-Shout": "yes"}),  # the handler's text/plain
    ("POST", "/predictions/nope", b'{"x": [1.0]}', {}),
    ("POST", "/predictions/doubler/7.0", b'{"x": [1.0]}', {}),
    ("POST", "/predictions/doubler", b'{"x": "' + b"a" * LIMIT + b'"}', {}),  # over the limit: TorchServe's 413
    ("POST", "/v1/embeddings", b'{"model": "hasher", "input": ["one", "two"]}', {}),
    ("POST", "/openai/v1/embeddings", b'{"model": "hasher:1", "input": "x", "encoding_format": "base64"}', {}),
    ("POST", "/v1/embeddings", b'{"model": "hasher", "input": "x"}', {"X-Workbench-Key": "user-7"}),
    ("POST", "/v1/embeddings", b'{"model": "nope", "input": "x"}', {}),  # OpenAI's 404
    ("POST", "/v1/embeddings", b'{"model": "hasher:canary", "input": "x"}', {}),  # no such label
    ("POST", "/v1/embeddings", b'{"model": "parrot", "input": "x"}', {}),  # not an embedder: 400 naming the model
    ("POST", "/v1/embeddings", b'{"model": "hasher", "input": "x", "dimensions": 4}', {}),  # a parameter it refuses
    ("POST", "/v1/embeddings", b'{"model": "hasher"', {}),
    ("POST", "/v1/embeddings", b'{"model": "hasher", "input": "' + b"a" * LIMIT + b'"}', {}),  # over the limit
    ("POST", "/v1/embeddings/", b'{"model": "hasher", "input": "x"}', {}),  # no such route
    ("GET", "/v1/embeddings", b"", {}),  # another method
]


@pytest.mark.parametrize("method, path, body, headers", REQUESTS)
def test_hot_routes_answer_as_starlettes_routes(servers, method, path, body, headers) -> None:
    hot, starlette = servers
    fast = exchange(hot, method, path, body, headers)
    assert fast == exchange(starlette, method, path, body, headers)
    assert fast[0] != 500, fast


def test_a_binary_answer_says_where_its_json_ends(servers) -> None:
    hot, _ = servers
    status, headers, body = exchange(hot, "POST", "/v2/models/hp/infer", BINARY, BINARY_HEADERS)
    assert status == 200
    found = dict(headers)
    length = int(found[LENGTH.lower()])
    assert found["content-type"] == "application/octet-stream"
    assert json.loads(body[:length])["outputs"][0]["parameters"] == {"binary_data_size": 8}
    assert struct.unpack("<2f", body[length:]) == (2.5, 3.5)


def test_a_torchserve_answer_keeps_the_handlers_type(servers) -> None:
    hot, _ = servers
    status, headers, body = exchange(hot, "POST", "/predictions/doubler", b'{"x": [1.0]}', {"X-Shout": "yes"})
    assert (status, dict(headers)["content-type"], body) == (200, "text/plain; charset=utf-8", b"HELLO")
    status, headers, body = exchange(hot, "POST", "/predictions/doubler", b'{"x": [1.5]}', {})
    assert (status, json.loads(body)) == (200, {"y": [3.0], "batch": 1})


def test_only_the_server_without_cors_takes_the_hot_routes(servers, monkeypatch: pytest.MonkeyPatch) -> None:
    taken: list[str] = []
    for kind in (V2Rest, TorchServeRest, OpenAIApi):
        original = kind.answer

        async def counting(self: Any, match: Any, request: Any, original: Any = original) -> Any:
            taken.append(match.string)
            return await original(self, match, request)

        monkeypatch.setattr(kind, "answer", counting)
    hot, starlette = servers
    for server in (starlette, hot):
        assert exchange(server, "POST", "/v2/models/hp/infer", v2([X]), {})[0] == 200
        assert exchange(server, "POST", "/predictions/doubler", b'{"x": [1.0]}', {})[0] == 200
        assert exchange(server, "POST", "/v1/embeddings", b'{"model": "hasher", "input": "x"}', {})[0] == 200
    assert taken == ["/v2/models/hp/infer", "/predictions/doubler", "/v1/embeddings"]
