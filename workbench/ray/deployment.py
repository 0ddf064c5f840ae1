"""Deploy a model repository on Ray Serve from a notebook or a script: :func:`deploy` and its handle.

One Ray Serve application with one deployment of :class:`~workbench.ray.replica.WorkbenchReplica`. Ray's HTTP proxy
serves workbench's REST API on ``http_port`` and Ray's gRPC proxy TF Serving's and v2's gRPC services on
``grpc_port``, on every node of the cluster; replicas scale by count or by Ray's autoscaling. The repository is the
single source of truth: a folder every node sees, or an object-store URL, whose routing state every replica polls.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import ray
from ray import serve
from ray.serve.schema import ProxyStatus

from workbench.config.options import ServerOptions
from workbench.config.ray_deploy_defaults import RAY_DEPLOY_DEFAULTS
from workbench.config.serve_options import serve_options
from workbench.config.server_flags import MANAGEMENT_TOKEN_ENV, serve_flag_words
from workbench.jupyter import server_records
from workbench.ray.grpc_methods import SERVICER_FUNCTIONS
from workbench.ray.peers import forget_replicas
from workbench.ray.replica import WorkbenchReplica
from workbench.runtime.storage import is_remote

DEFAULT_NAME = RAY_DEPLOY_DEFAULTS.name
# How long Serve's proxies may take to start in all (Ray's own wait is a minute; see _start_serve).
PROXY_START_SECONDS = 300.0
log = logging.getLogger(__name__)
# Ray's default (5) suits a model called once per request; workbench queues and batches many requests a replica.
DEFAULT_MAX_ONGOING_REQUESTS = 256


@dataclasses.dataclass
class RayDeployment:
    """A workbench application on Ray Serve: where it answers, how it is doing, and :meth:`shutdown`."""

    name: str
    host: str
    http_port: int
    grpc_port: int
    started_seconds: float  # from deploy() to every replica serving
    _owns_ray: bool = dataclasses.field(default=False, repr=False)
    _registry_id: str | None = dataclasses.field(default=None, repr=False)

    @property
    def rest_url(self) -> str:
        """The REST API's base URL (TF Serving's ``/v1/models/…`` are under it)."""
        return f"http://{self.host}:{self.http_port}"

    @property
    def grpc_target(self) -> str:
        """``host:port`` for ``grpc.insecure_channel`` (TF Serving's PredictionService and v2's service)."""
        return f"{self.host}:{self.grpc_port}"

    def status(self) -> dict[str, Any]:
        """The application's status and its replicas by state, as Ray Serve reports them."""
        return application_status(self.name)

    def shutdown(self) -> None:
        """Delete the application; stop Serve when no other application runs, and Ray when deploy() started it."""
        if self._registry_id is not None:
            server_records.unregister(self._registry_id)
            self._registry_id = None
        delete_application(self.name)
        if self._owns_ray:
            ray.shutdown()


def _enum_value(value: Any) -> str:
    """An enum of Ray's (ApplicationStatus, ReplicaState) by its value: "RUNNING", not "ApplicationStatus.RUNNING"."""
    return str(getattr(value, "value", value))


def application_status(name: str) -> dict[str, Any]:
    """``{"status", "message", "replicas": {state: count}}`` of application ``name`` (status NOT_DEPLOYED if none)."""
    app = serve.status().applications.get(name)
    if app is None:
        return {"status": "NOT_DEPLOYED", "message": "", "replicas": {}}
    deployment = next(iter(app.deployments.values()), None)
    replicas = {} if deployment is None else {_enum_value(state): n for state, n in deployment.replica_states.items()}
    return {"status": _enum_value(app.status), "message": app.message, "replicas": replicas}


def delete_application(name: str) -> None:
    """Delete application ``name`` and wait until its replicas stopped; stop Serve when no application is left."""
    serve.delete(name)
    forget_replicas(name)
    if not serve.status().applications:
        serve.shutdown()


def _serve_flags(
    repository: str | os.PathLike[str] | None, flags: Sequence[str], http_host: str
) -> tuple[list[str], ServerOptions]:
    """The replicas' ``workbench serve`` flags, checked here (a bad flag fails now, not in every replica)."""
    source: dict[str, Any] = {}
    if repository is not None:
        where = str(repository)
        # Replicas run in other processes (other machines): a relative path would mean their working folder.
        source["model_repository"] = where if is_remote(where) else Path(where).resolve()
    # Replicas bind nothing, but the proxies expose their REST app on http_host: the management token's rule
    # (a token, or --management_token=none, beyond loopback) is the proxy's address's. Last: it wins over flags'.
    words = [
        *serve_flag_words(source, keep_defaults=True),
        *flags,
        *serve_flag_words({"host": http_host}, keep_defaults=True),
    ]
    return words, serve_options(words)  # raises FlagError with argparse's own message


def _with_token(ray_actor_options: Mapping[str, Any] | None, token: str) -> dict[str, Any] | None:
    """The replicas' actor options, carrying the management token in their environment (not on their flags, which
    Ray shows with the deployment's arguments) when the driver's came from ``$WORKBENCH_MANAGEMENT_TOKEN``."""
    options = dict(ray_actor_options or {})
    if token:
        runtime_env = dict(options.get("runtime_env") or {})
        runtime_env["env_vars"] = {**(runtime_env.get("env_vars") or {}), MANAGEMENT_TOKEN_ENV: token}
        options["runtime_env"] = runtime_env
    return options or None


def _list_for_jupyter(options: ServerOptions, name: str, host: str, http_port: int, grpc_port: int) -> str | None:
    """Record the application where JupyterLab's sidebar lists servers (this machine's proxy serves it)."""
    listed = dataclasses.replace(
        options,
        rest_api_host=host,
        grpc_host=host,
        server_name=f"{server_records.server_name(options)} (Ray Serve: {name})",
    )
    return server_records.register_server(listed, http_port, grpc_port)


def _start_serve(**options: Any) -> None:
    """``serve.start(**options)``, patient with proxies slower to start than Ray's minute.

    Ray waits 60 s for its proxies to be ready (``HTTP_PROXY_TIMEOUT``, a constant), then raises, with its
    controller and proxies left running; on a busy machine the proxies took longer, and the deployment failed for
    nothing. Here they get :data:`PROXY_START_SECONDS` in all: ``serve.start`` again connects to the running
    controller at once, and the proxies it reports are waited for until every one is healthy."""
    started = time.monotonic()
    try:
        serve.start(**options)
        return
    except TimeoutError as exc:
        if "proxies not available" not in str(exc):
            raise
        log.warning("%s Waiting for them up to %.0f s in all.", exc, PROXY_START_SECONDS)
    serve.start(**options)
    while True:
        proxies = serve.status().proxies
        if proxies and all(state == ProxyStatus.HEALTHY for state in proxies.values()):
            return
        if time.monotonic() - started > PROXY_START_SECONDS:
            raise TimeoutError(f"Ray Serve's proxies not ready after {PROXY_START_SECONDS:.0f}s: {proxies}")
        time.sleep(0.5)


def deploy(
    repository: str | os.PathLike[str] | None = None,
    *,
    name: str = DEFAULT_NAME,
    num_replicas: int | None = None,
    autoscaling_config: Mapping[str, Any] | None = None,
    http_host: str = RAY_DEPLOY_DEFAULTS.http_host,
    http_port: int = RAY_DEPLOY_DEFAULTS.http_port,
    grpc_port: int = RAY_DEPLOY_DEFAULTS.grpc_port,
    ray_actor_options: Mapping[str, Any] | None = None,
    max_ongoing_requests: int = DEFAULT_MAX_ONGOING_REQUESTS,
    serve_flags: Sequence[str] = (),
    route_prefix: str = RAY_DEPLOY_DEFAULTS.route_prefix,
    address: str | None = None,
    proxy_location: str = "EveryNode",
) -> RayDeployment:
    """Serve ``repository`` (a folder every node sees, or an ``s3://`` / ``gs://`` URL) on Ray Serve.

    Connects to the Ray cluster at ``address`` (or the one already initialised, or ``RAY_ADDRESS``, or a new local
    one, which :meth:`RayDeployment.shutdown` stops again), starts Serve's proxies on ``http_port`` and
    ``grpc_port`` unless Serve already runs (its ports and gRPC services are then the running ones'), and returns
    once every replica serves. ``num_replicas`` or ``autoscaling_config`` (Ray's keys: ``min_replicas``,
    ``max_replicas``, ``target_ongoing_requests`` …) size the deployment; ``serve_flags`` are more
    ``workbench serve`` flags for every replica (``--enable_batching``, ``--file_system_poll_wait_seconds=2`` …), or
    the model source itself when ``repository`` is None. ``proxy_location`` is Ray's: ``"EveryNode"`` (a proxy on
    every node, for a load balancer in front of them all) or ``"HeadOnly"``.
    """
    started = time.perf_counter()
    flags, options = _serve_flags(repository, serve_flags, http_host)
    if num_replicas is not None and autoscaling_config is not None:
        raise ValueError("give num_replicas or autoscaling_config, not both")
    owns_ray = False
    if not ray.is_initialized():
        address = address or os.environ.get("RAY_ADDRESS")
        # log_to_driver off: replicas' log lines stay in Ray's log files instead of printing into notebook cells.
        ray.init(address=address, log_to_driver=False, ignore_reinit_error=True)
        # None may still join a running local cluster (Ray reads /tmp/ray/ray_current_cluster): then shutting
        # down only disconnects. "local" always starts a new local Ray, which is ours to stop.
        owns_ray = address in (None, "local")
    _start_serve(
        proxy_location=proxy_location,
        http_options={"host": http_host, "port": http_port},
        grpc_options={"port": grpc_port, "grpc_servicer_functions": SERVICER_FUNCTIONS},
    )
    deployment_options: dict[str, Any] = {"name": name, "max_ongoing_requests": max_ongoing_requests}
    if autoscaling_config is not None:
        deployment_options["autoscaling_config"] = dict(autoscaling_config)
    else:
        deployment_options["num_replicas"] = 1 if num_replicas is None else num_replicas
    actor_options = _with_token(ray_actor_options, options.management_token)
    if actor_options is not None:
        deployment_options["ray_actor_options"] = actor_options
    ingress = serve.ingress()(WorkbenchReplica)
    deployment: Any = serve.deployment(ingress, **deployment_options)
    app = deployment.bind(flags)
    serve.run(app, name=name, route_prefix=route_prefix, blocking=False)
    host = "127.0.0.1" if http_host in ("0.0.0.0", "::", "") else http_host
    seconds = time.perf_counter() - started
    # A Ray Client driver (ray://) runs off the cluster: no proxy of the cluster answers on this machine.
    listed = (
        None if (address or "").startswith("ray://") else _list_for_jupyter(options, name, host, http_port, grpc_port)
    )
    return RayDeployment(name, host, http_port, grpc_port, seconds, owns_ray, listed)
