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

import threading

import ipywidgets as widgets

from workbench.notebook.dashboard_part import (
    Part,
    Server,
    on_kernel_thread,
    register,
)
from workbench.notebook.drift_panel import DriftPanel
from workbench.notebook.live_chart import LiveChart
from workbench.notebook.load_panel import LoadPanel
from workbench.notebook.query_panel import PROTOCOL_CHOICES, QueryPanel, example_inputs
from workbench.notebook.shadow_panel import ShadowPanel
from workbench.notebook.versions_panel import VersionsPanel, routing_summary

__all__ = [
    "Dashboard",
    "LiveChart",
    "LoadPanel",
    "PROTOCOL_CHOICES",
    "QueryPanel",
    "VersionsPanel",
    "example_inputs",
    "on_kernel_thread",
    "routing_summary",
]


# ----------------------------------------------------------------------------------------- dashboard
class Dashboard(Part):
    """All the parts together: versions and query side by side, the live chart, and the load button."""

    def __init__(self, server: Server, window_seconds: float = 60.0) -> None:
        super().__init__()
        self.versions = VersionsPanel(server)
        self.query = QueryPanel(server)
        self.chart = LiveChart(server, window_seconds=window_seconds)
        self.load = LoadPanel(server)
        self.shadow = ShadowPanel(server)
        self.drift = DriftPanel(server)
        self.parts: list[Part] = [self.versions, self.query, self.chart, self.load, self.shadow, self.drift]
        tabs = widgets.Tab(
            children=[self.versions.widget, self.query.widget, self.load.widget, self.shadow.widget, self.drift.widget]
        )
        for index, title in enumerate(("Versions", "Query", "Load", "v1 vs v2", "Drift")):
            tabs.set_title(index, title)
        self.widget = widgets.VBox([tabs, self.chart.widget])
        register(server, self)

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)

    @property
    def threads(self) -> list[threading.Thread]:
        return [t for part in self.parts for t in part.threads]

    def close(self, timeout: float = 5.0) -> None:
        for part in self.parts:
            part.close(timeout)
