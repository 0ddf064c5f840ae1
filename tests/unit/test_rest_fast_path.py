"""TF Serving's REST inference answered in raw ASGI (:class:`workbench.frontends.rest.RestApp`) against the same
requests through Starlette's routing, byte for byte: statuses, headers (names, values, order) and bodies.

With CORS on, every request goes through Starlette (and, without an Origin header, CORS adds only its
``vary: Origin``), so the two apps differ by the path alone. Also: reading a body in chunks, over the limit, and a
client that disconnects.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np
import pytest
from fakes import FakeServable
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect

from workbench.core.errors import Code, ServingError
from workbench.frontends import rest_asgi
from workbench.frontends.rest import create_app


class FakeDataplane:
    """Model ``m`` (version 3) answers ``y = 2x + 1``; any other name is NOT_FOUND, as the data plane words it."""

    async def infer(self, spec: Any, protocol: str, request: Any, timeout: float | None = None) -> Any:
        if spec.name != "m":
            raise ServingError(Code.NOT_FOUND, f"Servable not found for request: Latest({spec.name})")
        servable = FakeServable("m", 3)
        _, inputs = request.decode(servable.signatures)
        x = inputs["x"]
        if np.any(x < 0):
            raise RuntimeError("a bug in the model")  # a 500 with a JSON body, logged
        return servable.version, request.encode({"y": x * 2 + 1})


def asgi(app: Any, method: str, path: str, body: bytes = b"", chunk: int = 0, **scope: Any) -> tuple[Any, ...]:
    """One request through ``app``: (status, raw headers, body); ``chunk`` sends the body in pieces of that size."""
    pieces = [body[i : i + chunk] for i in range(0, len(body), chunk)] if chunk else [body]
    messages = [
        {"type": "http.request", "body": piece, "more_body": i < len(pieces) - 1} for i, piece in enumerate(pieces)
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    headers = [(b"host", b"test"), (b"content-length", str(len(body)).encode())]
    full = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
            "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "", "headers": headers,
            "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2), **scope}  # fmt: skip
    asyncio.run(app(full, receive, send))
    start, *bodies = sent
    return start["status"], start["headers"], b"".join(m.get("body", b"") for m in bodies)


def without_vary(answer: tuple[Any, ...]) -> tuple[Any, ...]:
    """An answer of the app behind CORS less the one header CORS adds to a request without an Origin."""
    status, headers, body = answer
    return status, [h for h in headers if h != (b"vary", b"Origin")], body


def apps(**kwargs: Any) -> tuple[Any, Any]:
    """The app as served (raw ASGI inference) and the same behind CORS (Starlette for everything)."""
    return create_app(FakeDataplane(), **kwargs), create_app(FakeDataplane(), enable_cors=True, **kwargs)


REQUESTS = [
    ("/v1/models/m:predict", {"instances": [[1.0], [2.5]]}),
    ("/v1/models/m/versions/3:predict", {"inputs": {"x": [[0.5]]}}),
    ("/v1/models/m/labels/stable:PREDICT", {"inputs": [[4.0]]}),
    ("/v1/models/nope:predict", {"instances": [[1.0]]}),
    ("/v1/models/m:predict", b"{not json"),
    ("/v1/models/m:predict", {"instances": [[1.0], [2.0, 3.0]]}),
    ("/v1/models/m:predict", {"instances": [[-1.0]]}),
    ("/v1/models/m/versions/99999999999999999999:predict", {"instances": [[1.0]]}),
    ("/v1/models/m:explain", {"instances": [[1.0]]}),
    ("/v1/models/m/versions/x:predict", {"instances": [[1.0]]}),
]


@pytest.mark.parametrize("path, body", REQUESTS)
def test_inference_answers_the_same_bytes_on_either_path(path, body):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    fast, starlette = apps()
    assert asgi(fast, "POST", path, data) == without_vary(asgi(starlette, "POST", path, data))


def test_a_prediction_says_which_servable_answered():
    fast, _ = apps()
    status, headers, body = asgi(fast, "POST", "/v1/models/m:predict", b'{"instances": [[1.0]]}')
    assert (status, body) == (200, b'{"predictions":[[3.0]]}')
    assert headers == [
        (b"x-model-name", b"m"),
        (b"x-model-version", b"3"),
        (b"content-length", b"23"),
        (b"content-type", b"application/json"),
    ]


def test_inference_skips_starlette_and_everything_else_goes_through_it(monkeypatch):
    calls: list[str] = []
    original = Starlette.__call__

    async def counting(self: Any, scope: Any, receive: Any, send: Any) -> None:
        calls.append(scope["path"])
        await original(self, scope, receive, send)

    monkeypatch.setattr(Starlette, "__call__", counting)
    fast, starlette = apps()
    asgi(fast, "POST", "/v1/models/m:predict", b'{"instances": [[1.0]]}')
    assert calls == []
    asgi(fast, "GET", "/v1/models/m")  # status: Starlette's route
    asgi(fast, "POST", "/v1/models/m:predict", b'{"instances": [[1.0]]}', root_path="/prefix")  # a mount's path
    asgi(starlette, "POST", "/v1/models/m:predict", b'{"instances": [[1.0]]}')  # CORS on
    assert calls == ["/v1/models/m", "/v1/models/m:predict", "/v1/models/m:predict"]


@pytest.mark.parametrize("chunk", [0, 3])
def test_a_body_over_the_limit_is_refused_alike(chunk):
    fast, starlette = apps(max_request_bytes=10)
    data = b'{"instances": [[1.0]]}'
    answer = asgi(fast, "POST", "/v1/models/m:predict", data, chunk=chunk)
    assert answer == without_vary(asgi(starlette, "POST", "/v1/models/m:predict", data, chunk=chunk))
    assert answer[0] == 429 and b"larger than the server's limit of 10 bytes" in answer[2]


def test_a_body_in_chunks_is_joined():
    fast, _ = apps()
    data = json.dumps({"instances": [[float(i)] for i in range(50)]}).encode()
    status, _, body = asgi(fast, "POST", "/v1/models/m:predict", data, chunk=7)
    assert status == 200 and json.loads(body)["predictions"][49] == [99.0]


def test_read_body_raises_client_disconnect_as_starlette_does():
    async def gone() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    with pytest.raises(ClientDisconnect):
        asyncio.run(rest_asgi.read_body({"headers": []}, gone, 100))
    assert rest_asgi.declared_too_large([(b"content-length", b"101")], 100)
    assert not rest_asgi.declared_too_large([(b"content-length", b"100")], 100)
    assert not rest_asgi.declared_too_large([(b"content-length", b"x1")], 100)
