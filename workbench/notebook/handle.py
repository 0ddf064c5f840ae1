"""``ServerHandle``: a ``workbench serve`` child process of the notebook kernel.

The server runs in its own process (the kernel stays responsive under load, a crashing model cannot take the
kernel down, and what is tested in the notebook is what ships). The handle starts it on free ports, waits until
it answers, and stops it on ``.stop()``, at kernel shutdown or restart (``atexit``), and — through the child's
``--parent_pid`` watchdog — even when the kernel is killed. The child's output goes to a log file, never into
cells; a server that died is reported with the end of that log and can be restarted.
"""

from __future__ import annotations

import atexit
import contextlib
import html
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from workbench.client import Client

DEFAULT_REPOSITORY = "workbench-models"
_handles: list[ServerHandle] = []
_handles_lock = threading.Lock()


class ServerDied(RuntimeError):
    """The server process exited; the message ends with the last lines of its log."""


class ServerHandle:
    """A model server started from the notebook. Use :func:`workbench.serve` to make one."""

    def __init__(
        self,
        repository: str | os.PathLike[str] = DEFAULT_REPOSITORY,
        *,
        name: str = "default",
        rest_port: int | None = None,
        grpc_port: int | None = None,
        batching: bool = False,
        batching_parameters: str | os.PathLike[str] | None = None,
        poll_seconds: float = 0.5,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.name = name
        self.repository = Path(repository).resolve()
        self._rest_port_asked, self._grpc_port_asked = rest_port, grpc_port
        self.batching = batching
        self.batching_parameters = batching_parameters
        self.poll_seconds = poll_seconds
        self.extra_args = list(extra_args)
        self._dir = Path(tempfile.mkdtemp(prefix=f"workbench-{name}-"))
        self.log_path = self._dir / "server.log"
        self._ready_path = self._dir / "ready.json"
        self._process: subprocess.Popen[bytes] | None = None
        self._log_file: Any = None
        self.rest_port: int | None = None
        self.grpc_port: int | None = None
        self.started_seconds: float | None = None
        self._client: Client | None = None
        self._on_stop: list[Callable[[], None]] = []

    # --------------------------------------------------------------------------------- lifecycle
    def command(self) -> list[str]:
        args = [
            sys.executable, "-m", "workbench", "serve",
            f"--model_repository={self.repository}",
            f"--port={self._grpc_port_asked or 0}",
            f"--rest_api_port={self._rest_port_asked or -1}",
            f"--file_system_poll_wait_seconds={self.poll_seconds}",
            f"--server_name={self.name}",
            f"--ready_file={self._ready_path}",
            f"--parent_pid={os.getpid()}",
        ]  # fmt: skip
        if self.batching or self.batching_parameters:
            args.append("--enable_batching")
        if self.batching_parameters:
            args.append(f"--batching_parameters_file={Path(self.batching_parameters).resolve()}")
        return args + self.extra_args

    def start(self, timeout: float = 180.0) -> ServerHandle:
        """Start the server and return once it answers (raises :class:`ServerDied` if it cannot start)."""
        if self.running:
            return self
        self.repository.mkdir(parents=True, exist_ok=True)
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
        deadline = time.perf_counter() + timeout
        while not self._ready_path.exists():
            if self._process.poll() is not None:
                message = f"workbench server {self.name!r} could not start:\n{self.log_tail()}"
                self.stop()
                raise ServerDied(message)
            if time.perf_counter() > deadline:
                self.stop()
                raise ServerDied(f"workbench server {self.name!r} did not answer in {timeout:g}s:\n{self.log_tail()}")
            time.sleep(0.05)
        ready = json.loads(self._ready_path.read_text())
        self.rest_port, self.grpc_port = ready["rest_port"], ready["grpc_port"]
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

    def restart(self, timeout: float = 180.0) -> ServerHandle:
        """Start again (on the same ports unless they were free picks), e.g. after :class:`ServerDied`."""
        self.stop()
        return self.start(timeout)

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def check(self) -> None:
        """Raise :class:`ServerDied` (with the end of the log) if the server is no longer running."""
        if self._process is None:
            raise ServerDied(f"workbench server {self.name!r} is not started")
        code = self._process.poll()
        if code is not None:
            raise ServerDied(f"workbench server {self.name!r} exited with code {code}:\n{self.log_tail()}")

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
        return f"http://127.0.0.1:{self.rest_port}"

    @property
    def grpc_target(self) -> str:
        self.check()
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def proxy_url(self) -> str | None:
        """The REST API's path through jupyter-server-proxy, when this kernel runs behind JupyterHub or Binder.

        There only the Jupyter server's port reaches the browser; jupyter-server-proxy forwards
        ``<prefix>proxy/<port>/`` to ``127.0.0.1:<port>``. The prefix is the hub's ``JUPYTERHUB_SERVICE_PREFIX``.
        """
        prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX")
        if not prefix or not self.running:
            return None
        return f"{prefix.rstrip('/')}/proxy/{self.rest_port}/"

    @property
    def client(self) -> Client:
        """A :class:`~workbench.client.Client` for this server (REST by default, gRPC with ``protocol="grpc"``)."""
        self.check()
        if self._client is None:
            self._client = Client(self.rest_url, self.grpc_target)
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

    # ----------------------------------------------------------------------------------- display
    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        if not self.running:
            return f"<workbench server {self.name!r}: {state}, repository {self.repository}>"
        proxied = f", browser {self.proxy_url}" if self.proxy_url else ""
        return (
            f"<workbench server {self.name!r}: {state}, REST http://127.0.0.1:{self.rest_port}, "
            f"gRPC 127.0.0.1:{self.grpc_port}{proxied}, repository {self.repository}>"
        )

    def _repr_html_(self) -> str:
        if not self.running:
            return f"<b>workbench server</b> <code>{html.escape(self.name)}</code>: stopped"
        try:
            models = self.models()
        except Exception as exc:  # noqa: BLE001 - a display must not raise
            return f"<b>workbench server</b> <code>{html.escape(self.name)}</code>: {html.escape(str(exc))}"
        return models_table_html(
            models,
            title=f"workbench server <code>{html.escape(self.name)}</code> · REST "
            f"<code>http://127.0.0.1:{self.rest_port}</code> · gRPC <code>127.0.0.1:{self.grpc_port}</code>",
        )


def models_table_html(models: list[dict[str, Any]], title: str = "") -> str:
    """Models and versions as an HTML table (state, labels, traffic share, load error)."""
    rows = []
    for model in models:
        for version in model["versions"]:
            error = html.escape(version["error"]) if version["error"] else ""
            rows.append(
                "<tr>"
                f"<td>{html.escape(model['name'])}</td><td>{version['version']}</td><td>{version['state']}</td>"
                f"<td>{html.escape(', '.join(version['labels']))}</td>"
                f"<td>{version['traffic_share'] * 100:.0f}%</td><td>{error}</td>"
                "</tr>"
            )
    if not rows:
        rows.append('<tr><td colspan="6"><i>no models yet: export one with workbench.export</i></td></tr>')
    head = "<tr><th>model</th><th>version</th><th>state</th><th>labels</th><th>traffic</th><th>error</th></tr>"
    return f"<div><b>{title}</b><table>{head}{''.join(rows)}</table></div>"


def models_table_text(models: list[dict[str, Any]]) -> str:
    """The same as plain text, stable for notebook output comparison."""
    lines = []
    for model in models:
        for version in model["versions"]:
            labels = ",".join(version["labels"]) or "-"
            error = f"  error: {version['error']}" if version["error"] else ""
            lines.append(
                f"{model['name']:<16} v{version['version']:<4} {version['state']:<10} labels={labels:<14} "
                f"traffic={version['traffic_share'] * 100:.0f}%{error}"
            )
    return "\n".join(lines) if lines else "(no models)"


def serve(
    repository: str | os.PathLike[str] = DEFAULT_REPOSITORY,
    *,
    name: str = "default",
    rest_port: int | None = None,
    grpc_port: int | None = None,
    batching: bool = False,
    batching_parameters: str | os.PathLike[str] | None = None,
    timeout: float = 180.0,
) -> ServerHandle:
    """Start a model server on ``repository`` (every sub-folder is a model) and return its handle.

    Ports are free picks unless given; ``batching=True`` turns dynamic batching on with TF Serving's defaults,
    ``batching_parameters`` names a BatchingParameters text file. The server stops with the kernel.
    """
    handle = ServerHandle(
        repository,
        name=name,
        rest_port=rest_port,
        grpc_port=grpc_port,
        batching=batching,
        batching_parameters=batching_parameters,
    ).start(timeout)
    if handle.proxy_url:  # behind a hub, the browser reaches the REST API only through the Jupyter server
        print(f"workbench server {name!r}: REST API in the browser at {handle.proxy_url}")
    return handle


def running_servers() -> list[ServerHandle]:
    with _handles_lock:
        return list(_handles)


@atexit.register
def _stop_all() -> None:  # kernel shutdown and restart end the kernel process: take the servers along
    for handle in running_servers():
        with contextlib.suppress(Exception):  # best effort at interpreter exit
            handle.stop(timeout=10)
