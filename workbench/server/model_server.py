"""The serving process's composition root: the engine, the two planes and the frontends, on one asyncio loop.

:class:`ModelServer` wires the manager, the control plane (the repository source, config changes, model control and
routing changes), metrics, the data plane and the frontends (:class:`~workbench.frontends.wiring.Frontends`), and
runs a server's life: its ports (:mod:`workbench.server.ports`), its watchers (:mod:`workbench.server.watchers`) and
its announcements (:mod:`workbench.server.announce`).

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
import threading
import time
from collections.abc import Callable

from workbench.asynchronous.service import AsyncInference
from workbench.batching.scheduler import Batcher, BatchRecord, BatchScheduler
from workbench.batching.threads import InferenceThreads
from workbench.config.memory_budget import MemoryOptions
from workbench.config.options import ServerOptions
from workbench.core.errors import Code
from workbench.core.servable import Loader, Servable
from workbench.frontends.batch_jobs import BatchJobs
from workbench.frontends.grpc import ReadinessHealth
from workbench.frontends.sequence_routing import SequenceRouter, private_socket
from workbench.frontends.v2_shared_memory import SharedMemoryAccess
from workbench.frontends.wiring import Frontends, FrontendSettings
from workbench.models.manager import Manager, VersionState
from workbench.models.mlflow_registry import MlflowRegistry
from workbench.models.readiness import Phase, ServerReadiness
from workbench.models.routing.routing_file import read_legacy_state
from workbench.models.warmup_replay import warm_up
from workbench.observability import tracing
from workbench.observability.drift import parse_thresholds
from workbench.observability.drift_monitor import DriftCollector, DriftMonitor
from workbench.observability.memory_metrics import MemoryMetrics
from workbench.observability.metrics import ServingMetrics
from workbench.observability.request_log_metrics import RequestLogCollector
from workbench.observability.request_logger import RequestLogger
from workbench.observability.stats import RollingStats
from workbench.observability.whole_server import LocalViews, Peers, WholeServerMetrics, WorkerPeers
from workbench.planes.controlplane import ControlPlane
from workbench.planes.dataplane import Dataplane, ServerStatus
from workbench.planes.response_cache import ResponseCache
from workbench.planes.shared_memory import SharedMemoryRegistry
from workbench.platforms import Loader as PlatformLoader
from workbench.platforms.base import LoadPolicy
from workbench.platforms.triton import own_batching
from workbench.runners.remote import RunnerDispatch, RunnerLoader, RunnerPool, RunnerServable
from workbench.runtime.storage import VersionCache, caching_loader
from workbench.server.announce import JupyterRecord, write_ready_file
from workbench.server.cache_counts import CacheCounts
from workbench.server.ports import Ports
from workbench.server.watchers import ConfigFileWatcher, watch_parent

log = logging.getLogger("workbench.server")  # the server's log lines, whichever of its modules writes them


def _warm_up_here(servable: Servable) -> None:
    """Warm up a version loaded in this process (a model runner warms up the versions it loads)."""
    if not isinstance(servable, RunnerServable):
        warm_up(servable)


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
        # Versions in object stores load from a local copy, downloaded per load and removed on unload.
        self.model_cache = VersionCache(options.model_cache_dir, options.mlflow_tracking_uri)
        loader: Loader = PlatformLoader(
            LoadPolicy(
                options.allow_pickle,
                options.allow_python_models,
                pytorch_device=options.pytorch_device,
                pytorch_threads=options.pytorch_threads,
                auto_complete_config=not options.disable_auto_complete_config,
                prefer_tflite_model=options.prefer_tflite_model,
                tflite_interpreters=options.tflite_interpreters,
                max_batched_tokens=options.max_batched_tokens,
            )
        )
        # A worker with model runners: the runners load the versions (and warm them up) and run their batches.
        self.runners = (
            RunnerPool(options.worker_dir, options.model_runners, self._on_batch)
            if options.worker_dir and options.model_runners
            else None
        )
        loader = caching_loader(loader, self.model_cache)
        if self.runners is not None:
            # Runners are handed a version's source, so every worker names it alike and a runner downloads and
            # holds one copy; a version the runner gives back (LOCAL) is downloaded here.
            loader = RunnerLoader(self.runners, loader)
        # MLflow's models:/ and runs:/ base paths: listed through its registry (MLflow is imported only for them).
        self.registry = MlflowRegistry.of(options)
        self.manager = Manager(
            loader,
            warmup=_warm_up_here if options.enable_model_warmup else None,
            load_threads=options.num_load_threads,
            allow_labels_for_unavailable=options.allow_version_labels_for_unavailable_models,
            # Routing lives in each model's base path (a registered MLflow model's: its aliases); an older workbench's
            # state file is where it starts.
            routing_stores=self.registry.routing_store,
            initial_routing=read_legacy_state(options.routing_state_path()),
            # Many models in bounded memory: evicted versions load again when asked for (docs/memory-budget.md).
            memory=MemoryOptions.of(
                options.memory_budget, options.load_on_demand, options.unload_after_idle, options.pin
            ),
        )
        self.manager.add_listener(self._on_state_change)
        self.readiness = ServerReadiness(self.manager.served)
        # TF Serving's logging_config: sampled requests to TFRecord files, Parquet files or CloudEvents
        self.request_log = RequestLogger(parquet_flush_seconds=options.request_log_flush_seconds)
        self.metrics.registry.register(RequestLogCollector(self.request_log))
        # Served inputs against each version's reference (docs/request-logs-and-drift.md)
        self.drift = DriftMonitor(
            options.drift_window, options.drift_reference_rows, parse_thresholds(options.drift_thresholds)
        )
        self.metrics.registry.register(DriftCollector(self.drift))
        self.cache = (
            ResponseCache(
                options.response_cache_bytes, options.response_cache_models, CacheCounts(self.stats, self.metrics)
            )
            if options.response_cache_bytes > 0
            else None
        )
        self.controlplane = ControlPlane(
            self.manager,
            options,
            request_log=self.request_log,
            cache=self.cache,
            on_models_changed=self._readiness_changed,
            # A promotion's condition is checked against the shadow records the server's statistics show.
            shadow_records=lambda: self.stats_snapshot().get("shadow"),
            registry=self.registry,
        )
        self.source = self.controlplane.source
        # With --num_workers: a sequence's requests go to the worker that holds it (its private socket).
        self.router = (
            SequenceRouter(options.worker_dir, options.worker_index, options.num_workers)
            if options.worker_dir and options.num_workers > 1
            else None
        )
        # N workers share the cores: each takes its part of the default
        threads = options.num_inference_threads or max(4, 2 * (os.cpu_count() or 1) // max(1, options.num_workers))
        self._executor = InferenceThreads(threads, "workbench-infer")
        # A native model answering in microseconds runs on the loop: the hop to a thread and back cost more than
        # the call (REST half_plus_two, 32 clients: 1.3x the requests/s; benchmarks/request_path.py).
        self.scheduler = BatchScheduler(
            self._executor,
            # A Triton model whose config was completed at load may batch beyond what its file said.
            lambda servable: self.controlplane.batching_for(servable.name) or own_batching(servable),
            listener=self._on_batch,
            inline_cheap_calls=options.inline_cheap_calls,
        )
        self.batcher: Batcher = (
            RunnerDispatch(self.scheduler, self.runners, self.controlplane.batching_for)
            if self.runners is not None
            else self.scheduler
        )
        self.metrics.report_queue_depths(self._queue_depths)
        self.metrics.report_traffic_shares(self._traffic_shares)
        if self.manager.budgeted_loads.on_demand:  # the budget, each version's memory, loads and evictions
            self.metrics.registry.register(MemoryMetrics(self.manager.served.memory_summary))
        self._stopped = asyncio.Event()  # set when the ports close: live stat streams end
        self.dataplane = Dataplane(
            self.manager,
            self.metrics,
            self.stats,
            self._executor,
            self.batcher,
            request_log=self.request_log,
            batching_for=self.controlplane.batching_for,
            first_load_wait=options.wait_for_model_load_seconds,
            cache=self.cache,
            status=ServerStatus(self.readiness, self.health, self.stats_snapshot, self._stopped),
        )
        self.dataplane.drift = self.drift
        self._health = ReadinessHealth(self.dataplane.readiness)  # gRPC's health service: the same answer as /readyz
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
        # :predictAsync: accepted into a queue every process of the server shares, answered by each one's consumer.
        self.asynchronous = AsyncInference(
            self.dataplane,
            self.controlplane,
            options.async_queue_uri(),
            concurrency=options.async_concurrency,
            visibility_seconds=options.async_visibility_seconds,
            results_seconds=options.async_results_seconds,
            max_attempts=options.async_max_attempts,
            timeout_ms=options.rest_api_timeout_in_ms,
            max_request_bytes=options.rest_api_max_request_bytes,
            output=options.async_output,
            notify_url=options.async_notify_url,
        )
        if options.worker_index == 0:  # one queue for every process: counted once
            self.metrics.report_async_queue(self.asynchronous.waiting)
        self.batch_jobs = BatchJobs(self.dataplane, options.management_token)  # jobs on this server's models
        self.frontends = Frontends(
            self.dataplane,
            self.controlplane,
            FrontendSettings.of(options, self.router, self.shared_memory_access, self.asynchronous, self.batch_jobs),
        )
        self._ports = Ports(options, self.dataplane.one_client)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_task: asyncio.Future[None] | None = None
        self._stopping = threading.Event()
        self._traced = False  # this server turned tracing on (OTEL_TRACES_EXPORTER): it turns it off when it stops
        self._config_watcher: ConfigFileWatcher | None = None
        self.started_at: float | None = None
        self._jupyter = JupyterRecord()

    @property
    def rest_port(self) -> int | None:
        return self._ports.rest_port

    @property
    def grpc_port(self) -> int | None:
        return self._ports.grpc_port

    @property
    def openai_port(self) -> int | None:
        """OpenAI's endpoints' own port (--openai_port); None when they are on the REST port."""
        return self._ports.openai_port

    def _on_state_change(self, model: str, version: int, state: VersionState) -> None:
        self.metrics.set_version_state(model, version, state == VersionState.AVAILABLE)
        if state == VersionState.END:
            self.dataplane.forget_version(model, version)  # its sequences end
            if self.cache is not None:
                self.cache.evict(model, version)  # its answers go with it
        if state == VersionState.END and self.manager.served.version_state(model, version) in (None, VersionState.END):
            self.model_cache.release(model, version)  # unloaded (or failed): its downloaded copy goes too
            self.drift.forget(model, version)  # and its drift window
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
        return self.batcher.queue_depths()

    def _traffic_shares(self) -> list[tuple[str, int, float]]:
        return [
            (model["name"], version["version"], version["traffic_share"])
            for model in self.manager.served.describe()
            for version in model["versions"]
            if version["state"] == "AVAILABLE"
        ]

    def stats_snapshot(self) -> dict[str, object]:
        return self.peers.stats() if self.peers is not None else self._own_stats_snapshot()

    def _own_stats_snapshot(self) -> dict[str, object]:
        snapshot = self.stats.snapshot({(m, v): rows for m, v, rows in self.batcher.queue_depths()})
        if self.asynchronous.in_use:  # the dashboard shows the asynchronous queue beside the chart
            waiting, oldest = self.asynchronous.waiting()
            snapshot["async"] = {"waiting": waiting, "oldest_seconds": round(oldest, 3)}
        memory = self.manager.served.memory_summary()
        if memory is not None:  # the dashboard's memory panel: the budget, what each version holds, evictions
            snapshot["memory"] = memory
        shadows = self.dataplane.shadows.summaries()
        if shadows:  # each shadowed model's comparison with its primary (the dashboard's "v1 vs v2")
            snapshot["shadow"] = shadows
        drift = self.drift.summaries()
        if drift:  # monitored versions' features against their reference (the dashboard's "Drift")
            snapshot["drift"] = drift
        return snapshot

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
            "openai_port": self.openai_port,  # None: OpenAI's endpoints are on the REST port
            # How to reach the ports: https or http, and whether gRPC wants a TLS channel (secure_channel)
            "rest_scheme": "https" if self.options.rest_api_ssl_cert_file else "http",
            "grpc_tls": bool(self.options.ssl_config_file),
            "models": self.manager.served.model_names(),
            "batching": self.controlplane.batching_models(),
            "request_log": self.request_log.describe(),
            # Only with --response_cache_bytes: its size, fill and models
            **({"response_cache": self.cache.describe()} if self.cache is not None else {}),
        }

    # ------------------------------------------------------------------------------------ lifecycle
    async def start(self, open_ports: bool = True) -> None:
        """Load the models, then open the ports; on any failure, stop what had started and re-raise.

        ``open_ports=False`` starts the engine alone: another server (Ray Serve's proxies) carries the requests to
        :attr:`frontends`, so nothing binds, and the server is not listed for Jupyter.
        """
        try:
            await self._start(open_ports)
        except BaseException:
            await self.stop(cause="start-up failed")
            raise

    async def _start(self, open_ports: bool) -> None:
        options = self.options
        self._loop = asyncio.get_running_loop()
        if not open_ports:  # Ray Serve's proxies carry the requests: the client may be on any host, so may a replica
            self.shared_memory.close(
                Code.UNIMPLEMENTED, "Shared memory is not served through Ray Serve: a replica may run on another host"
            )
        if self.peers is not None:
            self.peers.start()
        if self.runners is not None:  # the supervisor started them before this worker
            await self.runners.connect()
        models = self.controlplane.initial_models(options)  # raises on a malformed config, before anything starts
        options.monitoring()  # raises on a malformed monitoring config, before anything starts
        options.drain_timing()  # raises on impossible drain flags, before anything starts
        # OTEL_TRACES_EXPORTER turns tracing on (raises on an unknown exporter), in each process of the server
        # before its frontends are built.
        self._traced = tracing.start_from_environment(self.metrics.count_invalid_trace_context) is not None
        if options.model_config_file and options.model_config_file_poll_wait_seconds > 0:
            self._config_watcher = ConfigFileWatcher(
                options.model_config_file,
                options.model_config_file_poll_wait_seconds,
                self.controlplane.apply_models,
                self._stopping,
            )
        # Unlike TF Serving, the ports open before the models load: liveness answers during a long start-up
        # (no restarts while a big model loads), readiness says "starting", and a bad port fails at once. A worker of
        # --num_workers joins the shared ports only once its models are loaded: the kernel hands new connections to
        # every listening worker, and a (re)started one must not answer "not found" beside siblings that serve.
        joins_late = bool(options.worker_dir) or not open_ports
        if joins_late:
            await self._loop.run_in_executor(None, self.controlplane.apply_models, models)
        else:
            # Named before the ports open: a request for one of them sent the moment a port answers waits for its
            # first load (Dataplane.loaded), as scripts written for TF Serving expect, instead of NOT_FOUND.
            await self._loop.run_in_executor(None, self.controlplane.name_models, models)
        if open_ports:
            await self._ports.open(
                self.frontends.grpc_servicers().adders(),
                self._health,
                self.frontends.rest_app,
                private_socket=str(private_socket(options.worker_dir, options.worker_index)) if self.router else "",
                openai_app=self.frontends.openai_app,
            )
        if not joins_late:  # loading blocks (TensorFlow): off the loop, which meanwhile answers probes
            await self._loop.run_in_executor(None, self.controlplane.apply_models, models)
        self.controlplane.start_polling()
        if open_ports or options.consume_only:  # requests queued before a restart, or by other processes
            self.asynchronous.start(force=options.consume_only)
        if self._config_watcher is not None:
            self._config_watcher.start()
        self.readiness.enter(Phase.SERVING)
        self._health.changed()
        readiness = self.readiness()
        log.info("Models loaded: %s", "ready" if readiness.ready else f"not ready: {readiness.reason}")
        self.started_at = time.time()
        if options.parent_pid:
            watch_parent(options.parent_pid, self._stopping)
        # Recorded once it answers, before the ready file so a started handle is listed; never raises. Of
        # --num_workers, the first worker records the server.
        if options.worker_index == 0 and open_ports:
            self._jupyter.write(options, self.rest_port, self.grpc_port, self.started_at)
        if options.ready_file and open_ports:
            write_ready_file(options.ready_file, self.health())

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
        self._jupyter.remove()  # Jupyter stops listing and proxying a server going away
        if delay > 0:
            log.info("Still taking new connections for %gs while load balancers stop routing here", delay)
            await asyncio.sleep(delay)
        grace = max(0.0, deadline - time.monotonic())
        log.info("Refusing new connections; accepted requests have %.1fs to finish", grace)
        self._stopped.set()
        started = time.monotonic()
        finished = await self._ports.close(grace)
        # Asynchronous requests running here finish within what is left; the others wait in the queue for the next
        # consumer (this server started again, or its other processes).
        await self.asynchronous.stop(max(0.0, deadline - time.monotonic()))
        await self.batch_jobs.stop()  # what they wrote stays: the same job started again finishes the rest
        await self.dataplane.shadows.stop()  # copies to a shadow version answer nobody: a short wait at most
        took = time.monotonic() - started
        if finished and took < grace:
            log.info("Every accepted request finished (%.1fs)", took)
        elif took < grace:
            # A port's drain ended early with something cancelled, said as it was (gRPC calls core took in and never
            # handed to the server, an HTTP server that failed to stop): not the budget's end, which says so itself.
            log.warning("Drain ended after %.1fs, its budget not spent: what was cancelled is said above", took)
        else:
            log.warning("Drain budget (--drain_seconds=%g) spent: requests still running were cancelled", budget)
        self.controlplane.stop_polling()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.request_log.close)  # no requests come any more: write what is queued
        await loop.run_in_executor(None, self.drift.close)
        await loop.run_in_executor(None, self.manager.stop)
        if self.runners is not None:
            await self.runners.close()
        self.shared_memory.close()  # no request reads or writes a region any more: unmap them
        self.controlplane.close()
        await loop.run_in_executor(None, self.model_cache.close)
        if self.peers is not None:
            self.peers.stop()
        if self.router is not None:
            await self.router.close()
        self._executor.shutdown(wait=False, cancel_futures=True)
        if self._traced:
            await loop.run_in_executor(None, tracing.stop)  # every request answered: export the spans still buffered
        log.info("Stopped")
