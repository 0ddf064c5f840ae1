"""The dashboard's "v1 vs v2" panel: how each model's shadow compares with the version that answers, as it goes.

Fed by the server's stats snapshot (its ``"shadow"`` records, :mod:`workbench.planes.shadowing`) every second: the
agreement of each shadowed model over time, the distribution of the latest copies' differences, and, in words, the
figures a promotion's condition is checked against and the slowest inputs the shadow answered.
"""

from __future__ import annotations

import collections
import html
import threading
import time
from typing import Any

import ipywidgets as widgets

from workbench.notebook.dashboard_part import PALETTE, Server, StatsPanel
from workbench.notebook.live_figure import LiveFigure

POINTS = 300  # agreement readings kept a model (5 minutes at one a second)
NO_SHADOW = "<i>No model has a shadow: <code>%serve shadow MODEL VERSION</code> starts one.</i>"


class ShadowPanel(StatsPanel):
    """Agreement over time, the differences' distribution, and the slowest inputs, per shadowed model."""

    RECORDS = "shadow"

    def __init__(self, server: Server, interval: float = 1.0) -> None:
        super().__init__(server, interval)
        from plotly.subplots import make_subplots

        self._agreement: dict[str, collections.deque[tuple[float, float]]] = {}
        self._lock = threading.Lock()
        figure = make_subplots(
            rows=1, cols=2, subplot_titles=["agreement with the answering version", "|difference| of recent copies"]
        )
        figure.update_layout(height=320, margin={"l": 50, "r": 20, "t": 40, "b": 30}, legend={"orientation": "h"})
        figure.update_yaxes(range=[0, 1.02], row=1, col=1)
        self._live = LiveFigure(figure)
        self.details = widgets.HTML(
            "<i>No model has a shadow: <code>%serve shadow MODEL VERSION</code> starts one.</i>"
        )
        self.widget = widgets.VBox([self._live.widget, self.details])
        self._start(server)

    def _received(self, records: dict[str, dict[str, Any]]) -> None:
        """Each reading of the agreement joins its series as it arrives: drawn later if the kernel is busy."""
        now = time.time()
        with self._lock:
            for model, record in records.items():
                if record.get("agreement") is not None:
                    self._agreement.setdefault(model, collections.deque(maxlen=POINTS)).append(
                        (now, record["agreement"])
                    )

    def _draw(self, records: dict[str, dict[str, Any]]) -> None:
        with self._lock:
            agreement = {model: list(series) for model, series in self._agreement.items()}
        traces = []
        import plotly.graph_objects as go

        for index, model in enumerate(sorted(records)):
            color = PALETTE[index % len(PALETTE)]
            series = agreement.get(model, [])
            name = f"{model}: v{records[model].get('version')} vs v{records[model].get('primary_version')}"
            traces.append(
                go.Scatter(
                    x=[time.strftime("%H:%M:%S", time.localtime(t)) for t, _ in series],
                    y=[value for _, value in series],
                    mode="lines",
                    name=name,
                    line={"color": color},
                    xaxis="x",
                    yaxis="y",
                )
            )
            diffs = records[model].get("recent_abs_diffs") or []
            traces.append(
                go.Histogram(x=diffs, name=f"{model} |diff|", marker={"color": color}, xaxis="x2", yaxis="y2")
            )
        floats = any(record.get("recent_abs_diffs") for record in records.values())
        with self.figure.batch_update():
            self.figure.data = ()
            for trace in traces:
                self.figure.add_trace(trace)
            self.figure.layout.annotations = self.figure.layout.annotations[:2]  # the two subplot titles
            if records and not floats:  # class outputs only: they agree or not, there is no difference to draw
                self.figure.add_annotation(
                    text="no float outputs:<br>classes are compared by agreement",
                    xref="x2 domain", yref="y2 domain", x=0.5, y=0.5, showarrow=False,
                )  # fmt: skip
        self._live.drawn()
        self.details.value = _details(records) if records else NO_SHADOW
        self.records = records  # last: what the panel shows, figure and words


def _details(records: dict[str, dict[str, Any]]) -> str:
    parts = []
    for model, record in sorted(records.items()):
        agreement = record.get("agreement")
        figures = (
            f"agreement <b>{agreement:.2%}</b>" if agreement is not None else "no classification output",
            f"{record.get('compared', 0)} compared, {record.get('failed', 0)} failed, "
            f"{record.get('dropped', 0)} dropped",
            f"p99 {record.get('p99_ms')} ms against {record.get('primary_p99_ms')} ms",
        )
        outputs = "".join(
            f"<tr><td>{html.escape(name)}</td><td>{_shown(o.get('agreement'))}</td><td>{_shown(o.get('mean_abs_diff'))}</td>"
            f"<td>{_shown(o.get('max_abs_diff'))}</td></tr>"
            for name, o in record.get("outputs", {}).items()
        )
        slowest = "".join(
            f"<li>{slow['ms']} ms: <code>{html.escape(slow['inputs'])}</code></li>"
            for slow in record.get("slowest", [])
        )
        parts.append(
            f"<h4>{html.escape(model)}: v{record.get('version')} (shadow) vs v{record.get('primary_version')}</h4>"
            f"<p>{' · '.join(figures)}</p>"
            "<table><tr><th>output</th><th>agreement</th><th>mean |diff|</th><th>max |diff|</th></tr>"
            f"{outputs}</table><p>slowest inputs on the shadow:</p><ul>{slowest}</ul>"
        )
    return "".join(parts)


def _shown(value: Any) -> str:
    if value is None:
        return "–"
    return f"{value:.4g}" if isinstance(value, float) else html.escape(str(value))
