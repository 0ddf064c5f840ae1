"""The serving process: engine + frontends on one asyncio loop.

:class:`ModelServer` wires the manager, the repository source, config reloading, metrics, the dataplane and
the frontends. ``workbench serve`` runs it in the main thread (:func:`run`); tests and in-process use run it
on a background thread (:class:`ServerThread`).

Life of a server: the ports open first (liveness answers, readiness says "starting"), then the initial models
load; it is ready while every model has an AVAILABLE version. Stopping is a drain (:meth:`ModelServer.stop`):
readiness turns false, optionally new connections are still taken for a delay, then the ports stop accepting,
accepted requests (those queued for a batch included) finish within the drain's budget, and the engine stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import uvicorn
from starlette.applications import Starlette

from workbench import platforms
from workbench.batching.scheduler import BatchRecord, BatchScheduler
from workbench.batching.threads import InferenceThreads
from workbench.config import triton_model_config as triton_config
from workbench.config.batching_parameters import BatchingParameters, model_batching_parameters
from workbench.config.model_control import ControlMode, ModelControl
from workbench.config.options import (
    ModelConfig,
    ServerOptions,
    discover_models,
)
from workbench.core.errors import Code, ServingError
from workbench.frontends.grpc import ReadinessHealth, start_grpc_server
from workbench.frontends.management import management_routes
from workbench.frontends.probes import probe_routes
from workbench.frontends.rest import create_app
from workbench.frontends.sequence_routing import SequenceRouter, private_socket
from workbench.frontends.v2_grpc import InferenceService
from workbench.frontends.v2_rest import V2Settings, v2_routes
from workbench.frontends.v2_shared_memory import SharedMemoryAccess
from workbench.jupyter import registry  # Jupyter's server extension lists and proxies running servers
from workbench.models.configs import initial_models, parse_model_config_file
from workbench.models.manager import Manager, VersionState
from workbench.models.readiness import Phase, ServerReadiness
from workbench.models.routing.store import read_legacy_state
from workbench.models.source import RepositorySource
from workbench.models.warmup import warm_up
from workbench.observability.metrics import ServingMetrics
from workbench.observability.request_logger import RequestLogger
from workbench.observability.stats import RollingStats
from workbench.observability.whole_server import LocalViews, Peers, WholeServerMetrics, WorkerPeers
from workbench.planes.dataplane import Dataplane
from workbench.planes.response_cache import ResponseCache
from workbench.planes.shared_memory import SharedMemoryRegistry
from workbench.platforms.base import LoadPolicy
from workbench.runtime.loop import new_event_loop
from workbench.runtime.process import parent_gone, write_json_atomically
from workbench.runtime.storage import VersionCache, caching_loader

log = logging.getLogger(__name__)


def write_ready_file(path: str, content: dict[str, object]) -> None:
    """Tell whoever started this server that it answers, and on which ports (written atomically)."""
    write_json_atomically(path, content)


def _host_for_grpc(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _bind(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:  # one of --num_workers: the kernel spreads new connections among the workers' sockets
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ServingError(Code.UNAVAILABLE, f"Could not bind the REST port {host}:{port}: {exc.strerror}") from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock


class ModelServer:
    """One server: load the models, then answer on the configured ports until stopped."""

    def __init__(
        self,
        options: ServerOptions,
        *,
        peers: Callable[[LocalViews], Peers] | None = None,
        metrics: ServingMetrics | None = None,
    ) -> None:
        """``peers``: the processes this one serves with as one server, given this one's views (default: the
        other workers of --num_workers, if it is one); its stats, metrics and health then answer for all of them.
        ``metrics``: where requests and batches are recorded (with peers, a :class:`WholeServerMetrics`)."""
        self.options = options
        if peers is None and options.worker_dir:
            peers = functools.partial(WorkerPeers, options.worker_dir, options.worker_index, options.num_workers)
        self.metrics = metrics or (WholeServerMetrics() if peers is not None else ServingMetrics())
        self.peers: Peers | None = None
        if peers is not None:
            if not isinstance(self.metrics, WholeServerMetrics):
                raise TypeError("a server with peers answers their metrics too: give it a WholeServerMetrics")
            views = LocalViews(self._own_stats_snapshot, self.metrics.own_exposition, self._own_health)
            self.peers = self.metrics.peers = peers(views)
        self.stats = RollingStats()
        self._default_batching = options.batching_parameters()
        self._batching: dict[str, BatchingParameters | None] = {}
        # Versions in object stores load from a local copy, downloaded per load and removed on unload.
        self.model_cache = VersionCache(options.model_cache_dir)
        self.manager = Manager(
            caching_loader(
                platforms.Loader(LoadPolicy(options.allow_pickle, options.allow_python_models)), self.model_cache
            ),
            warmup=warm_up if options.enable_model_warmup else None,
            load_threads=options.num_load_threads,
            allow_labels_for_unavailable=options.allow_version_labels_for_unavailable_models,
            # Routing lives in each model's base path; an older workbench's state file is where it starts.
            initial_routing=read_legacy_state(options.routing_state_path()),
        )
        self.manager.add_listener(self._on_state_change)
        self.readiness = ServerReadiness(self.manager)
        self._health = ReadinessHealth(self.readiness)  # gRPC's health service: the same answer as /readyz
        discover = (lambda: discover_models(options.model_repository)) if options.model_repository else None
        # Which of the repository's models serve, and whether clients may change that (--model_control_mode).
        self.control = ModelControl(
            ControlMode.parse(options.model_control_mode), discover, self.apply_models, options.load_model
        )
        poll_wait = options.file_system_poll_wait_seconds
        if self.control.mode in (ControlMode.NONE, ControlMode.EXPLICIT) and poll_wait > 0:
            poll_wait = 0  # Triton's none and explicit modes read the repository at start-up and when a load asks
        # With --num_workers: a sequence's requests go to the worker that holds it (its private socket).
        self.router = (
            SequenceRouter(options.worker_dir, options.worker_index, options.num_workers)
            if options.worker_dir and options.num_workers > 1
            else None
        )
        self.request_log = RequestLogger()  # TF Serving's logging_config: sampled requests to TFRecord files
        self.source = RepositorySource(
            self.manager,
            poll_wait,
            discover=self.control.discover if discover is not None else None,
            on_scan=self.request_log.configure,
        )
        # N workers share the cores: each takes its part of the default
        threads = options.num_inference_threads or max(4, 2 * (os.cpu_count() or 1) // max(1, options.num_workers))
        self._executor = InferenceThreads(threads, "workbench-infer")
        self.scheduler = BatchScheduler(
            self._executor, lambda servable: self._batching.get(servable.name), listener=self._on_batch
        )
        self.cache = (
            ResponseCache(
                options.response_cache_bytes, options.response_cache_models, CacheCounts(self.stats, self.metrics)
            )
            if options.response_cache_bytes > 0
            else None
        )
        self.metrics.report_queue_depths(self._queue_depths)
        self.metrics.report_traffic_shares(self._traffic_shares)
        self.dataplane = Dataplane(
            self.manager,
            self.metrics,
            self.stats,
            self._executor,
            self.scheduler,
            request_log=self.request_log,
            batching_for=self._batching.get,
            first_load_wait=options.wait_for_model_load_seconds,
            cache=self.cache,
        )
        # Triton's system shared memory: one set of regions for both v2 frontends, unmapped when the server stops.
        self.shared_memory = SharedMemoryRegistry(options.shared_memory_max_bytes)
        if options.num_workers > 1:
            self.shared_memory.close(
                Code.UNIMPLEMENTED,
                "Shared memory needs a server of one process: with --num_workers each worker would hold regions of "
                "its own, and a request could reach one that never heard of its region",
            )
        self.shared_memory_access = SharedMemoryAccess(
            self.shared_memory, options.allow_remote_shared_memory, options.management_token
        )
        self._stopped: asyncio.Event | None = None  # set when the ports close: live stat streams end
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_task: asyncio.Future[None] | None = None
        self.rest_port: int | None = None
        self.grpc_port: int | None = None
        self._grpc: grpc.aio.Server | None = None
        self._apply_lock = threading.Lock()
        self._uvicorn: uvicorn.Server | None = None
        self._sockets: list[socket.socket] = []
        self._stopping = threading.Event()
        self._config_thread: threading.Thread | None = None
        self._config_text: str | None = None
        self.started_at: float | None = None
        self._registry_id: str | None = None  # our record for Jupyter (workbench.jupyter.registry)

    def _on_state_change(self, model: str, version: int, state: VersionState) -> None:
        self.metrics.set_version_state(model, version, state == VersionState.AVAILABLE)
        if state == VersionState.END:
            self.dataplane.forget_version(model, version)  # its sequences end
            if self.cache is not None:
                self.cache.evict(model, version)  # its answers go with it
        if state == VersionState.END and self.manager.version_state(model, version) in (None, VersionState.END):
            self.model_cache.release(model, version)  # unloaded (or failed): its downloaded copy goes too
        self._readiness_changed()

    def _readiness_changed(self) -> None:
        """Tell gRPC health watchers that readiness may have changed (from any thread)."""
        loop = self._loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody watches any more
            loop.call_soon_threadsafe(self._health.changed)

    def _on_batch(self, record: BatchRecord) -> None:
        self.metrics.observe_batch(record)
        self.stats.record_batch(record.model, record.version, record.size, record.tasks)

    def _queue_depths(self) -> list[tuple[str, int, int]]:
        return self.scheduler.queue_depths()

    def _traffic_shares(self) -> list[tuple[str, int, float]]:
        return [
            (model["name"], version["version"], version["traffic_share"])
            for model in self.manager.describe()
            for version in model["versions"]
            if version["state"] == "AVAILABLE"
        ]

    def stats_snapshot(self) -> dict[str, object]:
        return self.peers.stats() if self.peers is not None else self._own_stats_snapshot()

    def _own_stats_snapshot(self) -> dict[str, object]:
        return self.stats.snapshot({(m, v): rows for m, v, rows in self.scheduler.queue_depths()})

    def health(self) -> dict[str, object]:
        health = self._own_health()
        if self.peers is not None:  # "pid" is the worker that answered; "workers" lists them all
            health["worker"] = self.peers.index
            health["workers"] = self.peers.workers()
        return health

    def _own_health(self) -> dict[str, object]:
        return {
            "status": "ok",
            "readiness": self.readiness().body(),  # as GET /readyz answers
            "pid": os.getpid(),
            "grpc_port": self.grpc_port,
            "rest_port": self.rest_port,
            # How to reach the ports: https or http, and whether gRPC wants a TLS channel (secure_channel)
            "rest_scheme": "https" if self.options.rest_api_ssl_cert_file else "http",
            "grpc_tls": bool(self.options.ssl_config_file),
            "models": self.manager.model_names(),
            "batching": {name: params is not None for name, params in self._batching.items()},
            "request_log": self.request_log.describe(),
            # Only with --response_cache_bytes: its size, fill and models
            **({"response_cache": self.cache.describe()} if self.cache is not None else {}),
        }

    # -------------------------------------------------------------------------------------- models
    def apply_models(self, models: list[ModelConfig], wait_timeout: float | None = None) -> None:
        """Realise exactly ``models``: load what is new, unload what went, then set their labels.

        Like TF Serving, labels are applied once the versions have finished loading, so a label may point
        at a version that the same config brings in.
        """
        with self._apply_lock:  # the config-file watcher and gRPC's HandleReloadConfigRequest take turns
            # Per-model batching parameters sit beside the model (<base_path>/batching_parameters.txt); a Triton
            # model's config.pbtxt (its dynamic_batching) decides for it otherwise.
            batching = {
                m.name: model_batching_parameters(m.base_path)
                or triton_config.batching_parameters(m.base_path, self._default_batching)
                for m in models
            }
            self._batching.update(batching)
            self._opt_into_cache(models)
            self.manager.set_models(models)
            self.request_log.configure(models)
            self.source.poll_once()
            self.manager.wait_until_settled(wait_timeout)
            self.manager.set_labels({m.name: m.labels for m in models})
        self._readiness_changed()  # a model may have come or gone without any version changing state

    def _opt_into_cache(self, models: list[ModelConfig]) -> None:
        """Triton models whose config.pbtxt says ``response_cache { enable: true }`` join the response cache."""
        for model in models:
            if not triton_config.response_cache_enabled(model.base_path):
                continue
            if self.cache is None:
                log.warning("Model %s asks for the response cache, which is off (--response_cache_bytes)", model.name)
            else:
                self.cache.enable(model.name)

    def rescan(self, timeout: float | None = 300.0) -> None:
        """Re-read every model's folder now and wait until the versions it finds have loaded (or failed)."""
        self.source.poll_once()
        self.manager.wait_until_settled(timeout)

    def _watch_config_file(self) -> None:
        path, wait = self.options.model_config_file, self.options.model_config_file_poll_wait_seconds
        while not self._stopping.wait(wait):
            try:
                text = Path(path).read_text()
            except OSError as exc:
                log.error("Could not read model config file %s: %s", path, exc)
                continue
            if text == self._config_text:
                continue
            try:
                models = parse_model_config_file(path)
                self.apply_models(models)
                self._config_text = text
                log.info("Applied new model config from %s", path)
            except ServingError as exc:
                log.error("Model config %s not applied: %s", path, exc.message)
                self._config_text = text  # do not retry the same broken text every poll

    # ------------------------------------------------------------------------------------ lifecycle
    async def start(self, open_ports: bool = True) -> None:
        """Load the models, then open the ports; on any failure, stop what had started and re-raise.

        ``open_ports=False`` starts the engine alone: another server (Ray Serve's proxies) carries the requests to
        :attr:`dataplane` and :meth:`rest_app`, so nothing binds, and the server is not listed for Jupyter.
        """
        try:
            await self._start(open_ports)
        except BaseException:
            await self.stop(cause="start-up failed")
            raise

    async def _start(self, open_ports: bool) -> None:
        options = self.options
        self._stopped = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        if not open_ports:  # Ray Serve's proxies carry the requests: the client may be on any host, so may a replica
            self.shared_memory.close(
                Code.UNIMPLEMENTED, "Shared memory is not served through Ray Serve: a replica may run on another host"
            )
        if self.peers is not None:
            self.peers.start()
        # Raises on a malformed config, before anything starts.
        models = self.control.select(initial_models(options))
        options.monitoring()  # raises on a malformed monitoring config, before anything starts
        options.drain_timing()  # raises on impossible drain flags, before anything starts
        if options.model_config_file:
            self._config_text = Path(options.model_config_file).read_text()
        # Unlike TF Serving, the ports open before the models load: liveness answers during a long start-up
        # (no restarts while a big model loads), readiness says "starting", and a bad port fails at once. A worker of
        # --num_workers joins the shared ports only once its models are loaded: the kernel hands new connections to
        # every listening worker, and a (re)started one must not answer "not found" beside siblings that serve.
        joins_late = bool(options.worker_dir) or not open_ports
        if joins_late:
            await self._loop.run_in_executor(None, self.apply_models, models)
        else:
            # Named before the ports open: a request for one of them sent the moment a port answers waits for its
            # first load (Dataplane.loaded), as scripts written for TF Serving expect, instead of NOT_FOUND.
            await self._loop.run_in_executor(None, self.manager.set_models, models)
        if open_ports:
            await self._open_ports()
        if not joins_late:  # loading blocks (TensorFlow): off the loop, which meanwhile answers probes
            await self._loop.run_in_executor(None, self.apply_models, models)
        self.source.start_polling()
        if options.model_config_file and options.model_config_file_poll_wait_seconds > 0:
            self._config_thread = threading.Thread(target=self._watch_config_file, name="workbench-config", daemon=True)
            self._config_thread.start()
        self.readiness.enter(Phase.SERVING)
        self._health.changed()
        readiness = self.readiness()
        log.info("Models loaded: %s", "ready" if readiness.ready else f"not ready: {readiness.reason}")
        self.started_at = time.time()
        if options.parent_pid:
            threading.Thread(target=self._watch_parent, name="workbench-parent", daemon=True).start()
        # Recorded once it answers, before the ready file so a started handle is listed; never raises. Of
        # --num_workers, the first worker records the server.
        if options.worker_index == 0 and open_ports:
            self._registry_id = registry.register_server(options, self.rest_port, self.grpc_port, self.started_at)
        if options.ready_file and open_ports:
            write_ready_file(options.ready_file, self.health())

    async def _open_ports(self) -> None:
        options = self.options
        grpc_tls = options.grpc_tls()  # raises on a bad --ssl_config_file or --rest_api_ssl_* flag, before binding
        options.rest_tls()
        self._grpc, self.grpc_port = await start_grpc_server(
            self.dataplane,
            self.apply_models,
            address=f"{_host_for_grpc(options.grpc_host)}:{options.port}",
            socket_path=options.grpc_socket_path,
            max_message_bytes=options.grpc_max_message_bytes,
            channel_arguments=options.grpc_arguments(),
            health=self._health,
            reuse_port=bool(options.worker_dir),
            # The Open Inference Protocol's service on TF Serving's gRPC port
            services=[
                InferenceService(
                    self.dataplane,
                    self.readiness,
                    self.rescan,
                    options.management_token,
                    self.control,
                    self.router,
                    self.shared_memory_access,
                ).add_to
            ],
            private_socket=str(private_socket(options.worker_dir, options.worker_index)) if self.router else "",
            tls=grpc_tls,
            management_token=options.management_token,
        )
        tls_note = ""
        if grpc_tls is not None:
            tls_note = " with TLS, client certificates required" if grpc_tls.client_verify else " with TLS"
        log.info("Running gRPC ModelServer at %s:%d%s", options.grpc_host, self.grpc_port, tls_note)
        if options.rest_api_port != 0:  # 0 is off, as in TF Serving; -1 picks a free port
            await self._start_rest(max(options.rest_api_port, 0))

    def _watch_parent(self) -> None:
        """Serve only as long as the process that started us lives (a notebook kernel, even one killed -9)."""
        while not self._stopping.wait(0.5):
            if parent_gone(self.options.parent_pid):
                log.warning("Parent process %d is gone: stopping", self.options.parent_pid)
                self._on_parent_exit()
                return

    def _on_parent_exit(self) -> None:
        os.kill(os.getpid(), signal.SIGTERM)

    def rest_app(self) -> Starlette:
        """The REST API as an ASGI app: TF Serving's /v1, v2, management, stats, probes and metrics."""
        monitoring = self.options.monitoring()
        return create_app(
            self.dataplane,
            timeout_ms=self.options.rest_api_timeout_in_ms,
            max_request_bytes=self.options.rest_api_max_request_bytes,
            enable_cors=self.options.rest_api_enable_cors_support,
            prometheus_path=monitoring.prometheus_path if monitoring.prometheus_enabled else None,
            extra_routes=[
                *probe_routes(self.readiness),
                *management_routes(self, self._stopped or asyncio.Event(), self.options.management_token),
                *v2_routes(
                    self.dataplane,
                    self.readiness,
                    self.rescan,
                    V2Settings(
                        self.options.rest_api_timeout_in_ms,
                        self.options.rest_api_max_request_bytes,
                        self.options.management_token,
                    ),
                    self.control,
                    self.router,
                    self.shared_memory_access,
                ),
            ],
        )

    async def _start_rest(self, port: int) -> None:
        app = self.rest_app()
        sock = _bind(self.options.rest_api_host, port, reuse_port=bool(self.options.worker_dir))
        self._sockets.append(sock)
        self.rest_port = sock.getsockname()[1]
        tls = self.options.rest_tls()
        ssl_options: dict[str, Any] = {}
        if tls is not None:
            ssl_options = {"ssl_certfile": tls.cert_file, "ssl_keyfile": tls.key_file or None}
            if tls.client_ca_file:  # mutual TLS: no certificate issued by this CA, no connection
                ssl_options.update(ssl_ca_certs=tls.client_ca_file, ssl_cert_reqs=ssl.CERT_REQUIRED)
        config = uvicorn.Config(
            app,
            lifespan="off",
            log_config=None,
            access_log=False,
            http="httptools",
            loop="none",
            timeout_keep_alive=30,
            **ssl_options,
        )
        try:
            config.load()  # builds the SSL context: reads the certificate, key and client CA
        except (OSError, ssl.SSLError) as exc:
            files = ", ".join(f"{k}={v}" for k, v in ssl_options.items() if isinstance(v, str))
            raise ServingError(Code.INVALID_ARGUMENT, f"REST TLS cannot use {files}: {exc}") from None
        server = uvicorn.Server(config)
        server.lifespan = config.lifespan_class(config)
        await server.startup(sockets=[sock])
        self._uvicorn = server
        scheme = "HTTPS" if tls is not None else "HTTP"
        log.info("Exporting %s/REST API at %s:%d", scheme, self.options.rest_api_host, self.rest_port)

    async def stop(self, delay: float = 0.0, cause: str = "stop requested") -> None:
        """Drain, then stop: see :meth:`_drain`. The budget is ``--drain_seconds``; calling again waits for the
        same stop."""
        if self._stop_task is None:
            self._stop_task = asyncio.ensure_future(self._drain(delay, self.options.drain_seconds, cause))
        await asyncio.shield(self._stop_task)

    async def _drain(self, delay: float, budget: float, cause: str) -> None:
        """Readiness false; ``delay`` seconds still taking new connections; then no new connections, and what was
        accepted finishes, all within ``budget`` seconds; then the engine stops. One log line per phase."""
        deadline = time.monotonic() + budget
        self._stopping.set()
        self.readiness.enter(Phase.DRAINING)
        self._health.changed()
        log.info("Draining (%s): not ready any more (/readyz 503, gRPC health NOT_SERVING)", cause)
        if self._registry_id is not None:  # Jupyter stops listing and proxying a server going away
            registry.unregister(self._registry_id)
            self._registry_id = None
        if delay > 0:
            log.info("Still taking new connections for %gs while load balancers stop routing here", delay)
            await asyncio.sleep(delay)
        grace = max(0.0, deadline - time.monotonic())
        log.info("Refusing new connections; accepted requests have %.1fs to finish", grace)
        if self._stopped is not None:
            self._stopped.set()
        started = time.monotonic()
        await self._close_frontends(grace)
        if time.monotonic() - started < grace:
            log.info("Every accepted request finished (%.1fs)", time.monotonic() - started)
        else:
            log.warning("Drain budget (--drain_seconds=%g) spent: requests still running were cancelled", budget)
        self.source.stop()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.request_log.close)  # no requests come any more: write what is queued
        await loop.run_in_executor(None, self.manager.stop)
        self.shared_memory.close()  # no request reads or writes a region any more: unmap them
        self.control.close()
        await loop.run_in_executor(None, self.model_cache.close)
        if self.peers is not None:
            self.peers.stop()
        if self.router is not None:
            await self.router.close()
        self._executor.shutdown(wait=False, cancel_futures=True)
        log.info("Stopped")

    async def _close_frontends(self, grace: float) -> None:
        """Stop accepting on both ports at once; wait up to ``grace`` seconds for accepted requests to finish.

        gRPC's ``stop(grace)`` refuses new RPCs and cancels what still runs at the end of the grace. uvicorn closes
        its listening sockets and idle keep-alive connections, answers what it accepted with ``Connection:
        close``, and cancels what still runs at its graceful-shutdown timeout.
        """
        closing = []
        if self._grpc is not None:
            closing.append(self._grpc.stop(grace=grace))
            self._grpc = None
        if self._uvicorn is not None:
            # uvicorn hands this to asyncio.wait_for, which takes fractions of seconds too.
            self._uvicorn.config.timeout_graceful_shutdown = grace  # type: ignore[assignment]
            self._uvicorn.should_exit = True
            closing.append(self._uvicorn.shutdown(sockets=self._sockets))
            self._uvicorn = None
        await asyncio.gather(*closing)


class CacheCounts:
    """The response cache's lookups, counted in the server's live stats and its metrics (Triton's ``nv_cache_*``)."""

    def __init__(self, stats: RollingStats, metrics: ServingMetrics) -> None:
        self._stats, self._metrics = stats, metrics

    def cache_lookup(self, model: str, version: int, hit: bool, seconds: float) -> None:
        self._stats.record_cache(model, version, hit)
        self._metrics.observe_cache_lookup(model, version, hit, seconds)

    def cache_insert(self, model: str, version: int, seconds: float) -> None:
        self._metrics.observe_cache_insert(model, version, seconds)


def run(options: ServerOptions) -> int:
    """``workbench serve``: serve until SIGTERM or SIGINT, then drain; returns the process exit code (0).

    A second signal exits at once with 128 + its number (143 for SIGTERM, 130 for SIGINT), as a shell reports a
    process the signal killed. A signal while the initial models load exits at once with 0: nothing was ready,
    so no load balancer sent anything to finish, and a load in progress cannot be interrupted.
    """
    delay, _ = options.drain_timing()
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    server = ModelServer(options)
    signalled: asyncio.Future[signal.Signals] = loop.create_future()

    def on_signal(sig: signal.Signals) -> None:
        if not signalled.done():
            signalled.set_result(sig)
            return
        code = 128 + sig.value
        log.warning("Second %s: exiting at once with status %d; requests still running are lost", sig.name, code)
        _exit_now(code)

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)

    async def main() -> None:
        starting = asyncio.ensure_future(server.start())
        either: list[asyncio.Future[Any]] = [starting, signalled]
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            log.warning("%s while loading models at start-up: exiting now", signalled.result().name)
            _exit_now(0)
        starting.result()  # a start-up failure raises here
        sig = await signalled
        await server.stop(delay=delay, cause=sig.name)

    try:
        loop.run_until_complete(main())
    finally:
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()
    return 0


def _exit_now(code: int) -> None:
    """End the process without waiting for anything (threads loading models, requests running)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class ServerThread:
    """A ModelServer on its own loop in a background thread (tests, in-process use)."""

    def __init__(self, options: ServerOptions) -> None:
        self.server = ModelServer(options)
        self._loop = new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="workbench-server", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            try:
                self._loop.run_until_complete(self.server.start())
            except BaseException as exc:  # noqa: BLE001 - handed to the thread that called start()
                self._error = exc
                return
            finally:
                self._ready.set()
            self._loop.run_forever()
        finally:
            # run_in_executor(None, ...) started the loop's default executor: end its thread too.
            self._loop.run_until_complete(self._loop.shutdown_default_executor())
            self._loop.close()

    def start(self, timeout: float = 120) -> ServerThread:
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError("server did not start in time")
        if self._error is not None:
            raise self._error
        return self

    @property
    def rest_url(self) -> str:
        scheme = "https" if self.server.options.rest_api_ssl_cert_file else "http"
        return f"{scheme}://{self.server.options.rest_api_host}:{self.server.rest_port}"

    @property
    def grpc_target(self) -> str:
        return f"{self.server.options.grpc_host}:{self.server.grpc_port}"

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        budget = self.server.options.drain_seconds
        asyncio.run_coroutine_threadsafe(self.server.stop(), self._loop).result(timeout=budget + 60)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
