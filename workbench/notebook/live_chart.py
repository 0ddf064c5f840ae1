"""The live chart: latency percentiles and throughput per version, fed by the server's stats stream; a text
generator's time to first token and tokens per second beside them."""

from __future__ import annotations

import collections
import json
import threading
import time
from typing import Any

import requests

from workbench.client import Client
from workbench.core.errors import ServingError
from workbench.notebook.dashboard_part import (
    PALETTE,
    Newest,
    Part,
    Server,
    client_of,
    on_kernel_thread,
    register,
)
from workbench.notebook.live_figure import LiveFigure


def _has_response_cache(client: Client) -> bool:
    """Whether the server has Triton's response cache on (its health answer describes it only then). A server
    without workbench's health endpoint (TF Serving) or out of reach gets the chart without the cache row."""
    try:
        health = client.health()
    except (ServingError, requests.RequestException):
        return False
    return isinstance(health, dict) and "response_cache" in health


def _generated(snapshot: dict[str, Any]) -> bool:
    """Whether a stats snapshot has a version that generated text (its entry has the generation fields)."""
    return any("tokens_per_second" in entry for versions in snapshot["models"].values() for entry in versions.values())


def _has_generated(client: Client) -> bool:
    """Whether the server's stats already show a version that generated text."""
    try:
        return _generated(client.stats())
    except (ServingError, requests.RequestException, KeyError, TypeError):
        return False


class LiveChart(Part):
    """p50/p95/p99 latency, requests/s and mean batch size over time, one colour per model version; when the
    server has the response cache on, each version's cache hit rate since the start; once a version has generated
    text, each version's time to first token (p50, p95) and tokens per second; and, in its title, the asynchronous
    queue's requests waiting, once the server has one.

    The generation rows are there from the start when the server's stats already show a version that generated;
    else the first snapshot that shows one adds them: the figure is built anew with them, once, in its place (its
    history kept), so a chart opened before the first chat gets them with that chat.

    Fed by the server's stats stream a few times a second; keeps the last ``window_seconds``; redraws at most
    every ``min_redraw_seconds`` in one ``batch_update``. It keeps updating while the kernel is idle or a cell
    awaits; a cell that keeps the kernel's thread busy (a long computation, a blocking ``%serve bench``) holds
    the redraws until it ends, as it holds the frontend's clicks, and the chart then catches up at once.
    """

    def __init__(
        self, server: Server, window_seconds: float = 60.0, interval: float = 0.25, min_redraw_seconds: float = 0.5
    ) -> None:
        super().__init__()
        self.client = client_of(server)
        self.url = self.client.url
        self.interval, self.min_redraw = interval, min_redraw_seconds
        points = max(2, int(window_seconds / interval))
        self._series: dict[tuple[str, str], dict[str, collections.deque[Any]]] = {}
        self._points = points
        self._lock = threading.Lock()
        self._dirty = False
        self.snapshots = 0
        #: The server's asynchronous queue, as its last snapshot said: (requests waiting, oldest's age), or None.
        self.async_queue: tuple[int, float] | None = None
        #: Whether the figure has the cache row: asked once, as the server's cache is set when it starts.
        self.cache_row = _has_response_cache(self.client)
        #: Whether the figure has the generation rows (time to first token, tokens/s); see the class's docstring.
        self.generation_rows = _has_generated(self.client)
        self._generation_seen = self.generation_rows  # a snapshot showed a generation: the rows are wanted
        self._live = LiveFigure(self._build_figure())  # whole, so a browser slow to load plotly.js still draws it
        self._traces: dict[tuple[str, str], dict[str, int]] = {}
        self._colours: dict[tuple[str, str], str] = {}  # kept when the figure is built anew
        self._redraws: Newest[None] = Newest(lambda _: self._draw())
        self.widget = self._live.widget
        register(server, self)
        self._spawn(self._read_stream, "chart-stream")
        self._spawn(self._redraw_loop, "chart-draw")

    def _rows(self) -> list[tuple[str, str, int, str, bool]]:
        """Each trace of a version: (series, row's title, row, dash, in the legend)."""
        latency, throughput = "latency (ms): p50 ─  p95 ┄  p99 ·", "requests / s"
        rows = [
            ("p50", latency, 1, "solid", True),
            ("p95", latency, 1, "dash", False),
            ("p99", latency, 1, "dot", False),
            ("rps", throughput, 2, "solid", False),
            ("batch", "mean batch size", 3, "solid", False),
        ]
        if self.cache_row:
            rows.append(("cache", "response cache hit rate (%)", 4, "solid", False))
        if self.generation_rows:
            first_token, row = "time to first token (ms): p50 ─  p95 ┄", rows[-1][2] + 1
            rows += [
                ("ttft50", first_token, row, "solid", False),
                ("ttft95", first_token, row, "dash", False),
                ("tps", "tokens / s", row + 1, "solid", False),
            ]
        return rows

    def _build_figure(self) -> Any:
        from plotly.subplots import make_subplots

        titles = list(dict.fromkeys(title for _, title, _, _, _ in self._rows()))
        figure = make_subplots(
            rows=len(titles), cols=1, shared_xaxes=True, vertical_spacing=0.06, subplot_titles=titles
        )
        figure.update_layout(
            height=520 + 160 * (len(titles) - 3),  # a row more, not the same height shared by more rows
            margin={"l": 50, "r": 20, "t": 40, "b": 30},
            legend={"orientation": "h"},
        )
        if self.cache_row:
            figure.update_yaxes(range=[0, 100], row=4, col=1)  # a share: a fixed scale reads at a glance
        return figure

    @property
    def figure(self) -> Any:
        """The chart's plotly ``FigureWidget`` (read it anew: one the browser stopped drawing is replaced)."""
        return self._live.figure

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)

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
        queue = snapshot.get("async")
        with self._lock:
            self.snapshots += 1
            if queue is not None:
                self.async_queue = (int(queue["waiting"]), float(queue["oldest_seconds"]))
            for model, versions in snapshot["models"].items():
                for version, entry in versions.items():
                    if not version:  # requests that never reached a version (unknown model): not a series
                        continue
                    series = self._series.get((model, version))
                    if series is None:
                        series = self._series[(model, version)] = {
                            k: collections.deque(maxlen=self._points)
                            for k in ("t", "p50", "p95", "p99", "rps", "batch", "cache", "ttft50", "ttft95", "tps")
                        }
                    series["t"].append(stamp * 1000)
                    series["p50"].append(entry["p50_ms"])
                    series["p95"].append(entry["p95_ms"])
                    series["p99"].append(entry["p99_ms"])
                    series["rps"].append(entry["requests_per_second"])
                    series["batch"].append(entry["mean_batch_size"])
                    rate = entry.get("cache_hit_rate")  # only for a version with the cache on, once looked up
                    series["cache"].append(None if rate is None else round(rate * 100, 2))
                    # Only for a version that has generated: others get no points on those rows.
                    series["ttft50"].append(entry.get("time_to_first_token_p50_ms"))
                    series["ttft95"].append(entry.get("time_to_first_token_p95_ms"))
                    series["tps"].append(entry.get("tokens_per_second"))
                    self._generation_seen = self._generation_seen or "tokens_per_second" in entry
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
            queue = self.async_queue
            add_generation_rows = self._generation_seen and not self.generation_rows
        if add_generation_rows:  # the first generation: the figure built anew with its rows, drawn whole below
            self.generation_rows = True
            self._traces = {}
            self._live.replace(self._build_figure())
        with self.figure.batch_update():
            if queue is not None:
                waiting, oldest = queue
                title = f"asynchronous queue: {waiting} waiting" + (f", oldest {oldest:.1f} s" if waiting else "")
                self.figure.layout.title = {"text": title, "font": {"size": 13}}
            for key, series in sorted(data.items()):
                traces = self._traces.get(key) or self._add_traces(key)
                x = [time.strftime("%H:%M:%S", time.localtime(t / 1000)) for t in series["t"]]
                for name, index in traces.items():
                    self.figure.data[index].x = x
                    self.figure.data[index].y = series[name]
        self._live.drawn()

    def _add_traces(self, key: tuple[str, str]) -> dict[str, int]:
        colour = self._colours.setdefault(key, PALETTE[len(self._colours) % len(PALETTE)])
        label = f"{key[0]} v{key[1]}"
        traces = {}
        for name, _, row, dash, legend in self._rows():
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
