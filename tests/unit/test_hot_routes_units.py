"""workbench/frontends/hot_routes.py's answers against Starlette's ``Response``, which the hot routes' Starlette
handlers used to send: the same status, headers (names, values, order) and body for any status and media type; and
the route patterns against Starlette's router."""

from __future__ import annotations

import pytest
from starlette.responses import Response
from starlette.routing import Match, Route

from workbench.frontends.hot_routes import answer_of, answer_of_response, as_response, route_pattern, with_header

MEDIA_TYPES = ["application/json", "application/octet-stream", "text/plain", "text/html; charset=latin-1", "TEXT/x"]


@pytest.mark.parametrize("status", [100, 200, 202, 204, 304, 400, 404, 413, 429, 500, 503])
@pytest.mark.parametrize("media_type", MEDIA_TYPES)
def test_an_answer_is_what_starlettes_response_sends(status: int, media_type: str) -> None:
    body = b'{"y": [1.0]}'
    assert answer_of(body, status, media_type) == answer_of_response(Response(body, status, media_type=media_type))


def test_a_header_given_goes_first_as_in_starlettes_response() -> None:
    binary = "application/octet-stream"
    given = Response(b"raw", 200, headers={"Inference-Header-Content-Length": "1"}, media_type=binary)
    ours = with_header(b"inference-header-content-length", b"1", answer_of(b"raw", 200, binary))
    assert ours == answer_of_response(given)


def test_an_answer_as_a_response_keeps_its_headers() -> None:
    answer = with_header(b"x-a", b"1", answer_of(b"{}", 404))
    response = as_response(answer)
    assert answer_of_response(response) == answer
    assert response.background is None


@pytest.mark.parametrize(
    "path",
    [
        "/v2/models/m/infer",
        "/v2/models/m/versions/3/infer",
        "/v2/models/m/versions/canary/infer",
        "/v2/models/m/versions/infer",
        "/v2/models/m/infer/",
        "/v2/models//infer",
        "/v2/models/a b/infer",
        "/v2/models/m/infer\n",
        "/v2/models/m/x/infer",
    ],
)
def test_route_patterns_match_what_starlettes_routes_match(path: str) -> None:
    for template in ("/v2/models/{model:str}/infer", "/v2/models/{model:str}/versions/{version:str}/infer"):
        route = Route(template, lambda request: Response(), methods=["POST"])
        scope = {"type": "http", "method": "POST", "path": path, "root_path": ""}
        matched, child = route.matches(scope)
        ours = route_pattern(template).match(path)
        assert (matched is Match.FULL) == (ours is not None)
        if ours is not None:
            assert child["path_params"] == ours.groupdict()
