"""``ServerHandle``: a ``workbench serve`` child process of the notebook kernel.

The server runs in its own process (the kernel stays responsive under load, a crashing model cannot take the
kernel down, and what is tested in the notebook is what ships). The handle starts it on free ports, waits until
it answers, and stops it on ``.stop()``, at kernel shutdown or restart (``atexit``), and — through the child's
``--parent_pid`` watchdog — even when the kernel is killed. The child's output goes to a log file, never into
cells; a server that died is reported with the end of that log and can be restarted.

Options and attributes are named as ``workbench serve``'s flags (``model_repository``, ``server_name``,
``rest_api_port``, ``port`` for gRPC, ``enable_batching``, ``batching_parameters_file``); the earlier names
(``repository``, ``name``, ``rest_port``, ``grpc_port``, ``batching``, ``batching_parameters``) still work.

Why one module of this size: :class:`ServerHandle` is the notebook's one object for a server process (start,
wait, stop, restart, its client, its tables); the functions after it are the few it needs and ``serve()``.
"""

from __future__ import annotations

import atexit
import contextlib
import html
import inspect
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec

from workbench.config.server_flags import serve_flag_words
from workbench.config.vocabulary import SERVER_KEYWORD_ALIASES, Alias, renamed_keywords
from workbench.runtime.mlflow_uris import is_mlflow_uri

if TYPE_CHECKING:  # imported by start(), while the server process starts beside it (see there)
    from workbench.client import Client

DEFAULT_REPOSITORY = "workbench-models"
DEFAULT_SERVER_NAME = "default"  # a server's name when none is given
P = ParamSpec("P")
_handles: list[ServerHandle] = []
_handles_lock = threading.Lock()
# Each handle's folder (its server's log and ready file): kept after stop() so that logs() still reads, and removed
# when the process that made it exits, after its servers stopped.
_folders: list[Path] = []


def repository_location(model_repository: str | os.PathLike[str]) -> Path | str:
    """A local repository as an absolute path (the server's working folder differs); a store's URL unchanged.

    ``s3://bucket/models``, ``gs://...``: anything with ``://`` is a URL the server reads through its storage layer;
    ``models:/NAME``, ``runs:/...`` (which have no ``//``) name MLflow, which the server asks.
    """
    text = os.fspath(model_repository)
    return text if "://" in text or is_mlflow_uri(text) else Path(text).resolve()


class ServerDied(RuntimeError):
    """The server process exited; the message ends with the last lines of its log.

    ``exit_code`` is the process's exit status (negative: the signal that ended it, as ``subprocess`` reports it),
    None when the server never started; ``log_tail`` holds the log's last lines.
    """

    def __init__(self, message: str, *, exit_code: int | None = None, log_tail: str = "") -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.log_tail = log_tail


def describe_exit(code: int) -> str:
    """``exited with code 1``; ``exited with code -9 (killed by SIGKILL)`` for a process a signal ended."""
    if code >= 0:
        return f"exited with code {code}"
    try:
        cause = signal.Signals(-code).name
    except ValueError:  # a real-time signal has no name
        cause = f"signal {-code}"
    return f"exited with code {code} (killed by {cause})"


class ServerHandle:
    """A model server started from the notebook. Use :func:`workbench.serve` to make one.

    Once started, ``rest_api_port`` and ``port`` are the ports it answers on (REST and gRPC). ``timeout`` is how
    long :meth:`start` and :meth:`restart` wait for it to answer unless told otherwise; ``extra_args`` are more of
    ``workbench serve``'s flags, as words. Its keywords are :func:`serve`'s too.
    """

    # The earlier names of the attributes, as the earlier keywords are accepted by __init__.
    repository = Alias("model_repository")
    name = Alias("server_name")
    rest_port = Alias("rest_api_port")
    grpc_port = Alias("port")

    @renamed_keywords(**SERVER_KEYWORD_ALIASES)
    def __init__(
        self,
        model_repository: str | os.PathLike[str] = DEFAULT_REPOSITORY,
        *,
        server_name: str = DEFAULT_SERVER_NAME,
        rest_api_port: int | None = None,
        port: int | None = None,
        openai_port: int = 0,
        enable_batching: bool = False,
        batching_parameters_file: str | os.PathLike[str] | None = None,
        file_system_poll_wait_seconds: float = 0.5,
        allow_pickle: bool = False,
        allow_python_models: bool = False,
        num_workers: int | str = 1,
        response_cache_bytes: int = 0,
        response_cache_models: Sequence[str] = (),
        memory_budget: str = "",
        load_on_demand: bool = False,
        unload_after_idle: float = 0.0,
        pin: Sequence[str] = (),
        ssl_config_file: str | os.PathLike[str] | None = None,
        rest_api_ssl_cert_file: str | os.PathLike[str] | None = None,
        rest_api_ssl_key_file: str | os.PathLike[str] | None = None,
        ca_file: str | os.PathLike[str] | None = None,
        model_name: str | None = None,
        model_base_path: str | os.PathLike[str] | None = None,
        mlflow_tracking_uri: str = "",
        mlflow_stable_alias: str = "",
        mlflow_canary_alias: str = "",
        mlflow_write_aliases: bool = False,
        timeout: float = 180.0,
        extra_args: Sequence[str] = (),
    ) -> None:
        if rest_api_port == 0:  # TF Serving's "REST off": the handle itself talks to its server over REST
            raise ValueError(
                "rest_api_port=0 would turn REST off, which a notebook server needs (leave it out: a free port)"
            )
        self.server_name = server_name
        self.model_repository: Path | str = repository_location(model_repository)
        # One model instead of a repository (`workbench serve --model_base_path`): a folder, a store's URL, or MLflow
        # (models:/NAME serves a registered model's versions, its aliases routing them).
        self.model_base_path: Path | str | None = (
            None if model_base_path is None else repository_location(model_base_path)
        )
        self.model_name = model_name
        # MLflow's registry (docs/production.md): the tracking server (default: the kernel's MLFLOW_TRACKING_URI,
        # which the server inherits), the aliases that are the stable and canary versions, and whether promote,
        # canary and rollback may move them.
        self.mlflow_flags: dict[str, Any] = {
            "mlflow_tracking_uri": mlflow_tracking_uri,
            "mlflow_stable_alias": mlflow_stable_alias or None,
            "mlflow_canary_alias": mlflow_canary_alias or None,
            "mlflow_write_aliases": mlflow_write_aliases,
        }
        # None: a free port, picked by the server (-1 for REST, 0 for gRPC, as `workbench serve` takes them).
        self._rest_api_port_asked = -1 if rest_api_port is None else rest_api_port
        self._port_asked = 0 if port is None else port
        # OpenAI's endpoints: 0 on the REST port, else a port of their own (-1: a free one); read back once started.
        self._openai_port_asked = openai_port
        self.openai_port: int | None = None
        self.enable_batching = enable_batching
        self.batching_parameters_file = batching_parameters_file
        self.file_system_poll_wait_seconds = file_system_poll_wait_seconds
        self.allow_pickle = allow_pickle
        self.allow_python_models = allow_python_models
        self.num_workers = num_workers  # `workbench serve --num_workers`: a number, or "auto" (one per core)
        # Triton's response cache: its size in bytes (0: off) and the models that opt in.
        self.response_cache_bytes = response_cache_bytes
        self.response_cache_models = list(response_cache_models)
        # Many models in bounded memory (docs/memory-budget.md): the budget, loads on demand, idle unloads, pins.
        self.memory_flags: dict[str, Any] = {
            "memory_budget": memory_budget,
            "load_on_demand": load_on_demand,
            "unload_after_idle": unload_after_idle,
            "pin": list(pin),
        }
        # TLS: the server's flags (files resolved now: the server runs in another folder), and the CA this handle's
        # client checks the server's certificates with (None: the default trust store)
        self.tls_flags = {
            flag: str(Path(path).resolve())
            for flag, path in [
                ("ssl_config_file", ssl_config_file),
                ("rest_api_ssl_cert_file", rest_api_ssl_cert_file),
                ("rest_api_ssl_key_file", rest_api_ssl_key_file),
            ]
            if path
        }
        self.ca_file = str(Path(ca_file).resolve()) if ca_file else None
        self._rest_scheme = "http"  # read back from the server's ready file, as its ports are
        self._grpc_tls = False
        self.timeout = timeout  # how long start() and restart() wait for the server to answer, unless told
        self.extra_args = list(extra_args)
        readable = "".join(c if c.isalnum() or c in "-_." else "_" for c in server_name)  # any name, a safe folder
        self._dir = Path(tempfile.mkdtemp(prefix=f"workbench-{readable}-"))
        _folders.append(self._dir)
        self.log_path = self._dir / "server.log"
        self._ready_path = self._dir / "ready.json"
        self._process: subprocess.Popen[bytes] | None = None
        self._log_file: Any = None
        self.rest_api_port: int | None = None
        self.port: int | None = None
        self.started_seconds: float | None = None
        self._client: Client | None = None
        self._on_stop: list[Callable[[], None]] = []

    # --------------------------------------------------------------------------------- lifecycle
    def command(self) -> list[str]:
        """The server's command line: ``workbench serve`` with this handle's options as its flags."""
        batching_file = self.batching_parameters_file
        source = (
            {"model_repository": self.model_repository}
            if self.model_base_path is None
            else {"model_base_path": self.model_base_path, "model_name": self.model_name}
        )
        always = serve_flag_words(
            {
                **source,
                "port": self._port_asked,
                "rest_api_port": self._rest_api_port_asked,
                "file_system_poll_wait_seconds": self.file_system_poll_wait_seconds,
                "server_name": self.server_name,
                "ready_file": self._ready_path,
                "parent_pid": os.getpid(),
            },
            keep_defaults=True,
        )
        given = serve_flag_words(  # the rest only where not the server's default
            {
                "enable_batching": bool(self.enable_batching or batching_file),
                "batching_parameters_file": Path(batching_file).resolve() if batching_file else None,
                "allow_pickle": self.allow_pickle,
                "allow_python_models": self.allow_python_models,
                "openai_port": self._openai_port_asked,
                "num_workers": str(self.num_workers),
                "response_cache_bytes": self.response_cache_bytes,
                "response_cache_models": self.response_cache_models,
                **self.memory_flags,
                **self.tls_flags,
                **self.mlflow_flags,
            }
        )
        return [sys.executable, "-m", "workbench", "serve", *always, *given, *self.extra_args]

    def start(self, timeout: float | None = None) -> ServerHandle:
        """Start the server and return once it answers, within ``timeout`` seconds (default: the handle's); raises
        :class:`ServerDied` if it cannot start."""
        if self.running:
            return self
        timeout = self.timeout if timeout is None else timeout
        # A store's "folder" is a prefix, and MLflow's registry no folder: nothing to create.
        if self.model_base_path is None and isinstance(self.model_repository, Path):
            self.model_repository.mkdir(parents=True, exist_ok=True)
        self._ready_path.unlink(missing_ok=True)
        env = dict(os.environ)
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        env["TF_FORCE_GPU_ALLOW_GROWTH"] = "true"  # training in the kernel and serving share the GPU
        env["PYTHONUNBUFFERED"] = "1"
        started = time.perf_counter()
        self._log_file = open(self.log_path, "ab")  # noqa: SIM115 - stays open for the child's life
        self._process = subprocess.Popen(
            self.command(),
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # a Ctrl-C in the notebook interrupts the cell, not the server
        )
        with _handles_lock:
            if self not in _handles:
                _handles.append(self)
        # The client (requests, the transports: about 0.1 s) is imported now, on the kernel's core, while the server
        # process starts on another, rather than before it starts: the first request after start finds it imported.
        import workbench.client.facade  # noqa: F401

        deadline = time.perf_counter() + timeout
        while not self._ready_path.exists():
            if self._process.poll() is not None:
                message = f"workbench server {self.server_name!r} could not start:\n{self.log_tail()}"
                self.stop()
                raise ServerDied(message)
            if time.perf_counter() > deadline:
                self.stop()
                message = f"workbench server {self.server_name!r} did not answer in {timeout:g}s:\n{self.log_tail()}"
                raise ServerDied(message)
            time.sleep(0.05)
        ready = json.loads(self._ready_path.read_text())
        self.rest_api_port, self.port = ready["rest_port"], ready["grpc_port"]
        self.openai_port = ready.get("openai_port")
        self._rest_scheme, self._grpc_tls = ready.get("rest_scheme", "http"), bool(ready.get("grpc_tls"))
        self.started_seconds = time.perf_counter() - started
        self._client = None
        return self

    def on_stop(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` when this server stops (widgets close their threads with it)."""
        self._on_stop.append(callback)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL after ``timeout``); the ports are free when this returns."""
        callbacks, self._on_stop = self._on_stop, []
        for callback in callbacks:
            with contextlib.suppress(Exception):  # a widget failing to close must not keep the server up
                callback()
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        if self._client is not None:
            self._client.close()
            self._client = None
        with _handles_lock:
            if self in _handles:
                _handles.remove(self)

    def restart(self, timeout: float | None = None) -> ServerHandle:
        """Start again on the same REST and gRPC ports, e.g. after :class:`ServerDied`; returns once it answers.

        Free picks are kept too: clients, dashboards and proxies made for the old server reach the new one. The
        repository and options are the same, and so is the routing (promotions, canaries, labels), which lives in
        the repository (``routing.json``) and is read back at start. A port another process took meanwhile makes
        this raise :class:`ServerDied` naming it. From then on the handle keeps asking for these ports.
        """
        rest_api_port, port, openai_port = self.rest_api_port, self.port, self.openai_port
        self.stop()
        if rest_api_port is not None and port is not None:  # it ran: ask for its ports from now on
            self._rest_api_port_asked, self._port_asked = rest_api_port, port
            if openai_port:
                self._openai_port_asked = openai_port
        return self.start(timeout)

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def exit_code(self) -> int | None:
        """The exit status of a server that ended without ``stop()`` (negative: the killing signal); else None."""
        return self._process.poll() if self._process is not None else None

    def check(self) -> None:
        """Raise :class:`ServerDied` (with the end of the log) if the server is no longer running."""
        if self._process is None:
            raise ServerDied(f"workbench server {self.server_name!r} is not started")
        code = self._process.poll()
        if code is not None:
            tail = self.log_tail()
            raise ServerDied(
                f"workbench server {self.server_name!r} {describe_exit(code)}:\n{tail}", exit_code=code, log_tail=tail
            )

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    # ------------------------------------------------------------------------------------ access
    @property
    def rest_url(self) -> str:
        self.check()
        return self._rest_address()

    def _rest_address(self) -> str:
        return f"{self._rest_scheme}://127.0.0.1:{self.rest_api_port}"

    @property
    def openai_url(self) -> str:
        """The base URL of the OpenAI-compatible endpoints, for ``openai.OpenAI(base_url=...)``: ``/v1`` on their
        own port (``openai_port``), else ``/openai/v1`` on the REST port (docs/openai.md)."""
        self.check()
        if self.openai_port:
            return f"{self._rest_scheme}://127.0.0.1:{self.openai_port}/v1"
        return f"{self._rest_address()}/openai/v1"

    @property
    def grpc_target(self) -> str:
        self.check()
        return f"127.0.0.1:{self.port}"

    @property
    def proxy_url(self) -> str | None:
        """The REST API's path through jupyter-server-proxy, when this kernel runs behind JupyterHub or Binder.

        There only the Jupyter server's port reaches the browser; jupyter-server-proxy forwards
        ``<prefix>proxy/<port>/`` to ``127.0.0.1:<port>``. The prefix is the hub's ``JUPYTERHUB_SERVICE_PREFIX``.
        """
        prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX")
        if not prefix or not self.running:
            return None
        return f"{prefix.rstrip('/')}/proxy/{self.rest_api_port}/"

    @property
    def client(self) -> Client:
        """A :class:`~workbench.client.Client` for this server (REST by default, gRPC with ``protocol="grpc"``)."""
        self.check()
        if self._client is None:
            from workbench.client import Client

            self._client = Client(self.rest_url, self.grpc_target, tls=self._grpc_tls, ca_file=self.ca_file)
        return self._client

    def models(self) -> list[dict[str, Any]]:
        return self.client.models()

    def wait_for_version(self, model: str, version: int | None = None, timeout: float = 120.0) -> int:
        """Block until ``model`` (at ``version``, or any version) is AVAILABLE; returns the version."""
        deadline = time.perf_counter() + timeout
        last = "no answer"
        while time.perf_counter() < deadline:
            self.check()
            try:
                for status in self.client.status(model):
                    if status["state"] == "AVAILABLE" and (version is None or status["version"] == version):
                        return int(status["version"])
                    if status["version"] == version and status["state"] == "END" and status["error_code"] != "OK":
                        raise ServerDied(f"version {version} of {model} failed to load: {status['error_message']}")
                    last = str(status)
            except ServerDied:
                raise
            except Exception as exc:  # noqa: BLE001 - not there yet: keep polling
                last = str(exc)
            time.sleep(0.1)
        raise TimeoutError(f"{model} v{version} not AVAILABLE after {timeout:g}s (last: {last})")

    def wait_for_state(self, model: str, version: int, state: str = "AVAILABLE", timeout: float = 120.0) -> None:
        """Block until ``version`` of ``model`` is in ``state``: ``"END"`` once a removed version is unloaded.

        Raises :class:`ServerDied` if the server exits meanwhile; see :func:`wait_for_state`.
        """
        wait_for_state(self.client, model, version, state, timeout=timeout, alive=self.check)

    def wait_for_model(
        self, model: str, condition: Callable[[dict[str, Any]], bool], timeout: float = 120.0
    ) -> dict[str, Any]:
        """Block until ``condition`` holds for ``model``'s description (``client.model(model)``: its versions,
        ``stable``, ``canary``, ``registry``); returns that description. For what moves outside the notebook: an alias
        set in MLflow's registry reaches the server at its next poll. Raises :class:`ServerDied` if the server exits,
        TimeoutError after ``timeout`` seconds."""
        deadline = time.perf_counter() + timeout
        last: Any = "no answer"
        while True:
            self.check()
            try:
                described = self.client.model(model)
            except Exception as exc:  # noqa: BLE001 - not listening or not loaded yet: keep polling
                last = exc
            else:
                if condition(described):
                    return described
                last = {key: described.get(key) for key in ("stable", "canary", "registry")}
            if time.perf_counter() > deadline:
                raise TimeoutError(f"{model}'s description did not meet the condition in {timeout:g}s (last: {last})")
            time.sleep(0.1)

    # ----------------------------------------------------------------------------------- display
    @property
    def serves(self) -> str:
        """What it serves, in words: ``repository /path`` or ``model wine from models:/wine``."""
        if self.model_base_path is None:
            return f"repository {self.model_repository}"
        return f"model {self.model_name or 'default'} from {self.model_base_path}"

    def _stopped_state(self) -> str:
        """``stopped`` after ``stop()``; for a server that ended by itself, how, and where its log is."""
        code = self.exit_code
        if code is None:
            return "stopped"
        return f"died: {describe_exit(code)}, log {self.log_path} (restart() starts it again on the same ports)"

    def __repr__(self) -> str:
        state = "running" if self.running else self._stopped_state()
        if not self.running:
            return f"<workbench server {self.server_name!r}: {state}, {self.serves}>"
        proxied = f", browser {self.proxy_url}" if self.proxy_url else ""
        return (
            f"<workbench server {self.server_name!r}: {state}, REST {self._rest_address()}, "
            f"gRPC 127.0.0.1:{self.port}{proxied}, {self.serves}>"
        )

    def _repr_html_(self) -> str:
        if not self.running:
            state = html.escape(self._stopped_state())
            return f"<b>workbench server</b> <code>{html.escape(self.server_name)}</code>: {state}"
        try:
            models = self.models()
        except Exception as exc:  # noqa: BLE001 - a display must not raise
            return f"<b>workbench server</b> <code>{html.escape(self.server_name)}</code>: {html.escape(str(exc))}"
        return models_table_html(
            models,
            title=f"workbench server <code>{html.escape(self.server_name)}</code> · REST "
            f"<code>{self._rest_address()}</code> · gRPC <code>127.0.0.1:{self.port}</code>"
            + (" (TLS)" if self._grpc_tls else ""),
        )


def models_table_html(models: list[dict[str, Any]], title: str = "") -> str:
    """Models and versions as an HTML table (state, labels, traffic share, load error); under a memory budget also
    each version's residency, memory and evictions."""
    budgeted = any("memory" in version for model in models for version in model["versions"])
    rows = []
    for model in models:
        for version in model["versions"]:
            error = html.escape(version["error"]) if version["error"] else ""
            memory = f"<td>{html.escape(memory_summary(version.get('memory')))}</td>" if budgeted else ""
            rows.append(
                "<tr>"
                f"<td>{html.escape(model['name'])}</td><td>{version['version']}</td><td>{version['state']}</td>"
                f"<td>{html.escape(', '.join(version_marks(model, version)))}</td>"
                f"<td>{version['traffic_share'] * 100:.0f}%</td>{memory}<td>{error}</td>"
                "</tr>"
            )
    columns = ["model", "version", "state", "labels", "traffic", *(["memory"] if budgeted else []), "error"]
    if not rows:
        empty = "<i>no models yet: export one with workbench.export</i>"
        rows.append(f'<tr><td colspan="{len(columns)}">{empty}</td></tr>')
    head = "<tr>" + "".join(f"<th>{column}</th>" for column in columns) + "</tr>"
    return f"<div><b>{title}</b><table>{head}{''.join(rows)}</table></div>"


def version_marks(model: dict[str, Any], version: dict[str, Any]) -> list[str]:
    """A version's labels and, for a model routed by MLflow's registry, the aliases naming it: ``stable, @champion``."""
    aliases = (model.get("registry") or {}).get("aliases", {})
    return [*version["labels"], *(f"@{alias}" for alias, number in aliases.items() if number == version["version"])]


def memory_summary(memory: dict[str, Any] | None) -> str:
    """A version's memory under a budget, in a few words: ``resident · 32.0 MiB · 2 evictions`` (pinned, GPU
    memory where it has some); empty without a budget."""
    if not memory:
        return ""
    parts = [str(memory.get("residency", ""))]
    if memory.get("pinned"):
        parts.append("pinned")
    # What it takes in memory: its charge while loaded; once evicted, what it would take again (its measured size,
    # its files' size as the floor, as the budget charges it).
    host = memory.get("charged_bytes") or max(memory.get("measured_bytes") or 0, memory.get("disk_bytes") or 0)
    gpu = memory.get("charged_gpu_bytes") or memory.get("measured_gpu_bytes") or 0
    for size, unit in ((host, ""), (gpu, " GPU")):
        if size:
            parts.append(f"{size / 2**20:.1f} MiB{unit}")
    if memory.get("evictions"):
        parts.append(f"{memory['evictions']} eviction{'s' if memory['evictions'] != 1 else ''}")
    return " · ".join(parts)


def models_table_text(models: list[dict[str, Any]]) -> str:
    """The same as plain text, stable for notebook output comparison."""
    lines = []
    for model in models:
        for version in model["versions"]:
            labels = ",".join(version_marks(model, version)) or "-"
            error = f"  error: {version['error']}" if version["error"] else ""
            memory = memory_summary(version.get("memory"))
            lines.append(
                f"{model['name']:<16} v{version['version']:<4} {version['state']:<10} labels={labels:<14} "
                f"traffic={version['traffic_share'] * 100:.0f}%{f'  memory: {memory}' if memory else ''}{error}"
            )
    return "\n".join(lines) if lines else "(no models)"


def _takes_handle_options(
    handle: Callable[P, ServerHandle],
) -> Callable[[Callable[..., ServerHandle]], Callable[P, ServerHandle]]:
    """The decorated function takes ``handle``'s keywords, as ``handle`` declares them (names, types, defaults).

    Why this and not a TypedDict or a settings dataclass: ``ServerHandle.__init__`` is already the typed, documented
    declaration users see, so ``serve()`` borrows it instead of repeating it. The ParamSpec gives type checkers
    and IDEs its keywords, and ``__signature__`` gives them to ``help()`` and Jupyter's completion.
    """

    def adopt(function: Callable[..., ServerHandle]) -> Callable[P, ServerHandle]:
        function.__signature__ = inspect.signature(handle).replace(  # type: ignore[attr-defined]
            return_annotation="ServerHandle"
        )
        return function

    return adopt


@_takes_handle_options(ServerHandle)
@renamed_keywords(**SERVER_KEYWORD_ALIASES)
def serve(model_repository: str | os.PathLike[str] = DEFAULT_REPOSITORY, **options: Any) -> ServerHandle:
    """Start a model server on ``model_repository`` (every sub-folder is a model) and return its handle.

    ``model_repository`` is a local folder or a store's URL (``s3://bucket/models``, read with the credentials of
    the environment, as ``workbench serve --model_repository=s3://...`` reads them).

    The options are ``workbench serve``'s flags: ``rest_api_port`` (REST) and ``port`` (gRPC) are free picks
    unless given; ``enable_batching=True`` turns dynamic batching on with TF Serving's defaults,
    ``batching_parameters_file`` names a BatchingParameters text file; new versions are looked for every
    ``file_system_poll_wait_seconds``. ``allow_pickle`` (scikit-learn pickles) and ``allow_python_models``
    (``model.py``, ``handler.py``) let the server run code from the repository, off by default. ``num_workers``
    processes share the ports (``"auto"``: one per core), each with its own copy of the models; 1 by default, as
    a notebook shares its machine with the kernel. ``response_cache_bytes`` sizes Triton's response cache (0: off)
    for the ``response_cache_models`` that opt in: a repeated request is answered from memory. Many models in
    bounded memory: ``memory_budget`` (``"4Gi"``, ``"0.5"``, ``"gpu:0.8"``) evicts the least recently used versions,
    which load again when asked for, as do all of them with ``load_on_demand=True``; ``unload_after_idle`` seconds
    unloads idle versions; ``pin`` names models (or ``"model:version"``) never evicted. ``openai_port`` gives the
    OpenAI-compatible endpoints a port of their own (-1: a free one; default: the REST port's), and the handle's
    ``openai_url`` is their base URL either way. TLS:
    ``ssl_config_file`` (TF Serving's SSLConfig) secures gRPC, ``rest_api_ssl_cert_file`` and
    ``rest_api_ssl_key_file`` make REST https, and the handle's client checks the server's certificate against
    ``ca_file`` (default: the default trust store). The server stops with the kernel.
    The earlier keyword names (``repository``, ``name``, ``rest_port``, ``grpc_port``, ``batching``,
    ``batching_parameters``, ``poll_seconds``) are accepted too.
    """
    handle = ServerHandle(model_repository, **options).start()
    if handle.proxy_url:  # behind a hub, the browser reaches the REST API only through the Jupyter server
        print(f"workbench server {handle.server_name!r}: REST API in the browser at {handle.proxy_url}")
    return handle


def wait_for_state(
    client: Client,
    model: str,
    version: int,
    state: str = "AVAILABLE",
    *,
    timeout: float = 120.0,
    alive: Callable[[], None] | None = None,
) -> None:
    """Block until ``version`` of ``model`` is in ``state`` (``"AVAILABLE"``, ``"END"``...) on ``client``'s server.

    Works for any server, also one this kernel did not start (``workbench serve`` in a terminal, TF Serving in a
    container): a server not listening yet, or not knowing the model yet, is waited for. ``alive`` is called on
    every poll and may raise to stop waiting (a handle's ``check``). A version whose load fails raises
    RuntimeError at once with the server's message, unless END is what is waited for; TimeoutError after
    ``timeout`` seconds.
    """
    deadline = time.perf_counter() + timeout
    last = "no answer"
    while True:
        if alive is not None:
            alive()
        try:
            statuses = client.status(model)
        except Exception as exc:  # noqa: BLE001 - not listening or not loaded yet: keep polling
            last = str(exc)
        else:
            mine = next((s for s in statuses if s["version"] == version), None)
            if mine is not None and mine["state"] == state:
                return
            if mine is not None and mine["state"] == "END" and mine["error_code"] != "OK":
                raise RuntimeError(f"version {version} of {model} failed to load: {mine['error_message']}")
            last = mine["state"] if mine is not None else f"no version {version}"
        if time.perf_counter() > deadline:
            raise TimeoutError(f"{model} v{version} not {state} after {timeout:g}s (last: {last})")
        time.sleep(0.1)


def running_servers() -> list[ServerHandle]:
    with _handles_lock:
        return list(_handles)


@atexit.register
def _stop_all() -> None:  # kernel shutdown and restart end the kernel process: take the servers along
    for handle in running_servers():
        with contextlib.suppress(Exception):  # best effort at interpreter exit
            handle.stop(timeout=10)
    for folder in _folders:
        shutil.rmtree(folder, ignore_errors=True)
