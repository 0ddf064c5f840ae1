"""The versions panel: a model's versions, states, labels and traffic, with promote, roll back, canary and unload."""

from __future__ import annotations

import html
import itertools
import json
from collections.abc import Callable
from typing import Any

import ipywidgets as widgets
import requests

from workbench.client import Client
from workbench.core.errors import ServingError
from workbench.notebook.dashboard_part import (
    Newest,
    Part,
    Server,
    client_of,
    register,
    set_options,
)

_Fetched = tuple[int, list[dict[str, Any]] | Exception]  # (fetch number, the models or why not)


class VersionsPanel(Part):
    """Every model and version with state, labels, traffic share and load errors, and the buttons to change them.

    It shows the server's state, whoever changed it (these buttons, ``%serve``, the sidebar, another client):
    a polling thread fetches it, and when it changed the table, the version list, the routing line and the
    canary slider follow; the slider shows the selected model's canary weight (0% without a canary).
    """

    def __init__(self, server: Server, refresh_seconds: float = 1.0) -> None:
        super().__init__()
        self.client = client_of(server)
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
        self._fetched: Newest[_Fetched] = Newest(self._show)
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
        register(server, self)
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
        set_options(self.model, [m["name"] for m in models])
        self._fill_versions()

    def _fill_versions(self) -> None:
        model = next((m for m in self._models if m["name"] == self.model.value), None)
        set_options(self.version, [v["version"] for v in model["versions"]] if model else [])
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
    registry = model.get("registry")
    if registry:  # routed by MLflow's aliases: a change here moves them there
        aliases = ", ".join(f"@{alias} v{version}" for alias, version in registry["aliases"].items())
        parts.append(f"{registry['uri']}: {aliases or 'no alias set'}")
    return f"<small>{html.escape(' · '.join(parts))}</small>"
