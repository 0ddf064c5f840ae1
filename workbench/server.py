"""The serving process: engine + frontends on one asyncio loop.

:class:`ModelServer` wires the manager, the repository source, config reloading, metrics, the dataplane and
the frontends. ``workbench serve`` runs it in the main thread (:func:`run`); tests and in-process use run it
on a background thread (:class:`ServerThread`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import uvicorn

from workbench._loop import new_event_loop
from workbench.dataplane import Dataplane
from workbench.engine.batching import BatchRecord, BatchScheduler
from workbench.engine.batching_config import BatchingParameters, model_batching_parameters
from workbench.engine.manager import Manager, VersionState
from workbench.engine.metrics import ServingMetrics
from workbench.engine.options import ModelConfig, ServerOptions, discover_models, parse_model_config_file
from workbench.engine.request_log import RequestLogger
from workbench.engine.routing import RoutingStore
from workbench.engine.servable import LOADERS
from workbench.engine.source import RepositorySource
from workbench.engine.stats import RollingStats
from workbench.engine.status import Code, ServingError
from workbench.engine.warmup import warm_up
from workbench.frontends.grpc import start_grpc_server
from workbench.frontends.management import management_routes
from workbench.frontends.rest import create_app
from workbench.jupyter import registry  # Jupyter's server extension lists and proxies running servers

log = logging.getLogger(__name__)


def _process_alive(pid: int) -> bool:
    if os.getppid() != pid:  # re-parented: the parent exited
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def write_ready_file(path: str, content: dict[str, object]) -> None:
    """Tell whoever started this server that it answers, and on which ports (written atomically)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(content, f)
    os.replace(tmp, path)


def _host_for_grpc(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
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

    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        self.metrics = ServingMetrics()
        self.stats = RollingStats()
        self._default_batching = options.batching_parameters()
        self._batching: dict[str, BatchingParameters | None] = {}
        self.manager = Manager(
            LOADERS,
            warmup=warm_up if options.enable_model_warmup else None,
            load_threads=options.num_load_threads,
            allow_labels_for_unavailable=options.allow_version_labels_for_unavailable_models,
            routing_store=RoutingStore(options.routing_state_path() or None),
        )
        self.manager.add_listener(self._on_state_change)
        discover = (lambda: discover_models(options.model_repository)) if options.model_repository else None
        self.request_log = RequestLogger()  # TF Serving's logging_config: sampled requests to TFRecord files
        self.source = RepositorySource(
            self.manager,
            options.file_system_poll_wait_seconds,
            discover=discover,
            on_scan=self.request_log.configure,
        )
        threads = options.num_inference_threads or max(4, 2 * (os.cpu_count() or 1))
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="workbench-infer")
        self.scheduler = BatchScheduler(
            self._executor, lambda servable: self._batching.get(servable.name), listener=self._on_batch
        )
        self.metrics.report_queue_depths(self._queue_depths)
        self.metrics.report_traffic_shares(self._traffic_shares)
        self.dataplane = Dataplane(
            self.manager, self.metrics, self.stats, self._executor, self.scheduler, request_log=self.request_log
        )
        self._stopped: asyncio.Event | None = None
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
        return self.stats.snapshot({(m, v): rows for m, v, rows in self.scheduler.queue_depths()})

    def health(self) -> dict[str, object]:
        return {
            "status": "ok",
            "pid": os.getpid(),
            "grpc_port": self.grpc_port,
            "rest_port": self.rest_port,
            "models": self.manager.model_names(),
            "batching": {name: params is not None for name, params in self._batching.items()},
            "request_log": self.request_log.describe(),
        }

    # -------------------------------------------------------------------------------------- models
    def apply_models(self, models: list[ModelConfig], wait_timeout: float | None = None) -> None:
        """Realise exactly ``models``: load what is new, unload what went, then set their labels.

        Like TF Serving, labels are applied once the versions have finished loading, so a label may point
        at a version that the same config brings in.
        """
        with self._apply_lock:  # the config-file watcher and gRPC's HandleReloadConfigRequest take turns
            # Per-model batching parameters sit beside the model (<base_path>/batching_parameters.txt).
            batching = {m.name: model_batching_parameters(m.base_path) or self._default_batching for m in models}
            self._batching.update(batching)
            self.manager.set_models(models)
            self.request_log.configure(models)
            self.source.poll_once()
            self.manager.wait_until_settled(wait_timeout)
            self.manager.set_labels({m.name: m.labels for m in models})

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
    async def start(self) -> None:
        """Load the models, then open the ports; on any failure, stop what had started and re-raise."""
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> None:
        options = self.options
        self._stopped = asyncio.Event()
        models = options.initial_models()  # raises on a malformed config file, before anything starts
        monitoring = options.monitoring()
        if options.model_config_file:
            self._config_text = Path(options.model_config_file).read_text()
        loop = asyncio.get_running_loop()
        # Loading blocks (TensorFlow); run it off the loop, then open the ports, as TF Serving does.
        await loop.run_in_executor(None, self.apply_models, models)
        self.source.start_polling()
        if options.model_config_file and options.model_config_file_poll_wait_seconds > 0:
            self._config_thread = threading.Thread(target=self._watch_config_file, name="workbench-config", daemon=True)
            self._config_thread.start()
        self._grpc, self.grpc_port = await start_grpc_server(
            self.dataplane,
            self.apply_models,
            address=f"{_host_for_grpc(options.grpc_host)}:{options.port}",
            socket_path=options.grpc_socket_path,
            max_message_bytes=options.grpc_max_message_bytes,
            channel_arguments=options.grpc_arguments(),
        )
        log.info("Running gRPC ModelServer at %s:%d", options.grpc_host, self.grpc_port)
        if options.rest_api_port != 0:  # 0 is off, as in TF Serving; -1 picks a free port
            prometheus_path = monitoring.prometheus_path if monitoring.prometheus_enabled else None
            await self._start_rest(max(options.rest_api_port, 0), prometheus_path)
        self.started_at = time.time()
        if options.parent_pid:
            threading.Thread(target=self._watch_parent, name="workbench-parent", daemon=True).start()
        # Recorded once it answers, before the ready file so a started handle is listed; never raises.
        self._registry_id = registry.register_server(options, self.rest_port, self.grpc_port, self.started_at)
        if options.ready_file:
            write_ready_file(options.ready_file, self.health())

    def _watch_parent(self) -> None:
        """Serve only as long as the process that started us lives (a notebook kernel, even one killed -9)."""
        while not self._stopping.wait(0.5):
            if not _process_alive(self.options.parent_pid):
                log.warning("Parent process %d is gone: stopping", self.options.parent_pid)
                self._on_parent_exit()
                return

    def _on_parent_exit(self) -> None:
        os.kill(os.getpid(), signal.SIGTERM)

    async def _start_rest(self, port: int, prometheus_path: str | None) -> None:
        app = create_app(
            self.dataplane,
            timeout_ms=self.options.rest_api_timeout_in_ms,
            max_request_bytes=self.options.rest_api_max_request_bytes,
            enable_cors=self.options.rest_api_enable_cors_support,
            prometheus_path=prometheus_path,
            extra_routes=management_routes(self, self._stopped or asyncio.Event(), self.options.management_token),
        )
        sock = _bind(self.options.rest_api_host, port)
        self._sockets.append(sock)
        self.rest_port = sock.getsockname()[1]
        config = uvicorn.Config(
            app,
            lifespan="off",
            log_config=None,
            access_log=False,
            http="httptools",
            loop="none",
            timeout_keep_alive=30,
        )
        config.load()
        server = uvicorn.Server(config)
        server.lifespan = config.lifespan_class(config)
        await server.startup(sockets=[sock])
        self._uvicorn = server
        log.info("Exporting HTTP/REST API at %s:%d", self.options.rest_api_host, self.rest_port)

    async def stop(self) -> None:
        self._stopping.set()
        if self._registry_id is not None:  # first: Jupyter stops listing and proxying a server going away
            registry.unregister(self._registry_id)
            self._registry_id = None
        if self._stopped is not None:
            self._stopped.set()
        if self._grpc is not None:
            await self._grpc.stop(grace=2)
            self._grpc = None
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
            await self._uvicorn.shutdown(sockets=self._sockets)
            self._uvicorn = None
        self.source.stop()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.request_log.close)  # no requests come any more: write what is queued
        await loop.run_in_executor(None, self.manager.stop)
        self._executor.shutdown(wait=False, cancel_futures=True)


def run(options: ServerOptions) -> int:
    """``workbench serve``: serve until SIGINT/SIGTERM; returns the process exit code."""
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    server = ModelServer(options)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    async def main() -> None:
        await server.start()
        await stop.wait()
        await server.stop()

    try:
        loop.run_until_complete(main())
    finally:
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()
    return 0


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
        return f"http://{self.server.options.rest_api_host}:{self.server.rest_port}"

    @property
    def grpc_target(self) -> str:
        return f"{self.server.options.grpc_host}:{self.server.grpc_port}"

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self.server.stop(), self._loop).result(timeout=60)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
