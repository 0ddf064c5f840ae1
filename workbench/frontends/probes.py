"""Probes for orchestrators on the REST port: ``GET /healthz`` (liveness) and ``GET /readyz`` (readiness).

- ``/healthz``: 200 ``{"status": "alive"}`` whenever the process answers HTTP, from the moment the port opens,
  while models load at start-up and while draining. It runs no model and reads no state, so a busy server still
  answers; a restart would not help a server that answers this.
- ``/readyz``: 200 ``{"status": "ready"}`` when every configured model has an AVAILABLE version and the server is
  not draining; otherwise 503 ``{"status": "starting" | "unavailable" | "draining", "reason": "..."}``.

``/v1/models/<model>`` keeps TF Serving's meaning (the versions and their states), and is no probe: it answers 200
for a model whose versions all failed.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from workbench.frontends.rest import json_response
from workbench.planes.dataplane import Dataplane
from workbench.protocol.json_tensor import dumps

LIVENESS_PATH = "/healthz"
READINESS_PATH = "/readyz"


def probe_routes(dataplane: Dataplane) -> list[Route]:
    """Liveness answers while the process does; readiness is the data plane's (:meth:`Dataplane.readiness`)."""

    async def healthz(_: Request) -> Response:
        return json_response(b'{"status":"alive"}')

    async def readyz(_: Request) -> Response:
        answer = dataplane.readiness()
        return json_response(dumps(answer.body()), 200 if answer.ready else 503)

    return [Route(LIVENESS_PATH, healthz, methods=["GET"]), Route(READINESS_PATH, readyz, methods=["GET"])]
