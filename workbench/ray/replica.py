"""One Ray Serve replica: a whole workbench engine, reached through Ray's HTTP and gRPC proxies.

The replica starts :class:`~workbench.server.ModelServer` without ports (``open_ports=False``): its manager loads
the repository, batches per model and polls the repository's routing state as any server does, so every replica
follows one promotion or canary. Ray's HTTP proxy hands requests to workbench's REST app (the ASGI app Ray's
``serve.ingress`` runs); Ray's gRPC proxy calls one method per RPC (:mod:`workbench.ray.grpc_methods`), which call
workbench's own servicers. Every answer names the replica that gave it (``X-Workbench-Replica`` over REST, the
``workbench-replica`` trailing metadata over gRPC).
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from ray import serve
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from workbench.config.serve_options import serve_options
from workbench.ray.grpc_methods import ray_methods
from workbench.ray.peers import ReplicaPeers
from workbench.ray.replica_metrics import RayServingMetrics
from workbench.server import ModelServer

REPLICA_HEADER = "x-workbench-replica"

log = logging.getLogger(__name__)


class _ReplicaHeader:
    """ASGI middleware: every HTTP answer carries the id of the replica that gave it."""

    def __init__(self, app: ASGIApp, replica: str) -> None:
        self.app = app
        self.header = (REPLICA_HEADER.encode(), replica.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_header(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), self.header]
            await send(message)

        await self.app(scope, receive, send_with_header)


def _replica_identity() -> tuple[str, str]:
    """(application, replica id) of this replica."""
    try:
        context = serve.get_replica_context()
        return str(context.app_name), str(context.replica_id.unique_id)
    except Exception:  # noqa: BLE001 - outside a replica (the class used on its own): the process is the replica
        return "workbench", f"pid-{os.getpid()}"


def _log_to_stderr() -> None:
    """Workbench's log lines go where Ray keeps each replica's output (its log files), once per process."""
    logger = logging.getLogger("workbench")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


class WorkbenchReplica:
    """The deployment class :func:`workbench.ray.deploy` wraps with ``serve.ingress`` and ``serve.deployment``.

    ``serve_flags`` are ``workbench serve``'s flags (a model source among them); ports, workers and ready files
    do not apply, as Ray's proxies own the ports.
    """

    # Ray Serve awaits an async constructor: the replica takes requests once the repository has loaded.
    async def __init__(self, serve_flags: Sequence[str]) -> None:  # type: ignore[misc]
        _log_to_stderr()
        app, self.replica_id = _replica_identity()
        options = serve_options(list(serve_flags))
        # Stats, metrics and health through Ray's proxy describe every replica of the application, whichever answers.
        peers = functools.partial(ReplicaPeers, app, self.replica_id)
        self.server = ModelServer(options, peers=peers, metrics=RayServingMetrics())
        await self.server.start(open_ports=False)  # returns once the repository's versions have loaded
        # The server's own frontends, as its ports would serve them; Ray's proxy tells nothing of the client's address.
        servicers = self.server.frontends.grpc_servicers(direct=False)
        self.prediction_service = servicers.prediction
        self.model_service = servicers.model
        self.inference_service = servicers.inference
        self.torchserve_inference = servicers.torchserve_inference
        self.torchserve_management = servicers.torchserve_management
        models = self.server.dataplane.model_names()
        log.info("Replica %s serves %s", self.replica_id, ", ".join(models) or "no models")

    def __serve_build_asgi_app__(self) -> ASGIApp:  # the name Ray Serve calls
        return _ReplicaHeader(self.server.frontends.rest_app(), self.replica_id)

    def check_health(self) -> None:
        """Ray's controller asks this periodically: a replica whose engine stopped is replaced."""
        readiness = self.server.readiness()
        if readiness.status == "draining":
            raise RuntimeError(f"workbench replica {self.replica_id} is stopping")

    async def __del__(self) -> None:
        """Ray stops the replica (scale-down, redeploy, shutdown) once its requests have finished: stop the engine,
        then let Ray's ASGI wrapper end the app's lifespan."""
        server: ModelServer | None = getattr(self, "server", None)
        if server is not None:
            await server.stop(cause="Ray Serve stopped the replica")
        wrapper_del: Any = getattr(super(), "__del__", None)
        if wrapper_del is not None:
            await wrapper_del()


for _name, _method in ray_methods().items():
    setattr(WorkbenchReplica, _name, _method)
