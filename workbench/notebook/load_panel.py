"""The load panel: the load generator against a model, with its progress and its table."""

from __future__ import annotations

import contextlib
import html
import threading
import time
from typing import Any

import ipywidgets as widgets
import requests

from workbench.client import GRPC_PROTOCOLS
from workbench.core.errors import ServingError
from workbench.notebook.dashboard_part import (
    Newest,
    Part,
    Server,
    client_of,
    register,
    set_options,
)
from workbench.notebook.query_panel import PROTOCOL_CHOICES, example_inputs


class LoadPanel(Part):
    """Send N clients for T seconds through the benchmark generator, with a progress bar and a result table."""

    def __init__(self, server: Server) -> None:
        super().__init__()
        self.client = client_of(server)
        self.model = widgets.Dropdown(description="model")
        self.clients = widgets.IntSlider(value=16, min=1, max=128, description="clients")
        self.seconds = widgets.FloatSlider(value=10, min=1, max=120, step=1, description="seconds")
        self.protocol = widgets.ToggleButtons(options=PROTOCOL_CHOICES, value="grpc")
        self.start = widgets.Button(description="Send load", button_style="danger")
        self.progress = widgets.FloatProgress(value=0, min=0, max=1, description="")
        self.result = widgets.HTML()
        self.status = widgets.HTML()
        self.last: Any = None
        self._progress: Newest[float] = Newest(lambda fraction: setattr(self.progress, "value", fraction))
        self.start.on_click(lambda _: self._go())
        self.widget = widgets.VBox([
            widgets.HBox([self.model, self.protocol]),
            widgets.HBox([self.clients, self.seconds, self.start]),
            widgets.HBox([self.progress, self.status]),
            self.result,
        ])  # fmt: skip
        with contextlib.suppress(ServingError, requests.RequestException):
            set_options(self.model, [m["name"] for m in self.client.models()])
        register(server, self)

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
