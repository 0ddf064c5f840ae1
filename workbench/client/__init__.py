"""A client for TF Serving's and the Open Inference Protocol's (v2) REST and gRPC APIs with numpy in and out, and for
workbench's management API; and the load generator (:mod:`workbench.client.bench`).

The same call works over four protocols: TF Serving's (``protocol="rest"`` or ``"grpc"``) and v2's (``"v2"``, also
spelled ``"v2-rest"``, or ``"v2-grpc"``), against workbench, a real TF Serving (TF Serving's protocols) or any v2
server such as Triton (v2's). The management methods are workbench's own. Input dtypes come from the model's
metadata, fetched once per model, so ``client.predict("m", [[1.0]])`` sends float32 when the signature says so.
Every answer carries its latency; errors are :class:`~workbench.core.errors.ServingError` with the server's
code and message. :meth:`Client.predict_async` queues a request and returns an :class:`AsyncPrediction` (a future:
``.result(timeout)``). :meth:`Client.stream` iterates one request's responses (a decoupled model's 0..n) as they arrive,
over v2 gRPC's ``ModelStreamInfer``.

The :class:`Client` (:mod:`~workbench.client.facade`) hands each call to the transport of its protocol:
:mod:`~workbench.client.tfs_rest`, :mod:`~workbench.client.tfs_grpc`, :mod:`~workbench.client.v2_rest_transport` (JSON,
and Triton's binary tensor extension for large tensors: see :mod:`workbench.protocol.v2_client`) and
:mod:`~workbench.client.v2_grpc_transport` (the stubs tritonclient generates, on the client's one set of channels, which
also carry TF Serving's services). Nothing here imports the engine, nor TensorFlow's runtime.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workbench.client.async_requests import AsyncPrediction
    from workbench.client.facade import Client
    from workbench.client.grpc_channels import GRPC_CHANNELS
    from workbench.client.prediction import Prediction
    from workbench.client.protocols import GRPC_PROTOCOLS, PROTOCOLS, V2_PROTOCOLS, canonical_protocol
    from workbench.client.tls import ClientTLS

__all__ = [
    "AsyncPrediction",
    "GRPC_CHANNELS",
    "GRPC_PROTOCOLS",
    "PROTOCOLS",
    "V2_PROTOCOLS",
    "Client",
    "ClientTLS",
    "Prediction",
    "canonical_protocol",
]

# Each public name's module, imported on first use. `workbench serve` reads the bench command's options from
# workbench.client.bench, and importing the package would load the Client and with it requests and urllib3, whose
# four warning filters scikit-learn's ensembles re-install for every tree of every call (about 1 ms of a 200-tree
# forest's 7 ms call).
_HOMES = {
    "AsyncPrediction": "workbench.client.async_requests",
    "Client": "workbench.client.facade",
    "GRPC_CHANNELS": "workbench.client.grpc_channels",
    "Prediction": "workbench.client.prediction",
    "GRPC_PROTOCOLS": "workbench.client.protocols",
    "PROTOCOLS": "workbench.client.protocols",
    "V2_PROTOCOLS": "workbench.client.protocols",
    "canonical_protocol": "workbench.client.protocols",
    "ClientTLS": "workbench.client.tls",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
