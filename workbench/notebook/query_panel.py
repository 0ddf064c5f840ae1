"""The query panel: a request built from the model's signature, sent over REST, gRPC or v2, and its answer."""

from __future__ import annotations

import html
import json
from typing import Any

import ipywidgets as widgets
import numpy as np
import requests

from workbench.client import V2_PROTOCOLS
from workbench.core.errors import ServingError
from workbench.core.signatures import Signature
from workbench.notebook.dashboard_part import (
    Part,
    Server,
    client_of,
    register,
    set_options,
)

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


class QueryPanel(Part):
    """Pick a model, a version or label and a signature; edit the prefilled input; send over REST or gRPC, with
    TF Serving's API or v2's (which runs a model's ``serving_default`` signature)."""

    def __init__(self, server: Server) -> None:
        super().__init__()
        self.client = client_of(server)
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
        register(server, self)

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)

    def refresh(self) -> None:
        try:
            self._models = self.client.models()
        except (ServingError, requests.RequestException) as exc:
            self.status.value = html.escape(str(exc))
            return
        set_options(self.model, [m["name"] for m in self._models])
        self._fill_targets()

    def _fill_targets(self) -> None:
        model = next((m for m in self._models if m["name"] == self.model.value), None)
        options: list[tuple[str, Any]] = [("default", None)]
        if model:
            options += [(f"label {label}", ("label", label)) for label in sorted(model["labels"])]
            options += [
                (f"v{v['version']}", ("version", v["version"])) for v in model["versions"] if v["state"] == "AVAILABLE"
            ]
        set_options(self.target, options)
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
        set_options(self.signature, names)
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
