"""The dashboard's "Drift" panel: each monitored model version's features against their reference, as traffic comes.

Fed by the server's stats snapshot (its ``"drift"`` records, :mod:`workbench.observability.drift_monitor`) every
second: a bar per feature of its population stability index (red once the feature drifts, with the PSI threshold
drawn across), and a table of each feature's test and p-value. What it shows is what ``GET
/workbench/v1/models/{model}/drift`` answers and the ``workbench_drift_*`` gauges hold.
"""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as widgets

from workbench.notebook.dashboard_part import Server, StatsPanel
from workbench.notebook.live_figure import LiveFigure

NO_DRIFT = (
    "<i>No model version is monitored for drift: export one with <code>reference=X_train</code>, or serve with "
    "<code>--drift_reference_rows=N</code> to compare with its first N rows.</i>"
)
STEADY, DRIFTED = "#4C78A8", "#E45756"
PSI_THRESHOLD = 0.2  # the line drawn; the server's own thresholds decide the colours


class DriftPanel(StatsPanel):
    """PSI per feature (bars) and every feature's test, per monitored model version."""

    RECORDS = "drift"

    def __init__(self, server: Server, interval: float = 1.0) -> None:
        super().__init__(server, interval)
        layout = {
            "height": 300,
            "margin": {"l": 50, "r": 20, "t": 40, "b": 60},
            "title": {"text": "population stability index per feature", "font": {"size": 13}},
            "yaxis": {"title": "PSI", "rangemode": "tozero"},
            "showlegend": False,
            # The usual "significant shift" PSI, across the chart.
            "shapes": [
                {
                    "type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": "y", "y0": PSI_THRESHOLD,
                    "y1": PSI_THRESHOLD, "line": {"dash": "dot", "color": "#888"},
                }
            ],
        }  # fmt: skip
        self._live = LiveFigure({"layout": layout})
        self.details = widgets.HTML(NO_DRIFT)
        self.widget = widgets.VBox([self._live.widget, self.details])
        self._start(server)

    def _draw(self, records: dict[str, dict[str, Any]]) -> None:
        import plotly.graph_objects as go

        names, values, colours = [], [], []
        for model, versions in sorted(records.items()):
            for version, record in sorted(versions.items(), key=lambda item: int(item[0])):
                for feature, figures in record.get("features", {}).items():
                    names.append(f"{model} v{version} {feature}")
                    values.append(figures.get("psi", 0.0))
                    colours.append(DRIFTED if figures.get("drifted") else STEADY)
        with self.figure.batch_update():
            self.figure.data = ()
            if names:
                self.figure.add_trace(go.Bar(x=names, y=values, marker={"color": colours}))
        self._live.drawn()
        self.details.value = _details(records) if records else NO_DRIFT
        self.records = records  # last: what the panel shows, figure and words


def _details(records: dict[str, dict[str, Any]]) -> str:
    parts = []
    for model, versions in sorted(records.items()):
        for version, record in sorted(versions.items(), key=lambda item: int(item[0])):
            state = "<b style='color:#E45756'>drift</b>" if record.get("alert") else "steady"
            rows = "".join(
                f"<tr><td>{html.escape(name)}</td><td>{f.get('psi', 0.0):.3f}</td><td>{html.escape(str(f.get('test')))}"
                f"</td><td>{f.get('p_value', 1.0):.3g}</td><td>{'yes' if f.get('drifted') else ''}</td></tr>"
                for name, f in record.get("features", {}).items()
            )
            parts.append(
                f"<h4>{html.escape(model)} v{html.escape(version)}: {state}</h4>"
                f"<p>reference: {html.escape(str(record.get('reference')))} · window: {record.get('window_rows', 0)} "
                "rows</p><table><tr><th>feature</th><th>PSI</th><th>test</th><th>p-value</th><th>drifted</th></tr>"
                f"{rows}</table>"
            )
    return "".join(parts)
