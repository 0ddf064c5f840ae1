"""The serving dashboard: versions, queries, a live latency chart and a load button, inside the notebook.

Every part works on its own (``VersionsPanel``, ``QueryPanel``, ``LiveChart``, ``LoadPanel``) and
:class:`Dashboard` puts them together. They talk to the server only through its public APIs (the management
and stats endpoints, REST/gRPC predict), so they work for a child server, a remote one, and — read-only parts —
a real TF Serving.

Threads: button callbacks run their (network) work on a worker thread so the kernel never blocks; the chart is
fed by a thread reading the server's server-sent stats stream; panels refresh from a polling thread. Those
threads only fetch and compute: every widget change is made on the kernel's own thread (:func:`on_kernel_thread`
says why). Figure updates are batched (``batch_update``) and rate-limited, and ``close()`` (or stopping the
server's handle) stops every thread a part started.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import html
import itertools
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import ipywidgets as widgets
import numpy as np
import requests

from workbench.client import GRPC_PROTOCOLS, V2_PROTOCOLS, Client
from workbench.core.errors import ServingError
from workbench.core.signatures import Signature

Server = Any  # a ServerHandle, a Client, or a REST base URL

_PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"]
_log = logging.getLogger(__name__)
T = TypeVar("T")


# ------------------------------------------------------------------------------------ the kernel's thread
# ipywidgets are not thread-safe. A trait change runs its observers and sends its update to the frontend on
# whichever thread makes it, while the kernel's main thread applies the frontend's own messages (a slider
# dragged, a button clicked) to the same widgets: two threads interleaving there lose or reorder updates and
# run observers concurrently. So the parts' background threads only fetch and compute, and hand what they got
# to the kernel's IO loop, the one that handles those comm messages; tornado's ``add_callback`` is its
# thread-safe entry. Outside a kernel (a plain Python process, headless tests) there is no such loop and no
# frontend: changes are then made at once on the calling thread, one at a time.
_without_kernel = threading.RLock()


def _kernel_io_loop() -> Any | None:
    """The IO loop of the ipykernel this process runs, or None when it runs none."""
    try:
        from ipykernel.kernelbase import Kernel
    except ImportError:
        return None
    if not Kernel.initialized():
        return None
    return getattr(Kernel.instance(), "io_loop", None)


def on_kernel_thread(change: Callable[[], None]) -> None:
    """Make ``change`` (which sets widget traits) on the kernel's thread: now if this is it, else queued there."""
    loop = _kernel_io_loop()
    if loop is not None and threading.current_thread() is not threading.main_thread():  # ipykernel: main thread
        loop.add_callback(_logged, change)
        return
    with _without_kernel:
        change()


def _logged(change: Callable[[], None]) -> None:
    try:
        change()
    except Exception:  # noqa: BLE001 - a failed redraw must not take the kernel's loop down with it
        _log.exception("updating a workbench widget failed")


class _Newest(Generic[T]):
    """Hands values from a background thread to the kernel's thread; a value not applied yet is replaced by a
    newer one, so a kernel busy with a long cell finds one pending update per part, not a backlog."""

    def __init__(self, apply: Callable[[T], None]) -> None:
        self._apply = apply
        self._lock = threading.Lock()
        self._pending: list[T] = []

    def post(self, value: T) -> None:
        with self._lock:
            queued = bool(self._pending)
            self._pending[:] = [value]
        if not queued:
            on_kernel_thread(self._run)

    def _run(self) -> None:
        with self._lock:
            values, self._pending[:] = list(self._pending), []
        for value in values:
            self._apply(value)


def _client(server: Server) -> Client:
    if isinstance(server, Client):
        return server
    if isinstance(server, str):
        return Client(server)
    return server.client  # a ServerHandle


def _set_options(dropdown: widgets.Dropdown, options: list[Any]) -> None:
    """Replace a dropdown's options, keeping its value if still offered, else the first option."""
    values = [o[1] if isinstance(o, tuple) else o for o in options]
    if list(dropdown.options) == list(options):
        return
    current = dropdown.value
    dropdown.options = options
    if values:
        dropdown.value = current if current in values else values[0]


def _register(server: Server, part: _Part) -> None:
    """Stopping a ServerHandle closes the widgets built on it (their threads would talk to nothing)."""
    register = getattr(server, "on_stop", None)
    if callable(register):
        register(part.close)


class _Part:
    """Background-thread bookkeeping shared by every dashboard part."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def _spawn(self, target: Callable[[], None], name: str) -> threading.Thread:
        thread = threading.Thread(target=target, name=f"workbench-{name}", daemon=True)
        self._threads.append(thread)
        thread.start()
        return thread

    def _run_action(
        self,
        work: Callable[[], Any],
        buttons: list[widgets.Button],
        status: widgets.HTML,
        done: Callable[[Any], None] | None = None,
    ) -> None:
        """Run ``work`` off the kernel's main thread, with the buttons disabled; then show its outcome (``done``
        gets its result) on the kernel's thread."""
        for button in buttons:
            button.disabled = True
        status.value = "<i>working…</i>"

        def finish(result: Any = None, error: Exception | None = None) -> None:
            if error is not None:
                status.value = f'<span style="color:#c00">{html.escape(str(error))}</span>'
            else:
                if done is not None:
                    done(result)
                status.value = '<span style="color:#080">done</span>'
            for button in buttons:
                button.disabled = False

        def run() -> None:
            try:
                result = work()
            except Exception as exc:  # noqa: BLE001 - shown where the button was clicked; a bug is logged too
                if not isinstance(exc, (ServingError, requests.RequestException, ValueError)):
                    _log.exception("a workbench widget action failed")
                on_kernel_thread(functools.partial(finish, error=exc))
            else:
                on_kernel_thread(functools.partial(finish, result))

        self._threads = [t for t in self._threads if t.is_alive()]
        self._spawn(run, "action")

    @property
    def threads(self) -> list[threading.Thread]:
        return [t for t in self._threads if t.is_alive()]

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        for thread in list(self._threads):
            if thread is not threading.current_thread():
                thread.join(timeout)


# ------------------------------------------------------------------------------------------ versions
_Fetched = tuple[int, list[dict[str, Any]] | Exception]  # (fetch number, the models or why not)


class VersionsPanel(_Part):
    """Every model and version with state, labels, traffic share and load errors, and the buttons to change them.

    It shows the server's state, whoever changed it (these buttons, ``%serve``, the sidebar, another client):
    a polling thread fetches it, and when it changed the table, the version list, the routing line and the
    canary slider follow; the slider shows the selected model's canary weight (0% without a canary).
    """

    def __init__(self, server: Server, refresh_seconds: float = 1.0) -> None:
        super().__init__()
        self.client = _client(server)
        self.table = widgets.HTML()
        self.model = widgets.Dropdown(description="model")
        self.version = widgets.Dropdown(description="version")
        self.promote_button = widgets.Button(description="Promote", button_style="success", tooltip="make it stable")
        self.rollback_button = widgets.Button(description="Roll back", tooltip="stable back to the previous version")
        self.unload_button = widgets.Button(description="Unload", button_style="warning")
        self.load_button = widgets.Button(description="Load", tooltip="load beyond the version policy")
        self.canary_weight = widgets.FloatSlider(
            value=0.0, min=0.0, max=1.0, step=0.05, description="canary", readout_format=".0%"
        )
        self.canary_button = widgets.Button(description="Set canary", tooltip="send this share to the version")
        self.routing = widgets.HTML()
        self.status = widgets.HTML()
        self.buttons = [
            self.promote_button,
            self.rollback_button,
            self.unload_button,
            self.load_button,
            self.canary_button,
        ]
        # Touched on the kernel's thread only (see on_kernel_thread): no lock.
        self._models: list[dict[str, Any]] = []
        self._fingerprint = ""
        self._routing_shown: str | None = None
        self._shown = -1  # the newest fetch shown: one that started earlier and answered later is stale
        self._fetches = itertools.count()
        self._fetched: _Newest[_Fetched] = _Newest(self._show)
        self.promote_button.on_click(lambda _: self._act(lambda c, m, v, w: c.promote(m, v)))
        self.rollback_button.on_click(lambda _: self._act(lambda c, m, v, w: c.rollback(m), needs_version=False))
        self.unload_button.on_click(lambda _: self._act(lambda c, m, v, w: c.unload(m, v)))
        self.load_button.on_click(lambda _: self._act(lambda c, m, v, w: c.load(m, v)))
        self.canary_button.on_click(lambda _: self._act(lambda c, m, v, w: c.canary(m, v, w)))
        self.model.observe(lambda _: self._fill_versions(), names="value")
        self.widget = widgets.VBox([
            self.table,
            widgets.HBox([self.model, self.version]),
            widgets.HBox([self.promote_button, self.rollback_button, self.load_button, self.unload_button]),
            widgets.HBox([self.canary_weight, self.canary_button, self.routing]),
            self.status,
        ])  # fmt: skip
        self.refresh()
        _register(server, self)
        self._spawn(lambda: self._poll(refresh_seconds), "versions")

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)

    def refresh(self) -> None:
        """Fetch the models and redraw if anything changed (a new export appears without a click)."""
        self._fetched.post(self._fetch())

    def _fetch(self) -> _Fetched:
        number = next(self._fetches)
        try:
            return number, self.client.models()
        except (ServingError, requests.RequestException) as exc:
            return number, exc

    def _poll(self, seconds: float) -> None:
        while not self._stop.wait(seconds):
            self._fetched.post(self._fetch())

    def _show(self, fetched: _Fetched) -> None:
        number, models = fetched
        if number < self._shown:
            return
        self._shown = number
        if isinstance(models, Exception):
            self.status.value = f'<span style="color:#c00">{html.escape(str(models))}</span>'
            return
        fingerprint = json.dumps(models, sort_keys=True)
        if fingerprint == self._fingerprint:
            return
        self._fingerprint, self._models = fingerprint, models
        from workbench.notebook.handle import models_table_html

        self.table.value = models_table_html(models)
        _set_options(self.model, [m["name"] for m in models])
        self._fill_versions()

    def _fill_versions(self) -> None:
        model = next((m for m in self._models if m["name"] == self.model.value), None)
        _set_options(self.version, [v["version"] for v in model["versions"]] if model else [])
        self._follow_routing(model)

    def _follow_routing(self, model: dict[str, Any] | None) -> None:
        """When the selected model's routing changed on the server (or another model was picked), show it: the
        slider moves to the canary's weight and the version list to the canary; a slider the user moved since
        stays where it is until the routing changes again."""
        routing = json.dumps([model["name"], model["stable"], model["canary"]] if model else None)
        if routing == self._routing_shown:
            return
        self._routing_shown = routing
        canary = model["canary"] if model else None
        self.canary_weight.value = canary["weight"] if canary else 0.0
        if canary and canary["version"] in self.version.options:
            self.version.value = canary["version"]
        self.routing.value = routing_summary(model) if model else ""

    def _act(self, action: Callable[[Client, str, int, float], Any], needs_version: bool = True) -> None:
        # On the kernel's thread (a click): read the widgets here; act, and fetch the outcome, on a worker.
        model, version, weight = self.model.value, self.version.value, self.canary_weight.value
        if model is None or (needs_version and version is None):
            self.status.value = '<span style="color:#c00">pick a model and a version first</span>'
            return

        def work() -> _Fetched:
            action(self.client, model, version, weight)
            return self._fetch()

        # The new state is shown before "done" is, so the next click starts from it.
        self._run_action(work, self.buttons, self.status, done=self._show)


def routing_summary(model: dict[str, Any]) -> str:
    """Where the model's default traffic goes, as one line: ``stable v1 · canary v2 at 30%``."""
    parts = [f"stable v{model['stable']}" if model["stable"] is not None else "no stable version: the newest serves"]
    canary = model["canary"]
    if canary:
        parts.append(f"canary v{canary['version']} at {canary['weight'] * 100:.0f}%")
    return f"<small>{html.escape(' · '.join(parts))}</small>"


# --------------------------------------------------------------------------------------------- query
# The protocols the query and load panels offer, as their buttons name them: TF Serving's, then the Open
# Inference Protocol's (v2), each over REST and gRPC.
PROTOCOL_CHOICES = [("REST", "rest"), ("gRPC", "grpc"), ("v2 REST", "v2-rest"), ("v2 gRPC", "v2-grpc")]
_PROTOCOL_LABELS = {value: label for label, value in PROTOCOL_CHOICES}


def example_inputs(signature: Signature) -> dict[str, Any]:
    """A valid request for a signature: zeros (or empty strings) with unknown dimensions set to 1."""
    spec = signature
    example: dict[str, Any] = {}
    for alias, tensor in spec.inputs.items():
        shape = tuple(max(d, 1) for d in (tensor.shape if tensor.shape is not None else (1,)))
        if tensor.dtype.kind == "O":
            example[alias] = np.full(shape, "", dtype=object).tolist()
        else:
            example[alias] = np.zeros(shape, dtype=tensor.dtype).tolist()
    return example


class QueryPanel(_Part):
    """Pick a model, a version or label and a signature; edit the prefilled input; send over REST or gRPC, with
    TF Serving's API or v2's (which runs a model's ``serving_default`` signature)."""

    def __init__(self, server: Server) -> None:
        super().__init__()
        self.client = _client(server)
        self.model = widgets.Dropdown(description="model")
        self.target = widgets.Dropdown(description="version")
        self.signature = widgets.Dropdown(description="signature")
        self.protocol = widgets.ToggleButtons(options=PROTOCOL_CHOICES, value="rest")
        self.inputs = widgets.Textarea(layout=widgets.Layout(width="100%", height="80px"))
        self.send = widgets.Button(description="Send", button_style="primary")
        self.response = widgets.HTML()
        self.status = widgets.HTML()
        self.last: Any = None
        self.model.observe(lambda _: self._fill_targets(), names="value")
        self.target.observe(lambda _: self._fill_signatures(), names="value")
        self.protocol.observe(self._protocol_changed, names="value")
        self.signature.observe(lambda _: self._prefill(), names="value")
        self.send.on_click(lambda _: self._send())
        self.widget = widgets.VBox([
            widgets.HBox([self.model, self.target, self.signature]),
            self.inputs,
            widgets.HBox([self.protocol, self.send, self.status]),
            self.response,
        ])  # fmt: skip
        self.refresh()
        _register(server, self)

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)

    def refresh(self) -> None:
        try:
            self._models = self.client.models()
        except (ServingError, requests.RequestException) as exc:
            self.status.value = html.escape(str(exc))
            return
        _set_options(self.model, [m["name"] for m in self._models])
        self._fill_targets()

    def _fill_targets(self) -> None:
        model = next((m for m in self._models if m["name"] == self.model.value), None)
        options: list[tuple[str, Any]] = [("default", None)]
        if model:
            options += [(f"label {label}", ("label", label)) for label in sorted(model["labels"])]
            options += [
                (f"v{v['version']}", ("version", v["version"])) for v in model["versions"] if v["state"] == "AVAILABLE"
            ]
        _set_options(self.target, options)
        self._fill_signatures()

    def _where(self) -> dict[str, Any]:
        target = self.target.value
        if target is None:
            return {}
        return {target[0]: target[1]}

    def _protocol_changed(self, change: dict[str, Any]) -> None:
        # Between TF Serving's API and v2 the signatures change (v2 has serving_default only); within one, not.
        if (change["old"] in V2_PROTOCOLS) != (change["new"] in V2_PROTOCOLS):
            self._fill_signatures()

    def _fill_signatures(self) -> None:
        if self.model.value is None:
            self.signature.options = []
            return
        try:
            # TF Serving's signatures read alike over REST and gRPC; v2 lists one (serving_default).
            protocol = self.protocol.value if self.protocol.value in V2_PROTOCOLS else None
            signatures = self.client.signatures(self.model.value, protocol=protocol, **self._where())
        except (ServingError, requests.RequestException) as exc:
            self.status.value = html.escape(str(exc))
            return
        self._signatures = signatures
        names = sorted(k for k in signatures if not k.startswith("__"))
        _set_options(self.signature, names)
        if "serving_default" in names:
            self.signature.value = "serving_default"
        self._prefill()

    def _prefill(self) -> None:
        name = self.signature.value
        if name is None:
            return
        self.inputs.value = json.dumps(example_inputs(self._signatures[name]))

    def _send(self) -> None:
        try:
            inputs = json.loads(self.inputs.value)
        except ValueError as exc:
            self.status.value = f'<span style="color:#c00">input is not JSON: {html.escape(str(exc))}</span>'
            return
        model, signature, protocol, where = self.model.value, self.signature.value, self.protocol.value, self._where()

        def work() -> Any:
            return self.client.predict(model, inputs, signature_name=signature or "", protocol=protocol, **where)

        def show(prediction: Any) -> None:
            body = "\n".join(f"{k}: {np.array2string(v, threshold=50)}" for k, v in sorted(prediction.items()))
            self.response.value = (
                f"<pre>{html.escape(body)}</pre><small>{_PROTOCOL_LABELS[protocol]} · "
                f"version {prediction.version if prediction.version is not None else '?'} · "
                f"{prediction.latency_ms:.2f} ms</small>"
            )
            self.last = prediction  # last: whoever waits on it finds the response already shown

        self._run_action(work, [self.send], self.status, done=show)


# --------------------------------------------------------------------------------------------- chart
class LiveChart(_Part):
    """p50/p95/p99 latency, requests/s and mean batch size over time, one colour per model version; and, when the
    server has the response cache on, each version's cache hit rate since the start.

    Fed by the server's stats stream a few times a second; keeps the last ``window_seconds``; redraws at most
    every ``min_redraw_seconds`` in one ``batch_update``. It keeps updating while the kernel is idle or a cell
    awaits; a cell that keeps the kernel's thread busy (a long computation, a blocking ``%serve bench``) holds
    the redraws until it ends, as it holds the frontend's clicks, and the chart then catches up at once.
    """

    def __init__(
        self, server: Server, window_seconds: float = 60.0, interval: float = 0.25, min_redraw_seconds: float = 0.5
    ) -> None:
        super().__init__()
        from plotly.subplots import make_subplots

        self.client = _client(server)
        self.url = self.client.url
        self.interval, self.min_redraw = interval, min_redraw_seconds
        points = max(2, int(window_seconds / interval))
        self._series: dict[tuple[str, str], dict[str, collections.deque[Any]]] = {}
        self._points = points
        self._lock = threading.Lock()
        self._dirty = False
        self.snapshots = 0
        #: Whether the figure has the cache row: asked once, as the server's cache is set when it starts.
        self.cache_row = _has_response_cache(self.client)
        titles = ["latency (ms): p50 ─  p95 ┄  p99 ·", "requests / s", "mean batch size"]
        if self.cache_row:
            titles.append("response cache hit rate (%)")
        figure = make_subplots(
            rows=len(titles), cols=1, shared_xaxes=True, vertical_spacing=0.06, subplot_titles=titles
        )
        import plotly.graph_objects as go

        self.figure = go.FigureWidget(figure)
        self.figure.update_layout(
            height=520 + 160 * (len(titles) - 3),  # a row more, not the same height shared by more rows
            margin={"l": 50, "r": 20, "t": 40, "b": 30},
            legend={"orientation": "h"},
        )
        if self.cache_row:
            self.figure.update_yaxes(range=[0, 100], row=4, col=1)  # a share: a fixed scale reads at a glance
        self._traces: dict[tuple[str, str], dict[str, int]] = {}
        self._redraws: _Newest[None] = _Newest(lambda _: self._draw())
        self.widget = self.figure
        _register(server, self)
        self._spawn(self._read_stream, "chart-stream")
        self._spawn(self._redraw_loop, "chart-draw")

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.figure)

    def _read_stream(self) -> None:
        """Follow the server-sent events; reconnect if the stream drops, until closed."""
        while not self._stop.is_set():
            try:
                with self.client.open_stream(  # the client's TLS settings: an https server is checked as it is
                    "/workbench/v1/stats/stream", params={"interval": self.interval}, timeout=(5, 30)
                ) as response:
                    for line in response.iter_lines():
                        if self._stop.is_set():
                            return
                        if line.startswith(b"data: "):
                            self._add(json.loads(line[6:]))
            except (requests.RequestException, ValueError):
                pass
            self._stop.wait(1.0)

    def _add(self, snapshot: dict[str, Any]) -> None:
        stamp = snapshot["time"]
        with self._lock:
            self.snapshots += 1
            for model, versions in snapshot["models"].items():
                for version, entry in versions.items():
                    if not version:  # requests that never reached a version (unknown model): not a series
                        continue
                    series = self._series.get((model, version))
                    if series is None:
                        series = self._series[(model, version)] = {
                            k: collections.deque(maxlen=self._points)
                            for k in ("t", "p50", "p95", "p99", "rps", "batch", "cache")
                        }
                    series["t"].append(stamp * 1000)
                    series["p50"].append(entry["p50_ms"])
                    series["p95"].append(entry["p95_ms"])
                    series["p99"].append(entry["p99_ms"])
                    series["rps"].append(entry["requests_per_second"])
                    series["batch"].append(entry["mean_batch_size"])
                    rate = entry.get("cache_hit_rate")  # only for a version with the cache on, once looked up
                    series["cache"].append(None if rate is None else round(rate * 100, 2))
            self._dirty = True

    def _redraw_loop(self) -> None:
        while not self._stop.wait(self.min_redraw):
            with self._lock:
                dirty = self._dirty
            if dirty:
                self._redraws.post(None)

    def redraw(self) -> None:
        """Draw the snapshots received since the last redraw (on the kernel's thread: it changes the figure)."""
        on_kernel_thread(self._draw)

    def _draw(self) -> None:
        with self._lock:
            if not self._dirty:
                return
            self._dirty = False
            data = {key: {k: list(v) for k, v in series.items()} for key, series in self._series.items()}
        with self.figure.batch_update():
            for key, series in sorted(data.items()):
                traces = self._traces.get(key) or self._add_traces(key)
                x = [time.strftime("%H:%M:%S", time.localtime(t / 1000)) for t in series["t"]]
                for name, index in traces.items():
                    self.figure.data[index].x = x
                    self.figure.data[index].y = series[name]

    def _add_traces(self, key: tuple[str, str]) -> dict[str, int]:
        colour = _PALETTE[len(self._traces) % len(_PALETTE)]
        label = f"{key[0]} v{key[1]}"
        traces = {}
        rows = [
            ("p50", 1, "solid", True),
            ("p95", 1, "dash", False),
            ("p99", 1, "dot", False),
            ("rps", 2, "solid", False),
            ("batch", 3, "solid", False),
        ]
        if self.cache_row:
            rows.append(("cache", 4, "solid", False))
        for name, row, dash, legend in rows:
            self.figure.add_scatter(
                x=[],
                y=[],
                mode="lines",
                name=label,
                legendgroup=label,
                showlegend=legend,
                line={"color": colour, "dash": dash},
                row=row,
                col=1,
            )
            traces[name] = len(self.figure.data) - 1
        self._traces[key] = traces
        return traces

    def points(self, model: str, version: int | str) -> int:
        """How many snapshots the chart holds for a model version."""
        with self._lock:
            series = self._series.get((model, str(version)))
            return len(series["t"]) if series else 0


def _has_response_cache(client: Client) -> bool:
    """Whether the server has Triton's response cache on (its health answer describes it only then). A server
    without workbench's health endpoint (TF Serving) or out of reach gets the chart without the cache row."""
    try:
        health = client.health()
    except (ServingError, requests.RequestException):
        return False
    return isinstance(health, dict) and "response_cache" in health


# ---------------------------------------------------------------------------------------------- load
class LoadPanel(_Part):
    """Send N clients for T seconds through the benchmark generator, with a progress bar and a result table."""

    def __init__(self, server: Server) -> None:
        super().__init__()
        self.client = _client(server)
        self.model = widgets.Dropdown(description="model")
        self.clients = widgets.IntSlider(value=16, min=1, max=128, description="clients")
        self.seconds = widgets.FloatSlider(value=10, min=1, max=120, step=1, description="seconds")
        self.protocol = widgets.ToggleButtons(options=PROTOCOL_CHOICES, value="grpc")
        self.start = widgets.Button(description="Send load", button_style="danger")
        self.progress = widgets.FloatProgress(value=0, min=0, max=1, description="")
        self.result = widgets.HTML()
        self.status = widgets.HTML()
        self.last: Any = None
        self._progress: _Newest[float] = _Newest(lambda fraction: setattr(self.progress, "value", fraction))
        self.start.on_click(lambda _: self._go())
        self.widget = widgets.VBox([
            widgets.HBox([self.model, self.protocol]),
            widgets.HBox([self.clients, self.seconds, self.start]),
            widgets.HBox([self.progress, self.status]),
            self.result,
        ])  # fmt: skip
        with contextlib.suppress(ServingError, requests.RequestException):
            _set_options(self.model, [m["name"] for m in self.client.models()])
        _register(server, self)

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)

    def _go(self) -> None:
        from workbench.client.bench import format_table, run_load

        model, clients, seconds, protocol = (
            self.model.value,
            self.clients.value,
            self.seconds.value,
            self.protocol.value,
        )
        if model is None:
            self.status.value = '<span style="color:#c00">no model to load</span>'
            return
        target = self.client.grpc_target if protocol in GRPC_PROTOCOLS else self.client.url
        if target is None:
            missing = "gRPC target" if protocol in GRPC_PROTOCOLS else "REST url"
            self.status.value = f'<span style="color:#c00">this client has no {missing}</span>'
            return

        def work() -> Any:
            signature = self.client.signature(model)
            feeds = self.client.encode_inputs(signature, example_inputs(signature))
            started = time.perf_counter()
            done = threading.Event()

            def tick() -> None:
                while not done.wait(0.2):
                    self._progress.post(min(1.0, (time.perf_counter() - started) / seconds))

            ticker = threading.Thread(target=tick, daemon=True)
            ticker.start()
            try:
                return run_load(
                    target, protocol, model, feeds, concurrency=clients, duration=seconds, tls=self.client.tls
                )
            finally:
                done.set()
                ticker.join()

        def show(result: Any) -> None:
            self.progress.value = 1.0
            self.result.value = f"<pre>{html.escape(format_table([result.summary()], list(result.summary())))}</pre>"
            self.last = result  # last: whoever waits on it finds the table already shown

        self.progress.value = 0.0
        self._run_action(work, [self.start], self.status, done=show)


# ----------------------------------------------------------------------------------------- dashboard
class Dashboard(_Part):
    """All the parts together: versions and query side by side, the live chart, and the load button."""

    def __init__(self, server: Server, window_seconds: float = 60.0) -> None:
        super().__init__()
        self.versions = VersionsPanel(server)
        self.query = QueryPanel(server)
        self.chart = LiveChart(server, window_seconds=window_seconds)
        self.load = LoadPanel(server)
        self.parts: list[_Part] = [self.versions, self.query, self.chart, self.load]
        tabs = widgets.Tab(children=[self.versions.widget, self.query.widget, self.load.widget])
        for index, title in enumerate(("Versions", "Query", "Load")):
            tabs.set_title(index, title)
        self.widget = widgets.VBox([tabs, self.chart.widget])
        _register(server, self)

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)

    @property
    def threads(self) -> list[threading.Thread]:
        return [t for part in self.parts for t in part.threads]

    def close(self, timeout: float = 5.0) -> None:
        for part in self.parts:
            part.close(timeout)
